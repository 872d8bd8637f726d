// What the frontend's files share and its users do not see: the state behind a Tensor
// handle, the helpers that make tensors from nodes, and the placement machinery
// (tensor_placement.cc) that the ops, autograd and realize all go through.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/tensor.h"
#include "compiler/support/strings.h"

namespace uop::client {

using LeafSet = std::vector<std::shared_ptr<LeafStorage>>;

struct TensorImpl {
  ContextPtr ctx;
  const UOp* node = nullptr;
  // Every leaf the graph under `node` reads, kept alive while this tensor is (the context
  // holds leaf data only weakly, so data nobody can reach any more is freed).
  std::shared_ptr<const LeafSet> leaves;
  // A leaf's own data, one per shard in device order; empty for a lazy tensor.
  LeafSet data;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
};

namespace detail {

// A broken invariant of the calling program (a shape or dtype mistake): print and abort.
[[noreturn]] void fail(const std::string& message);
#define UOP_TENSOR_CHECK(cond, ...) \
  do {                               \
    if (!(cond)) ::uop::client::detail::fail(::uop::cat(__VA_ARGS__)); \
  } while (0)

// A tensor for `node` (recorded with `info`), holding `leaves`.
Tensor make(const ContextPtr& ctx, const UOp* node, NodeInfo info, std::shared_ptr<const LeafSet> leaves);
// A tensor for a node already recorded in ctx.
Tensor wrap(const ContextPtr& ctx, const UOp* node, std::shared_ptr<const LeafSet> leaves);
// The union of the operands' leaves (shared, not copied, when one operand has them all).
std::shared_ptr<const LeafSet> merge_leaves(std::span<const Tensor> xs);
// A leaf tensor over `data` (one storage per shard of `placement`).
Tensor leaf(const ContextPtr& ctx, LeafSet data, const Placement& placement, std::vector<int64_t> shape);
const UOp* shape_operand(Graph& g, const std::vector<int64_t>& dims);
int64_t normalize_axis(int64_t axis, int64_t rank);
std::vector<int64_t> shard_shape(const std::vector<int64_t>& shape, const Placement& p, size_t i);
// `size` entries of h along `axis` from `begin` (a shard of host data).
HostTensor host_slice(const HostTensor& h, int64_t axis, int64_t begin, int64_t size);

// ---- tensor_placement.cc
// Movement ops as nodes, no placement check (callers made sure they are legal).
Tensor raw_reshape(const Tensor& x, std::vector<int64_t> shape);
Tensor raw_expand(const Tensor& x, std::vector<int64_t> shape);
Tensor raw_shrink(const Tensor& x, std::vector<int64_t> begins, std::vector<int64_t> ends);
Tensor raw_pad(const Tensor& x, std::vector<int64_t> begins, std::vector<int64_t> ends);
// `x` (of `shape`'s rank, broadcastable to it) broadcast to `shape` with `target`'s
// placement: the reshard every ALU operand goes through. Records a relayout when the
// placement changes.
Tensor to_placement(const Tensor& x, const std::vector<int64_t>& shape, const Placement& target);
// The placement ALU operands (all of one rank) are brought to.
Placement common_placement(std::span<const Tensor> xs);
// Whether a movement op on a sharded tensor leaves the shard axis alone (README): if not,
// the op gathers the tensor first (replicated).
Tensor replicated_for_movement(const Tensor& x);

}  // namespace detail
}  // namespace uop::client
