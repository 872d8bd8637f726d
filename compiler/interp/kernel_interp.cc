// The kernel-level interpreter (interp.h; compiler/PIPELINE.md "Kernel-level semantics").
//
// A small machine with an explicit stack of frames, one per node being evaluated: value
// nodes compute once their sources are ready; STORE, END and REDUCE run their ranges as an
// odometer (first range outermost, each loop's end evaluated as the loop starts); SINK runs
// its sources in order. The environment is the current value of every active RANGE.
//
// Memoization: a value is reused while none of the ranges it depends on has moved since it
// was computed and, if it loads from memory, no STORE has happened since. Each range move
// and each store takes a tick of one clock, so "since" is a comparison of ticks.
#include <algorithm>

#include "compiler/interp/interp.h"
#include "compiler/interp/node_eval.h"

namespace uop {
namespace {

using namespace interp_internal;
using Vars = absl::flat_hash_map<std::string, int64_t>;

// Device: a DEVICE source of a PARAM or CONST, never evaluated.
enum class Kind : uint8_t { Const, Var, Range, Param, Device, Alu, Index, Load, Reduce, Store, End, Sink };

bool is_value(Kind k) {
  return k == Kind::Const || k == Kind::Var || k == Kind::Range || k == Kind::Alu || k == Kind::Load ||
         k == Kind::Reduce;
}

struct Node {
  const UOp* u = nullptr;
  Kind kind = Kind::Const;
  std::vector<int> src;     // slots of the sources
  std::vector<int> closes;  // STORE / END / REDUCE: slots of the ranges it loops over
  std::vector<int> free;    // slots of the RANGEs the value depends on (sorted)
  bool loads = false;       // depends on a LOAD
  // INDEX / LOAD / STORE: the buffer, its bound, and the INDEX's sources.
  HostTensor* buf = nullptr;
  int64_t limit = 0;
  int64_t slot = 0;
  int idx = -1, gate = -1, alt = -1;
  // Memo: the value (INDEX: the linear index and gate) and the tick it was computed at.
  ConstValue value;
  bool gate_value = true;
  uint64_t at = 0;
};

struct RangeState {
  bool active = false;
  int64_t value = 0;
  uint64_t moved_at = 0;
};

enum class Stage : uint8_t { Start, Enter, Body, Gate, Fold, Advance };

struct Frame {
  int n;
  Stage stage = Stage::Start;
  size_t level = 0;           // loops: the range to enter next
  int k = 0;                  // loops: the range to advance next (-1: done)
  std::vector<int64_t> ends;  // loops: each range's trip count
  ConstValue acc;             // REDUCE
  size_t next = 0;            // SINK: the next source
};

class KernelInterp {
 public:
  KernelInterp(const UOp* sink, std::span<HostTensor* const> params, const Vars& vars, const InterpOptions& o)
      : sink_(sink), params_(params), vars_(vars), opts_(o), namer_(sink) {}

  absl::Status run() {
    if (absl::Status st = prepare(); !st.ok()) return st;
    push(static_cast<int>(nodes_.size()) - 1);
    while (!stack_.empty())
      if (absl::Status st = step(); !st.ok()) return st;
    return absl::OkStatus();
  }

 private:
  absl::Status error(int n, std::string_view what) { return namer_.error(nodes_[n].u, what); }
  absl::Status prepare();
  absl::Status prepare_node(int n);
  absl::Status step();
  absl::Status step_loop(Frame& f, Node& x);
  absl::Status compute(int n);

  void push(int n) { stack_.push_back(Frame{n}); }
  bool valid(const Node& x) const {
    if (x.at == 0 || (x.loads && stored_at_ > x.at)) return false;
    for (int r : x.free)
      if (!ranges_[r].active || ranges_[r].moved_at > x.at) return false;
    return true;
  }
  // Pushes a frame for n unless its value is still good. Effects always run; RANGE and
  // PARAM are read where they are used. True when a frame was pushed.
  bool need(int n) {
    const Node& x = nodes_[n];
    if (x.kind == Kind::Range || x.kind == Kind::Param || x.kind == Kind::Device) return false;
    if (is_value(x.kind) || x.kind == Kind::Index)
      if (valid(x)) return false;
    push(n);
    return true;
  }
  absl::StatusOr<ConstValue> value_of(int n) {
    if (nodes_[n].kind != Kind::Range) return nodes_[n].value;
    if (!ranges_[n].active) return error(n, "is used outside the STORE / END / REDUCE that loops over it");
    return ConstValue::Int(ranges_[n].value);
  }
  // Restarts the odometer at the innermost range after one body run.
  void after_body(Frame& f) {
    f.stage = Stage::Advance;
    f.k = static_cast<int>(nodes_[f.n].closes.size()) - 1;
  }

  const UOp* sink_;
  std::span<HostTensor* const> params_;
  const Vars& vars_;
  InterpOptions opts_;
  Namer namer_;
  std::vector<Node> nodes_;
  std::vector<RangeState> ranges_;  // by slot; used for RANGE nodes
  std::vector<Frame> stack_;
  uint64_t clock_ = 0, stored_at_ = 0;
  int64_t steps_ = 0;
};

absl::Status KernelInterp::prepare() {
  if (!sink_->is(Op::SINK)) return namer_.error(sink_, "a kernel is a SINK of STOREs");
  std::vector<const UOp*> order = toposort(sink_);
  absl::flat_hash_map<const UOp*, int> slot;
  nodes_.resize(order.size());
  ranges_.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    slot.emplace(order[i], static_cast<int>(i));
    Node& x = nodes_[i];
    x.u = order[i];
    for (const UOp* s : x.u->src()) x.src.push_back(slot.at(s));  // sources come first
    if (absl::Status st = prepare_node(static_cast<int>(i)); !st.ok()) return st;
  }
  if (!nodes_.back().free.empty())
    return error(nodes_.back().free[0], "is used outside any STORE / END / REDUCE that loops over it");
  return absl::OkStatus();
}

absl::Status KernelInterp::prepare_node(int n) {
  Node& x = nodes_[n];
  const UOp* u = x.u;
  const OpInfo& info = op_info(u->op());
  const int ns = static_cast<int>(u->num_src());
  if (ns < info.min_src || (info.max_src >= 0 && ns > info.max_src)) return error(n, cat("has ", ns, " sources"));
  if (arg_kind(u->arg()) != info.arg) return error(n, "has an arg of the wrong kind");
  auto kind = [&](int i) { return nodes_[x.src[i]].kind; };
  auto need_value = [&](int i, const char* what) -> absl::Status {
    if (is_value(kind(i)) && is_scalar_value(nodes_[x.src[i]].u->dtype())) return absl::OkStatus();
    return error(n, cat("its ", what, " (source ", i, ", ", op_name(nodes_[x.src[i]].u->op()), ") is not a scalar value"));
  };
  const Scalar dt = u->dtype().scalar;
  absl::Status st;

  switch (u->op()) {
    case Op::CONST:
      x.kind = Kind::Const;
      if (!is_scalar_value(u->dtype())) return error(n, cat("a constant of dtype ", u->dtype().str()));
      x.value = const_of(u);
      x.at = ++clock_;
      break;
    case Op::DEFINE_VAR: {
      x.kind = Kind::Var;
      const auto& a = u->arg_as<DefineVarArg>();
      auto it = vars_.find(a.name);
      if (it == vars_.end()) return error(n, cat("no value is given for the variable '", a.name, "'"));
      if (it->second < a.min || it->second > a.max)
        return error(n, cat("the value ", it->second, " of '", a.name, "' is outside [", a.min, ", ", a.max, "]"));
      if (!is_scalar_value(u->dtype()) || !scalar_is_int(dt)) return error(n, cat("a variable of dtype ", u->dtype().str()));
      x.value = cast_value(ConstValue::Int(it->second), dt);
      x.at = ++clock_;
      break;
    }
    case Op::RANGE:
      x.kind = Kind::Range;
      if (!is_scalar_value(u->dtype()) || !scalar_is_int(dt)) return error(n, cat("a range of dtype ", u->dtype().str()));
      if (st = need_value(0, "end"); !st.ok()) return st;
      x.free.push_back(n);
      break;
    case Op::DEVICE:
      x.kind = Kind::Device;
      break;
    case Op::PARAM: {
      x.kind = Kind::Param;
      const auto& a = u->arg_as<ParamArg>();
      if (!u->dtype().ptr) return error(n, cat("a PARAM has a pointer dtype, not ", u->dtype().str()));
      if (a.slot < 0 || a.slot >= static_cast<int64_t>(params_.size()) || !params_[a.slot])
        return error(n, cat("no buffer is bound to slot ", a.slot, " (", params_.size(), " given)"));
      x.buf = params_[a.slot];
      x.slot = a.slot;
      x.limit = a.size;
      if (x.buf->dtype != dt || x.buf->numel() < a.size || x.buf->nbytes() != x.buf->numel() * x.buf->itemsize())
        return error(n, cat("slot ", a.slot, " needs ", a.size, " x ", scalar_name(dt), ", the buffer is ", x.buf->str(0)));
      break;
    }
    case Op::INDEX: {
      x.kind = Kind::Index;
      if (!nodes_[x.src[0]].u->is(Op::PARAM)) return error(n, "indexes a PARAM only (bind buffers by slot)");
      const Node& p = nodes_[x.src[0]];
      int last = ns - 1;
      if (last >= 2 && nodes_[x.src[last]].u->dtype() == dtypes::bool_) x.gate = x.src[last--];
      if (last != 1) return error(n, cat("takes one linear index (and a gate), not ", last, " indices"));
      if (st = need_value(1, "index"); !st.ok()) return st;
      if (!scalar_is_int(nodes_[x.src[1]].u->dtype().scalar)) return error(n, "the index is not an integer");
      if (x.gate >= 0 && !is_value(nodes_[x.gate].kind)) return error(n, "the gate is not a value");
      x.idx = x.src[1];
      x.buf = p.buf;
      x.limit = p.limit;
      x.slot = p.slot;
      if (dt != x.buf->dtype) return error(n, cat("dtype ", scalar_name(dt), " is not the buffer's ", scalar_name(x.buf->dtype)));
      break;
    }
    case Op::LOAD:
      x.kind = Kind::Load;
      x.loads = true;
      if (kind(1) != Kind::Index || nodes_[x.src[1]].src[0] != x.src[0])
        return error(n, "reads through an INDEX of its own buffer");
      x.idx = x.src[1];
      x.buf = nodes_[x.idx].buf;
      if (dt != x.buf->dtype || !is_scalar_value(u->dtype()))
        return error(n, cat("dtype ", u->dtype().str(), " is not the buffer's ", scalar_name(x.buf->dtype)));
      if (ns == 3) {
        if (st = need_value(2, "alt"); !st.ok()) return st;
        if (nodes_[x.src[2]].u->dtype() != u->dtype()) return error(n, "alt has another dtype");
        x.alt = x.src[2];
      }
      break;
    case Op::STORE:
      x.kind = Kind::Store;
      if (kind(0) != Kind::Index) return error(n, "writes through an INDEX");
      if (st = need_value(1, "value"); !st.ok()) return st;
      x.idx = x.src[0];
      x.buf = nodes_[x.idx].buf;
      if (nodes_[x.src[1]].u->dtype().scalar != x.buf->dtype)
        return error(n, cat("stores ", nodes_[x.src[1]].u->dtype().str(), " into a ", scalar_name(x.buf->dtype), " buffer"));
      break;
    case Op::END:
      x.kind = Kind::End;
      if (kind(0) == Kind::Param || kind(0) == Kind::Device || kind(0) == Kind::Index || kind(0) == Kind::Sink)
        return error(n, "ends a computation that is not a value or an effect");
      break;
    case Op::REDUCE: {
      x.kind = Kind::Reduce;
      if (st = need_value(0, "value"); !st.ok()) return st;
      if (nodes_[x.src[0]].u->dtype() != u->dtype()) return error(n, "reduces a value of another dtype");
      ReduceOp r = u->arg_as<ReduceOpArg>().op;
      const ConstValue probe[2] = {reduce_identity(r, dt), reduce_identity(r, dt)};
      if (!eval_alu(reduce_combine_op(r), dt, probe)) return error(n, cat(reduce_op_name(r), " is not defined on ", scalar_name(dt)));
      break;
    }
    case Op::SINK:
      x.kind = Kind::Sink;
      if (n != static_cast<int>(nodes_.size()) - 1) return error(n, "a SINK inside a kernel");
      for (int i = 0; i < ns; ++i)
        if (kind(i) == Kind::Param || kind(i) == Kind::Device || kind(i) == Kind::Index)
          return error(n, "runs a buffer, a device or an INDEX");
      break;
    default:
      if (!is_scalar_op(u->op())) return error(n, "is not supported by the kernel interpreter");
      x.kind = Kind::Alu;
      if (std::string why = check_scalar_op(u); !why.empty()) return error(n, why);
      for (int i = 0; i < ns; ++i)
        if (st = need_value(i, "operand"); !st.ok()) return st;
  }

  // Ranges the op loops over (ops.def RANGE_START), then what the value depends on.
  if (info.range_start >= 0 && x.kind != Kind::Sink)
    for (int i = info.range_start; i < ns; ++i) {
      if (kind(i) != Kind::Range) return error(n, cat("source ", i, " should be a RANGE it closes"));
      x.closes.push_back(x.src[i]);
    }
  for (int s : x.src) {
    x.loads = x.loads || nodes_[s].loads;
    for (int r : nodes_[s].free)
      if (std::find(x.closes.begin(), x.closes.end(), r) == x.closes.end()) x.free.push_back(r);
  }
  std::sort(x.free.begin(), x.free.end());
  x.free.erase(std::unique(x.free.begin(), x.free.end()), x.free.end());
  return absl::OkStatus();
}

absl::Status KernelInterp::compute(int n) {
  Node& x = nodes_[n];
  switch (x.kind) {
    case Kind::Alu: {
      ConstValue args[3];
      for (size_t i = 0; i < x.src.size(); ++i) {
        auto v = value_of(x.src[i]);
        if (!v.ok()) return v.status();
        args[i] = *v;
      }
      auto r = apply_scalar_op(x.u, std::span<const ConstValue>(args, x.src.size()));
      if (!r) return error(n, cat("not defined on ", x.u->src(0)->dtype().str()));
      x.value = *r;
      break;
    }
    case Kind::Index: {
      auto i = value_of(x.idx);
      if (!i.ok()) return i.status();
      auto g = x.gate >= 0 ? value_of(x.gate) : absl::StatusOr<ConstValue>(ConstValue::Bool(true));
      if (!g.ok()) return g.status();
      x.value = ConstValue::Int(i->to_int());
      x.gate_value = g->as_bool();
      // An oracle must not touch memory outside a buffer: a used index out of bounds is
      // the kernel's bug, reported, never performed.
      if (x.gate_value && (x.value.as_int() < 0 || x.value.as_int() >= x.limit))
        return error(n, cat("index ", x.value.as_int(), " is outside the buffer at slot ", x.slot, " of ",
                            x.limit, " elements"));
      break;
    }
    case Kind::Load: {
      const Node& ix = nodes_[x.idx];
      if (ix.gate_value) {
        x.value = x.buf->get(ix.value.as_int());
      } else if (x.alt >= 0) {
        auto v = value_of(x.alt);
        if (!v.ok()) return v.status();
        x.value = *v;
      } else {
        x.value = cast_value(ConstValue::Int(0), x.u->dtype().scalar);
      }
      break;
    }
    default: return absl::InternalError("compute() on a node without a value rule");
  }
  x.at = ++clock_;
  return absl::OkStatus();
}

absl::Status KernelInterp::step() {
  Frame& f = stack_.back();
  Node& x = nodes_[f.n];
  switch (x.kind) {
    case Kind::Sink:
      if (f.next < x.src.size()) need(x.src[f.next++]);
      else stack_.pop_back();
      return absl::OkStatus();
    case Kind::Reduce: case Kind::Store: case Kind::End:
      return step_loop(f, x);
    default: break;
  }
  // A value: sources first, then the value itself.
  if (f.stage == Stage::Start) {
    if (valid(x)) {  // pushed twice through a shared source: already done
      stack_.pop_back();
      return absl::OkStatus();
    }
    f.stage = Stage::Body;
    bool pushed = false;
    for (int s : x.src)
      if (s != x.src[0] || x.kind == Kind::Alu) pushed = need(s) || pushed;  // src 0 of INDEX / LOAD is the buffer
    if (pushed) return absl::OkStatus();
  }
  int n = f.n;
  stack_.pop_back();
  return compute(n);
}

absl::Status KernelInterp::step_loop(Frame& f, Node& x) {
  switch (f.stage) {
    case Stage::Start:
      if (x.kind == Kind::Reduce && valid(x)) {  // pushed twice through a shared source
        stack_.pop_back();
        return absl::OkStatus();
      }
      f.ends.assign(x.closes.size(), 0);
      if (x.kind == Kind::Reduce) f.acc = reduce_identity(x.u->arg_as<ReduceOpArg>().op, x.u->dtype().scalar);
      f.stage = Stage::Enter;
      return absl::OkStatus();
    case Stage::Enter: {
      if (f.level == x.closes.size()) {
        f.stage = Stage::Body;
        return absl::OkStatus();
      }
      const int r = x.closes[f.level], end = nodes_[r].src[0];
      if (need(end)) return absl::OkStatus();  // back here once the end is known
      auto e = value_of(end);
      if (!e.ok()) return e.status();
      f.ends[f.level] = e->to_int();
      if (f.ends[f.level] <= 0) {  // an empty loop: move the one outside it on
        f.stage = Stage::Advance;
        f.k = static_cast<int>(f.level) - 1;
        return absl::OkStatus();
      }
      if (ranges_[r].active) return error(r, "is looped over again inside its own loop");
      ranges_[r] = RangeState{true, 0, ++clock_};
      ++f.level;
      return absl::OkStatus();
    }
    case Stage::Body:
      if (++steps_ > opts_.max_steps)
        return namer_.error(x.u, cat("the kernel ran more than ", opts_.max_steps, " loop iterations"),
                            absl::StatusCode::kResourceExhausted);
      f.stage = x.kind == Kind::Store ? Stage::Gate : Stage::Fold;
      need(x.kind == Kind::Store ? x.idx : x.src[0]);
      return absl::OkStatus();
    case Stage::Gate:  // STORE: the address is known; a false gate skips the value
      if (!nodes_[x.idx].gate_value) {
        after_body(f);
        return absl::OkStatus();
      }
      f.stage = Stage::Fold;
      need(x.src[1]);
      return absl::OkStatus();
    case Stage::Fold:
      if (x.kind == Kind::Reduce) {
        auto v = value_of(x.src[0]);
        if (!v.ok()) return v.status();
        const ConstValue args[2] = {f.acc, *v};
        f.acc = *eval_alu(reduce_combine_op(x.u->arg_as<ReduceOpArg>().op), x.u->dtype().scalar, args);
      } else if (x.kind == Kind::Store) {
        auto v = value_of(x.src[1]);
        if (!v.ok()) return v.status();
        x.buf->set(nodes_[x.idx].value.as_int(), *v);
        stored_at_ = ++clock_;
      }
      after_body(f);
      return absl::OkStatus();
    case Stage::Advance:
      while (f.k >= 0) {
        RangeState& r = ranges_[x.closes[f.k]];
        r.moved_at = ++clock_;
        if (++r.value < f.ends[f.k]) {
          f.level = f.k + 1;
          f.stage = Stage::Enter;
          return absl::OkStatus();
        }
        r.active = false;
        --f.k;
      }
      if (x.kind == Kind::Reduce) {
        x.value = f.acc;
        x.at = ++clock_;
      }
      stack_.pop_back();
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status interpret_kernel(const UOp* kernel_sink, std::span<HostTensor* const> params, const Vars& vars,
                              const InterpOptions& options) {
  return KernelInterp(kernel_sink, params, vars, options).run();
}

}  // namespace uop
