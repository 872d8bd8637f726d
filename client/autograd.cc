// Reverse-mode autograd (autograd.h): one vector-Jacobian rule per op, written with the
// frontend's ops, applied in reverse toposort order.
#include "client/autograd.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "client/tensor_internal.h"

namespace uop::client {
namespace {

using detail::wrap;

std::vector<int64_t> operand_values(const UOp* shape_operand) {
  std::vector<int64_t> v;
  for (const ConstValue& c : shape_operand->arg_as<VConstArg>().values) v.push_back(c.to_int());
  return v;
}

// g summed over the axes `shape` broadcast (a 1 where g has more); ranks are equal.
Tensor sum_to(const Tensor& g, const std::vector<int64_t>& shape) {
  std::vector<int64_t> axes;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 1 && g.shape()[i] != 1) axes.push_back(static_cast<int64_t>(i));
  return axes.empty() ? g : g.sum(axes, true);
}

class Walk {
 public:
  Walk(ContextPtr ctx, std::shared_ptr<const LeafSet> leaves) : ctx_(std::move(ctx)), leaves_(std::move(leaves)) {}

  // Which nodes lie on a path from a target up to the root, in toposort order.
  void mark(const std::vector<const UOp*>& topo, const absl::flat_hash_set<const UOp*>& targets) {
    for (const UOp* u : topo) {
      bool on = targets.contains(u);
      const NodeInfo* info = ctx_->find(u);
      if (!on && info && !info->leaf && !u->is(Op::DETACH))
        for (const UOp* s : u->src()) on = on || needs_.contains(s);
      if (on) needs_.insert(u);
    }
  }

  void seed(const UOp* root, Tensor g) { grads_.emplace(root, std::move(g)); }

  void run(const std::vector<const UOp*>& topo) {
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      const UOp* u = *it;
      auto g = grads_.find(u);
      if (g == grads_.end() || !needs_.contains(u)) continue;
      const NodeInfo* info = ctx_->find(u);
      if (!info || info->leaf) continue;
      const Tensor grad = g->second;  // a copy: rules add to grads_
      if (info->relayout_of) {
        relayout(info->relayout_of, grad);
      } else {
        rule(u, grad);
      }
    }
  }

  Tensor grad(const UOp* u) const {
    auto it = grads_.find(u);
    return it == grads_.end() ? Tensor() : it->second;
  }

 private:
  Tensor t(const UOp* u) const { return wrap(ctx_, u, leaves_); }

  void add(const UOp* u, const Tensor& g) {
    if (!needs_.contains(u)) return;
    auto [it, fresh] = grads_.try_emplace(u, g);
    if (!fresh) it->second = it->second + g;
  }

  // A layout change: the gradient goes to the tensor it came from, summed over what the
  // change broadcast, on that tensor's placement.
  void relayout(const UOp* from, const Tensor& g) {
    const NodeInfo& x = ctx_->info(from);
    Tensor gx = sum_to(g, x.shape);
    if (!gx.placement().constant() && gx.placement() != x.placement)
      gx = detail::to_placement(gx, x.shape, x.placement);
    add(from, gx);
  }

  void rule(const UOp* u, const Tensor& g) {
    auto src = [&](size_t i) { return t(u->src(i)); };
    auto need = [&](size_t i) { return needs_.contains(u->src(i)); };
    const Tensor out = t(u);
    const double ln2 = std::log(2.0);
    switch (u->op()) {
      case Op::ADD: add(u->src(0), g); add(u->src(1), g); return;
      case Op::SUB:
        add(u->src(0), g);
        if (need(1)) add(u->src(1), -g);
        return;
      case Op::MUL:
        if (need(0)) add(u->src(0), g * src(1));
        if (need(1)) add(u->src(1), g * src(0));
        return;
      case Op::FDIV:
        if (need(0)) add(u->src(0), g / src(1));
        if (need(1)) add(u->src(1), -(g * out) / src(1));
        return;
      case Op::NEG: add(u->src(0), -g); return;
      case Op::EXP2: add(u->src(0), g * out * ln2); return;
      case Op::LOG2: add(u->src(0), g / (src(0) * ln2)); return;
      case Op::SQRT: add(u->src(0), g / (out * 2.0)); return;
      case Op::RECIPROCAL: add(u->src(0), -(g * out * out)); return;
      case Op::MAX: case Op::MIN: {
        // The larger (smaller) side takes the gradient; a tie splits it evenly.
        const Tensor a = src(0), b = src(1);
        const Tensor wins = u->is(Op::MAX) ? a.gt(b) : a.lt(b);
        const Tensor one = Tensor::full({}, 1, g.dtype(), ctx_), half = Tensor::full({}, 0.5, g.dtype(), ctx_),
                     zero = Tensor::full({}, 0, g.dtype(), ctx_);
        const Tensor share = where(wins, one, where(a.eq(b), half, zero));
        if (need(0)) add(u->src(0), g * share);
        if (need(1)) add(u->src(1), g * (1.0 - share));
        return;
      }
      case Op::WHERE: {
        const Tensor zero = Tensor::full({}, 0, g.dtype(), ctx_);
        if (need(1)) add(u->src(1), where(src(0), g, zero));
        if (need(2)) add(u->src(2), where(src(0), zero, g));
        return;
      }
      case Op::CAST:
        if (scalar_is_float(u->src(0)->dtype().scalar)) add(u->src(0), g.cast(u->src(0)->dtype().scalar));
        return;
      case Op::REDUCE_AXIS: {
        const auto& arg = u->arg_as<ReduceAxisArg>();
        const Tensor x = src(0);
        if (arg.op == ReduceOp::Add) {
          add(u->src(0), g.expand(x.shape()));
        } else if (arg.op == ReduceOp::Max || arg.op == ReduceOp::Min) {
          // Split evenly among the elements equal to the result.
          const Tensor hit = x.eq(out).cast(g.dtype());
          add(u->src(0), hit * (g / hit.sum(arg.axes, true)));
        } else {
          detail::fail("no gradient rule for REDUCE_AXIS Mul");
        }
        return;
      }
      case Op::RESHAPE: add(u->src(0), g.reshape(src(0).shape())); return;
      case Op::EXPAND: add(u->src(0), sum_to(g, src(0).shape())); return;
      case Op::PERMUTE: {
        const auto& perm = u->arg_as<IntsArg>().values;
        std::vector<int64_t> inverse(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
        add(u->src(0), g.permute(inverse));
        return;
      }
      case Op::PAD: {
        std::vector<int64_t> begins = operand_values(u->src(1)), ends = begins;
        const auto& shape = src(0).shape();
        for (size_t i = 0; i < ends.size(); ++i) ends[i] += shape[i];
        add(u->src(0), g.shrink(begins, ends));
        return;
      }
      case Op::SHRINK: {
        std::vector<int64_t> begins = operand_values(u->src(1)), ends = operand_values(u->src(2));
        const auto& shape = src(0).shape();
        for (size_t i = 0; i < ends.size(); ++i) ends[i] = shape[i] - ends[i];
        add(u->src(0), g.pad(begins, ends));
        return;
      }
      case Op::FLIP: {
        std::vector<int64_t> axes;
        const auto& flags = u->arg_as<BoolsArg>().values;
        for (size_t i = 0; i < flags.size(); ++i)
          if (flags[i]) axes.push_back(static_cast<int64_t>(i));
        add(u->src(0), g.flip(axes));
        return;
      }
      case Op::CONTIGUOUS: case Op::CONTIGUOUS_BACKWARD: add(u->src(0), g); return;
      case Op::COPY: add(u->src(0), g.to(src(0).placement().devices[0])); return;
      // No gradient: constants, comparisons and integer or bitwise ops are piecewise
      // constant; DETACH stops it by definition.
      case Op::CONST: case Op::DETACH: case Op::CMPLT: case Op::CMPNE: case Op::CMPEQ: case Op::AND: case Op::OR:
      case Op::XOR: case Op::IDIV: case Op::MOD: case Op::SHL: case Op::SHR: case Op::TRUNC:
        return;
      default:
        // MULTI / MSELECT only appear inside layout changes, which relayout() handles.
        detail::fail(cat("no gradient rule for ", op_name(u->op())));
    }
  }

  ContextPtr ctx_;
  std::shared_ptr<const LeafSet> leaves_;
  absl::flat_hash_set<const UOp*> needs_;
  absl::flat_hash_map<const UOp*, Tensor> grads_;
};

Walk walk(const Tensor& loss, const absl::flat_hash_set<const UOp*>& targets, const Tensor& seed,
          const std::vector<const UOp*>& topo) {
  UOP_TENSOR_CHECK(loss.defined(), "backward of an undefined tensor");
  Tensor s = seed.defined() ? seed : Tensor::ones(loss.shape(), loss.dtype(), loss.context());
  UOP_TENSOR_CHECK(s.shape() == loss.shape(), "backward: seed ", shape_str(s.shape()), " for loss ",
                   shape_str(loss.shape()));
  const Tensor both[] = {loss, s};
  Walk w(loss.context(), detail::merge_leaves(both));
  w.mark(topo, targets);
  w.seed(loss.node(), s);
  w.run(topo);
  return w;
}

}  // namespace

std::vector<Tensor> gradients(const Tensor& loss, const std::vector<Tensor>& wrt, const Tensor& seed) {
  absl::flat_hash_set<const UOp*> targets;
  for (const Tensor& x : wrt) targets.insert(x.node());
  const std::vector<const UOp*> topo = toposort(loss.node());
  Walk w = walk(loss, targets, seed, topo);
  std::vector<Tensor> out;
  for (const Tensor& x : wrt) {
    Tensor g = w.grad(x.node());
    out.push_back(g.defined() ? g : Tensor::zeros(x.shape(), x.dtype(), x.context()));
  }
  return out;
}

void backward(const Tensor& loss, const Tensor& seed) {
  const std::vector<const UOp*> topo = toposort(loss.node());
  absl::flat_hash_set<const UOp*> targets;
  std::vector<std::shared_ptr<TensorImpl>> watched;
  for (const UOp* u : topo)
    for (auto& t : loss.context()->watchers(u)) {
      targets.insert(u);
      watched.push_back(std::move(t));
    }
  if (watched.empty()) return;
  Walk w = walk(loss, targets, seed, topo);
  for (const auto& t : watched) {
    Tensor g = w.grad(t->node);
    if (!g.defined()) continue;
    t->grad = t->grad ? (Tensor(t->grad) + g).impl() : g.impl();
  }
}

void Tensor::backward(const Tensor& seed) const { client::backward(*this, seed); }

}  // namespace uop::client
