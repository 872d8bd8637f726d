// The stage verifier. One pass over the toposort (sources first) checks each node against
// the rules of every stage (structure, dtypes, memory ops), then its stage's rules: shapes
// at tensor level, range scoping at kernel and linear level. The root's structure comes
// last. Range scoping keeps, per node, the sorted set of RANGEs it depends on that are
// not closed below it ("live"), and the set of RANGEs closed by a REDUCE below it; both
// are shared between nodes when unchanged, and the second is dropped once every user of
// a node has been visited, so a long chain costs little.
#include "compiler/ir/verifier.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/shape.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

#define UOP_RETURN_IF_ERROR(expr) \
  do {                            \
    absl::Status _st = (expr);    \
    if (!_st.ok()) return _st;    \
  } while (0)

constexpr uint32_t kMaxVectorWidth = 4096;

// Sorted ordinals (toposort positions) of RANGE nodes; null is the empty set.
using RangeSet = std::shared_ptr<const std::vector<uint32_t>>;

RangeSet merge(const RangeSet& a, const RangeSet& b) {
  if (!a || a == b) return b;
  if (!b) return a;
  auto out = std::make_shared<std::vector<uint32_t>>();
  std::set_union(a->begin(), a->end(), b->begin(), b->end(), std::back_inserter(*out));
  if (out->size() == a->size()) return a;
  if (out->size() == b->size()) return b;
  return out;
}

RangeSet remove(const RangeSet& a, const std::vector<uint32_t>& sorted) {
  if (!a || sorted.empty()) return a;
  auto out = std::make_shared<std::vector<uint32_t>>();
  std::set_difference(a->begin(), a->end(), sorted.begin(), sorted.end(), std::back_inserter(*out));
  if (out->size() == a->size()) return a;
  if (out->empty()) return nullptr;
  return out;
}

std::optional<uint32_t> first_common(const RangeSet& a, const RangeSet& b) {
  if (!a || !b) return std::nullopt;
  std::vector<uint32_t> c;
  std::set_intersection(a->begin(), a->end(), b->begin(), b->end(), std::back_inserter(c));
  if (c.empty()) return std::nullopt;
  return c.front();
}

bool is_buffer(const UOp* u) { return u->is(Op::BUFFER) || u->is(Op::BUFFER_VIEW); }

// Whether source `i` of `u`, a BUFFER, is used as memory rather than as a tensor value.
bool buffer_use_is_memory(const UOp* u, size_t i) {
  switch (u->op()) {
    case Op::INDEX: case Op::LOAD: case Op::BUFFER_VIEW: return i == 0;
    case Op::AFTER: case Op::LINEAR: return true;
    case Op::CALL: case Op::FUNCTION: return i >= 1;
    default: return false;
  }
}

bool is_kernel_op(Op op) {
  switch (op) {
    case Op::RANGE: case Op::END: case Op::REDUCE: case Op::BUFFERIZE: case Op::INDEX:
    case Op::POINTER_INDEX: case Op::LOAD: case Op::STORE: case Op::PARAM: case Op::SPECIAL:
    case Op::DEFINE_REG: case Op::DEFINE_LOCAL:
      return true;
    default:
      return false;
  }
}

// Ops that exist only after rangeify (or later): refused in a tensor-level graph.
bool not_tensor_level(Op op) {
  if (is_kernel_op(op)) return true;
  switch (op) {
    case Op::LINEAR: case Op::PROGRAM: case Op::SOURCE: case Op::PROGRAM_BINARY: case Op::WMMA:
    case Op::UNROLL: case Op::CONTRACT: case Op::IF: case Op::ENDIF: case Op::BARRIER: case Op::GEP:
    case Op::CAT: case Op::PTRCAT:
      return true;
    default:
      return false;
  }
}

// Tensor-level ops that rangeify removes: refused in kernel and linear graphs.
bool tensor_only(Op op) {
  return is_movement(op) || op == Op::REDUCE_AXIS || op == Op::CONTIGUOUS || op == Op::CONTIGUOUS_BACKWARD ||
         op == Op::DETACH || op == Op::COPY;
}

enum class DTypeRule { Void, Value, Any };
DTypeRule dtype_rule(Op op) {
  if (is_alu(op) || is_movement(op)) return DTypeRule::Value;
  switch (op) {
    case Op::SINK: case Op::STORE: case Op::END: case Op::LINEAR: case Op::IF: case Op::ENDIF:
    case Op::FUNCTION: case Op::TUPLE: case Op::PROGRAM: case Op::SOURCE: case Op::PROGRAM_BINARY:
    case Op::UNIQUE: case Op::LUNIQUE: case Op::DEVICE: case Op::GROUP:
      return DTypeRule::Void;
    case Op::CAST: case Op::BITCAST: case Op::CONST: case Op::VCONST: case Op::DEFINE_VAR: case Op::BIND:
    case Op::RANGE: case Op::SPECIAL: case Op::INDEX: case Op::LOAD: case Op::BUFFER: case Op::BUFFER_VIEW:
    case Op::VECTORIZE: case Op::GEP: case Op::CAT: case Op::PTRCAT: case Op::REDUCE_AXIS: case Op::REDUCE:
    case Op::ALLREDUCE: case Op::PARAM: case Op::DEFINE_LOCAL: case Op::DEFINE_REG: case Op::BUFFERIZE:
    case Op::POINTER_INDEX: case Op::WMMA: case Op::COPY: case Op::CONTIGUOUS: case Op::DETACH:
    case Op::CONTIGUOUS_BACKWARD:
      return DTypeRule::Value;
    default:
      return DTypeRule::Any;
  }
}

bool may_be_pointer(Op op) {
  switch (op) {
    case Op::PARAM: case Op::DEFINE_LOCAL: case Op::DEFINE_REG: case Op::POINTER_INDEX: case Op::PTRCAT:
    case Op::AFTER: case Op::GEP: case Op::CUSTOM: case Op::CUSTOMI:
      return true;
    default:
      return false;
  }
}

// Whether source `i` of an `op` may be void-typed (an effect, a DEVICE, a UNIQUE...).
bool void_source_ok(Op op, size_t i) {
  switch (op) {
    case Op::SINK: case Op::LINEAR: case Op::GROUP: case Op::BARRIER: case Op::PROGRAM: case Op::TUPLE:
    case Op::CALL: case Op::FUNCTION: case Op::CUSTOM: case Op::CUSTOMI: case Op::CUSTOM_FUNCTION:
    case Op::BUFFER:
      return true;
    case Op::AFTER: case Op::IF: return i >= 1;
    case Op::END: case Op::ENDIF: case Op::GET_TUPLE: case Op::CONST: case Op::PARAM: return i == 0;
    case Op::COPY: case Op::ALLREDUCE: return i == 1;
    default: return false;
  }
}


ConstValue zero_of(Scalar s) {
  switch (ConstValue::kind_of(s)) {
    case ConstValue::Kind::Bool: return ConstValue::Bool(false);
    case ConstValue::Kind::Int: return ConstValue::Int(0);
    case ConstValue::Kind::UInt: return ConstValue::UInt(0);
    case ConstValue::Kind::Float: return ConstValue::Float(0.0);
  }
  return ConstValue::Int(0);
}

// Whether eval.h defines `op` on operands of scalar type `t` (the verifier's ALU domain is
// exactly the evaluator's, so constant folding never meets an op it cannot evaluate).
bool alu_defined(Op op, Scalar t) {
  std::vector<ConstValue> args(op_info(op).min_src, zero_of(t));
  if (op == Op::WHERE) args[0] = ConstValue::Bool(false);
  return eval_alu(op, t, args).has_value();
}

const UOp* strip_after(const UOp* u) {
  while (u->is(Op::AFTER) && u->num_src() > 0) u = u->src(0);
  return u;
}

class Verifier {
 public:
  Verifier(Graph& g, const UOp* root, const VerifyOptions& opts)
      : g_(g), root_(root), opts_(opts), order_(toposort(root)),
        shapes_(g, ShapeLimits{opts.max_rank, opts.max_elements}, opts.index ? opts.index : &pos_) {
    pos_.reserve(order_.size());
    for (size_t i = 0; i < order_.size(); ++i) pos_.emplace(order_[i], static_cast<uint32_t>(i));
    index_ = opts.index ? opts.index : &pos_;
  }

  absl::Status run();

 private:
  absl::Status fail(const UOp* u, std::string_view tag, const std::string& detail) {
    return fail_raw(u, cat(detail, " [", tag, "]"));
  }
  absl::Status fail_raw(const UOp* u, const std::string& detail) {
    return absl::InvalidArgumentError(cat("node ", num(u), " (", op_name(u->op()), "): ", detail,
                                          "; path: ", path_to(u)));
  }
  std::string num(const UOp* u) const {
    auto it = index_->find(u);
    return it == index_->end() ? "?" : std::to_string(it->second);
  }
  std::string ref(const UOp* u) const { return cat("[", num(u), "] ", op_name(u->op())); }
  std::string range_ref(uint32_t ordinal) const {
    const UOp* r = order_[ordinal];
    return cat(ref(r), "(", arg_str(r->arg()), ")");
  }
  std::string path_to(const UOp* target) const;

  absl::Status check_structure(const UOp* u);
  absl::Status check_dtype(const UOp* u);
  absl::Status check_op(const UOp* u);
  absl::Status check_alu(const UOp* u);
  absl::Status check_memory(const UOp* u);
  absl::Status check_stage(const UOp* u);
  absl::Status check_ranges(const UOp* u, uint32_t pos);
  absl::Status check_root();
  absl::Status check_linear();

  Graph& g_;
  const UOp* root_;
  const VerifyOptions& opts_;
  Stage stage_ = Stage::Tensor;
  std::vector<const UOp*> order_;
  NodeIndex pos_;
  const NodeIndex* index_;
  ShapeInference shapes_;
  absl::flat_hash_map<const UOp*, const UOp*> bind_value_;  // DEFINE_VAR -> bound CONST
  std::vector<RangeSet> live_, reduced_;
  std::vector<uint32_t> users_left_;
};

std::string Verifier::path_to(const UOp* target) const {
  // Breadth-first from the root: the shortest path, recorded as (parent, source index).
  absl::flat_hash_map<const UOp*, std::pair<const UOp*, size_t>> parent;
  parent.emplace(root_, std::pair<const UOp*, size_t>{nullptr, 0});
  std::vector<const UOp*> frontier{root_};
  for (size_t head = 0; head < frontier.size() && !parent.contains(target); ++head) {
    const UOp* u = frontier[head];
    for (size_t i = 0; i < u->num_src(); ++i)
      if (parent.emplace(u->src(i), std::pair<const UOp*, size_t>{u, i}).second) frontier.push_back(u->src(i));
  }
  std::vector<std::string> steps;
  const UOp* next = nullptr;
  size_t via = 0;
  for (const UOp* u = target; u; ) {
    auto [p, i] = parent.at(u);
    steps.push_back(next ? cat(ref(u), " (src ", via, ")") : ref(u));
    next = u;
    via = i;
    u = p;
  }
  std::reverse(steps.begin(), steps.end());
  // A path through a 100k-deep graph is not worth printing whole.
  constexpr size_t kHead = 3, kTail = 8;
  if (steps.size() > kHead + kTail + 1) {
    size_t cut = steps.size() - kHead - kTail;
    steps.erase(steps.begin() + kHead, steps.end() - kTail);
    steps.insert(steps.begin() + kHead, cat("... (", cut, " more)"));
  }
  return join(steps, " -> ");
}

absl::Status Verifier::check_structure(const UOp* u) {
  const OpInfo& info = op_info(u->op());
  const int n = static_cast<int>(u->num_src());
  if (n < info.min_src || (info.max_src >= 0 && n > info.max_src)) {
    std::string want = info.max_src < 0 ? cat("at least ", info.min_src)
                       : info.min_src == info.max_src ? cat(info.min_src)
                                                      : cat(info.min_src, " to ", info.max_src);
    return fail(u, "src.count", cat("has ", n, n == 1 ? " source" : " sources", ", wants ", want));
  }
  if (arg_kind(u->arg()) != info.arg)
    return fail(u, "arg.kind", cat("carries a ", arg_kind_name(arg_kind(u->arg())), " arg, wants ",
                                   arg_kind_name(info.arg)));
  if ((u->is(Op::CUSTOM) || u->is(Op::CUSTOMI) || u->is(Op::CUSTOM_FUNCTION)) && !opts_.allow_custom)
    return fail(u, "custom.refused", "inline code is refused unless the server allows custom ops");
  return absl::OkStatus();
}

absl::Status Verifier::check_dtype(const UOp* u) {
  const DType& dt = u->dtype();
  if (dt.count == 0) {
    const auto* vc = u->arg_if<VConstArg>();
    if (!(u->is(Op::VCONST) && dt.scalar == Scalar::Index && !dt.ptr && vc && vc->values.empty()))
      return fail(u, "dtype.count", "vector width 0 (only the empty index VCONST of a rank-0 shape has it)");
  }
  if (dt.count > kMaxVectorWidth)
    return fail(u, "dtype.count", cat("vector width ", dt.count, " is over ", kMaxVectorWidth));
  if (dt.scalar == Scalar::Void && (dt.ptr || dt.count != 1)) return fail(u, "dtype.void", cat(dt.str(), " is not a type"));
  if (dt.ptr) {
    if (!may_be_pointer(u->op())) return fail(u, "dtype.ptr", cat("a ", op_name(u->op()), " is not a pointer (", dt.str(), ")"));
    if (dt.size < -1) return fail(u, "dtype.ptr", cat("pointer size ", dt.size, " is negative"));
  }
  switch (dtype_rule(u->op())) {
    case DTypeRule::Void:
      if (!dt.is_void()) return fail(u, "dtype.void", cat("has dtype ", dt.str(), ", wants void"));
      break;
    case DTypeRule::Value:
      if (dt.is_void()) return fail(u, "dtype.void", "is a value and cannot be void");
      break;
    case DTypeRule::Any: break;
  }
  for (size_t i = 0; i < u->num_src(); ++i)
    if (u->src(i)->dtype().is_void() && !void_source_ok(u->op(), i))
      return fail(u, "src.void", cat("source ", i, " (", ref(u->src(i)), ") is void"));
  return absl::OkStatus();
}

absl::Status Verifier::check_alu(const UOp* u) {
  const bool where = u->is(Op::WHERE);
  const DType& t = u->src(where ? 1 : 0)->dtype();
  for (size_t i = where ? 1 : 0; i < u->num_src(); ++i) {
    const DType& d = u->src(i)->dtype();
    if (d.ptr || d.is_void()) return fail(u, "alu.dtype", cat("operand ", i, " has dtype ", d.str(), ", not a value"));
    if (d != t) return fail(u, "alu.dtype", cat("operands have different dtypes ", t.str(), " and ", d.str()));
  }
  if (where) {
    const DType& c = u->src(0)->dtype();
    if (c != dtypes::bool_.vec(t.count))
      return fail(u, "alu.where", cat("condition has dtype ", c.str(), ", wants ", dtypes::bool_.vec(t.count).str()));
  }
  if (!alu_defined(u->op(), t.scalar))
    return fail(u, "alu.domain", cat(op_name(u->op()), " is not defined on ", scalar_name(t.scalar)));
  DType want = is_comparison(u->op()) ? dtypes::bool_.vec(t.count) : t;
  if (u->dtype() != want) return fail(u, "alu.result", cat("has dtype ", u->dtype().str(), ", wants ", want.str()));
  return absl::OkStatus();
}

absl::Status Verifier::check_memory(const UOp* u) {
  switch (u->op()) {
    case Op::INDEX: {
      const UOp* buf = strip_after(u->src(0));
      int64_t want_indices = 1;
      DType elem;
      switch (buf->op()) {
        case Op::PARAM: case Op::DEFINE_LOCAL: case Op::DEFINE_REG: elem = buf->dtype().pointee(); break;
        case Op::BUFFER: case Op::BUFFER_VIEW: elem = buf->dtype(); break;
        case Op::BUFFERIZE: elem = buf->dtype(); want_indices = static_cast<int64_t>(buf->num_src()) - 1; break;
        default:
          return fail(u, "index.buffer", cat("indexes a ", op_name(buf->op()),
                                             "; wants PARAM, BUFFER, DEFINE_LOCAL, DEFINE_REG or BUFFERIZE"));
      }
      size_t n = u->num_src();
      const bool gated = n >= 3 && u->src(n - 1)->dtype().scalar == Scalar::Bool;
      size_t nidx = n - 1 - (gated ? 1 : 0);
      for (size_t i = 1; i <= nidx; ++i) {
        const DType& d = u->src(i)->dtype();
        if (d.ptr || d.scalar != Scalar::Index)
          return fail(u, "index.index", cat("index ", i - 1, " has dtype ", d.str(), ", wants index"));
      }
      if (static_cast<int64_t>(nidx) != want_indices)
        return fail(u, "index.arity", cat("has ", nidx, " indices into a ", op_name(buf->op()), ", wants ", want_indices));
      // As wide as the index (a gather); over one scalar index any width: that many
      // consecutive elements from it (a vector access); no index (a scalar BUFFERIZE): one.
      const bool contiguous = nidx == 1 && u->src(1)->dtype().count == 1 && !u->dtype().ptr && u->dtype().count >= 1;
      DType want = DType(elem.scalar, contiguous ? u->dtype().count : nidx > 0 ? u->src(1)->dtype().count : 1);
      if (u->dtype() != want)
        return fail(u, "index.dtype", cat("has dtype ", u->dtype().str(), ", wants the element dtype ", want.str()));
      if (gated) {
        // One gate for the access, or one per element.
        const DType& gd = u->src(n - 1)->dtype();
        if (gd.ptr || (gd.count != 1 && gd.count != want.count))
          return fail(u, "index.gate", cat("the gate has dtype ", gd.str(), ", wants bool or ", dtypes::bool_.vec(want.count).str()));
      }
      return absl::OkStatus();
    }
    case Op::LOAD: {
      const UOp* idx = u->src(1);
      if (!idx->is(Op::INDEX)) return fail(u, "load.index", cat("source 1 is a ", op_name(idx->op()), ", wants INDEX"));
      // AFTER only orders accesses (an accumulator read after its loop): see through it.
      if (strip_after(idx->src(0)) != strip_after(u->src(0)))
        return fail(u, "load.buffer", cat("loads from ", ref(u->src(0)), " through an INDEX of ", ref(idx->src(0))));
      if (u->dtype() != idx->dtype())
        return fail(u, "load.dtype", cat("has dtype ", u->dtype().str(), ", the INDEX has ", idx->dtype().str()));
      if (u->num_src() == 3 && u->src(2)->dtype() != u->dtype())
        return fail(u, "load.alt", cat("alt has dtype ", u->src(2)->dtype().str(), ", wants ", u->dtype().str()));
      return absl::OkStatus();
    }
    case Op::STORE: {
      const UOp* idx = u->src(0);
      if (!idx->is(Op::INDEX)) return fail(u, "store.index", cat("source 0 is a ", op_name(idx->op()), ", wants INDEX"));
      if (u->src(1)->dtype() != idx->dtype())
        return fail(u, "store.value", cat("stores ", u->src(1)->dtype().str(), " into ", idx->dtype().str()));
      return absl::OkStatus();
    }
    case Op::POINTER_INDEX: {
      const DType& p = u->src(0)->dtype();
      const DType& off = u->src(1)->dtype();
      if (!p.ptr || u->dtype() != p)
        return fail(u, "pointer_index.dtype", cat("offsets ", p.str(), " as ", u->dtype().str()));
      if (off.ptr || off.count != 1 || !scalar_is_int(off.scalar))
        return fail(u, "pointer_index.dtype", cat("offset has dtype ", off.str()));
      return absl::OkStatus();
    }
    default: return absl::OkStatus();
  }
}

absl::Status Verifier::check_op(const UOp* u) {
  const DType& dt = u->dtype();
  auto src_is = [&](size_t i, std::initializer_list<Op> ops) {
    return std::any_of(ops.begin(), ops.end(), [&](Op o) { return u->src(i)->is(o); });
  };
  // Sources from the op's range_start are closed RANGEs (CALL/FUNCTION close only the
  // RANGEs among their arguments).
  if (int rs = op_info(u->op()).range_start; rs >= 0 && !u->is(Op::CALL) && !u->is(Op::FUNCTION)) {
    std::string tag(op_name(u->op()));
    for (char& c : tag) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    tag += ".range";
    for (size_t i = rs; i < u->num_src(); ++i)
      if (!u->src(i)->is(Op::RANGE))
        return fail(u, tag, cat("source ", i, " (", ref(u->src(i)), ") is closed as a range but is not a RANGE"));
  }
  if (is_alu(u->op())) return check_alu(u);
  if (is_movement(u->op()) || u->is(Op::CONTIGUOUS) || u->is(Op::CONTIGUOUS_BACKWARD) || u->is(Op::DETACH) ||
      u->is(Op::COPY) || u->is(Op::AFTER) || u->is(Op::BUFFERIZE)) {
    if (dt != u->src(0)->dtype())
      return fail(u, "passthrough.dtype", cat("has dtype ", dt.str(), " but its source has ", u->src(0)->dtype().str()));
  }
  switch (u->op()) {
    case Op::CONST: {
      const ConstValue& v = *u->const_value();
      if (!is_value_of(v, dt.scalar))
        return fail(u, "const.value", cat(v.str(), " is not a value of ", scalar_name(dt.scalar)));
      if (u->num_src() == 1 && !src_is(0, {Op::DEVICE})) return fail(u, "const.device", "source 0 is not a DEVICE");
      break;
    }
    case Op::VCONST: {
      const auto& vals = u->arg_as<VConstArg>().values;
      if (vals.size() != dt.count)
        return fail(u, "vconst.count", cat("holds ", vals.size(), " values for a width of ", dt.count));
      for (const ConstValue& v : vals)
        if (!is_value_of(v, dt.scalar))
          return fail(u, "const.value", cat(v.str(), " is not a value of ", scalar_name(dt.scalar)));
      break;
    }
    case Op::DEFINE_VAR: {
      const auto& a = u->arg_as<DefineVarArg>();
      if (dt.count != 1 || !scalar_is_int(dt.scalar))
        return fail(u, "define_var.dtype", cat("has dtype ", dt.str(), ", wants index or an integer"));
      if (a.min > a.max) return fail(u, "define_var.range", cat("min ", a.min, " > max ", a.max));
      // Bounds outside the dtype would be a value one backend truncates and another not.
      const int bits = scalar_bits(dt.scalar);
      const __int128 lo = scalar_is_unsigned_int(dt.scalar) ? 0 : -(__int128{1} << (bits - 1));
      const __int128 hi = (__int128{1} << (bits - (scalar_is_unsigned_int(dt.scalar) ? 0 : 1))) - 1;
      if (a.min < lo || a.max > hi)
        return fail(u, "define_var.range", cat("[", a.min, ", ", a.max, "] is not inside ", dt.str()));
      break;
    }
    case Op::BIND: {
      const UOp *var = u->src(0), *val = u->src(1);
      if (!var->is(Op::DEFINE_VAR)) return fail(u, "bind.var", cat("binds a ", op_name(var->op()), ", not a DEFINE_VAR"));
      if (!val->is(Op::CONST)) return fail(u, "bind.value", cat("binds to a ", op_name(val->op()), ", not a CONST"));
      if (dt != var->dtype() || val->dtype() != var->dtype())
        return fail(u, "bind.dtype", cat("binds ", var->dtype().str(), " to ", val->dtype().str(), " as ", dt.str()));
      const auto& r = var->arg_as<DefineVarArg>();
      int64_t v = val->const_value()->to_int();
      if (v < r.min || v > r.max)
        return fail(u, "bind.value", cat("value ", v, " is outside ", r.name, "'s range ", r.min, "..", r.max));
      auto [it, fresh] = bind_value_.emplace(var, val);
      if (!fresh && it->second != val)
        return fail(u, "bind.conflict", cat(r.name, " is bound to ", it->second->const_value()->to_int(), " and to ", v));
      break;
    }
    case Op::RANGE: case Op::SPECIAL: {
      std::string tag = u->is(Op::RANGE) ? "range" : "special";
      if (dt != dtypes::index) return fail(u, tag + ".dtype", cat("has dtype ", dt.str(), ", wants index"));
      const UOp* end = u->src(0);
      if (end->dtype() != dtypes::index) return fail(u, tag + ".end", cat("end has dtype ", end->dtype().str()));
      if (auto c = end->const_value(); c && c->to_int() < 0) return fail(u, tag + ".end", cat("end ", c->to_int(), " is negative"));
      for (size_t i = 1; i < u->num_src(); ++i)
        if (!u->src(i)->is(Op::RANGE)) return fail(u, "range.dep", cat("dependency ", ref(u->src(i)), " is not a RANGE"));
      break;
    }
    case Op::BUFFER: {
      if (!src_is(0, {Op::UNIQUE, Op::LUNIQUE}) || !src_is(1, {Op::DEVICE}))
        return fail(u, "buffer.src", "wants sources (UNIQUE or LUNIQUE, DEVICE)");
      int64_t size = u->arg_as<BufferArg>().size;
      if (size < 0 || size > opts_.max_elements)
        return fail(u, "buffer.size", cat("size ", size, " is outside 0..", opts_.max_elements));
      if (dt.count != 1 || dt.ptr) return fail(u, "buffer.dtype", cat("has dtype ", dt.str(), ", wants a scalar"));
      break;
    }
    case Op::BUFFER_VIEW: {
      const UOp* base = u->src(0);
      if (!is_buffer(base)) return fail(u, "buffer_view.src", cat("views a ", op_name(base->op())));
      if (dt != base->dtype()) return fail(u, "buffer_view.dtype", cat("views ", base->dtype().str(), " as ", dt.str()));
      const auto& a = u->arg_as<BufferViewArg>();
      int64_t base_size = base->is(Op::BUFFER) ? base->arg_as<BufferArg>().size : base->arg_as<BufferViewArg>().size;
      int64_t end;
      if (a.size < 0 || a.offset < 0 || __builtin_add_overflow(a.size, a.offset, &end) || end > base_size)
        return fail(u, "buffer_view.range", cat("[", a.offset, ", +", a.size, ") is outside its buffer of ", base_size));
      break;
    }
    case Op::PARAM: {
      const auto& p = u->arg_as<ParamArg>();
      if (!dt.ptr || dt.addrspace != AddrSpace::Global)
        return fail(u, "param.dtype", cat("has dtype ", dt.str(), ", wants a global pointer"));
      if (p.slot < 0 || p.size < 0 || p.size > opts_.max_elements || dt.size != p.size)
        return fail(u, "param.size", cat("slot ", p.slot, ", size ", p.size, " with dtype ", dt.str()));
      if (u->num_src() == 1 && !src_is(0, {Op::DEVICE})) return fail(u, "param.device", "source 0 is not a DEVICE");
      break;
    }
    case Op::DEFINE_LOCAL: case Op::DEFINE_REG: {
      AddrSpace want = u->is(Op::DEFINE_LOCAL) ? AddrSpace::Local : AddrSpace::Reg;
      std::string tag = u->is(Op::DEFINE_LOCAL) ? "define_local.dtype" : "define_reg.dtype";
      if (!dt.ptr || dt.addrspace != want)
        return fail(u, tag, cat("has dtype ", dt.str(), ", wants a ", addrspace_name(want), " pointer"));
      break;
    }
    case Op::DEVICE:
      if (u->arg_as<DeviceArg>().devices.empty()) return fail(u, "device.arg", "names no device");
      break;
    case Op::VECTORIZE: {
      const DType& e = u->src(0)->dtype();
      for (const UOp* s : u->src())
        if (s->dtype() != e || e.count != 1)
          return fail(u, "vectorize.dtype", cat("elements have dtypes ", e.str(), " and ", s->dtype().str()));
      DType want = e;
      want.count = static_cast<uint32_t>(u->num_src());
      if (dt != want) return fail(u, "vectorize.dtype", cat("has dtype ", dt.str(), ", wants ", want.str()));
      break;
    }
    case Op::GEP: {
      const DType& v = u->src(0)->dtype();
      const auto& idx = u->arg_as<IntsArg>().values;
      for (int64_t i : idx)
        if (i < 0 || i >= static_cast<int64_t>(v.count))
          return fail(u, "gep.index", cat("element ", i, " of a vector of ", v.count));
      DType want = v;
      want.count = static_cast<uint32_t>(idx.size());
      if (idx.empty() || dt != want) return fail(u, "gep.dtype", cat("has dtype ", dt.str(), ", wants ", want.str()));
      break;
    }
    case Op::CAT: {
      uint64_t total = 0;
      for (const UOp* s : u->src()) {
        if (s->dtype().ptr || s->dtype().scalar != dt.scalar)
          return fail(u, "cat.dtype", cat("joins ", s->dtype().str(), " into ", dt.str()));
        total += s->dtype().count;
      }
      if (dt.ptr || total != dt.count) return fail(u, "cat.dtype", cat("joins ", total, " elements into ", dt.str()));
      break;
    }
    case Op::PTRCAT:
      for (const UOp* s : u->src())
        if (!s->dtype().ptr) return fail(u, "ptrcat.dtype", cat("joins ", s->dtype().str(), ", not a pointer"));
      if (!dt.ptr) return fail(u, "ptrcat.dtype", cat("has dtype ", dt.str(), ", wants a pointer"));
      break;
    case Op::CAST: {
      const DType& s = u->src(0)->dtype();
      if (s.ptr || s.is_void() || dt.ptr || s.count != dt.count)
        return fail(u, "cast.dtype", cat("cannot cast ", s.str(), " to ", dt.str()));
      break;
    }
    case Op::BITCAST: {
      const DType& s = u->src(0)->dtype();
      if (s.ptr || dt.ptr || s.is_void() || s.scalar == Scalar::Bool || dt.scalar == Scalar::Bool ||
          int64_t{scalar_bits(s.scalar)} * s.count != int64_t{scalar_bits(dt.scalar)} * dt.count)
        return fail(u, "bitcast.dtype", cat("cannot bitcast ", s.str(), " to ", dt.str()));
      break;
    }
    case Op::REDUCE_AXIS: case Op::REDUCE: case Op::ALLREDUCE: {
      const DType& s = u->src(0)->dtype();
      if (dt != s) return fail(u, "reduce.dtype", cat("has dtype ", dt.str(), " but reduces ", s.str()));
      ReduceOp r = u->is(Op::REDUCE_AXIS) ? u->arg_as<ReduceAxisArg>().op : u->arg_as<ReduceOpArg>().op;
      if (s.ptr || !alu_defined(reduce_combine_op(r), s.scalar))
        return fail(u, "reduce.domain", cat("reduce ", reduce_op_name(r), " is not defined on ", s.str()));
      if (u->is(Op::ALLREDUCE) && !src_is(1, {Op::DEVICE})) return fail(u, "allreduce.device", "source 1 is not a DEVICE");
      break;
    }
    case Op::COPY:
      if (!src_is(1, {Op::DEVICE})) return fail(u, "copy.device", "source 1 is not a DEVICE");
      break;
    case Op::END:
      if (!u->src(0)->dtype().is_void())
        return fail(u, "end.computation", cat("closes ranges around a value (", ref(u->src(0)), "), not an effect"));
      break;
    case Op::IF:
      if (u->src(0)->dtype() != dtypes::bool_) return fail(u, "if.cond", cat("condition has dtype ", u->src(0)->dtype().str()));
      break;
    case Op::ENDIF:
      if (!src_is(0, {Op::IF})) return fail(u, "endif.if", cat("closes a ", op_name(u->src(0)->op()), ", not an IF"));
      break;
    case Op::GET_TUPLE: {
      int64_t i = u->arg_as<IntArg>().value;
      if (u->src(0)->is(Op::TUPLE) && (i < 0 || i >= static_cast<int64_t>(u->src(0)->num_src())))
        return fail(u, "get_tuple.index", cat("element ", i, " of a TUPLE of ", u->src(0)->num_src()));
      break;
    }
    case Op::PROGRAM: {
      static constexpr Op kStages[] = {Op::SINK, Op::DEVICE, Op::LINEAR, Op::SOURCE, Op::PROGRAM_BINARY};
      for (size_t i = 0; i < u->num_src(); ++i)
        if (!u->src(i)->is(kStages[i]))
          return fail(u, "program.src", cat("source ", i, " is a ", op_name(u->src(i)->op()), ", wants ",
                                            op_name(kStages[i])));
      break;
    }
    case Op::UNROLL: case Op::CONTRACT:
      for (auto [axis, factor] : u->arg_as<AxisFactorsArg>().factors)
        if (axis < 0 || factor < 1) return fail(u, "expand.factors", cat("axis ", axis, " factor ", factor));
      break;
    default: break;
  }
  return check_memory(u);
}

absl::Status Verifier::check_stage(const UOp* u) {
  const Op op = u->op();
  switch (stage_) {
    case Stage::Tensor:
      if (not_tensor_level(op))
        return fail(u, "stage.tensor_op",
                    cat(op_name(op), " does not exist at tensor level (the graph is tensor-level: ",
                        opts_.stage ? "as requested" : "it has movement ops, REDUCE_AXIS or BUFFER values", ")"));
      if (shapes_.has_shape(u) && !shapes_.shape(u).ok()) {
        const auto* f = shapes_.last_failure();
        return fail_raw(f->node, f->detail);
      }
      return absl::OkStatus();
    case Stage::Kernel: case Stage::Linear: {
      const bool linear = stage_ == Stage::Linear;
      const std::string tag = linear ? "stage.linear_op" : "stage.kernel_op";
      if (tensor_only(op) || (linear && (op == Op::REDUCE || op == Op::BUFFERIZE)))
        return fail(u, tag, cat(op_name(op), " does not exist at ", linear ? "linear" : "kernel", " level"));
      for (size_t i = 0; i < u->num_src(); ++i) {
        const UOp* s = u->src(i);
        if (is_buffer(s) && !buffer_use_is_memory(u, i))
          return fail(u, tag, cat("uses ", ref(s), " as a tensor value (source ", i, ")"));
        if (s->is(Op::LINEAR) && !u->is(Op::PROGRAM))
          return fail(u, tag, cat("LINEAR ", ref(s), " may only be a root or a PROGRAM's source"));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Verifier::check_ranges(const UOp* u, uint32_t pos) {
  RangeSet live, reduced;
  for (const UOp* s : u->src()) {
    uint32_t p = pos_.at(s);
    live = merge(live, live_[p]);
    reduced = merge(reduced, reduced_[p]);
  }
  if (auto r = first_common(live, reduced))
    return fail(u, "range.escape", cat("uses ", range_ref(*r), " outside the REDUCE that closes it"));
  if (u->is(Op::RANGE)) {
    live = merge(live, std::make_shared<std::vector<uint32_t>>(1, pos));
  } else if (int rs = op_info(u->op()).range_start; rs >= 0) {
    std::vector<uint32_t> closed;
    for (size_t i = rs; i < u->num_src(); ++i)
      if (u->src(i)->is(Op::RANGE)) closed.push_back(pos_.at(u->src(i)));
    std::sort(closed.begin(), closed.end());
    closed.erase(std::unique(closed.begin(), closed.end()), closed.end());
    live = remove(live, closed);
    if (u->is(Op::REDUCE) && !closed.empty())
      reduced = merge(reduced, std::make_shared<const std::vector<uint32_t>>(std::move(closed)));
  }
  if (live && static_cast<int64_t>(live->size()) > opts_.max_open_ranges)
    return fail(u, "range.too_many", cat("depends on ", live->size(), " open ranges, over the limit of ",
                                         opts_.max_open_ranges));
  live_[pos] = std::move(live);
  reduced_[pos] = std::move(reduced);
  // The REDUCE sets are needed only until every user has merged them.
  for (const UOp* s : u->src())
    if (--users_left_[pos_.at(s)] == 0) reduced_[pos_.at(s)].reset();
  return absl::OkStatus();
}

absl::Status Verifier::check_root() {
  const UOp* r = root_;
  switch (stage_) {
    case Stage::Tensor:
      if (r->is(Op::SINK)) {
        for (size_t i = 0; i < r->num_src(); ++i) {
          const UOp* s = r->src(i);
          if (!shapes_.has_shape(s) && !s->is(Op::MULTI) && !s->is(Op::MSTACK) && !s->is(Op::MSELECT))
            return fail(r, "tensor.root", cat("output ", i, " (", ref(s), ") is not a tensor"));
        }
      } else if (!shapes_.has_shape(r)) {
        return fail(r, "tensor.root", "a tensor-level root is a SINK of outputs or a tensor");
      }
      return absl::OkStatus();
    case Stage::Kernel:
      if (!r->is(Op::SINK)) return fail(r, "kernel.root", "a kernel is a SINK of STOREs");
      for (size_t i = 0; i < r->num_src(); ++i) {
        const UOp* s = r->src(i);
        if (!s->is(Op::STORE) && !s->is(Op::END) && !s->is(Op::AFTER) && !s->is(Op::CALL) && !s->is(Op::BUFFERIZE))
          return fail(r, "kernel.root", cat("source ", i, " is a ", op_name(s->op()), "; a kernel SINK holds STOREs "
                                            "(or ENDs / AFTERs around them)"));
      }
      for (const UOp* s : r->src())
        if (const RangeSet& l = live_[pos_.at(s)])
          return fail(s, "range.unclosed", cat("depends on ", range_ref(l->front()), ", which no STORE or END "
                                               "on the way to the SINK closes"));
      return absl::OkStatus();
    case Stage::Linear:
      return check_linear();
  }
  return absl::OkStatus();
}

absl::Status Verifier::check_linear() {
  const UOp* root = root_;
  if (!root->is(Op::LINEAR)) return fail(root, "linear.root", "a linear program is a LINEAR");
  absl::flat_hash_map<const UOp*, size_t> at;
  for (size_t i = 0; i < root->num_src(); ++i)
    if (!at.emplace(root->src(i), i).second)
      return fail(root->src(i), "linear.duplicate", cat("is listed twice (at ", at.at(root->src(i)), " and ", i, ")"));
  std::vector<uint32_t> open;           // RANGE ordinals, outermost first
  absl::flat_hash_set<uint32_t> is_open;
  // The blocks RANGE / END and IF / ENDIF open and close, innermost last, and the block each
  // listed value is computed in (0: the kernel's entry, valid anywhere). The renderers emit
  // a value in the block it is listed in, so it may be used only while that block is open.
  struct Block {
    int id;
    const UOp* node;
  };
  std::vector<Block> blocks;
  absl::flat_hash_map<const UOp*, int> home;
  int next_block = 1;
  auto block_open = [&](int id) {
    return id == 0 || std::any_of(blocks.begin(), blocks.end(), [&](const Block& b) { return b.id == id; });
  };
  for (size_t i = 0; i < root->num_src(); ++i) {
    const UOp* u = root->src(i);
    RangeSet deps;
    for (size_t k = 0; k < u->num_src(); ++k) {
      const UOp* s = u->src(k);
      auto it = at.find(s);
      if (it == at.end() || it->second >= i)
        return fail(u, "linear.order", cat("source ", k, " (", ref(s), ") is not listed before it"));
      if (!block_open(home.at(s)))
        return fail(u, "linear.scope", cat("uses ", ref(s), " outside the RANGE / IF that computes it"));
      // An INDEX is an address: only a LOAD or a STORE reads it (AFTER and BARRIER may
      // wait for one).
      if (s->is(Op::INDEX) && !(u->is(Op::LOAD) && k == 1) && !(u->is(Op::STORE) && k == 0) &&
          !((u->is(Op::AFTER) || u->is(Op::BARRIER)) && k >= 1))
        return fail(u, "linear.operand", cat("source ", k, " (", ref(s), ") is an address, not a value"));
      deps = merge(deps, live_[pos_.at(s)]);
    }
    if (deps)
      for (uint32_t r : *deps)
        if (!is_open.contains(r))
          return fail(u, "linear.scope", cat("depends on ", range_ref(r), " but is not between that RANGE and its END"));
    if (u->is(Op::RANGE)) {
      open.push_back(pos_.at(u));
      is_open.insert(pos_.at(u));
    } else if (u->is(Op::END)) {
      size_t k = u->num_src() - 1;
      bool innermost = k <= open.size() && k <= blocks.size();
      for (size_t j = 0; innermost && j < k; ++j)
        innermost = open[open.size() - k + j] == pos_.at(u->src(1 + j)) && blocks[blocks.size() - k + j].node == u->src(1 + j);
      if (!innermost) {
        std::vector<std::string> want;
        for (size_t j = blocks.size() > k ? blocks.size() - k : 0; j < blocks.size(); ++j)
          want.push_back(blocks[j].node->is(Op::RANGE) ? range_ref(pos_.at(blocks[j].node)) : ref(blocks[j].node));
        return fail(u, "linear.nesting", cat("does not close the innermost open ranges, outermost first (",
                                             join(want, ", "), ")"));
      }
      for (size_t j = 0; j < k; ++j) {
        is_open.erase(open.back());
        open.pop_back();
        blocks.pop_back();
      }
    } else if (u->is(Op::ENDIF)) {
      if (blocks.empty() || blocks.back().node != u->src(0))
        return fail(u, "linear.nesting", cat("does not close the innermost open block (",
                                             blocks.empty() ? std::string("none") : ref(blocks.back().node), ")"));
      blocks.pop_back();
    }
    // Where u's value lives: definitions and effects anywhere; AFTER (and a BARRIER that
    // passes a value through) where its value is; a RANGE in its own loop; anything else
    // in the innermost open block.
    if (u->is(Op::RANGE) || u->is(Op::IF)) blocks.push_back({next_block++, u});
    int where = blocks.empty() ? 0 : blocks.back().id;
    if (is_linear_definition(u->op()) || u->dtype().is_void() || u->is(Op::IF)) where = 0;
    else if ((u->is(Op::AFTER) || u->is(Op::BARRIER)) && u->num_src() > 0) where = home.at(u->src(0));
    home[u] = where;
  }
  if (!blocks.empty())
    return fail(blocks.back().node, "linear.nesting",
                blocks.back().node->is(Op::RANGE) ? "is opened but never closed by an END" : "is opened but never closed by an ENDIF");
  return absl::OkStatus();
}

absl::Status Verifier::run() {
  stage_ = opts_.stage ? *opts_.stage : detect_stage(root_);
  const bool ranges = stage_ != Stage::Tensor;
  if (ranges) {
    live_.resize(order_.size());
    reduced_.resize(order_.size());
    users_left_.assign(order_.size(), 0);
    for (const UOp* u : order_)
      for (const UOp* s : u->src()) ++users_left_[pos_.at(s)];
  }
  for (uint32_t pos = 0; pos < order_.size(); ++pos) {
    const UOp* u = order_[pos];
    UOP_RETURN_IF_ERROR(check_structure(u));
    UOP_RETURN_IF_ERROR(check_dtype(u));
    UOP_RETURN_IF_ERROR(check_op(u));
    UOP_RETURN_IF_ERROR(check_stage(u));
    // The root's own range set would be the union of a whole LINEAR; its sources are what
    // check_root() looks at.
    if (ranges && u != root_) UOP_RETURN_IF_ERROR(check_ranges(u, pos));
  }
  return check_root();
}

}  // namespace

bool is_linear_definition(Op op) {
  switch (op) {
    case Op::CONST: case Op::VCONST: case Op::PARAM: case Op::DEFINE_VAR: case Op::DEFINE_REG:
    case Op::DEFINE_LOCAL: case Op::SPECIAL:
      return true;
    default: return false;
  }
}

std::string_view stage_name(Stage s) {
  switch (s) {
    case Stage::Tensor: return "tensor";
    case Stage::Kernel: return "kernel";
    case Stage::Linear: return "linear";
  }
  return "?";
}

Stage detect_stage(const UOp* root) {
  if (root->is(Op::LINEAR)) return Stage::Linear;
  bool kernel = false;
  for (const UOp* u : toposort(root)) {
    if (is_movement(u->op()) || u->is(Op::REDUCE_AXIS)) return Stage::Tensor;
    for (size_t i = 0; i < u->num_src(); ++i)
      if (is_buffer(u->src(i)) && !buffer_use_is_memory(u, i)) return Stage::Tensor;
    kernel = kernel || is_kernel_op(u->op());
  }
  return kernel ? Stage::Kernel : Stage::Tensor;
}

absl::Status verify(Graph& g, const UOp* root, const VerifyOptions& opts) {
  return Verifier(g, root, opts).run();
}

absl::Status verify_linear(const UOp* linear, VerifyOptions opts) {
  Graph scratch;  // shape inference's, which only tensor-level graphs use
  opts.stage = Stage::Linear;
  return Verifier(scratch, linear, opts).run();
}

}  // namespace uop
