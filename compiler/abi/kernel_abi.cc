// Derives a kernel's ABI from its LINEAR and gives the ABI a stable text form. The text
// form is a cache artifact: parse_abi treats it as untrusted and never crashes on it.
// Version 1 is the CPU form; version 2 appends the GPU launch dims, so every version-1
// text stays what it was; version 3 adds a `stop` line after `tasks` (the GPU dims, if
// any, follow it), and is written only for kernels that check a stop word, so a kernel
// without one keeps its version 1 or 2 text; version 4 is version 3 with the stop line
// always there (`stop 0` or `stop 1`) and the work estimate after it, written for every
// kernel that has one, so that texts without an estimate keep their older versions;
// version 5 is version 4 with a `schedule` line after the loops: the loop schedule the
// optimize stage applied (loop_schedule.h text, possibly empty).
#include "compiler/abi/kernel_abi.h"

#include <algorithm>
#include <charconv>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr std::string_view kMagic = "uopd-abi";
constexpr int kVersion = 1;     // without GPU launch dims
constexpr int kGpuVersion = 2;  // with them
constexpr int kStopVersion = 3;  // with a stop word, GPU dims optional
constexpr int kWorkVersion = 4;  // a stop line and the work estimate, GPU dims optional
constexpr int kScheduleVersion = kAbiVersion;  // version 4 and the loop schedule
constexpr int kMaxExprDepth = 256;

bool is_launch_op(Op op) {
  return op == Op::ADD || op == Op::SUB || op == Op::MUL || op == Op::IDIV || op == Op::MAX ||
         op == Op::MIN;
}

std::string_view op_symbol(Op op) {
  switch (op) {
    case Op::ADD: return "+";
    case Op::SUB: return "-";
    case Op::MUL: return "*";
    case Op::IDIV: return "/";
    case Op::MAX: return "max";
    default: return "min";
  }
}

// The buffer an INDEX addresses, looking through AFTER (which only orders).
const UOp* buffer_of(const UOp* index) {
  if (index->num_src() == 0) return nullptr;
  const UOp* b = index->src(0);
  while (b->is(Op::AFTER)) b = b->src(0);
  return b;
}

const UOp* index_of(const UOp* u) {
  while (u->is(Op::AFTER)) u = u->src(0);
  return u->is(Op::INDEX) ? u : nullptr;
}

// Postfix terms of a launch extent (a Thread range's or a SPECIAL's end), or
// INVALID_ARGUMENT; `what` names it in messages.
absl::Status to_launch_terms(const UOp* u, const KernelAbi& abi, int depth,
                             std::vector<LaunchExpr::Term>& out, const NodeIndex& ix,
                             std::string_view what = "Thread range extent") {
  using Kind = LaunchExpr::Term::Kind;
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(cat("node ", ix.contains(u) ? ix.at(u) : 0u, " (",
                                          op_name(u->op()), "): ", what, why, " [abi.launch_expr]"));
  };
  if (depth > kMaxExprDepth) return bad(" is nested too deeply");
  if (u->dtype().is_vector() || !(u->dtype().is_int() || u->dtype().is_index()))
    return bad(" must be an integer scalar");
  if (const ConstValue* c = u->const_value()) {
    out.push_back({Kind::Const, cast_value(*c, Scalar::Int64).as_int(), Op::ADD});
    return absl::OkStatus();
  }
  if (u->is(Op::DEFINE_VAR)) {
    int pos = abi.var_position(u->arg_as<DefineVarArg>().name);
    if (pos < 0) return bad("unknown variable");
    out.push_back({Kind::Var, pos, Op::ADD});
    return absl::OkStatus();
  }
  if (!is_launch_op(u->op()) || u->num_src() != 2)
    return bad(" must use only constants, DEFINE_VAR and ADD SUB MUL IDIV MAX MIN");
  for (const UOp* s : u->src())
    if (auto st = to_launch_terms(s, abi, depth + 1, out, ix, what); !st.ok()) return st;
  out.push_back({Kind::Op, 0, u->op()});
  return absl::OkStatus();
}

// A cursor over the text form; every read reports failure instead of trusting the input.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool token(std::string_view& t) {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != ' ' && s_[pos_] != '\n') ++pos_;
    t = s_.substr(start, pos_ - start);
    return !t.empty();
  }
  bool integer(int64_t& v) {
    std::string_view t;
    if (!token(t)) return false;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc() && p == t.data() + t.size();
  }
  bool expect(std::string_view want) {
    std::string_view t;
    return token(t) && t == want;
  }
  // `<len>:<bytes>`
  bool bytes(std::string& out) {
    std::string_view t;
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
    size_t colon = s_.find(':', pos_);
    if (colon == std::string_view::npos) return false;
    int64_t n = 0;
    auto [p, ec] = std::from_chars(s_.data() + pos_, s_.data() + colon, n);
    if (ec != std::errc() || p != s_.data() + colon || n < 0 ||
        static_cast<uint64_t>(n) > s_.size() - colon - 1)
      return false;
    out.assign(s_.substr(colon + 1, n));
    pos_ = colon + 1 + n;
    return true;
  }
  bool at_end() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
    return pos_ == s_.size();
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

void write_terms(std::string& out, const LaunchExpr& e) {
  out += cat(e.terms().size());
  for (const LaunchExpr::Term& t : e.terms()) {
    if (t.kind == LaunchExpr::Term::Kind::Const) out += cat(" c", t.value);
    else if (t.kind == LaunchExpr::Term::Kind::Var) out += cat(" v", t.value);
    else out += cat(" ", op_symbol(t.op));
  }
}

// `<count> <term>...` as written by write_terms; false on anything malformed.
bool read_terms(Reader& r, size_t num_vars, LaunchExpr& out) {
  int64_t n = 0;
  if (!r.integer(n) || n < 1 || n > (1 << 16)) return false;
  std::vector<LaunchExpr::Term> terms;
  for (int64_t i = 0; i < n; ++i) {
    std::string_view t;
    if (!r.token(t)) return false;
    LaunchExpr::Term term;
    if (t[0] == 'c' || t[0] == 'v') {
      term.kind = t[0] == 'c' ? LaunchExpr::Term::Kind::Const : LaunchExpr::Term::Kind::Var;
      auto [p, ec] = std::from_chars(t.data() + 1, t.data() + t.size(), term.value);
      if (ec != std::errc() || p != t.data() + t.size()) return false;
    } else {
      term.kind = LaunchExpr::Term::Kind::Op;
      bool found = false;
      for (Op op : {Op::ADD, Op::SUB, Op::MUL, Op::IDIV, Op::MAX, Op::MIN})
        if (op_symbol(op) == t) term.op = op, found = true;
      if (!found) return false;
    }
    terms.push_back(term);
  }
  auto expr = LaunchExpr::from_terms(std::move(terms), num_vars);
  if (!expr.ok()) return false;
  out = *std::move(expr);
  return true;
}

// "blockIdx.y" -> (false, 1); "threadIdx.z" -> (true, 2); nullopt for other names.
std::optional<std::pair<bool, int>> special_dim(std::string_view name) {
  bool thread = name.starts_with("threadIdx.");
  if (!thread && !name.starts_with("blockIdx.")) return std::nullopt;
  std::string_view axis = name.substr(thread ? 10 : 9);
  if (axis == "x") return std::make_pair(thread, 0);
  if (axis == "y") return std::make_pair(thread, 1);
  if (axis == "z") return std::make_pair(thread, 2);
  return std::nullopt;
}

// Floating point operations of one ALU op, counting each lane (MULACC is a multiply and an
// add); 0 for integer and index arithmetic, which is addressing and loop bookkeeping.
int64_t flops_of(const UOp* u) {
  if (!is_alu(u->op()) || !u->dtype().is_float()) return 0;
  return (u->is(Op::MULACC) ? 2 : 1) * static_cast<int64_t>(u->dtype().count);
}

// Bytes a LOAD or STORE moves to or from a kernel buffer (a PARAM); 0 for registers.
int64_t bytes_of(const UOp* u) {
  if (!u->is(Op::LOAD) && !u->is(Op::STORE)) return 0;
  const UOp* idx = index_of(u->src(u->is(Op::LOAD) ? 1 : 0));
  const UOp* buf = idx ? buffer_of(idx) : nullptr;
  if (!buf || !buf->is(Op::PARAM)) return 0;
  const UOp* value = u->is(Op::LOAD) ? u : u->src(1);
  return static_cast<int64_t>(value->dtype().bytes());
}

// The work estimate of KernelAbi::work: the LINEAR's listed ops walked in order with the
// ranges open at each; the ops of one scope (one stack of open ranges) are summed first,
// so the expression has one product per scope, not one per op. nullopt where an open
// range's extent is not a launch expression.
std::optional<KernelAbi::Work> work_of(const UOp* linear, const KernelAbi& abi, const NodeIndex& ix) {
  using Term = LaunchExpr::Term;
  struct Scope {
    std::vector<const UOp*> ranges;
    int64_t flops = 0, bytes = 0;
  };
  KernelAbi::Work work;
  std::vector<const UOp*> loops;
  std::vector<Scope> scopes;
  absl::flat_hash_map<std::vector<const UOp*>, size_t> scope_of;
  std::vector<const UOp*> open;
  auto add = [&](int64_t flops, int64_t bytes) {
    auto [it, fresh] = scope_of.try_emplace(open, scopes.size());
    if (fresh) scopes.push_back({open});
    scopes[it->second].flops += flops;
    scopes[it->second].bytes += bytes;
  };
  for (const UOp* u : linear->src()) {
    if (u->is(Op::RANGE)) {
      open.push_back(u);
      loops.push_back(u);
    } else if (u->is(Op::END)) {
      for (size_t i = 1; i < u->num_src(); ++i) std::erase(open, u->src(i));
    } else if (int64_t f = flops_of(u), b = bytes_of(u); f > 0 || b > 0) {
      add(f, b);
      if (f > 0) work.lanes = std::max<int64_t>(work.lanes, u->dtype().count);
    }
  }
  // Each range's extent once: a product per scope refers to them.
  absl::flat_hash_map<const UOp*, std::vector<Term>> extents;
  for (const UOp* r : loops) {
    if (extents.contains(r)) continue;
    std::vector<Term> terms;
    if (r->num_src() < 1 || !to_launch_terms(r->src(0), abi, 0, terms, ix).ok()) return std::nullopt;
    auto extent = LaunchExpr::from_terms(terms, abi.vars.size());
    if (!extent.ok()) return std::nullopt;
    work.loops.push_back({r->arg_as<RangeArg>().type, *std::move(extent)});
    // A range runs max(extent, 0) times.
    terms.push_back({Term::Kind::Const, 0, Op::ADD});
    terms.push_back({Term::Kind::Op, 0, Op::MAX});
    extents.emplace(r, std::move(terms));
  }
  // A GPU kernel's LINEAR is one thread's work: every thread of the grid does it.
  std::vector<Term> threads;
  if (abi.gpu)
    for (const auto* dims : {&abi.gpu->grid, &abi.gpu->block})
      for (const LaunchExpr& d : *dims) {
        threads.insert(threads.end(), d.terms().begin(), d.terms().end());
        threads.push_back({Term::Kind::Const, 0, Op::ADD});
        threads.push_back({Term::Kind::Op, 0, Op::MAX});
        threads.push_back({Term::Kind::Op, 0, Op::MUL});
      }
  auto total = [&](int64_t Scope::*field) -> std::optional<LaunchExpr> {
    std::vector<Term> terms{{Term::Kind::Const, 0, Op::ADD}};
    for (const Scope& s : scopes) {
      if (s.*field == 0) continue;
      terms.push_back({Term::Kind::Const, s.*field, Op::ADD});
      for (const UOp* r : s.ranges) {
        const auto& e = extents.at(r);
        terms.insert(terms.end(), e.begin(), e.end());
        terms.push_back({Term::Kind::Op, 0, Op::MUL});
      }
      terms.insert(terms.end(), threads.begin(), threads.end());
      terms.push_back({Term::Kind::Op, 0, Op::ADD});
    }
    if (terms.size() > (1 << 16)) return std::nullopt;  // what parse_abi reads back
    auto expr = LaunchExpr::from_terms(std::move(terms), abi.vars.size());
    if (!expr.ok()) return std::nullopt;
    return *std::move(expr);
  };
  auto flops = total(&Scope::flops);
  auto bytes = total(&Scope::bytes);
  if (!flops || !bytes) return std::nullopt;
  work.flops = *std::move(flops);
  work.bytes = *std::move(bytes);
  return work;
}

}  // namespace

bool GpuDims::empty() const {
  for (int i = 0; i < 3; ++i)
    if (grid[i] <= 0 || block[i] <= 0) return true;
  return false;
}

LaunchExpr LaunchExpr::constant(int64_t v) { return LaunchExpr({{Term::Kind::Const, v, Op::ADD}}); }

absl::StatusOr<LaunchExpr> LaunchExpr::from_terms(std::vector<Term> terms, size_t num_vars) {
  int64_t depth = 0;
  for (const Term& t : terms) {
    switch (t.kind) {
      case Term::Kind::Const: ++depth; break;
      case Term::Kind::Var:
        if (t.value < 0 || static_cast<uint64_t>(t.value) >= num_vars)
          return absl::InvalidArgumentError(cat("launch expression: variable ", t.value, " out of range"));
        ++depth;
        break;
      case Term::Kind::Op:
        if (!is_launch_op(t.op)) return absl::InvalidArgumentError("launch expression: bad operator");
        if (depth < 2) return absl::InvalidArgumentError("launch expression: operator without operands");
        --depth;
        break;
    }
  }
  if (depth != 1) return absl::InvalidArgumentError("launch expression: not a single value");
  return LaunchExpr(std::move(terms));
}

int64_t LaunchExpr::eval(std::span<const int64_t> vars) const {
  std::vector<int64_t> stack;
  stack.reserve(terms_.size());
  for (const Term& t : terms_) {
    if (t.kind == Term::Kind::Const) {
      stack.push_back(t.value);
    } else if (t.kind == Term::Kind::Var) {
      stack.push_back(static_cast<size_t>(t.value) < vars.size() ? vars[t.value] : 0);
    } else {
      ConstValue args[2] = {ConstValue::Int(stack[stack.size() - 2]), ConstValue::Int(stack.back())};
      stack.pop_back();
      stack.back() = eval_alu(t.op, Scalar::Index, args).value_or(ConstValue::Int(0)).as_int();
    }
  }
  return stack.empty() ? 0 : stack.back();
}

std::string LaunchExpr::str(std::span<const KernelVar> vars) const {
  std::vector<std::string> stack;
  for (const Term& t : terms_) {
    if (t.kind == Term::Kind::Const) {
      stack.push_back(cat(t.value));
    } else if (t.kind == Term::Kind::Var) {
      stack.push_back(static_cast<size_t>(t.value) < vars.size() ? vars[t.value].name : cat("v", t.value));
    } else {
      std::string b = std::move(stack.back());
      stack.pop_back();
      std::string& a = stack.back();
      if (t.op == Op::MAX || t.op == Op::MIN) a = cat(op_symbol(t.op), "(", a, ", ", b, ")");
      else a = cat("(", a, " ", op_symbol(t.op), " ", b, ")");
    }
  }
  return stack.empty() ? "" : stack.back();
}

int64_t KernelAbi::eval_tasks(std::span<const int64_t> var_values) const {
  return std::max<int64_t>(tasks_extent.eval(var_values), 0);
}

GpuDims KernelAbi::eval_gpu(std::span<const int64_t> var_values) const {
  GpuDims d;
  if (!gpu) return d;
  for (int i = 0; i < 3; ++i) {
    d.grid[i] = gpu->grid[i].eval(var_values);
    d.block[i] = gpu->block[i].eval(var_values);
  }
  return d;
}

std::string KernelAbi::loops_str() const {
  if (!work) return "";
  std::string out;
  for (const Loop& l : work->loops)
    out += cat(out.empty() ? "" : " ", axis_type_name(l.type), "(", l.extent.str(vars), ")");
  if (work->lanes > 1) out += cat(out.empty() ? "" : " ", "lanes=", work->lanes);
  return out.empty() ? "scalar" : out;
}

int KernelAbi::var_position(std::string_view name) const {
  for (size_t i = 0; i < vars.size(); ++i)
    if (vars[i].name == name) return static_cast<int>(i);
  return -1;
}

std::string KernelAbi::serialize() const {
  const int version = work ? kScheduleVersion : stop_word ? kStopVersion : gpu ? kGpuVersion : kVersion;
  std::string out = cat(kMagic, " ", version, "\nparams ", params.size(), "\n");
  for (const KernelParam& p : params)
    out += cat(p.slot, " ", scalar_name(p.dtype.scalar), " ", p.dtype.count, " ", p.size, " ",
               p.read ? "r" : "-", p.written ? "w" : "-", "\n");
  out += cat("vars ", vars.size(), "\n");
  for (const KernelVar& v : vars) out += cat(v.min, " ", v.max, " ", v.name.size(), ":", v.name, "\n");
  out += cat("thread ", has_thread_range ? 1 : 0, "\ntasks ", tasks_extent.terms().size());
  for (const LaunchExpr::Term& t : tasks_extent.terms()) {
    if (t.kind == LaunchExpr::Term::Kind::Const) out += cat(" c", t.value);
    else if (t.kind == LaunchExpr::Term::Kind::Var) out += cat(" v", t.value);
    else out += cat(" ", op_symbol(t.op));
  }
  out += "\n";
  if (work) {
    out += cat("stop ", stop_word ? 1 : 0, "\nflops ");
    write_terms(out, work->flops);
    out += "\nbytes ";
    write_terms(out, work->bytes);
    out += cat("\nlanes ", work->lanes, "\nloops ", work->loops.size(), "\n");
    for (const Loop& l : work->loops) {
      out += cat(axis_type_name(l.type), " ");
      write_terms(out, l.extent);
      out += "\n";
    }
    out += cat("schedule ", schedule.size(), ":", schedule, "\n");
  } else if (stop_word) {
    out += "stop 1\n";
  }
  if (gpu) {
    out += cat("gpu shared ", gpu->dynamic_shared_bytes, "\n");
    for (int i = 0; i < 3; ++i) {
      out += cat("grid ", i, " ");
      write_terms(out, gpu->grid[i]);
      out += "\n";
    }
    for (int i = 0; i < 3; ++i) {
      out += cat("block ", i, " ");
      write_terms(out, gpu->block[i]);
      out += "\n";
    }
  }
  return out;
}

absl::StatusOr<KernelAbi> parse_abi(std::string_view text) {
  auto bad = [](std::string_view what) {
    return absl::DataLossError(cat("malformed kernel ABI: ", what));
  };
  Reader r(text);
  int64_t version = 0, n = 0;
  if (!r.expect(kMagic) || !r.integer(version)) return bad("header");
  if (version != kVersion && version != kGpuVersion && version != kStopVersion && version != kWorkVersion &&
      version != kScheduleVersion)
    return bad(cat("version ", version));
  KernelAbi abi;
  if (!r.expect("params") || !r.integer(n) || n < 0 || n > (1 << 20)) return bad("params");
  for (int64_t i = 0; i < n; ++i) {
    KernelParam p;
    std::string_view scalar, rw;
    int64_t count = 0;
    if (!r.integer(p.slot) || !r.token(scalar) || !r.integer(count) || !r.integer(p.size) ||
        !r.token(rw) || rw.size() != 2)
      return bad("param");
    auto s = scalar_from_name(scalar);
    if (!s || count < 1 || count > (1 << 16) || p.slot < 0 || p.size < 0) return bad("param dtype");
    if (!abi.params.empty() && abi.params.back().slot >= p.slot) return bad("param order");
    p.dtype = DType(*s, static_cast<uint32_t>(count));
    p.read = rw[0] == 'r';
    p.written = rw[1] == 'w';
    abi.params.push_back(p);
  }
  if (!r.expect("vars") || !r.integer(n) || n < 0 || n > (1 << 16)) return bad("vars");
  for (int64_t i = 0; i < n; ++i) {
    KernelVar v;
    if (!r.integer(v.min) || !r.integer(v.max) || !r.bytes(v.name) || v.min > v.max) return bad("var");
    abi.vars.push_back(std::move(v));
  }
  int64_t thread = 0;
  if (!r.expect("thread") || !r.integer(thread) || (thread != 0 && thread != 1)) return bad("thread");
  abi.has_thread_range = thread == 1;
  if (!r.expect("tasks") || !r.integer(n) || n < 1 || n > (1 << 16)) return bad("tasks");
  std::vector<LaunchExpr::Term> terms;
  for (int64_t i = 0; i < n; ++i) {
    std::string_view t;
    if (!r.token(t)) return bad("tasks term");
    LaunchExpr::Term term;
    if (t[0] == 'c' || t[0] == 'v') {
      term.kind = t[0] == 'c' ? LaunchExpr::Term::Kind::Const : LaunchExpr::Term::Kind::Var;
      auto [p, ec] = std::from_chars(t.data() + 1, t.data() + t.size(), term.value);
      if (ec != std::errc() || p != t.data() + t.size()) return bad("tasks term");
    } else {
      term.kind = LaunchExpr::Term::Kind::Op;
      bool found = false;
      for (Op op : {Op::ADD, Op::SUB, Op::MUL, Op::IDIV, Op::MAX, Op::MIN})
        if (op_symbol(op) == t) term.op = op, found = true;
      if (!found) return bad("tasks operator");
    }
    terms.push_back(term);
  }
  auto expr = LaunchExpr::from_terms(std::move(terms), abi.vars.size());
  if (!expr.ok()) return bad(cat(expr.status().message()));
  abi.tasks_extent = *std::move(expr);
  if (version == kStopVersion) {
    int64_t stop = 0;
    if (!r.expect("stop") || !r.integer(stop) || stop != 1) return bad("stop");
    abi.stop_word = true;
  }
  if (version == kWorkVersion || version == kScheduleVersion) {
    int64_t stop = 0;
    if (!r.expect("stop") || !r.integer(stop) || (stop != 0 && stop != 1)) return bad("stop");
    abi.stop_word = stop == 1;
    KernelAbi::Work w;
    if (!r.expect("flops") || !read_terms(r, abi.vars.size(), w.flops)) return bad("flops");
    if (!r.expect("bytes") || !read_terms(r, abi.vars.size(), w.bytes)) return bad("bytes");
    if (!r.expect("lanes") || !r.integer(w.lanes) || w.lanes < 1 || w.lanes > (1 << 16)) return bad("lanes");
    if (!r.expect("loops") || !r.integer(n) || n < 0 || n > (1 << 16)) return bad("loops");
    for (int64_t i = 0; i < n; ++i) {
      std::string_view name;
      KernelAbi::Loop l;
      if (!r.token(name)) return bad("loop");
      std::optional<AxisType> type;
      for (int t = 0; t <= static_cast<int>(AxisType::Unroll); ++t)
        if (axis_type_name(static_cast<AxisType>(t)) == name) type = static_cast<AxisType>(t);
      if (!type || !read_terms(r, abi.vars.size(), l.extent)) return bad("loop");
      l.type = *type;
      w.loops.push_back(std::move(l));
    }
    if (version == kScheduleVersion && (!r.expect("schedule") || !r.bytes(abi.schedule) || abi.schedule.size() > 4096))
      return bad("schedule");
    abi.work = std::move(w);
  }
  if (version == kGpuVersion || (version >= kStopVersion && !r.at_end())) {
    GpuLaunch gl;
    if (!r.expect("gpu") || !r.expect("shared") || !r.integer(gl.dynamic_shared_bytes) || gl.dynamic_shared_bytes < 0)
      return bad("gpu");
    for (auto* dims : {&gl.grid, &gl.block}) {
      for (int i = 0; i < 3; ++i) {
        int64_t axis = -1;
        if (!r.expect(dims == &gl.grid ? "grid" : "block") || !r.integer(axis) || axis != i ||
            !read_terms(r, abi.vars.size(), (*dims)[i]))
          return bad(dims == &gl.grid ? "grid" : "block");
      }
    }
    abi.gpu = std::move(gl);
  }
  if (!r.at_end()) return bad("trailing bytes");
  return abi;
}

absl::StatusOr<KernelAbi> abi_of(const UOp* linear) {
  NodeIndex ix = index_by_toposort(linear);
  auto bad = [&](const UOp* u, std::string_view why) {
    return absl::InvalidArgumentError(cat("node ", ix.at(u), " (", op_name(u->op()), "): ", why));
  };
  if (!linear->is(Op::LINEAR)) return bad(linear, "expected a LINEAR [abi.linear]");

  KernelAbi abi;
  absl::flat_hash_map<int64_t, KernelParam> params;
  absl::flat_hash_map<std::string, KernelVar> vars;
  // Everything reachable, not only the listed ops, so nothing the code reads is missed.
  for (const UOp* u : toposort(linear)) {
    if (u->is(Op::PARAM)) {
      const auto& a = u->arg_as<ParamArg>();
      if (!u->dtype().ptr || a.slot < 0 || a.size < 0 || u->dtype().scalar == Scalar::Void)
        return bad(u, "PARAM needs a pointer dtype, slot >= 0 and size >= 0 [abi.param]");
      KernelParam p{a.slot, u->dtype().pointee(), a.size, false, false};
      auto [it, inserted] = params.try_emplace(a.slot, p);
      if (!inserted && !(it->second == p))
        return bad(u, cat("slot ", a.slot, " has two different PARAMs [abi.param]"));
    } else if (u->is(Op::DEFINE_VAR)) {
      const auto& a = u->arg_as<DefineVarArg>();
      if (a.min > a.max) return bad(u, "DEFINE_VAR has min > max [abi.var]");
      KernelVar v{a.name, a.min, a.max};
      auto [it, inserted] = vars.try_emplace(a.name, v);
      if (!inserted && !(it->second == v))
        return bad(u, cat("variable '", a.name, "' is defined twice with different bounds [abi.var]"));
    } else if (u->is(Op::LOAD) || u->is(Op::STORE)) {
      const UOp* idx = index_of(u->src(u->is(Op::LOAD) ? 1 : 0));
      const UOp* buf = idx ? buffer_of(idx) : nullptr;
      if (buf && buf->is(Op::PARAM)) {
        auto it = params.find(buf->arg_as<ParamArg>().slot);
        if (it != params.end()) (u->is(Op::LOAD) ? it->second.read : it->second.written) = true;
      }
    }
  }
  for (auto& [slot, p] : params) abi.params.push_back(p);
  std::sort(abi.params.begin(), abi.params.end(),
            [](const KernelParam& a, const KernelParam& b) { return a.slot < b.slot; });
  for (auto& [name, v] : vars) abi.vars.push_back(v);
  std::sort(abi.vars.begin(), abi.vars.end(),
            [](const KernelVar& a, const KernelVar& b) { return a.name < b.name; });

  // Thread range: at most one, opened with no loop or IF around it, enclosing every
  // buffer store. Walk the listed ops keeping the open scopes.
  const UOp* thread = nullptr;
  for (const UOp* u : linear->src()) {
    if (u->is(Op::RANGE) && u->arg_as<RangeArg>().type == AxisType::Thread) {
      if (thread) return bad(u, "more than one Thread range [abi.thread]");
      thread = u;
    }
  }
  std::vector<const UOp*> open;
  bool in_thread = false;
  for (const UOp* u : linear->src()) {
    if (u->is(Op::RANGE) || u->is(Op::IF)) {
      if (u == thread) {
        if (!open.empty()) return bad(u, "the Thread range must be outermost [abi.thread]");
        in_thread = true;
      }
      open.push_back(u);
    } else if (u->is(Op::END) || u->is(Op::ENDIF)) {
      for (size_t i = u->is(Op::END) ? 1 : 0; i < u->num_src(); ++i) {
        const UOp* closed = u->src(i);
        auto it = std::find(open.begin(), open.end(), closed);
        if (it != open.end()) open.erase(it);
        if (closed == thread) in_thread = false;
      }
    } else if (u->is(Op::STORE) && thread && !in_thread) {
      const UOp* idx = index_of(u->src(0));
      const UOp* buf = idx ? buffer_of(idx) : nullptr;
      if (buf && buf->is(Op::PARAM))
        return bad(u, "a buffer store outside the Thread range would run once per task [abi.thread]");
    }
  }
  // GPU launch dims: one extent per SPECIAL name, the same wherever the name appears.
  absl::flat_hash_map<std::string, const UOp*> specials;
  for (const UOp* u : toposort(linear)) {
    if (!u->is(Op::SPECIAL)) continue;
    const std::string& name = u->arg_as<StrArg>().value;
    auto dim = special_dim(name);
    if (!dim) return bad(u, cat("SPECIAL '", name, "' is not blockIdx.{x,y,z} or threadIdx.{x,y,z} [abi.special]"));
    if (u->num_src() != 1) return bad(u, "SPECIAL needs its extent as its one source [abi.special]");
    auto [it, fresh] = specials.try_emplace(name, u->src(0));
    if (!fresh && it->second != u->src(0))
      return bad(u, cat("SPECIAL '", name, "' appears with two different extents [abi.special]"));
    if (!fresh) continue;
    if (thread) return bad(u, "a kernel has SPECIALs or a Thread range, not both [abi.special]");
    if (!abi.gpu) abi.gpu.emplace();
    std::vector<LaunchExpr::Term> terms;
    if (auto st = to_launch_terms(u->src(0), abi, 0, terms, ix, cat(name, " extent")); !st.ok()) return st;
    auto expr = LaunchExpr::from_terms(std::move(terms), abi.vars.size());
    if (!expr.ok()) return bad(u, cat(expr.status().message()));
    (dim->first ? abi.gpu->block : abi.gpu->grid)[dim->second] = *std::move(expr);
  }
  abi.work = work_of(linear, abi, ix);
  if (thread) {
    std::vector<LaunchExpr::Term> terms;
    if (thread->num_src() < 1) return bad(thread, "RANGE without an end [abi.thread]");
    if (auto st = to_launch_terms(thread->src(0), abi, 0, terms, ix); !st.ok()) return st;
    auto expr = LaunchExpr::from_terms(std::move(terms), abi.vars.size());
    if (!expr.ok()) return bad(thread, cat(expr.status().message()));
    abi.tasks_extent = *std::move(expr);
    abi.has_thread_range = true;
  }
  return abi;
}

}  // namespace uop
