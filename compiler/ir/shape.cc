// Tensor-level shape inference: the README's rules for each tensor op, over dims built,
// bounded and compared by the dim algebra (dim.h). Every walk is iterative: graphs may be
// arbitrarily deep.
#include "compiler/ir/shape.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

std::string dim_str(const UOp* d) {
  if (auto c = const_dim(d)) return std::to_string(*c);
  if (d->is(Op::BIND) && d->num_src() > 0) d = d->src(0);
  if (const auto* v = d->arg_if<DefineVarArg>()) return v->name;
  int64_t m = dim_max(d);
  return m == kMax ? "<expr>" : cat("<expr <= ", m, ">");
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += cat(i ? ", " : "", dim_str(s[i]));
  return out + (s.size() == 1 ? ",)" : ")");
}

// Whether two shapes have equal dims (but on axis `skip`): kFalse when some pair is proven
// to differ, kUnknown when some pair could not be decided (dim.h).
DimTruth same_dims(const Shape& a, const Shape& b, int64_t skip = -1) {
  if (a.size() != b.size()) return DimTruth::kFalse;
  DimTruth r = DimTruth::kTrue;
  for (size_t k = 0; k < a.size(); ++k) {
    if (static_cast<int64_t>(k) == skip) continue;
    DimTruth t = dims_equal(a[k], b[k]);
    if (t == DimTruth::kFalse) return t;
    if (t == DimTruth::kUnknown) r = t;
  }
  return r;
}

// What a refusal says when the dim algebra could not decide the claim either way: the
// dims may be equal, but nothing here proves it.
const char* undecided(DimTruth t) { return t == DimTruth::kUnknown ? " (not provably equal)" : ""; }

}  // namespace

std::optional<std::vector<int64_t>> const_shape(const Shape& s) {
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (const UOp* d : s) {
    auto c = const_dim(d);
    if (!c) return std::nullopt;
    out.push_back(*c);
  }
  return out;
}

absl::StatusOr<Shape> shape_operand_dims(Graph& g, const UOp* s) {
  const DType& dt = s->dtype();
  if (dt.ptr || dt.scalar != Scalar::Index)
    return absl::InvalidArgumentError(cat("a shape operand has dtype index, not ", dt.str(), " [shape.operand]"));
  if (s->is(Op::VCONST)) {
    const auto* vc = s->arg_if<VConstArg>();
    if (!vc || vc->values.size() != dt.count)
      return absl::InvalidArgumentError(cat("VCONST shape of width ", dt.count, " does not hold ", dt.count,
                                            " values [shape.operand]"));
    Shape out;
    for (const ConstValue& v : vc->values) {
      if (v.kind() != ConstValue::Kind::Int)
        return absl::InvalidArgumentError("a VCONST shape holds index values [shape.operand]");
      out.push_back(g.idx(v.as_int()));
    }
    return out;
  }
  if (s->is(Op::VECTORIZE)) {
    if (s->num_src() != dt.count)
      return absl::InvalidArgumentError(cat("VECTORIZE shape of width ", dt.count, " has ", s->num_src(),
                                            " elements [shape.operand]"));
    return Shape(s->src().begin(), s->src().end());
  }
  if (dt.count == 1) return Shape{s};
  return absl::InvalidArgumentError(
      cat("a shape operand is a VCONST, a VECTORIZE or (rank 1) an index scalar, not ", op_name(s->op()),
          " [shape.operand]"));
}

const UOp* make_shape_operand(Graph& g, const Shape& s) {
  if (auto c = const_shape(s)) {
    VConstArg arg;
    for (int64_t v : *c) arg.values.push_back(ConstValue::Int(v));
    return g.make(Op::VCONST, DType(Scalar::Index, static_cast<uint32_t>(s.size())), {}, std::move(arg));
  }
  return g.make(Op::VECTORIZE, DType(Scalar::Index, static_cast<uint32_t>(s.size())), s);
}

const UOp* shape_numel(Graph& g, const Shape& s) {
  const UOp* n = g.idx(1);
  for (const UOp* d : s) n = dim_mul(g, n, d);
  return n;
}

// ---------------------------------------------------------------------------------------

ShapeInference::ShapeInference(Graph& g, ShapeLimits limits, const NodeIndex* index)
    : g_(g), limits_(limits), index_(index) {}

bool ShapeInference::has_shape(const UOp* u) const {
  while (u->is(Op::AFTER) && u->num_src() > 0) u = u->src(0);
  if (is_alu(u->op()) || is_movement(u->op())) return true;
  switch (u->op()) {
    case Op::BUFFER: case Op::BUFFER_VIEW: case Op::CONST: case Op::DEFINE_VAR: case Op::BIND:
    case Op::REDUCE_AXIS: case Op::CAST: case Op::BITCAST: case Op::CONTIGUOUS:
    case Op::CONTIGUOUS_BACKWARD: case Op::DETACH: case Op::COPY: case Op::PRECAST: case Op::ALLREDUCE:
    case Op::MULTI: case Op::MSELECT:
      return true;
    default:
      return false;
  }
}

absl::Status ShapeInference::fail(const UOp* u, std::string detail) {
  return absl::InvalidArgumentError(std::move(detail));
}

absl::Status ShapeInference::check_limits(const UOp* u, const Shape& s) {
  if (static_cast<int64_t>(s.size()) > limits_.max_rank)
    return fail(u, cat("rank ", s.size(), " is over the limit of ", limits_.max_rank, " [shape.rank]"));
  int64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < s.size(); ++i) {
    auto f = facts(s[i]);
    if (!f || s[i]->dtype() != dtypes::index)
      return fail(u, cat("dim ", i, " is not an index expression (", op_name(s[i]->op()), " : ",
                         s[i]->dtype().str(), ") [shape.dim]"));
    // Index arithmetic wraps like int64: a dim whose arithmetic may overflow has no bounds
    // (ValueRange's "unknown"), and that is a dim too large, not one that is negative.
    const bool wraps = f->min == std::numeric_limits<int64_t>::min() && f->max == kMax;
    if (f->min < 0 && !wraps)
      return fail(u, cat("dim ", i, " of ", shape_str(s), " may be negative [shape.negative]"));
    if (f->max > limits_.max_elements)
      return fail(u, cat("dim ", i, " of ", shape_str(s), " may exceed ", limits_.max_elements,
                         " [shape.too_large]"));
    overflow = overflow || __builtin_mul_overflow(numel, f->max, &numel);
  }
  // A zero dim makes the product zero whatever the other dims are.
  bool has_zero = std::any_of(s.begin(), s.end(), [&](const UOp* d) { return facts(d)->max == 0; });
  if (!has_zero && (overflow || numel > limits_.max_elements))
    return fail(u, cat(shape_str(s), " has more than ", limits_.max_elements, " elements [shape.too_large]"));
  return absl::OkStatus();
}

absl::StatusOr<Shape> ShapeInference::operand(const UOp* u, size_t i, size_t rank, const char* tag) {
  const UOp* s = u->src(i);
  if (s->dtype().count > static_cast<uint32_t>(limits_.max_rank))
    return fail(u, cat("source ", i, " has rank ", s->dtype().count, ", over the limit of ", limits_.max_rank,
                       " [shape.rank]"));
  auto dims = shape_operand_dims(g_, s);
  if (!dims.ok()) return fail(u, cat("source ", i, ": ", dims.status().message()));
  if (rank != SIZE_MAX && dims->size() != rank)
    return fail(u, cat("source ", i, " has ", dims->size(), " dims for an input of rank ", rank, " [", tag, "]"));
  for (size_t k = 0; k < dims->size(); ++k) {
    const UOp* d = (*dims)[k];
    auto f = facts(d);
    if (!f || d->dtype() != dtypes::index)
      return fail(u, cat("source ", i, " dim ", k, " is not an index expression (", op_name(d->op()), " : ",
                         d->dtype().str(), ") [shape.dim]"));
    // Pads and shrink bounds have their own rules; a negative dim is a shape error.
    if (f->min < 0)
      return fail(u, cat("source ", i, " dim ", k, " (", dim_str(d), ") may be negative [",
                         u->is(Op::PAD) || u->is(Op::SHRINK) ? tag : "shape.negative", "]"));
  }
  return dims;
}

absl::StatusOr<Shape> ShapeInference::infer(const UOp* u) {
  const OpInfo& info = op_info(u->op());
  const int n = static_cast<int>(u->num_src());
  // Shape inference may run on graphs nobody verified: never index past the sources.
  if (n < info.min_src || (info.max_src >= 0 && n > info.max_src))
    return fail(u, cat("has ", n, " sources [src.count]"));
  if (arg_kind(u->arg()) != info.arg) return fail(u, "arg of the wrong kind [arg.kind]");
  const DType& dt = u->dtype();
  if (dt.ptr || dt.count != 1 || dt.scalar == Scalar::Void)
    return fail(u, cat("a tensor has a scalar element dtype, not ", dt.str(), " [shape.dtype]"));

  auto src_shape = [&](int i) -> const Shape& { return *shapes_.at(u->src(i)); };
  Shape out;
  const bool elementwise_src0 = u->is(Op::CAST) || u->is(Op::BITCAST) || u->is(Op::CONTIGUOUS) ||
                                u->is(Op::CONTIGUOUS_BACKWARD) || u->is(Op::DETACH) || u->is(Op::COPY) ||
                                u->is(Op::PRECAST) || u->is(Op::AFTER);
  if (is_alu(u->op())) {
    for (int i = 1; i < n; ++i) {
      const Shape &a = src_shape(0), &b = src_shape(i);
      if (DimTruth t = same_dims(a, b); t != DimTruth::kTrue)
        return fail(u, cat("source ", i, " has shape ", shape_str(b), " but source 0 has ", shape_str(a),
                           undecided(t), " [shape.alu]"));
    }
    out = src_shape(0);
  } else if (elementwise_src0) {
    out = src_shape(0);
  } else {
    switch (u->op()) {
      case Op::BUFFER: {
        int64_t size = u->arg_as<BufferArg>().size;
        if (size < 0) return fail(u, cat("size ", size, " is negative [shape.buffer]"));
        out = {g_.idx(size)};
        break;
      }
      case Op::BUFFER_VIEW: {
        const UOp* base = u->src(0);
        int64_t base_size;
        if (const auto* b = base->arg_if<BufferArg>(); b && base->is(Op::BUFFER)) base_size = b->size;
        else if (const auto* v = base->arg_if<BufferViewArg>(); v && base->is(Op::BUFFER_VIEW)) base_size = v->size;
        else return fail(u, cat("views a ", op_name(base->op()), ", not a BUFFER [shape.buffer_view]"));
        const auto& a = u->arg_as<BufferViewArg>();
        int64_t end;
        if (a.size < 0 || a.offset < 0 || __builtin_add_overflow(a.size, a.offset, &end) || end > base_size)
          return fail(u, cat("view [", a.offset, ", +", a.size, ") is outside its buffer of ", base_size,
                             " [shape.buffer_view]"));
        out = {g_.idx(a.size)};
        break;
      }
      case Op::CONST: case Op::DEFINE_VAR: case Op::BIND:
        break;  // scalars: shape ()
      case Op::MULTI: {
        // Shards agree on every dim but the shard axis, whose sizes add up; replicated
        // shards (axis -1) agree on every dim.
        int64_t axis = u->arg_as<IntArg>().value;
        const Shape& first = src_shape(0);
        if (axis < -1 || axis >= static_cast<int64_t>(first.size()))
          return fail(u, cat("shard axis ", axis, " is not an axis of shape ", shape_str(first), " [shape.multi]"));
        out = first;
        for (int i = 1; i < n; ++i) {
          const Shape& si = src_shape(i);
          if (DimTruth t = same_dims(si, first, axis); t != DimTruth::kTrue)
            return fail(u, cat("shard ", i, " has shape ", shape_str(si), " but shard 0 has ", shape_str(first),
                               undecided(t), " [shape.multi]"));
          if (axis >= 0) out[axis] = dim_add(g_, out[axis], si[axis]);
        }
        break;
      }
      case Op::MSELECT: {
        // One device's part: a MULTI's shard, or the value every device of a replicated
        // collective holds.
        const UOp* m = u->src(0);
        int64_t i = u->arg_as<IntArg>().value;
        if (m->is(Op::MULTI)) {
          if (i < 0 || i >= static_cast<int64_t>(m->num_src()))
            return fail(u, cat("shard ", i, " of a MULTI of ", m->num_src(), " [shape.mselect]"));
          out = *shapes_.at(m->src(i));
        } else {
          out = src_shape(0);
        }
        break;
      }
      case Op::ALLREDUCE: {
        // Every device ends with the reduction of all shards: a shard's shape.
        const UOp* m = u->src(0);
        out = m->is(Op::MULTI) ? *shapes_.at(m->src(0)) : src_shape(0);
        break;
      }
      case Op::RESHAPE: {
        const Shape& x = src_shape(0);
        auto ns = operand(u, 1, SIZE_MAX, "shape.reshape");
        if (!ns.ok()) return ns.status();
        if (auto st = check_limits(u, *ns); !st.ok()) return st;
        auto cx = const_shape(x), cn = const_shape(*ns);
        DimTruth same;
        if (cx && cn) {
          // Both products are within the element limit (checked), so they cannot overflow.
          int64_t px = 1, pn = 1;
          for (int64_t d : *cx) px *= d;
          for (int64_t d : *cn) pn *= d;
          same = px == pn ? DimTruth::kTrue : DimTruth::kFalse;
        } else {
          same = dims_equal(shape_numel(g_, x), shape_numel(g_, *ns));
        }
        if (same != DimTruth::kTrue)
          return fail(u, cat("cannot reshape ", shape_str(x), " to ", shape_str(*ns), ": the element counts ",
                             same == DimTruth::kUnknown ? "are not provably equal" : "differ", " [shape.reshape]"));
        out = std::move(*ns);
        break;
      }
      case Op::EXPAND: {
        const Shape& x = src_shape(0);
        auto ns = operand(u, 1, x.size(), "shape.expand");
        if (!ns.ok()) return ns.status();
        for (size_t k = 0; k < x.size(); ++k)
          if (DimTruth t = dims_equal(x[k], (*ns)[k]); t != DimTruth::kTrue && const_dim(x[k]) != 1)
            return fail(u, cat("axis ", k, ": cannot expand ", shape_str(x), " to ", shape_str(*ns),
                               " (only dims of 1 broadcast)", undecided(t), " [shape.expand]"));
        out = std::move(*ns);
        break;
      }
      case Op::PERMUTE: {
        const Shape& x = src_shape(0);
        const auto& perm = u->arg_as<IntsArg>().values;
        std::vector<bool> used(x.size(), false);
        bool ok = perm.size() == x.size();
        for (size_t k = 0; ok && k < perm.size(); ++k) {
          ok = perm[k] >= 0 && perm[k] < static_cast<int64_t>(x.size()) && !used[perm[k]];
          if (ok) used[perm[k]] = true;
        }
        if (!ok)
          return fail(u, cat("[", join(perm, ", "), "] is not a permutation of ", x.size(), " axes [shape.permute]"));
        for (int64_t p : perm) out.push_back(x[p]);
        break;
      }
      case Op::PAD: case Op::SHRINK: {
        const bool pad = u->is(Op::PAD);
        const char* tag = pad ? "shape.pad" : "shape.shrink";
        const Shape& x = src_shape(0);
        auto b = operand(u, 1, x.size(), tag);
        if (!b.ok()) return b.status();
        auto e = operand(u, 2, x.size(), tag);
        if (!e.ok()) return e.status();
        for (size_t k = 0; k < x.size(); ++k) {
          const UOp *bk = (*b)[k], *ek = (*e)[k];
          if (pad) {
            out.push_back(dim_add(g_, dim_add(g_, bk, x[k]), ek));
          } else {
            DimTruth inside = dims_le(bk, ek);
            if (inside == DimTruth::kTrue) inside = dims_le(ek, x[k]);
            if (inside != DimTruth::kTrue)
              return fail(u, cat("axis ", k, ": [", dim_str(bk), ", ", dim_str(ek), ") is not ",
                                 inside == DimTruth::kUnknown ? "provably " : "", "inside 0..", dim_str(x[k]),
                                 " [shape.shrink]"));
            out.push_back(dim_sub(g_, ek, bk));
          }
        }
        break;
      }
      case Op::FLIP: {
        const Shape& x = src_shape(0);
        size_t k = u->arg_as<BoolsArg>().values.size();
        if (k != x.size()) return fail(u, cat(k, " flags for ", x.size(), " axes [shape.flip]"));
        out = x;
        break;
      }
      case Op::REDUCE_AXIS: {
        out = src_shape(0);
        std::vector<bool> seen(out.size(), false);
        for (int64_t a : u->arg_as<ReduceAxisArg>().axes) {
          if (a < 0 || a >= static_cast<int64_t>(out.size()) || seen[a])
            return fail(u, cat("axis ", a, " is out of range or repeated for rank ", out.size(),
                               " [shape.reduce_axis]"));
          seen[a] = true;
          out[a] = g_.idx(1);  // keepdim
        }
        break;
      }
      default:
        return fail(u, cat(op_name(u->op()), " is not a tensor-level op [shape.operand]"));
    }
  }
  if (auto st = check_limits(u, out); !st.ok()) return st;
  return out;
}

absl::StatusOr<const Shape*> ShapeInference::shape(const UOp* root) {
  auto error = [&](size_t fi) {
    last_ = fi;
    const Failure& f = failed_[fi];
    std::string where;
    if (index_) {
      auto it = index_->find(f.node);
      where = it != index_->end() ? std::to_string(it->second) : "?";
    } else {
      where = std::to_string(index_by_toposort(root).at(f.node));
    }
    return absl::InvalidArgumentError(cat("node ", where, " (", op_name(f.node->op()), "): ", f.detail));
  };
  if (auto it = shapes_.find(root); it != shapes_.end()) return it->second;
  if (auto it = failures_.find(root); it != failures_.end()) return error(it->second);
  if (!has_shape(root)) {
    failed_.push_back({root, cat(op_name(root->op()), " is not a tensor-level value [shape.operand]")});
    return error(failed_.size() - 1);
  }
  // Which sources a node's rule reads the shapes of.
  auto needed = [](const UOp* u, size_t i) {
    switch (u->op()) {
      case Op::BUFFER: case Op::BUFFER_VIEW: case Op::CONST: case Op::DEFINE_VAR: case Op::BIND: return false;
      // A MULTI's rule reads every shard's shape (once only shard 0's was computed, so
      // an uncached shard threw out_of_range from shapes_.at).
      default: return is_alu(u->op()) || u->is(Op::MULTI) || i == 0;
    }
  };
  // A failure is memoized at the node where it happened and at each node that found a
  // failed source; the next query through them stops there.
  std::vector<const UOp*> stack{root};
  auto fail_at = [&](const UOp* v, size_t fi) {
    failures_.emplace(v, fi);
    return error(fi);
  };
  while (!stack.empty()) {
    const UOp* v = stack.back();
    if (shapes_.contains(v)) { stack.pop_back(); continue; }
    bool pending = false;
    for (size_t i = 0; i < v->num_src(); ++i) {
      const UOp* s = v->src(i);
      if (!needed(v, i) || shapes_.contains(s)) continue;
      if (auto it = failures_.find(s); it != failures_.end()) return fail_at(v, it->second);
      if (!has_shape(s)) {
        failed_.push_back({v, cat("source ", i, " (", op_name(s->op()), ") is not a tensor [shape.operand]")});
        return fail_at(v, failed_.size() - 1);
      }
      stack.push_back(s);
      pending = true;
    }
    if (pending) continue;
    auto r = infer(v);
    if (!r.ok()) {
      failed_.push_back({v, std::string(r.status().message())});
      return fail_at(v, failed_.size() - 1);
    }
    const Shape* stored = &store_.emplace_back(std::move(*r));
    shapes_.emplace(v, stored);
    stack.pop_back();
  }
  return shapes_.at(root);
}

}  // namespace uop
