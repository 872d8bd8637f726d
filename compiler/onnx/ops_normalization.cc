// The normalizations: BatchNormalization (inference mode), InstanceNormalization,
// LayerNormalization, MeanVarianceNormalization, and LRN (a window sum over channels).
#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

// (x - mean) / sqrt(var + eps) over `axes`, in float32 at least; mean and 1/sqrt returned.
struct Normalized {
  const UOp* y;
  const UOp* mean;
  const UOp* inv_std;
};
Normalized normalize(TensorBuilder& tb, const UOp* x, const std::vector<int64_t>& axes, double eps) {
  Math m(tb);
  const Dims s = tb.shape(x);
  int64_t count = 1;
  for (int64_t a : axes) count *= s[a];
  const UOp* mean = m.div(m.reduce(x, ReduceOp::Add, axes), m.k(x, static_cast<double>(count)));
  const UOp* d = m.sub(x, tb.broadcast_to(mean, s));
  const UOp* var = m.div(m.reduce(m.mul(d, d), ReduceOp::Add, axes), m.k(x, static_cast<double>(count)));
  const UOp* inv = m.recip(m.sqrt(m.add(var, m.k(var, eps))));
  return {m.mul(d, tb.broadcast_to(inv, s)), mean, inv};
}

absl::Status batch_norm(NodeContext& c) {
  if (c.attr_int("training_mode", 0) != 0 || c.wants(1) || c.wants(2))
    return c.unsupported("training mode (running statistics outputs)");
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* scale, c.in(1));
  ONNX_ASSIGN(const UOp* bias, c.in(2));
  ONNX_ASSIGN(const UOp* mean, c.in(3));
  ONNX_ASSIGN(const UOp* var, c.in(4));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims s = c.shape_of(x);
  if (s.size() < 2) return c.invalid("X must have a channel axis");
  Dims cr(s.size(), 1);
  cr[1] = s[1];
  for (const UOp* p : {scale, bias, mean, var})
    if (c.shape_of(p) != Dims{s[1]}) return c.invalid("scale, B, mean and var must have one value per channel");
  auto ch = [&](const UOp* p) { return tb.broadcast_to(tb.reshape(p, cr), s); };
  const UOp* inv = m.recip(m.sqrt(m.add(var, m.k(var, c.attr_float("epsilon", 1e-5f)))));
  c.out(0, m.add(m.mul(m.mul(m.sub(x, ch(mean)), ch(inv)), ch(scale)), ch(bias)));
  return absl::OkStatus();
}

absl::Status instance_norm(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* scale, c.in(1));
  ONNX_ASSIGN(const UOp* bias, c.in(2));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims s = c.shape_of(x);
  if (s.size() < 3) return c.invalid("X must be [N, C, D...]");
  std::vector<int64_t> axes;
  for (size_t i = 2; i < s.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  Normalized n = normalize(tb, x, axes, c.attr_float("epsilon", 1e-5f));
  Dims cr(s.size(), 1);
  cr[1] = s[1];
  c.out(0, m.add(m.mul(n.y, tb.broadcast_to(tb.reshape(scale, cr), s)), tb.broadcast_to(tb.reshape(bias, cr), s)));
  return absl::OkStatus();
}

absl::Status layer_norm(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x0, c.in(0));
  ONNX_ASSIGN(const UOp* scale, c.in(1));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims s = c.shape_of(x0);
  const int64_t r = static_cast<int64_t>(s.size());
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", -1), r));
  std::vector<int64_t> axes;
  for (int64_t i = axis; i < r; ++i) axes.push_back(i);
  Scalar dt = c.dtype_of(x0);
  Scalar stash = c.attr_int("stash_type", 1) == 1 ? Scalar::Float32 : dt;
  if (dt == Scalar::Float64) stash = dt;
  const UOp* x = m.cast(x0, stash);
  Normalized n = normalize(tb, x, axes, c.attr_float("epsilon", 1e-5f));
  const UOp* y = m.cast(n.y, dt);
  ONNX_ASSIGN(Dims ss, c.broadcast({s, c.shape_of(scale)}));
  if (ss != s) return c.invalid("Scale does not broadcast to X");
  y = m.mul(y, tb.broadcast_to(scale, s));
  if (c.has(2)) {
    ONNX_ASSIGN(const UOp* b, c.in(2));
    y = m.add(y, tb.broadcast_to(b, s));
  }
  c.out(0, y);
  c.out(1, m.cast(n.mean, stash));
  c.out(2, m.cast(n.inv_std, stash));
  return absl::OkStatus();
}

absl::Status mvn(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims s = c.shape_of(x);
  std::vector<int64_t> axes = c.has_attr("axes") ? c.attr_ints("axes") : std::vector<int64_t>{0, 2, 3};
  ONNX_ASSIGN(axes, c.axes(axes, static_cast<int64_t>(s.size())));
  c.out(0, normalize(c.tb(), x, axes, 1e-9).y);
  return absl::OkStatus();
}

absl::Status lrn(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims s = c.shape_of(x);
  if (s.size() < 3) return c.invalid("X must be [N, C, D...]");
  int64_t size = c.attr_int("size", 0);
  if (size <= 0 || size >= (int64_t{1} << 31)) return c.invalid("size must be in [1, 2^31)");
  double alpha = c.attr_float("alpha", 1e-4f), beta = c.attr_float("beta", 0.75f), bias = c.attr_float("bias", 1.0f);
  // Channels moved last, padded by floor((size-1)/2) before and ceil after, windows of size.
  const int64_t r = static_cast<int64_t>(s.size());
  std::vector<int64_t> perm = {0};
  for (int64_t i = 2; i < r; ++i) perm.push_back(i);
  perm.push_back(1);
  const UOp* sq = tb.permute(m.mul(x, x), perm);
  std::vector<int64_t> b(r, 0), e(r, 0);
  b[r - 1] = (size - 1) / 2;
  e[r - 1] = size - 1 - (size - 1) / 2;
  const UOp* w = windows_last(tb, tb.pad(sq, b, e), size, 1, 1);  // [N, D..., size, C]
  const UOp* sum = tb.reduce(w, ReduceOp::Add, {r - 1});
  Dims ps = tb.shape(sq);
  sum = tb.reshape(sum, ps);
  std::vector<int64_t> back(r);
  for (int64_t i = 0; i < r; ++i) back[perm[i]] = i;
  sum = tb.permute(sum, back);
  const UOp* den = m.pow(m.add(m.k(x, bias), m.mul(m.k(x, alpha / static_cast<double>(size)), sum)), m.k(x, beta));
  c.out(0, m.div(x, den));
  return absl::OkStatus();
}

}  // namespace

void register_normalization(Registry& r) {
  r["BatchNormalization"] = {batch_norm, {"epsilon", "momentum", "training_mode", "spatial"}};
  r["InstanceNormalization"] = {instance_norm, {"epsilon"}};
  r["LayerNormalization"] = {layer_norm, {"axis", "epsilon", "stash_type"}};
  r["MeanVarianceNormalization"] = {mvn, {"axes"}};
  r["LRN"] = {lrn, {"alpha", "beta", "bias", "size"}};
}

}  // namespace uop::onnx_import
