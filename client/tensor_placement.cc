// Placement: how the frontend keeps every op it builds inside the README's multi-device
// contract. An ALU op's operands are first brought to one placement (to_placement): a
// replicated operand meeting a sharded one is cut per shard (MSELECT, SHRINK, EXPAND), a
// single-device one is copied there (SHRINK, COPY), and device-less constants are left to
// broadcast. A movement op that would touch the shard axis first replicates the tensor
// (gather to one device, COPY to the others). shard() and to() are the same machinery.
//
// Every layout change is recorded as a relayout of the tensor it came from
// (NodeInfo::relayout_of), so autograd sends gradients straight back to that tensor and
// never differentiates the MSELECT / COPY / MULTI scaffolding.
#include <algorithm>

#include "client/tensor_internal.h"

namespace uop::client {
namespace detail {
namespace {

Graph& graph_of(const Tensor& x) { return x.context()->graph(); }

// Shard i of a MULTI: a single-device tensor on the i-th device.
Tensor mselect(const Tensor& x, size_t i) {
  const Placement& p = x.placement();
  const UOp* u = graph_of(x).make(Op::MSELECT, x.node()->dtype(), {x.node()}, IntArg{static_cast<int64_t>(i)});
  return make(x.context(), u, NodeInfo{shard_shape(x.shape(), p, i), Placement::on(p.devices[i])}, x.impl()->leaves);
}

// A single-device tensor's value on `device`.
Tensor copy_to(const Tensor& x, const std::string& device) {
  if (x.placement().devices[0] == device) return x;
  const UOp* u = graph_of(x).make(Op::COPY, x.node()->dtype(), {x.node(), x.context()->device_node(device)});
  return make(x.context(), u, NodeInfo{x.shape(), Placement::on(device)}, x.impl()->leaves);
}

Tensor multi(std::vector<Tensor> shards, const Placement& p, std::vector<int64_t> shape, const Tensor& of) {
  std::vector<const UOp*> src;
  for (const Tensor& s : shards) src.push_back(s.node());
  const UOp* u = graph_of(of).make(Op::MULTI, of.node()->dtype(), src, IntArg{p.axis});
  return make(of.context(), u, NodeInfo{std::move(shape), p, of.node()}, merge_leaves(shards));
}

// Marks y as a layout change of `of` (the same values, maybe on other devices).
Tensor relayout(const Tensor& y, const Tensor& of) {
  if (y.node() == of.node()) return y;
  return make(y.context(), y.node(), NodeInfo{y.shape(), y.placement(), of.node()}, y.impl()->leaves);
}

}  // namespace

HostTensor host_slice(const HostTensor& h, int64_t axis, int64_t begin, int64_t size) {
  std::vector<int64_t> shape = h.shape;
  const int64_t dim = shape[axis];
  shape[axis] = size;
  HostTensor out = HostTensor::zeros(h.dtype, shape);
  int64_t outer = 1, inner = h.itemsize();
  for (int64_t i = 0; i < axis; ++i) outer *= h.shape[i];
  for (size_t i = axis + 1; i < h.shape.size(); ++i) inner *= h.shape[i];
  for (int64_t o = 0; o < outer; ++o)
    out.data.replace(o * size * inner, size * inner, h.data, (o * dim + begin) * inner, size * inner);
  return out;
}

Tensor raw_reshape(const Tensor& x, std::vector<int64_t> shape) {
  if (shape == x.shape()) return x;
  Graph& g = graph_of(x);
  const UOp* u = g.make(Op::RESHAPE, x.node()->dtype(), {x.node(), shape_operand(g, shape)});
  return make(x.context(), u, NodeInfo{std::move(shape), x.placement()}, x.impl()->leaves);
}

Tensor raw_expand(const Tensor& x, std::vector<int64_t> shape) {
  if (shape == x.shape()) return x;
  UOP_TENSOR_CHECK(shape.size() == x.shape().size(), "expand of ", shape_str(x.shape()), " to ", shape_str(shape));
  Graph& g = graph_of(x);
  const UOp* u = g.make(Op::EXPAND, x.node()->dtype(), {x.node(), shape_operand(g, shape)});
  return make(x.context(), u, NodeInfo{std::move(shape), x.placement()}, x.impl()->leaves);
}

Tensor raw_shrink(const Tensor& x, std::vector<int64_t> begins, std::vector<int64_t> ends) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < begins.size(); ++i) out.push_back(ends[i] - begins[i]);
  if (out == x.shape() && std::all_of(begins.begin(), begins.end(), [](int64_t b) { return b == 0; })) return x;
  Graph& g = graph_of(x);
  const UOp* u = g.make(Op::SHRINK, x.node()->dtype(), {x.node(), shape_operand(g, begins), shape_operand(g, ends)});
  return make(x.context(), u, NodeInfo{std::move(out), x.placement()}, x.impl()->leaves);
}

Tensor raw_pad(const Tensor& x, std::vector<int64_t> begins, std::vector<int64_t> ends) {
  std::vector<int64_t> out = x.shape();
  bool any = false;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] += begins[i] + ends[i];
    any |= begins[i] != 0 || ends[i] != 0;
  }
  if (!any) return x;
  Graph& g = graph_of(x);
  const UOp* u = g.make(Op::PAD, x.node()->dtype(), {x.node(), shape_operand(g, begins), shape_operand(g, ends)});
  return make(x.context(), u, NodeInfo{std::move(out), x.placement()}, x.impl()->leaves);
}

Placement common_placement(std::span<const Tensor> xs) {
  for (const Tensor& x : xs)
    if (x.placement().sharded()) return x.placement();
  for (const Tensor& x : xs)
    if (x.placement().replicated()) return x.placement();
  for (const Tensor& x : xs)
    if (x.placement().single()) return x.placement();
  return Placement{};
}

Tensor to_placement(const Tensor& x, const std::vector<int64_t>& shape, const Placement& target) {
  const Placement from = x.placement();
  UOP_TENSOR_CHECK(x.shape().size() == shape.size(), "to_placement: rank ", x.ndim(), " to ", shape_str(shape));
  if (from.constant() || from == target) return raw_expand(x, shape);  // constants broadcast into every shard
  if (target.single()) return raw_expand(x.to(target.devices[0]), shape);
  if (target.replicated()) {
    const Tensor src = from.single() ? x : x.to(target.devices[0]);
    std::vector<Tensor> shards;
    for (const std::string& d : target.devices) shards.push_back(copy_to(src, d));
    return raw_expand(multi(std::move(shards), target, x.shape(), x), shape);
  }
  // Sharded: each device takes its slice of the shard axis (or broadcasts a 1 there) from
  // its own replica, or from one single-device copy.
  const bool own_replica = from.replicated() && from.devices == target.devices;
  const Tensor src = from.single() || own_replica ? x : x.to(target.devices[0]);
  const int64_t a = target.axis;
  std::vector<Tensor> shards;
  for (size_t i = 0; i < target.devices.size(); ++i) {
    Tensor s = own_replica ? mselect(src, i) : src;
    if (x.shape()[a] != 1) {
      std::vector<int64_t> begins(shape.size(), 0), ends = s.shape();
      begins[a] = target.offset(i);
      ends[a] = begins[a] + target.splits[i];
      s = raw_shrink(s, begins, ends);
    }
    s = copy_to(s, target.devices[i]);
    shards.push_back(raw_expand(s, shard_shape(shape, target, i)));
  }
  return multi(std::move(shards), target, shape, x);
}

Tensor replicated_for_movement(const Tensor& x) {
  return to_placement(x, x.shape(), Placement::replicate(x.placement().devices));
}

}  // namespace detail

using namespace detail;

Tensor Tensor::to(const std::string& device) const {
  const Placement& p = placement();
  if (p.constant() || (p.single() && p.devices[0] == device)) return *this;
  if (p.single()) return relayout(copy_to(*this, device), *this);
  if (p.replicated()) {
    auto it = std::find(p.devices.begin(), p.devices.end(), device);
    if (it != p.devices.end()) return relayout(mselect(*this, it - p.devices.begin()), *this);
    return relayout(copy_to(mselect(*this, 0), device), *this);
  }
  // Gather: one COPY of the whole multi-device value, which the multi pass turns into
  // per-shard copies stitched together on `device` (passes/multi.cc, "copy.gather").
  // (Building it here from MSELECTs of the shards would need shape inference to know a
  // lazy sharded value's shard shapes, and a sum of zero-padded parts loses -0.0.)
  const UOp* u = context()->graph().make(Op::COPY, node()->dtype(), {node(), context()->device_node(device)});
  return make(context(), u, NodeInfo{shape(), Placement::on(device), node()}, impl_->leaves);
}

Tensor Tensor::shard(std::vector<std::string> devices, int64_t axis) const {
  UOP_TENSOR_CHECK(!devices.empty(), "shard over no devices");
  if (devices.size() == 1) return to(devices[0]);
  const Placement target = axis < 0 ? Placement::replicate(std::move(devices))
                                    : Placement::shard(std::move(devices), normalize_axis(axis, ndim()),
                                                       shape()[normalize_axis(axis, ndim())]);
  if (placement() == target) return *this;
  // Host data that needs no gradient is cut here and uploaded per device: a new leaf.
  if (realized() && placement().single() && !requires_grad() && impl_->data[0]->host) {
    const HostTensor& h = *impl_->data[0]->host;
    LeafSet data;
    for (size_t i = 0; i < target.devices.size(); ++i) {
      auto s = std::make_shared<LeafStorage>();
      s->dtype = dtype();
      s->shape = shard_shape(shape(), target, i);
      s->device = target.devices[i];
      s->host = target.sharded() ? host_slice(h, target.axis, target.offset(i), target.splits[i]) : h;
      s->host->shape = s->shape;
      data.push_back(std::move(s));
    }
    return leaf(context(), std::move(data), target, shape());
  }
  return to_placement(*this, shape(), target);
}

}  // namespace uop::client
