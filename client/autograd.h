// Reverse-mode autograd over the frontend's tensor graphs. It builds the gradient graph
// (more nodes in the same context) and runs nothing: realize the gradients, or tensors
// made from them (an SGD update), like any other tensor.
//
// The walk goes over the loss's nodes in reverse toposort order; each op has a
// vector-Jacobian rule written with the frontend's own ops, so gradient graphs follow the
// same broadcasting and placement rules as forward ones. Where a node is used more than
// once its gradients are summed. DETACH, comparisons and integer ops pass no gradient;
// leaves (BUFFER-backed tensors) end the walk. Layout changes the frontend built (shard,
// to, reshards) pass the gradient straight to the tensor they came from, summed over what
// they broadcast and brought back to its placement: for a replicated weight used with a
// batch sharded on axis 0 that sum is a REDUCE_AXIS over the shard axis, which the multi
// pass turns into the ALLREDUCE of the gradients.
#pragma once

#include <vector>

#include "client/tensor.h"

namespace uop::client {

// d(loss)/d(x) for each x of `wrt` (leaves or intermediate tensors of loss's graph), seeded
// with `seed` (default: ones of loss's shape). An x the loss does not depend on gets zeros.
std::vector<Tensor> gradients(const Tensor& loss, const std::vector<Tensor>& wrt, const Tensor& seed = {});

// Adds d(loss)/d(x) to x.grad() for every tensor x with requires_grad that loss depends on
// (grad() starts undefined; a second backward accumulates, as in PyTorch).
void backward(const Tensor& loss, const Tensor& seed = {});

}  // namespace uop::client
