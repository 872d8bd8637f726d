// LINEAR -> CUDA C. The LINEAR is emitted op by op in its own order: RANGE / END and IF /
// ENDIF open and close C blocks, every value becomes a const local (a vector one local per
// lane), SPECIAL reads blockIdx / threadIdx, DEFINE_LOCAL is a __shared__ array, DEFINE_REG
// a local array, BARRIER is __syncthreads(), WMMA one mma.sync (cuda_prelude.cc). A value
// may only be used inside the block that computes it (checked, so bad input is an error,
// not C that fails to compile). Values are spelled by cuda_alu.cc.
//
// Memory: a buffer is a pointer to its element type; an INDEX i into a buffer of
// count-wide vectors addresses element i*count. A vector access to a kernel argument is
// done in aligned chunks of up to 16 bytes when the index is provably a multiple of the
// chunk (ABI: arguments are 16-byte aligned), else lane by lane; registers and shared
// memory are always accessed lane by lane, which keeps register arrays in registers.
#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "compiler/codegen/cuda.h"
#include "compiler/codegen/cuda_alu.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

using cuda_c::reg_type;

// What an emitted op stands for.
struct Emitted {
  enum class Kind { None, Value, Buffer, Address };
  Kind kind = Kind::None;
  std::vector<std::string> lanes;  // Value: one C expression per lane
  std::string base;                // Buffer / Address: the pointer or array
  DType mem;                       // Buffer / Address: the element dtype (may be a vector)
  bool global = false;             // a kernel argument: vector accesses allowed
  std::string index;               // Address: the element index (long long)
  int64_t align = 1;               // Address: the scalar offset is a multiple of this
  std::vector<std::string> gate;   // Address: none, one, or one per lane
  int scope = 0;                   // the block that computed it (0: anywhere)
};

// A power of two (at most 64) that divides every value of the integer expression `u`.
int64_t multiple_of(const UOp* u, absl::flat_hash_map<const UOp*, int64_t>& memo) {
  if (auto it = memo.find(u); it != memo.end()) return it->second;
  int64_t m = 1;
  if (const ConstValue* c = u->const_value()) {
    uint64_t b = c->bits();
    m = b == 0 ? 64 : std::min<int64_t>(64, int64_t{1} << __builtin_ctzll(b));
  } else if (u->dtype().is_int() || u->dtype().is_index()) {
    switch (u->op()) {
      case Op::ADD: case Op::SUB: m = std::min(multiple_of(u->src(0), memo), multiple_of(u->src(1), memo)); break;
      case Op::MUL: m = std::min<int64_t>(64, multiple_of(u->src(0), memo) * multiple_of(u->src(1), memo)); break;
      case Op::NEG: m = multiple_of(u->src(0), memo); break;
      case Op::SHL:
        if (const ConstValue* k = u->src(1)->const_value(); k && k->to_int() >= 0 && k->to_int() < 7)
          m = std::min<int64_t>(64, multiple_of(u->src(0), memo) << k->to_int());
        break;
      case Op::CAST:
        if (u->src(0)->dtype().is_int() || u->src(0)->dtype().is_index()) m = multiple_of(u->src(0), memo);
        break;
      default: break;
    }
  }
  memo[u] = m;
  return m;
}

class Renderer {
 public:
  Renderer(const UOp* linear, const KernelAbi& abi) : abi_(abi), ix_(index_by_toposort(linear)) {}

  absl::Status render(const UOp* linear) {
    for (const UOp* u : linear->src()) {
      if (done_.contains(u)) {
        if (is_definition(u)) continue;  // made on an earlier use
        return bad(u, "listed twice in the LINEAR [linear.order]");
      }
      if (auto st = emit(u); !st.ok()) return st;
    }
    if (!scopes_.empty()) return bad(scopes_.back(), "RANGE / IF is never closed [linear.scope]");
    if (threads_ > 1024) return absl::InvalidArgumentError(cat("a block of ", threads_, " threads, over 1024 [cuda.block]"));
    return absl::OkStatus();
  }

  std::string kernel(std::string_view entry) const {
    std::vector<std::string> args;
    for (int64_t slot = 0, p = 0; slot < abi_.num_buffers(); ++slot) {
      if (abi_.params[p].slot != slot) {
        args.push_back(cat("const void* __restrict__ b", slot));  // a hole in the slots
        continue;
      }
      const KernelParam& kp = abi_.params[p++];
      args.push_back(cat(kp.written ? "" : "const ", cuda_c::mem_type(kp.dtype.scalar), "* __restrict__ b", kp.slot));
    }
    for (size_t k = 0; k < abi_.vars.size(); ++k) args.push_back(cat("long long var", k));
    std::string out;
    for (size_t k = 0; k < abi_.vars.size(); ++k)
      out += cat("// var", k, ": ", abi_.vars[k].name, " in [", abi_.vars[k].min, ", ", abi_.vars[k].max, "]\n");
    out += cat("extern \"C\" __global__ void __launch_bounds__(", threads_, ") ", entry, "(", join(args, ", "), ") {\n");
    return out + decls_ + body_ + "}\n";
  }
  int64_t threads() const { return threads_; }

 private:
  absl::Status bad(const UOp* u, std::string_view why) const {
    auto it = ix_.find(u);
    return absl::InvalidArgumentError(
        cat("node ", it == ix_.end() ? 0u : it->second, " (", op_name(u->op()), "): ", why));
  }
  std::string name(const UOp* u) const { return cat("v", ix_.at(u)); }
  void line(const std::string& s) { body_ += std::string(2 + 2 * scopes_.size(), ' ') + s + "\n"; }

  // Definitions the linearizer may list late or not at all (constants, arguments, arrays,
  // SPECIAL) are made on first use and are valid anywhere.
  static bool is_definition(const UOp* s) {
    switch (s->op()) {
      case Op::CONST: case Op::VCONST: case Op::PARAM: case Op::DEFINE_VAR: case Op::DEFINE_REG:
      case Op::DEFINE_LOCAL: case Op::SPECIAL:
        return true;
      default: return false;
    }
  }

  bool in_scope(int id) const {
    return id == 0 || std::find(scope_ids_.begin(), scope_ids_.end(), id) != scope_ids_.end();
  }
  int current_scope() const { return scope_ids_.empty() ? 0 : scope_ids_.back(); }

  absl::StatusOr<const Emitted*> get(const UOp* u, const UOp* s) {
    auto it = done_.find(s);
    if (it == done_.end()) {
      if (!is_definition(s))
        return bad(u, cat("uses node ", ix_.at(s), " (", op_name(s->op()), ") before it is listed [linear.order]"));
      if (auto st = emit(s); !st.ok()) return st;
      it = done_.find(s);
    }
    if (!in_scope(it->second.scope))
      return bad(u, cat("uses node ", ix_.at(s), " (", op_name(s->op()), ") outside the RANGE / IF that computes it [linear.scope]"));
    return &it->second;
  }

  absl::StatusOr<std::vector<std::string>> value(const UOp* u, const UOp* s) {
    auto e = get(u, s);
    if (!e.ok()) return e.status();
    if ((*e)->kind != Emitted::Kind::Value)
      return bad(u, cat("operand node ", ix_.at(s), " (", op_name(s->op()), ") is not a value [linear.operand]"));
    return (*e)->lanes;
  }

  // A scalar integer operand as a long long expression.
  absl::StatusOr<std::string> index_value(const UOp* u, const UOp* s) {
    if (s->dtype().is_vector() || !(s->dtype().is_int() || s->dtype().is_index()))
      return bad(u, cat("needs an integer scalar index, got ", s->dtype().str(), " [linear.index]"));
    auto v = value(u, s);
    if (!v.ok()) return v.status();
    return s->dtype().is_index() ? (*v)[0] : cat("((long long)(", (*v)[0], "))");
  }

  // Declares `u` as a value with these lane expressions: const locals, named after u.
  void define_value(const UOp* u, const std::vector<std::string>& exprs) {
    std::vector<std::string> lanes;
    std::string T(reg_type(u->dtype().scalar));
    for (size_t l = 0; l < exprs.size(); ++l) {
      std::string n = exprs.size() == 1 ? name(u) : cat(name(u), "_", l);
      line(cat("const ", T, " ", n, " = ", exprs[l], ";"));
      lanes.push_back(n);
    }
    done_[u] = {Emitted::Kind::Value, lanes, {}, {}, false, {}, 1, {}, current_scope()};
  }
  // A value whose lanes are other values' (no code).
  void alias(const UOp* u, std::vector<std::string> lanes, int scope) {
    done_[u] = {Emitted::Kind::Value, std::move(lanes), {}, {}, false, {}, 1, {}, scope};
  }

  absl::Status emit(const UOp* u);
  absl::Status emit_alu(const UOp* u);
  absl::Status emit_vector(const UOp* u);
  absl::Status emit_index(const UOp* u);
  absl::Status emit_load(const UOp* u);
  absl::Status emit_store(const UOp* u);
  absl::Status emit_special(const UOp* u);
  absl::Status emit_wmma(const UOp* u);

  // The C element `elem` scalars past an address (folded when the index is a constant).
  static std::string at(const Emitted& a, int64_t elem) {
    std::string off = a.mem.count == 1 ? a.index : cat("(", a.index, ") * ", a.mem.count);
    return elem == 0 ? off : cat(off, " + ", elem);
  }
  // Lanes per access for `count` lanes of `s` at address `a`: the widest aligned chunk
  // of at most 16 bytes, 1 where only scalar accesses are possible.
  static int64_t chunk(const Emitted& a, Scalar s, int64_t count) {
    if (!a.global || a.gate.size() > 1) return 1;
    int64_t c = 1;
    while (c * 2 <= count && count % (c * 2) == 0 && c * 2 * scalar_bytes(s) <= 16 && a.align % (c * 2) == 0) c *= 2;
    return c;
  }
  static std::string vec_type(Scalar s, int64_t n) {
    return cat("uop_vec<", cuda_c::mem_type(s), ", ", n, ", ", n * scalar_bytes(s), ">");
  }

  const KernelAbi& abi_;
  NodeIndex ix_;
  absl::flat_hash_map<const UOp*, Emitted> done_;
  absl::flat_hash_map<const UOp*, int64_t> multiples_;
  std::vector<const UOp*> scopes_;  // open RANGE / IF, innermost last
  std::vector<int> scope_ids_;
  int next_scope_ = 1;
  std::string decls_, body_;
  absl::flat_hash_map<std::string, const UOp*> specials_;
  int64_t threads_ = 1;
  int next_array_ = 0;
};

absl::Status Renderer::emit(const UOp* u) {
  using K = Emitted::Kind;
  const Op op = u->op();
  if (is_alu(op) || op == Op::CAST || op == Op::BITCAST) return emit_alu(u);
  switch (op) {
    case Op::PARAM: {
      DType d = u->dtype();
      if (!d.ptr || d.scalar == Scalar::Void) return bad(u, "PARAM needs a pointer dtype [linear.param]");
      done_[u] = {K::Buffer, {}, cat("b", u->arg_as<ParamArg>().slot), d.pointee(), true, {}, 1, {}, 0};
      return absl::OkStatus();
    }
    case Op::DEFINE_VAR: {
      int pos = abi_.var_position(u->arg_as<DefineVarArg>().name);
      if (pos < 0) return bad(u, "unknown variable [linear.var]");
      alias(u, {cat("var", pos)}, 0);
      return absl::OkStatus();
    }
    case Op::DEFINE_REG: case Op::DEFINE_LOCAL: {
      DType d = u->dtype();
      bool local = op == Op::DEFINE_LOCAL;
      int64_t size = local ? d.size : u->arg_as<DefineRegArg>().size;
      if (!d.ptr || d.scalar == Scalar::Void || size < 1 || size * d.bytes() > (local ? 48 << 10 : 64 << 10))
        return bad(u, cat(op_name(op), " needs a pointer dtype and 1 .. ", local ? "48" : "64",
                          " KiB of elements [linear.", local ? "local" : "reg", "]"));
      std::string n = cat(local ? "smem" : "reg", next_array_++);
      decls_ += cat("  ", local ? "__shared__ " : "", "alignas(16) ", cuda_c::mem_type(d.scalar), " ", n, "[",
                    size * d.count, "];\n");
      done_[u] = {K::Buffer, {}, n, d.pointee(), false, {}, 1, {}, 0};
      return absl::OkStatus();
    }
    case Op::CONST: case Op::VCONST: {
      if (u->dtype().ptr || u->dtype().scalar == Scalar::Void) return bad(u, cat("a constant of dtype ", u->dtype().str(), " [linear.const]"));
      std::vector<ConstValue> vals = op == Op::CONST ? std::vector<ConstValue>{u->arg_as<ConstValue>()} : u->arg_as<VConstArg>().values;
      if (vals.empty() || (op == Op::VCONST && vals.size() != u->dtype().count && vals.size() != 1))
        return bad(u, cat("VCONST has ", vals.size(), " values for ", u->dtype().str(), " [linear.const]"));
      std::vector<std::string> lanes;
      for (uint32_t l = 0; l < u->dtype().count; ++l)
        lanes.push_back(cuda_c::constant(u->dtype().scalar, vals[vals.size() == 1 ? 0 : l]));
      alias(u, std::move(lanes), 0);
      return absl::OkStatus();
    }
    case Op::VECTORIZE: case Op::CAT: case Op::GEP: return emit_vector(u);
    case Op::INDEX: return emit_index(u);
    case Op::LOAD: return emit_load(u);
    case Op::STORE: return emit_store(u);
    case Op::SPECIAL: return emit_special(u);
    case Op::WMMA: return emit_wmma(u);
    case Op::RANGE: {
      auto end = index_value(u, u->src(0));
      if (!end.ok()) return end.status();
      if (u->dtype().is_vector() || !(u->dtype().is_int() || u->dtype().is_index()))
        return bad(u, "RANGE must be an integer scalar [linear.range]");
      std::string n = name(u);
      line(cat("for (long long ", n, " = 0, ", n, "_end = ", *end, "; ", n, " < ", n, "_end; ++", n, ") {"));
      scopes_.push_back(u);
      scope_ids_.push_back(next_scope_++);
      alias(u, {u->dtype().is_index() ? n : cat("((", reg_type(u->dtype().scalar), ")", n, ")")}, current_scope());
      return absl::OkStatus();
    }
    case Op::END: {
      std::vector<const UOp*> closes(u->src().begin() + 1, u->src().end());
      if (closes.empty()) return bad(u, "END closes no RANGE [linear.scope]");
      while (!closes.empty()) {
        auto it = scopes_.empty() ? closes.end() : std::find(closes.begin(), closes.end(), scopes_.back());
        if (it == closes.end() || !scopes_.back()->is(Op::RANGE))
          return bad(u, "END does not close the innermost open RANGE [linear.scope]");
        closes.erase(it);
        scopes_.pop_back();
        scope_ids_.pop_back();
        line("}");
      }
      done_[u] = {};
      return absl::OkStatus();
    }
    case Op::IF: {
      if (u->src(0)->dtype() != dtypes::bool_) return bad(u, "IF needs a scalar bool condition [linear.if]");
      auto c = value(u, u->src(0));
      if (!c.ok()) return c.status();
      line(cat("if (", (*c)[0], ") {"));
      scopes_.push_back(u);
      scope_ids_.push_back(next_scope_++);
      done_[u] = {};
      return absl::OkStatus();
    }
    case Op::ENDIF: {
      if (scopes_.empty() || scopes_.back() != u->src(0)) return bad(u, "ENDIF does not close the innermost open IF [linear.scope]");
      scopes_.pop_back();
      scope_ids_.pop_back();
      line("}");
      done_[u] = {};
      return absl::OkStatus();
    }
    case Op::AFTER: {
      for (const UOp* dep : u->src().subspan(1))
        if (!done_.contains(dep)) return bad(u, cat("depends on node ", ix_.at(dep), " before it is listed [linear.order]"));
      auto e = get(u, u->src(0));
      if (!e.ok()) return e.status();
      Emitted same = **e;  // copied before done_[u] may rehash the map it points into
      done_[u] = std::move(same);  // AFTER only orders: it is its first source
      return absl::OkStatus();
    }
    case Op::BARRIER: {
      // Every thread of the block must reach it: the lowering never puts one under a
      // condition that differs between threads.
      for (const UOp* dep : u->src())
        if (!done_.contains(dep)) return bad(u, cat("depends on node ", ix_.at(dep), " before it is listed [linear.order]"));
      line("__syncthreads();");
      if (u->num_src() > 0 && !u->dtype().is_void()) {
        auto e = get(u, u->src(0));
        if (!e.ok()) return e.status();
        Emitted same = **e;
        done_[u] = std::move(same);  // the value passes through
      } else {
        done_[u] = {};
      }
      return absl::OkStatus();
    }
    case Op::SINK: case Op::DEVICE: case Op::GROUP:
      done_[u] = {};
      return absl::OkStatus();
    default:
      return bad(u, cat(op_name(op), " is not supported by the CUDA backend [cuda.op]"));
  }
}

absl::Status Renderer::emit_alu(const UOp* u) {
  if (auto st = cuda_c::check_alu(u); !st.ok()) return bad(u, std::string(st.message()));
  std::vector<std::vector<std::string>> srcs;
  for (const UOp* s : u->src()) {
    auto v = value(u, s);
    if (!v.ok()) return v.status();
    srcs.push_back(*std::move(v));
  }
  const uint32_t n = u->dtype().count;
  const Scalar t = u->src(u->is(Op::WHERE) ? 1 : 0)->dtype().scalar;
  std::vector<std::string> lanes;
  for (uint32_t l = 0; l < n; ++l) {
    std::vector<std::string> a;
    for (const auto& s : srcs) a.push_back(s.size() == 1 ? s[0] : s[l]);
    if (u->is(Op::CAST)) lanes.push_back(cuda_c::cast(t, u->dtype().scalar, a[0]));
    else if (u->is(Op::BITCAST)) lanes.push_back(cuda_c::bitcast(t, u->dtype().scalar, a[0]));
    else lanes.push_back(cuda_c::alu(u->op(), t, a));
  }
  define_value(u, lanes);
  return absl::OkStatus();
}

absl::Status Renderer::emit_vector(const UOp* u) {
  std::vector<std::string> lanes;
  int scope = 0;
  for (const UOp* s : u->src()) {
    if (s->dtype().ptr || s->dtype().scalar != u->dtype().scalar)
      return bad(u, cat("source dtype ", s->dtype().str(), " does not match ", u->dtype().str(), " [linear.vector]"));
    auto v = value(u, s);
    if (!v.ok()) return v.status();
    lanes.insert(lanes.end(), v->begin(), v->end());
    scope = std::max(scope, done_.at(s).scope);  // nested scopes have larger ids
  }
  if (u->is(Op::GEP)) {
    std::vector<std::string> picked;
    for (int64_t i : u->arg_as<IntsArg>().values) {
      if (i < 0 || static_cast<uint64_t>(i) >= lanes.size()) return bad(u, "GEP index out of range [linear.gep]");
      picked.push_back(lanes[i]);
    }
    lanes = std::move(picked);
  }
  if (lanes.size() != u->dtype().count) return bad(u, cat(lanes.size(), " lanes for ", u->dtype().str(), " [linear.vector]"));
  alias(u, std::move(lanes), scope);
  return absl::OkStatus();
}

absl::Status Renderer::emit_index(const UOp* u) {
  size_t n = u->num_src();
  bool gated = n >= 3 && u->src(n - 1)->dtype().scalar == Scalar::Bool;
  if (n != (gated ? 3u : 2u)) return bad(u, "INDEX needs one linear index and an optional gate [linear.index]");
  auto buf = get(u, u->src(0));
  if (!buf.ok()) return buf.status();
  if ((*buf)->kind != Emitted::Kind::Buffer) return bad(u, "INDEX of something that is not a buffer [linear.index]");
  auto i = index_value(u, u->src(1));
  if (!i.ok()) return i.status();
  Emitted a = **buf;
  a.kind = Emitted::Kind::Address;
  a.index = *i;
  a.align = std::min<int64_t>(64, multiple_of(u->src(1), multiples_) * a.mem.count);
  if (gated) {
    auto g = value(u, u->src(2));
    if (!g.ok()) return g.status();
    a.gate = *g;
  }
  a.scope = current_scope();
  done_[u] = std::move(a);
  return absl::OkStatus();
}

absl::Status Renderer::emit_load(const UOp* u) {
  auto e = get(u, u->src(1));
  if (!e.ok()) return e.status();
  const Emitted a = **e;
  const DType d = u->dtype();
  if (a.kind != Emitted::Kind::Address) return bad(u, "LOAD needs an INDEX as its second source [linear.load]");
  if (d.ptr || d.scalar != a.mem.scalar) return bad(u, cat("LOAD of ", d.str(), " from a buffer of ", a.mem.str(), " [linear.load]"));
  const int64_t n = d.count;
  if (a.gate.size() > 1 && a.gate.size() != static_cast<size_t>(n))
    return bad(u, "a per-lane gate needs one lane per loaded element [linear.load]");
  std::vector<std::string> alt(1, cuda_c::constant(d.scalar, ConstValue::Int(0)));
  if (u->num_src() > 2) {
    const UOp* s = u->src(2);
    if (s->dtype() != d && s->dtype() != d.element())
      return bad(u, cat("LOAD alt of ", s->dtype().str(), " for a LOAD of ", d.str(), " [linear.load]"));
    auto v = value(u, s);
    if (!v.ok()) return v.status();
    alt = *v;
  }
  const std::string T(reg_type(d.scalar));
  std::vector<std::string> lanes;
  for (int64_t l = 0; l < n; ++l) lanes.push_back(n == 1 ? name(u) : cat(name(u), "_", l));
  auto read = [&](int64_t l) { return cuda_c::from_memory(d.scalar, cat(a.base, "[", at(a, l), "]")); };
  if (a.gate.empty() && n == 1) {
    line(cat("const ", T, " ", lanes[0], " = ", read(0), ";"));
  } else if (a.gate.size() > 1 || (n == 1 && a.gate.size() == 1)) {  // no memory is touched where a gate is off
    for (int64_t l = 0; l < n; ++l)
      line(cat("const ", T, " ", lanes[l], " = (", a.gate[a.gate.size() == 1 ? 0 : l], ") ? ", read(l), " : ",
               alt[alt.size() == 1 ? 0 : l], ";"));
  } else {
    line(cat(T, " ", join(lanes, ", "), ";"));
    if (!a.gate.empty()) line(cat("if (", a.gate[0], ") {"));
    const int64_t c = chunk(a, d.scalar, n);
    std::string pre = a.gate.empty() ? "" : "  ";
    for (int64_t j = 0; j < n; j += c) {
      if (c == 1) {
        line(cat(pre, lanes[j], " = ", read(j), ";"));
        continue;
      }
      std::string vt = vec_type(d.scalar, c);
      std::string parts = cat(pre, "{ const ", vt, " t = *(const ", vt, "*)(", a.base, " + ", at(a, j), ");");
      for (int64_t l = 0; l < c; ++l) parts += cat(" ", lanes[j + l], " = ", cuda_c::from_memory(d.scalar, cat("t.v[", l, "]")), ";");
      line(parts + " }");
    }
    if (!a.gate.empty()) {
      line("} else {");
      for (int64_t l = 0; l < n; ++l) line(cat("  ", lanes[l], " = ", alt[alt.size() == 1 ? 0 : l], ";"));
      line("}");
    }
  }
  done_[u] = {Emitted::Kind::Value, lanes, {}, {}, false, {}, 1, {}, current_scope()};
  return absl::OkStatus();
}

absl::Status Renderer::emit_store(const UOp* u) {
  // Sources past the value are ranges the STORE closes at kernel level; at linear level
  // END closes them, so they only order here.
  auto e = get(u, u->src(0));
  if (!e.ok()) return e.status();
  const Emitted a = **e;
  const DType d = u->src(1)->dtype();
  if (a.kind != Emitted::Kind::Address) return bad(u, "STORE needs an INDEX as its first source [linear.store]");
  if (d.ptr || d.scalar != a.mem.scalar) return bad(u, cat("STORE of ", d.str(), " into a buffer of ", a.mem.str(), " [linear.store]"));
  auto v = value(u, u->src(1));
  if (!v.ok()) return v.status();
  const int64_t n = d.count;
  if (a.gate.size() > 1 && a.gate.size() != static_cast<size_t>(n))
    return bad(u, "a per-lane gate needs one lane per stored element [linear.store]");
  auto write = [&](int64_t l) { return cat(a.base, "[", at(a, l), "] = ", cuda_c::to_memory(d.scalar, (*v)[l]), ";"); };
  if (a.gate.size() > 1) {
    for (int64_t l = 0; l < n; ++l) line(cat("if (", a.gate[l], ") ", write(l)));
  } else {
    std::string pre;
    if (a.gate.size() == 1) {
      line(cat("if (", a.gate[0], ") {"));
      pre = "  ";
    }
    const int64_t c = chunk(a, d.scalar, n);
    for (int64_t j = 0; j < n; j += c) {
      if (c == 1) {
        line(pre + write(j));
        continue;
      }
      std::string vt = vec_type(d.scalar, c);
      std::string parts = cat(pre, "{ ", vt, " t;");
      for (int64_t l = 0; l < c; ++l) parts += cat(" t.v[", l, "] = ", cuda_c::to_memory(d.scalar, (*v)[j + l]), ";");
      line(cat(parts, " *(", vt, "*)(", a.base, " + ", at(a, j), ") = t; }"));
    }
    if (a.gate.size() == 1) line("}");
  }
  done_[u] = {};
  return absl::OkStatus();
}

absl::Status Renderer::emit_special(const UOp* u) {
  const std::string& n = u->arg_as<StrArg>().value;
  static const char* kNames[] = {"blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z"};
  if (std::find(std::begin(kNames), std::end(kNames), n) == std::end(kNames))
    return bad(u, cat("SPECIAL '", n, "' is not blockIdx.{x,y,z} or threadIdx.{x,y,z} [cuda.special]"));
  if (u->dtype() != dtypes::index) return bad(u, "SPECIAL must be an index [cuda.special]");
  auto [it, fresh] = specials_.try_emplace(n, u);
  if (!fresh) {  // the same dim under another node: read it once more
    alias(u, done_.at(it->second).lanes, 0);
    return absl::OkStatus();
  }
  if (n.starts_with("threadIdx")) {
    const ConstValue* c = u->src(0)->const_value();
    if (!c || c->to_int() < 1 || c->to_int() > 1024) return bad(u, "a threadIdx extent must be a constant in 1 .. 1024 [cuda.block]");
    threads_ *= c->to_int();
  }
  std::string v = name(u);
  decls_ += cat("  const long long ", v, " = (long long)", n, ";\n");
  alias(u, {v}, 0);
  return absl::OkStatus();
}

absl::Status Renderer::emit_wmma(const UOp* u) {
  const auto& w = u->arg_as<WmmaArg>();
  DType a = u->src(0)->dtype(), b = u->src(1)->dtype(), c = u->src(2)->dtype();
  bool f16 = w.dtype_in == Scalar::Float16;
  if (w.m != 16 || w.n != 8 || w.k != 16 || w.threads != 32 || (!f16 && w.dtype_in != Scalar::BFloat16) ||
      w.dtype_out != Scalar::Float32 || a != DType(w.dtype_in, 8) || b != DType(w.dtype_in, 4) ||
      c != DType(Scalar::Float32, 4) || u->dtype() != c)
    return bad(u, "WMMA must be m16n8k16 (a: 8 x f16 / bf16, b: 4 x the same, c and d: 4 x f32) [cuda.wmma]");
  std::vector<std::string> args;
  for (int i = 0; i < 4; ++i) args.push_back(cat(name(u), "_", i));
  line(cat("float ", join(args, ", "), ";"));
  std::vector<std::string> all = args;
  for (int s = 0; s < 3; ++s) {
    auto v = value(u, u->src(s));
    if (!v.ok()) return v.status();
    all.insert(all.end(), v->begin(), v->end());
  }
  line(cat(f16 ? "uop_mma_m16n8k16_f16(" : "uop_mma_m16n8k16_bf16(", join(all, ", "), ");"));
  done_[u] = {Emitted::Kind::Value, args, {}, {}, false, {}, 1, {}, current_scope()};
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CudaSource> render_cuda(const UOp* linear, std::string_view entry, bool with_prelude) {
  if (!linear || !linear->is(Op::LINEAR)) return absl::InvalidArgumentError("render_cuda needs a LINEAR");
  auto abi = abi_of(linear);
  if (!abi.ok()) return abi.status();
  if (abi->has_thread_range) return absl::InvalidArgumentError("a CUDA kernel has no Thread range (it is a CPU axis) [cuda.thread]");
  Renderer r(linear, *abi);
  if (auto st = r.render(linear); !st.ok()) return st;
  if (!abi->gpu) abi->gpu.emplace();  // one block of one thread: still a GPU launch
  CudaSource out;
  out.entry = std::string(entry);
  out.source = cat(with_prelude ? cuda_prelude() : "", with_prelude ? "\n" : "", r.kernel(entry));
  out.abi = *std::move(abi);
  out.threads_per_block = r.threads();
  return out;
}

}  // namespace uop
