// Small helpers the ops_*.cc handler files share: broadcasting model operands together,
// host-side constants made into BUFFERs (iota, masks), and reading optional inputs.
// Internal to compiler/onnx.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/onnx/composites.h"
#include "compiler/onnx/import_context.h"
#include "compiler/onnx/tensor_proto.h"

namespace uop::onnx_import {

// The operands broadcast (NumPy rules) to their common shape; INVALID_ARGUMENT when they
// do not broadcast.
absl::StatusOr<std::vector<const UOp*>> broadcast_all(NodeContext& c, std::vector<const UOp*> xs);
// Every input i (in order, skipping omitted ones) as a node.
absl::StatusOr<std::vector<const UOp*>> all_inputs(NodeContext& c);
// A constant tensor of host data as a node (a BUFFER bound to it; a CONST if one element).
const UOp* host_constant(NodeContext& c, HostTensor t);
// 0, 1, ..., n-1 of `dtype`, shaped [n] then reshaped to `shape` (which holds n once and
// 1 elsewhere), for index arithmetic in masks.
const UOp* iota(NodeContext& c, int64_t n, Scalar dtype, std::vector<int64_t> shape);
// The numel of a shape.
int64_t numel_of(const Dims& d);
// Row-major strides... and shape helpers.
Dims with_axis_removed(const Dims& d, int64_t axis);
// Concatenation of same-rank tensors along `axis` (pads + sum; OR for bool).
const UOp* concat(TensorBuilder& tb, const std::vector<const UOp*>& xs, int64_t axis);
// x[begin:end:step] along `axis` (step may be negative; begin/end already clamped to the
// valid range for the step's direction, as Python's slice.indices gives them).
const UOp* slice_axis(TensorBuilder& tb, const UOp* x, int64_t axis, int64_t begin, int64_t end, int64_t step);
// Windows of the last axis: [..., n] -> [..., K, O] with out[..., k, o] = x[..., o*s + k*d].
const UOp* windows_last(TensorBuilder& tb, const UOp* x, int64_t K, int64_t s, int64_t d);
// The identity element of a reduce for a dtype: 0, 1, lowest, highest.
ConstValue reduce_identity(ReduceOp op, Scalar s);
// Gather along axis with the indices given as a node (any int dtype; negative indices
// count from the end): one-hot compare and sum.
absl::StatusOr<const UOp*> gather(NodeContext& c, const UOp* data, const UOp* indices, int64_t axis);

}  // namespace uop::onnx_import
