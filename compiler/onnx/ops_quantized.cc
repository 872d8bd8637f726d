// The integer and quantized MatMul / Conv (MatMulInteger, ConvInteger, QLinearMatMul,
// QLinearConv): operands minus their zero points in int32, the product accumulated in
// int32 by the float forms' matmul / conv_core; the QLinear forms then requantize.
#include "compiler/onnx/ops_matmul_conv.h"

namespace uop::onnx_import {

namespace {

// A zero point or scale of a matmul operand: a scalar, or per row of A ([M] -> [M, 1]) /
// per column of B ([N] stays [N]).
absl::StatusOr<const UOp*> mm_param(NodeContext& c, int i, bool rows) {
  ONNX_ASSIGN(const UOp* p, c.in(i));
  const Dims ps = c.shape_of(p);
  if (numel_of(ps) == 1) return c.tb().reshape(p, {});
  if (ps.size() != 1) return c.unsupported("a zero point or scale of rank > 1");
  return rows ? c.tb().reshape(p, {ps[0], 1}) : p;
}

// x - zero_point in int32 (input `zi` may be omitted).
absl::StatusOr<const UOp*> minus_zp(NodeContext& c, const UOp* x, int zi, bool rows, bool conv_w = false) {
  Math m(c.tb());
  const UOp* v = m.cast(x, Scalar::Int32);
  if (!c.has(zi)) return v;
  const UOp* zp;
  if (conv_w) {
    // Conv weights: per output channel ([M] -> [M, 1, 1...]).
    ONNX_ASSIGN(zp, c.in(zi));
    const Dims zs = c.shape_of(zp);
    if (numel_of(zs) == 1) {
      zp = c.tb().reshape(zp, {});
    } else {
      Dims r(c.shape_of(x).size(), 1);
      r[0] = numel_of(zs);
      zp = c.tb().reshape(zp, r);
    }
  } else {
    ONNX_ASSIGN(zp, mm_param(c, zi, rows));
  }
  return m.sub(v, m.cast(zp, Scalar::Int32));
}

absl::StatusOr<const UOp*> conv_int32(NodeContext& c, const UOp* x, const UOp* w) {
  const Dims xs = c.shape_of(x), ws = c.shape_of(w);
  if (xs.size() < 3 || ws.size() != xs.size()) return c.invalid("X and W must be [N, C, D...] and [M, C/group, K...]");
  Dims kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(ws.begin() + 2, ws.end());
  ONNX_ASSIGN(Geometry g, geometry(c, Dims(xs.begin() + 2, xs.end()), kernel));
  return conv_core(c, x, w, g, c.attr_int("group", 1));
}

// round_half_even(v * scale) + zero_point, saturated to the zero point's type.
absl::StatusOr<const UOp*> requantize(NodeContext& c, const UOp* acc, const UOp* scale, int zi) {
  Math m(c.tb());
  const UOp* q = m.round_even(m.mul(m.cast(acc, Scalar::Float32), m.cast(scale, Scalar::Float32)));
  Scalar to = Scalar::UInt8;
  if (c.has(zi)) {
    ONNX_ASSIGN(const UOp* zp, c.in(zi));
    to = c.dtype_of(zp);
    q = m.add(q, m.cast(c.tb().reshape(zp, {}), Scalar::Float32));
  }
  double lo = to == Scalar::Int8 ? -128 : 0, hi = to == Scalar::Int8 ? 127 : 255;
  if (to != Scalar::Int8 && to != Scalar::UInt8) return c.unsupported(cat("output type ", scalar_name(to)));
  q = m.min(m.max(q, m.k(q, lo)), m.k(q, hi));
  return m.cast(q, to);
}

absl::Status matmul_integer(NodeContext& c) {
  ONNX_ASSIGN(const UOp* a, c.in(0));
  ONNX_ASSIGN(const UOp* b, c.in(1));
  ONNX_ASSIGN(a, minus_zp(c, a, 2, true));
  ONNX_ASSIGN(b, minus_zp(c, b, 3, false));
  ONNX_ASSIGN(const UOp* y, matmul(c, a, b));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status conv_integer(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* w, c.in(1));
  ONNX_ASSIGN(x, minus_zp(c, x, 2, false));
  ONNX_ASSIGN(w, minus_zp(c, w, 3, false, true));
  ONNX_ASSIGN(const UOp* y, conv_int32(c, x, w));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status qlinear_matmul(NodeContext& c) {
  ONNX_ASSIGN(const UOp* a, c.in(0));
  ONNX_ASSIGN(const UOp* b, c.in(3));
  ONNX_ASSIGN(a, minus_zp(c, a, 2, true));
  ONNX_ASSIGN(b, minus_zp(c, b, 5, false));
  ONNX_ASSIGN(const UOp* acc, matmul(c, a, b));
  Math m(c.tb());
  ONNX_ASSIGN(const UOp* sa, mm_param(c, 1, true));
  ONNX_ASSIGN(const UOp* sb, mm_param(c, 4, false));
  ONNX_ASSIGN(const UOp* sy, mm_param(c, 6, false));
  const UOp* scale = m.div(m.mul(m.cast(sa, Scalar::Float32), m.cast(sb, Scalar::Float32)), m.cast(sy, Scalar::Float32));
  ONNX_ASSIGN(const UOp* y, requantize(c, acc, scale, 7));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status qlinear_conv(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* w, c.in(3));
  ONNX_ASSIGN(x, minus_zp(c, x, 2, false));
  ONNX_ASSIGN(w, minus_zp(c, w, 5, false, true));
  ONNX_ASSIGN(const UOp* acc, conv_int32(c, x, w));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const size_t r = c.shape_of(acc).size();
  if (c.has(8)) {
    ONNX_ASSIGN(const UOp* bias, c.in(8));
    Dims br(r, 1);
    br[1] = numel_of(c.shape_of(bias));
    acc = m.add(acc, m.cast(tb.reshape(bias, br), Scalar::Int32));
  }
  ONNX_ASSIGN(const UOp* sx, c.in(1));
  ONNX_ASSIGN(const UOp* sw, c.in(4));
  ONNX_ASSIGN(const UOp* sy, c.in(6));
  Dims wr(r, 1);
  wr[1] = numel_of(c.shape_of(sw));
  const UOp* swr = numel_of(c.shape_of(sw)) == 1 ? tb.reshape(sw, {}) : tb.reshape(sw, wr);
  const UOp* scale = m.div(m.mul(m.cast(tb.reshape(sx, {}), Scalar::Float32), m.cast(swr, Scalar::Float32)),
                           m.cast(tb.reshape(sy, {}), Scalar::Float32));
  ONNX_ASSIGN(const UOp* y, requantize(c, acc, scale, 7));
  c.out(0, y);
  return absl::OkStatus();
}

}  // namespace

void register_quantized(Registry& r) {
  r["MatMulInteger"] = {matmul_integer, {}};
  r["ConvInteger"] = {conv_integer, conv_attrs()};
  r["QLinearMatMul"] = {qlinear_matmul, {}};
  r["QLinearConv"] = {qlinear_conv, conv_attrs()};
}

}  // namespace uop::onnx_import
