// The reference interpreter (interp.h). Both levels walk graphs with explicit stacks,
// never recursion: graphs from the network may be chains of 100k nodes.
#include "compiler/interp/interp.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "compiler/interp/node_eval.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/shape.h"
#include "compiler/support/strings.h"

namespace uop {

namespace {

using namespace interp_internal;
using Inputs = absl::flat_hash_map<const UOp*, HostTensor>;

// Row-major flat index of coords c in shape s; -1 when a coord is outside.
int64_t flat_of(std::span<const int64_t> c, std::span<const int64_t> s) {
  int64_t f = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    if (c[k] < 0 || c[k] >= s[k]) return -1;
    f = f * s[k] + c[k];
  }
  return f;
}

// Steps coords c through shape s in row-major order.
void next_coords(std::vector<int64_t>& c, std::span<const int64_t> s) {
  for (size_t k = c.size(); k-- > 0;) {
    if (++c[k] < s[k]) return;
    c[k] = 0;
  }
}

// out[o] = in[map(o, ic)] for every output coord o, where map fills the input coords ic;
// an input coord outside the input leaves out's zero (PAD's fill).
template <typename Map>
void gather(const HostTensor& in, HostTensor& out, Map map) {
  std::vector<int64_t> o(out.shape.size(), 0), ic(in.shape.size(), 0);
  for (int64_t i = 0; i < out.numel(); ++i, next_coords(o, out.shape)) {
    map(o, ic);
    int64_t src = flat_of(ic, in.shape);
    if (src >= 0) out.set_bits(i, in.get_bits(src));
  }
}

// ---------------------------------------------------------------------------------------
// Tensor level

class TensorInterp {
 public:
  TensorInterp(Graph& g, const UOp* sink, const Inputs& inputs, const InterpOptions& o)
      : g_(g), sink_(sink), inputs_(inputs), opts_(o), namer_(sink), si_(g, ShapeLimits{}, &namer_.index()) {}

  absl::StatusOr<std::vector<HostTensor>> run();

 private:
  absl::Status collect_binds();
  absl::StatusOr<int64_t> dim_value(const UOp* d);
  absl::StatusOr<std::vector<int64_t>> dims_value(const UOp* user, const Shape& dims);
  absl::StatusOr<HostTensor> alloc(const UOp* u, Scalar dtype, std::vector<int64_t> shape);
  absl::StatusOr<HostTensor> eval(const UOp* u);
  absl::StatusOr<HostTensor> eval_reduce(const UOp* u, const HostTensor& in, std::vector<int64_t> shape);
  std::span<const UOp* const> tensor_sources(const UOp* u) const {
    if (u->is(Op::SINK) || u->is(Op::MULTI) || is_alu(u->op())) return u->src();
    if (u->num_src() == 0 || u->is(Op::BUFFER) || u->is(Op::CONST) || u->is(Op::BIND) || u->is(Op::DEFINE_VAR))
      return {};
    return u->src().subspan(0, 1);
  }

  Graph& g_;
  const UOp* sink_;
  const Inputs& inputs_;
  InterpOptions opts_;
  Namer namer_;
  ShapeInference si_;
  absl::flat_hash_map<const UOp*, int64_t> bound_;     // DEFINE_VAR -> value of its BIND
  absl::flat_hash_map<const UOp*, ConstValue> dims_;   // index-expression node -> value
  absl::flat_hash_map<const UOp*, HostTensor> values_;

  // Multi-device values (README "Multi-device"). values_ holds every node's logical value;
  // a MULTI also keeps its shards as given (parts_), since a replicated MULTI's logical
  // value is only shard 0 and an ALLREDUCE under it reads every part. layouts_ says how a
  // multi-device node's logical value splits into per-device shards.
  struct Layout {
    size_t devices = 0;
    int64_t axis = -1;            // -1 replicated
    std::vector<int64_t> splits;  // sharded: each device's size along axis
  };
  absl::StatusOr<HostTensor> eval_multi(const UOp* u, HostTensor out);
  void note_layout(const UOp* u);
  absl::StatusOr<std::vector<HostTensor>> shards_of(const UOp* user, const UOp* m);
  absl::flat_hash_map<const UOp*, std::vector<HostTensor>> parts_;
  absl::flat_hash_map<const UOp*, Layout> layouts_;
};

absl::Status TensorInterp::collect_binds() {
  for (const UOp* u : toposort(sink_)) {
    if (!u->is(Op::BIND)) continue;
    // Unverified graphs reach here too: check the arg kinds before reading them.
    const DefineVarArg* var = u->num_src() == 2 ? u->src(0)->arg_if<DefineVarArg>() : nullptr;
    const ConstValue* c = u->num_src() == 2 ? u->src(1)->arg_if<ConstValue>() : nullptr;
    if (!var || !c || !u->src(0)->is(Op::DEFINE_VAR) || !u->src(1)->is(Op::CONST))
      return namer_.error(u, "a BIND binds a DEFINE_VAR to a CONST");
    int64_t v = c->to_int();
    if (v < var->min || v > var->max)
      return namer_.error(u, cat("value ", v, " of '", var->name, "' is outside [", var->min, ", ", var->max, "]"));
    auto [it, fresh] = bound_.emplace(u->src(0), v);
    if (!fresh && it->second != v)
      return namer_.error(u, cat("'", var->name, "' is bound to both ", it->second, " and ", v));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TensorInterp::dim_value(const UOp* d) {
  if (auto it = dims_.find(d); it != dims_.end()) return it->second.to_int();
  std::vector<ConstValue> args;
  for (const UOp* u : toposort(d)) {
    if (dims_.contains(u)) continue;
    ConstValue v;
    if (u->is(Op::CONST)) {
      v = const_of(u);
    } else if (u->is(Op::DEFINE_VAR) || u->is(Op::BIND)) {
      const UOp* var = u->is(Op::BIND) ? u->src(0) : u;
      auto it = bound_.find(var);
      if (it == bound_.end()) {
        const auto* a = var->arg_if<DefineVarArg>();
        return namer_.error(u, cat("variable '", a ? a->name : "?", "' has no BIND in the graph"));
      }
      v = ConstValue::Int(it->second);
    } else if (is_scalar_op(u->op())) {
      if (std::string why = check_scalar_op(u); !why.empty()) return namer_.error(u, why);
      args.clear();
      for (const UOp* s : u->src()) args.push_back(dims_.at(s));
      auto r = apply_scalar_op(u, args);
      if (!r) return namer_.error(u, cat("not defined on ", u->src(0)->dtype().str()));
      v = *r;
    } else {
      return namer_.error(u, "is not part of an index expression");
    }
    dims_.emplace(u, v);
  }
  return dims_.at(d).to_int();
}

absl::StatusOr<std::vector<int64_t>> TensorInterp::dims_value(const UOp* user, const Shape& dims) {
  std::vector<int64_t> out;
  for (const UOp* d : dims) {
    auto v = dim_value(d);
    if (!v.ok()) return v.status();
    if (*v < 0) return namer_.error(user, cat("a dim evaluates to ", *v, " with the bound values"));
    out.push_back(*v);
  }
  return out;
}

absl::StatusOr<HostTensor> TensorInterp::alloc(const UOp* u, Scalar dtype, std::vector<int64_t> shape) {
  std::optional<int64_t> n = checked_numel(shape);
  if (!n || *n > opts_.max_elements)
    return namer_.error(u, cat("a tensor of shape ", shape_str(shape), " is over the interpreter's limit of ",
                               opts_.max_elements, " elements"),
                        absl::StatusCode::kResourceExhausted);
  return HostTensor::zeros(dtype, std::move(shape));
}

absl::StatusOr<std::vector<HostTensor>> TensorInterp::run() {
  if (absl::Status st = collect_binds(); !st.ok()) return st;
  // Post-order over tensor edges only (shape operands are not tensors), counting each
  // node's uses so an intermediate is freed as soon as its last user has run.
  std::vector<const UOp*> order;
  absl::flat_hash_map<const UOp*, int64_t> uses;
  {
    absl::flat_hash_map<const UOp*, bool> seen;
    std::vector<std::pair<const UOp*, size_t>> stack{{sink_, 0}};
    seen.emplace(sink_, true);
    while (!stack.empty()) {
      auto& [u, next] = stack.back();
      auto srcs = tensor_sources(u);
      if (next < srcs.size()) {
        const UOp* s = srcs[next++];
        ++uses[s];
        if (seen.emplace(s, true).second) stack.push_back({s, 0});
        continue;
      }
      order.push_back(u);
      stack.pop_back();
    }
  }
  for (const UOp* u : order) {
    if (u == sink_ && u->is(Op::SINK)) break;  // the root is last in post-order
    auto t = eval(u);
    if (!t.ok()) return t.status();
    values_.emplace(u, *std::move(t));
    note_layout(u);
    for (const UOp* s : tensor_sources(u))
      if (--uses[s] == 0) {
        values_.erase(s);
        parts_.erase(s);
        layouts_.erase(s);
      }
  }
  std::vector<HostTensor> outs;
  if (!sink_->is(Op::SINK)) outs.push_back(std::move(values_.at(sink_)));
  for (const UOp* s : sink_->is(Op::SINK) ? sink_->src() : std::span<const UOp* const>{}) outs.push_back(values_.at(s));
  return outs;
}

absl::StatusOr<HostTensor> TensorInterp::eval(const UOp* u) {
  if (!si_.has_shape(u)) return namer_.error(u, "is not a tensor-level value the interpreter evaluates");
  auto sym = si_.shape(u);
  if (!sym.ok()) return sym.status();
  auto shape = dims_value(u, **sym);
  if (!shape.ok()) return shape.status();
  if (!is_scalar_value(u->dtype())) return namer_.error(u, cat("a tensor of dtype ", u->dtype().str()));
  const Scalar dt = u->dtype().scalar;
  auto out = alloc(u, dt, *shape);
  if (!out.ok()) return out.status();
  const HostTensor* x = u->num_src() > 0 && values_.contains(u->src(0)) ? &values_.at(u->src(0)) : nullptr;
  if (!tensor_sources(u).empty() && !x) return namer_.error(u, "its source is not a tensor");
  auto same_dtype = [&]() -> absl::Status {
    if (x->dtype == dt) return absl::OkStatus();
    return namer_.error(u, cat("dtype ", scalar_name(dt), " differs from its source's ", scalar_name(x->dtype)));
  };
  const std::vector<int64_t>& os = out->shape;
  const size_t rank = os.size();
  auto check_rank = [&]() -> absl::Status {
    if (x->shape.size() == rank) return absl::OkStatus();
    return namer_.error(u, cat("rank ", rank, " differs from its source's ", shape_str(x->shape)));
  };

  switch (u->op()) {
    case Op::BUFFER: {
      auto it = inputs_.find(u);
      if (it == inputs_.end()) return namer_.error(u, "no input tensor is bound to this BUFFER");
      const HostTensor& in = it->second;
      if (in.dtype != dt || in.numel() != out->numel() || in.nbytes() != out->nbytes())
        return namer_.error(u, cat("the input is ", in.str(0), ", the BUFFER holds ", out->numel(), " x ",
                                   scalar_name(dt)));
      out->data = in.data;
      return out;
    }
    case Op::BUFFER_VIEW: {
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      const auto& a = u->arg_as<BufferViewArg>();
      if (a.offset < 0 || a.offset + out->numel() > x->numel()) return namer_.error(u, "the view is outside its buffer");
      out->data = x->data.substr(a.offset * x->itemsize(), out->data.size());
      return out;
    }
    case Op::CONST: out->set(0, const_of(u)); return out;
    case Op::DEFINE_VAR: case Op::BIND: {
      auto v = dim_value(u);
      if (!v.ok()) return v.status();
      out->set(0, ConstValue::Int(*v));
      return out;
    }
    case Op::CONTIGUOUS: case Op::CONTIGUOUS_BACKWARD: case Op::DETACH: case Op::COPY: case Op::AFTER:
    case Op::RESHAPE:
      // Row-major order is kept: the bytes are the source's.
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      if (x->numel() != out->numel())
        return namer_.error(u, cat("cannot take ", shape_str(x->shape), " to ", shape_str(os), " with the bound values"));
      out->data = x->data;
      return out;
    case Op::PERMUTE: {
      if (absl::Status st = check_rank(); !st.ok()) return st;
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      const auto& perm = u->arg_as<IntsArg>().values;
      gather(*x, *out, [&](const auto& o, auto& ic) {
        for (size_t k = 0; k < rank; ++k) ic[perm[k]] = o[k];
      });
      return out;
    }
    case Op::EXPAND: {
      if (absl::Status st = check_rank(); !st.ok()) return st;
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      for (size_t k = 0; k < rank; ++k)
        if (x->shape[k] != os[k] && x->shape[k] != 1)
          return namer_.error(u, cat("cannot expand ", shape_str(x->shape), " to ", shape_str(os)));
      gather(*x, *out, [&](const auto& o, auto& ic) {
        for (size_t k = 0; k < rank; ++k) ic[k] = x->shape[k] == 1 ? 0 : o[k];
      });
      return out;
    }
    case Op::PAD: case Op::SHRINK: {
      if (absl::Status st = check_rank(); !st.ok()) return st;
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      auto bd = shape_operand_dims(g_, u->src(1));
      if (!bd.ok()) return namer_.error(u, cat(bd.status().message()));
      auto begins = dims_value(u, *bd);
      if (!begins.ok()) return begins.status();
      if (begins->size() != rank) return namer_.error(u, "begins do not match the rank");
      const bool pad = u->is(Op::PAD);
      for (size_t k = 0; k < rank; ++k)
        if ((*begins)[k] < 0 || (pad ? (*begins)[k] + x->shape[k] > os[k] : (*begins)[k] + os[k] > x->shape[k]))
          return namer_.error(u, cat("axis ", k, " is out of range with the bound values"));
      gather(*x, *out, [&](const auto& o, auto& ic) {
        for (size_t k = 0; k < rank; ++k) ic[k] = pad ? o[k] - (*begins)[k] : o[k] + (*begins)[k];
      });
      return out;
    }
    case Op::FLIP: {
      if (absl::Status st = check_rank(); !st.ok()) return st;
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      const auto& flip = u->arg_as<BoolsArg>().values;
      gather(*x, *out, [&](const auto& o, auto& ic) {
        for (size_t k = 0; k < rank; ++k) ic[k] = flip[k] ? os[k] - 1 - o[k] : o[k];
      });
      return out;
    }
    case Op::REDUCE_AXIS: {
      if (absl::Status st = check_rank(); !st.ok()) return st;
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      return eval_reduce(u, *x, *shape);
    }
    case Op::MULTI: case Op::MSELECT: case Op::ALLREDUCE:
      if (absl::Status st = same_dtype(); !st.ok()) return st;
      return eval_multi(u, *std::move(out));
    default: break;
  }
  if (!is_scalar_op(u->op())) return namer_.error(u, "is not supported by the interpreter");
  if (std::string why = check_scalar_op(u); !why.empty()) return namer_.error(u, why);
  std::vector<const HostTensor*> srcs;
  for (const UOp* s : u->src()) {
    const HostTensor& t = values_.at(s);
    if (t.shape != os)
      return namer_.error(u, cat("operand of shape ", shape_str(t.shape), " for a result of shape ", shape_str(os)));
    srcs.push_back(&t);
  }
  std::vector<ConstValue> args(srcs.size());
  for (int64_t i = 0; i < out->numel(); ++i) {
    for (size_t k = 0; k < srcs.size(); ++k) args[k] = srcs[k]->get(i);
    auto r = apply_scalar_op(u, args);
    if (!r) return namer_.error(u, cat("not defined on ", u->src(0)->dtype().str()));
    out->set(i, *r);
  }
  return out;
}

absl::StatusOr<HostTensor> TensorInterp::eval_reduce(const UOp* u, const HostTensor& in, std::vector<int64_t> shape) {
  const auto& a = u->arg_as<ReduceAxisArg>();
  const Scalar t = in.dtype;
  const ConstValue id = reduce_identity(a.op, t);
  const Op op = reduce_combine_op(a.op);
  const ConstValue probe[2] = {id, id};
  if (!eval_alu(op, t, probe)) return namer_.error(u, cat(reduce_op_name(a.op), " is not defined on ", scalar_name(t)));
  std::vector<bool> reduced(in.shape.size(), false);
  for (int64_t ax : a.axes) {
    if (ax < 0 || ax >= static_cast<int64_t>(in.shape.size())) return namer_.error(u, cat("axis ", ax, " out of range"));
    reduced[ax] = true;
  }
  for (size_t k = 0; k < in.shape.size(); ++k)
    if (shape[k] != (reduced[k] ? 1 : in.shape[k]))
      return namer_.error(u, cat("result shape ", shape_str(shape), " does not match ", shape_str(in.shape)));
  auto out = alloc(u, t, std::move(shape));
  if (!out.ok()) return out.status();
  for (int64_t j = 0; j < out->numel(); ++j) out->set(j, id);
  // Visiting the input in increasing flat order folds each output's inputs in increasing
  // index order, as the semantics require.
  std::vector<int64_t> c(in.shape.size(), 0), oc(in.shape.size(), 0);
  ConstValue args[2];
  for (int64_t i = 0; i < in.numel(); ++i, next_coords(c, in.shape)) {
    for (size_t k = 0; k < c.size(); ++k) oc[k] = reduced[k] ? 0 : c[k];
    int64_t j = flat_of(oc, out->shape);
    args[0] = out->get(j);
    args[1] = in.get(i);
    out->set(j, *eval_alu(op, t, args));
  }
  return out;
}


// How a node's logical value is spread over devices, from its sources' layouts (README
// "Multi-device"): a MULTI says it; element-wise ops take a sharded operand's layout (else
// a replicated one's); movement ops and markers keep their source's, the shard axis
// following a PERMUTE; a REDUCE_AXIS over the shard axis, like an ALLREDUCE, leaves the
// value replicated. MSELECT and COPY give single-device values. Only MSELECT and
// ALLREDUCE of something other than a MULTI need this.
void TensorInterp::note_layout(const UOp* u) {
  auto of = [&](const UOp* s) -> const Layout* {
    auto it = layouts_.find(s);
    return it == layouts_.end() ? nullptr : &it->second;
  };
  std::optional<Layout> l;
  if (u->is(Op::MULTI)) {
    l = Layout{u->num_src(), u->arg_as<IntArg>().value, {}};
    if (l->axis >= 0)
      for (const HostTensor& p : parts_.at(u)) l->splits.push_back(p.shape.at(l->axis));
  } else if (u->is(Op::ALLREDUCE)) {
    if (const Layout* s = of(u->src(0))) l = Layout{s->devices, -1, {}};
    else if (u->src(0)->is(Op::MULTI)) l = Layout{u->src(0)->num_src(), -1, {}};
  } else if (is_scalar_op(u->op())) {
    for (const UOp* s : u->src())
      if (const Layout* ls = of(s); ls && (!l || (l->axis < 0 && ls->axis >= 0))) l = *ls;
  } else if (u->is(Op::REDUCE_AXIS)) {
    if (const Layout* s = of(u->src(0))) {
      l = *s;
      const auto& axes = u->arg_as<ReduceAxisArg>().axes;
      if (l->axis >= 0 && std::find(axes.begin(), axes.end(), l->axis) != axes.end()) l = Layout{s->devices, -1, {}};
    }
  } else if (u->is(Op::PERMUTE)) {
    if (const Layout* s = of(u->src(0))) {
      l = *s;
      const auto& perm = u->arg_as<IntsArg>().values;
      if (l->axis >= 0) l->axis = std::find(perm.begin(), perm.end(), l->axis) - perm.begin();
    }
  } else if (is_movement(u->op()) || u->is(Op::CONTIGUOUS) || u->is(Op::CONTIGUOUS_BACKWARD) || u->is(Op::DETACH) ||
             u->is(Op::PRECAST) || u->is(Op::AFTER)) {
    if (const Layout* s = of(u->src(0))) l = *s;
  }
  if (l) layouts_.emplace(u, std::move(*l));
}

// The per-device values of multi-device node m: a MULTI's shards as given, else m's
// logical value cut (sharded) or repeated (replicated) by its layout.
absl::StatusOr<std::vector<HostTensor>> TensorInterp::shards_of(const UOp* user, const UOp* m) {
  if (auto it = parts_.find(m); it != parts_.end()) return it->second;
  auto l = layouts_.find(m);
  if (l == layouts_.end()) return namer_.error(user, cat("its source ", op_name(m->op()), " is not a multi-device value"));
  const HostTensor& whole = values_.at(m);
  std::vector<HostTensor> out;
  if (l->second.axis < 0) {
    out.assign(l->second.devices, whole);
    return out;
  }
  const int64_t axis = l->second.axis;
  int64_t begin = 0;
  for (int64_t size : l->second.splits) {
    std::vector<int64_t> shape = whole.shape;
    shape[axis] = size;
    auto part = alloc(user, whole.dtype, shape);
    if (!part.ok()) return part.status();
    gather(whole, *part, [&](const auto& o, auto& ic) {
      for (size_t k = 0; k < o.size(); ++k) ic[k] = o[k] + (static_cast<int64_t>(k) == axis ? begin : 0);
    });
    begin += size;
    out.push_back(*std::move(part));
  }
  return out;
}

// MULTI, MSELECT, ALLREDUCE (README "Multi-device"); `out` is zeros of u's shape.
absl::StatusOr<HostTensor> TensorInterp::eval_multi(const UOp* u, HostTensor out) {
  auto check_shape = [&](const HostTensor& t, std::string_view what) -> absl::Status {
    if (t.shape == out.shape && t.dtype == out.dtype) return absl::OkStatus();
    return namer_.error(u, cat(what, " is ", t.str(0), " for a result of ", shape_str(out.shape), " x ",
                               scalar_name(out.dtype)));
  };
  if (u->is(Op::MULTI)) {
    // The logical value: the shards concatenated along the axis, or (replicated) shard 0.
    const int64_t axis = u->arg_as<IntArg>().value;
    std::vector<HostTensor> parts;
    for (const UOp* s : u->src()) parts.push_back(values_.at(s));
    if (axis < 0) {
      if (absl::Status st = check_shape(parts[0], "shard 0"); !st.ok()) return st;
      out = parts[0];
    } else {
      int64_t begin = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        const HostTensor& p = parts[i];
        if (p.shape.size() != out.shape.size() || axis >= static_cast<int64_t>(p.shape.size()) ||
            begin + p.shape[axis] > out.shape[axis])
          return namer_.error(u, cat("shard ", i, " ", shape_str(p.shape), " does not fit ", shape_str(out.shape)));
        // out[.., begin + j, ..] = p[.., j, ..]: scatter by gathering each shard into its rows.
        std::vector<int64_t> c(p.shape.size(), 0);
        for (int64_t k = 0; k < p.numel(); ++k, next_coords(c, p.shape)) {
          std::vector<int64_t> oc = c;
          oc[axis] += begin;
          out.set_bits(flat_of(oc, out.shape), p.get_bits(k));
        }
        begin += p.shape[axis];
      }
      if (begin != out.shape[axis]) return namer_.error(u, "the shards do not add up to the whole");
    }
    parts_.emplace(u, std::move(parts));
    return out;
  }
  const UOp* m = u->src(0);
  if (u->is(Op::MSELECT)) {
    const int64_t i = u->arg_as<IntArg>().value;
    // Every device holds a collective's whole result.
    if (m->is(Op::ALLREDUCE)) {
      auto l = layouts_.find(m);
      if (i < 0 || (l != layouts_.end() && i >= static_cast<int64_t>(l->second.devices)))
        return namer_.error(u, cat("device ", i, " is not a member of the collective"));
      const HostTensor& v = values_.at(m);
      if (absl::Status st = check_shape(v, "the collective's result"); !st.ok()) return st;
      return v;
    }
    auto shards = shards_of(u, m);
    if (!shards.ok()) return shards.status();
    if (i < 0 || i >= static_cast<int64_t>(shards->size()))
      return namer_.error(u, cat("shard ", i, " of a value on ", shards->size(), " devices"));
    if (absl::Status st = check_shape((*shards)[i], cat("shard ", i)); !st.ok()) return st;
    return std::move((*shards)[i]);
  }
  // ALLREDUCE: every device ends with the fold of all parts in device order, element by
  // element, with the reduce op's combine (as eval.h defines it).
  auto shards = shards_of(u, m);
  if (!shards.ok()) return shards.status();
  const auto* dev = u->src(1)->arg_if<DeviceArg>();
  if (!u->src(1)->is(Op::DEVICE) || !dev || dev->devices.size() != shards->size())
    return namer_.error(u, cat("an ALLREDUCE over ", shards->size(), " parts needs a DEVICE of as many devices"));
  const ReduceOp rop = u->arg_as<ReduceOpArg>().op;
  const Op combine = reduce_combine_op(rop);
  const Scalar t = out.dtype;
  const ConstValue id = reduce_identity(rop, t);
  const ConstValue probe[2] = {id, id};
  if (!eval_alu(combine, t, probe)) return namer_.error(u, cat(reduce_op_name(rop), " is not defined on ", scalar_name(t)));
  for (size_t k = 0; k < shards->size(); ++k)
    if (absl::Status st = check_shape((*shards)[k], cat("part ", k)); !st.ok()) return st;
  out = (*shards)[0];
  ConstValue args[2];
  for (int64_t i = 0; i < out.numel(); ++i) {
    args[0] = out.get(i);
    for (size_t k = 1; k < shards->size(); ++k) {
      args[1] = (*shards)[k].get(i);
      args[0] = *eval_alu(combine, t, args);
    }
    out.set(i, args[0]);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<HostTensor>> interpret(Graph& g, const UOp* sink, const Inputs& inputs,
                                                  const InterpOptions& options) {
  return TensorInterp(g, sink, inputs, options).run();
}

}  // namespace uop
