// What the float products and windows (ops_matmul_conv.cc) share with their integer and
// quantized forms (ops_quantized.cc): MatMul's broadcasting product, the spatial geometry
// of a Conv, and the convolution itself. Internal to compiler/onnx.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

// NumPy matmul of a and b (rank 1 operands promoted and the added axis dropped again),
// batch dims broadcast; INVALID_ARGUMENT when the shapes do not multiply.
absl::StatusOr<const UOp*> matmul(NodeContext& c, const UOp* a, const UOp* b);

// Spatial geometry shared by Conv and the pools: kernel, strides, dilations and the pads
// that auto_pad / pads / ceil_mode give, per spatial axis.
struct Geometry {
  Dims kernel, strides, dilations;
  std::vector<int64_t> pad_b, pad_e;
};
absl::StatusOr<Geometry> geometry(NodeContext& c, const Dims& in_spatial, Dims kernel, bool ceil_mode = false);
// INVALID_ARGUMENT naming the attribute unless every kernel size, stride and dilation is
// in [1, 2^31): geometry() checks its own, ConvTranspose its.
absl::Status check_window_sizes(NodeContext& c, const Dims& kernel, const Dims& strides, const Dims& dilations);

// Conv of x [N, C, D...] with w [M, C/group, K...] over the geometry: the windows of the
// padded input times the weights, summed over channels and kernel positions.
absl::StatusOr<const UOp*> conv_core(NodeContext& c, const UOp* x, const UOp* w, const Geometry& g, int64_t group);

// The attributes every Conv form (float, integer, QLinear) understands.
const std::vector<std::string>& conv_attrs();

}  // namespace uop::onnx_import
