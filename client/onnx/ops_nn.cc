// Neural-network operators: MatMul, Gemm, Conv / ConvTranspose and pooling written as
// windows (op_helpers.h windows_last: movement ops) plus reductions, and the
// normalizations (BatchNormalization in inference mode, InstanceNormalization,
// LayerNormalization, MeanVarianceNormalization, LRN), the integer / QLinear MatMul and Conv
// forms, and Resize / Upsample (per-axis resampling matrices worked out at import).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "client/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

absl::StatusOr<const UOp*> matmul(NodeContext& c, const UOp* a, const UOp* b) {
  TensorBuilder& tb = c.tb();
  Dims sa = c.shape_of(a), sb = c.shape_of(b);
  if (sa.empty() || sb.empty()) return c.invalid("operands must have rank 1 or more");
  if (c.dtype_of(a) != c.dtype_of(b)) return c.invalid("operands of different types");
  bool va = sa.size() == 1, vb = sb.size() == 1;
  if (va) sa.insert(sa.begin(), 1);
  if (vb) sb.push_back(1);
  if (sa.back() != sb[sb.size() - 2]) return c.invalid(cat("shapes ", shape_str(sa), " and ", shape_str(sb), " do not multiply"));
  Dims ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  ONNX_ASSIGN(Dims batch, c.broadcast({ba, bb}));
  Dims fa = batch, fb = batch;
  fa.insert(fa.end(), sa.end() - 2, sa.end());
  fb.insert(fb.end(), sb.end() - 2, sb.end());
  a = tb.broadcast_to(tb.reshape(a, sa), fa);
  b = tb.broadcast_to(tb.reshape(b, sb), fb);
  const UOp* y = tb.matmul(a, b);
  Dims out = batch;
  if (!va) out.push_back(fa[fa.size() - 2]);
  if (!vb) out.push_back(fb.back());
  return tb.reshape(y, out);
}

absl::Status gemm(NodeContext& c) {
  ONNX_ASSIGN(const UOp* a, c.in(0));
  ONNX_ASSIGN(const UOp* b, c.in(1));
  TensorBuilder& tb = c.tb();
  if (c.shape_of(a).size() != 2 || c.shape_of(b).size() != 2) return c.invalid("A and B must be matrices");
  if (c.attr_int("transA", 0)) a = tb.permute(a, {1, 0});
  if (c.attr_int("transB", 0)) b = tb.permute(b, {1, 0});
  ONNX_ASSIGN(const UOp* y, matmul(c, a, b));
  Math m(tb);
  float alpha = c.attr_float("alpha", 1), beta = c.attr_float("beta", 1);
  if (alpha != 1) y = m.mul(y, m.k(y, alpha));
  if (c.has(2)) {
    ONNX_ASSIGN(const UOp* cc, c.in(2));
    ONNX_ASSIGN(Dims out, c.broadcast({c.shape_of(y), c.shape_of(cc)}));
    if (out != c.shape_of(y)) return c.invalid("C does not broadcast to the result");
    if (beta != 1) cc = m.mul(cc, m.k(cc, beta));
    y = m.add(y, tb.broadcast_to(cc, out));
  }
  c.out(0, y);
  return absl::OkStatus();
}

// Pads (may be negative: crop) per axis with a fill value (zero bits unless fill is set).
const UOp* pad_any(TensorBuilder& tb, const UOp* x, std::vector<int64_t> b, std::vector<int64_t> e,
                   std::optional<double> fill = std::nullopt) {
  Dims s = tb.shape(x);
  std::vector<int64_t> cb(s.size(), 0), ce = s;
  bool crop = false, grow = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (b[i] < 0) cb[i] = -b[i], b[i] = 0, crop = true;
    if (e[i] < 0) ce[i] = s[i] + e[i], e[i] = 0, crop = true;
    if (b[i] > 0 || e[i] > 0) grow = true;
  }
  if (crop) x = tb.shrink(x, cb, ce);
  if (!grow) return x;
  const UOp* p = tb.pad(x, b, e);
  if (fill && *fill != 0) {
    Math m(tb);
    const UOp* mask = tb.pad(tb.full(Scalar::Bool, ConstValue::Bool(true), tb.shape(x)), b, e);
    p = m.where(mask, p, m.k(p, *fill));
  }
  return p;
}

// Spatial geometry shared by Conv and the pools.
struct Geometry {
  Dims kernel, strides, dilations;
  std::vector<int64_t> pad_b, pad_e;
};

absl::StatusOr<Geometry> geometry(NodeContext& c, const Dims& in_spatial, Dims kernel, bool ceil_mode = false) {
  const size_t m = in_spatial.size();
  Geometry g;
  g.kernel = std::move(kernel);
  g.strides = c.attr_ints("strides");
  g.dilations = c.attr_ints("dilations");
  if (g.strides.empty()) g.strides.assign(m, 1);
  if (g.dilations.empty()) g.dilations.assign(m, 1);
  if (g.kernel.size() != m || g.strides.size() != m || g.dilations.size() != m)
    return c.invalid("kernel_shape, strides and dilations must have one value per spatial axis");
  std::vector<int64_t> pads = c.attr_ints("pads");
  std::string ap = c.attr_string("auto_pad", "NOTSET");
  g.pad_b.assign(m, 0);
  g.pad_e.assign(m, 0);
  if (ap == "NOTSET") {
    if (!pads.empty()) {
      if (pads.size() != 2 * m) return c.invalid("pads must have two values per spatial axis");
      for (size_t i = 0; i < m; ++i) g.pad_b[i] = pads[i], g.pad_e[i] = pads[i + m];
    }
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    for (size_t i = 0; i < m; ++i) {
      int64_t out = (in_spatial[i] + g.strides[i] - 1) / g.strides[i];
      int64_t total = std::max<int64_t>(0, (out - 1) * g.strides[i] + (g.kernel[i] - 1) * g.dilations[i] + 1 - in_spatial[i]);
      int64_t small = total / 2;
      g.pad_b[i] = ap == "SAME_UPPER" ? small : total - small;
      g.pad_e[i] = total - g.pad_b[i];
    }
  } else if (ap != "VALID") {
    return c.invalid(cat("auto_pad '", ap, "'"));
  }
  for (size_t i = 0; i < m; ++i) {
    int64_t span = (g.kernel[i] - 1) * g.dilations[i] + 1;
    int64_t padded = in_spatial[i] + g.pad_b[i] + g.pad_e[i];
    if (padded < span) return c.invalid("the kernel is larger than the padded input");
    if (ceil_mode) {
      int64_t out = (padded - span + g.strides[i] - 1) / g.strides[i] + 1;
      // The last window must start inside the input or the begin padding.
      if ((out - 1) * g.strides[i] >= in_spatial[i] + g.pad_b[i]) --out;
      int64_t need = (out - 1) * g.strides[i] + span;
      if (need > padded) g.pad_e[i] += need - padded;
    }
  }
  return g;
}

// [N, C, D1..Dm] (already padded) -> [N, C, O1..Om, K1..Km].
const UOp* windows(TensorBuilder& tb, const UOp* x, const Geometry& g) {
  const size_t m = g.kernel.size();
  const UOp* y = x;
  for (size_t i = 0; i < m; ++i) {
    size_t r = tb.shape(y).size();
    std::vector<int64_t> perm = {0, 1};
    for (size_t a = 3; a < r; ++a) perm.push_back(static_cast<int64_t>(a));
    perm.push_back(2);
    y = windows_last(tb, tb.permute(y, perm), g.kernel[i], g.strides[i], g.dilations[i]);
  }
  // Now [N, C, K1, O1, ..., Km, Om].
  std::vector<int64_t> perm = {0, 1};
  for (size_t i = 0; i < m; ++i) perm.push_back(static_cast<int64_t>(3 + 2 * i));
  for (size_t i = 0; i < m; ++i) perm.push_back(static_cast<int64_t>(2 + 2 * i));
  return tb.permute(y, perm);
}

std::vector<int64_t> spatial_pads(const std::vector<int64_t>& p) {
  std::vector<int64_t> v = {0, 0};
  v.insert(v.end(), p.begin(), p.end());
  return v;
}

absl::StatusOr<const UOp*> conv_core(NodeContext& c, const UOp* x, const UOp* w, const Geometry& g, int64_t group) {
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims xs = c.shape_of(x), ws = c.shape_of(w);
  const size_t sp = ws.size() - 2;
  const int64_t N = xs[0], C = xs[1], M = ws[0];
  if (C % group || M % group || ws[1] != C / group) return c.invalid("channels do not match the weights and group");
  const UOp* xp = pad_any(tb, x, spatial_pads(g.pad_b), spatial_pads(g.pad_e));
  const UOp* xw = windows(tb, xp, g);
  Dims wshape = tb.shape(xw);  // [N, C, O..., K...]
  Dims O(wshape.begin() + 2, wshape.begin() + 2 + sp);
  Dims xr = {N, group, 1, C / group};
  xr.insert(xr.end(), wshape.begin() + 2, wshape.end());
  Dims wr = {1, group, M / group, C / group};
  wr.insert(wr.end(), sp, 1);
  wr.insert(wr.end(), ws.begin() + 2, ws.end());
  const UOp* prod = tb.alu(Op::MUL, {tb.reshape(xw, xr), tb.reshape(w, wr)});
  std::vector<int64_t> axes = {3};
  for (size_t i = 0; i < sp; ++i) axes.push_back(static_cast<int64_t>(4 + sp + i));
  const UOp* y = tb.reduce(prod, ReduceOp::Add, axes);
  Dims out = {N, M};
  out.insert(out.end(), O.begin(), O.end());
  return tb.reshape(y, out);
}

absl::Status add_bias(NodeContext& c, const UOp*& y) {
  if (!c.has(2)) return absl::OkStatus();
  ONNX_ASSIGN(const UOp* b, c.in(2));
  Dims s = c.shape_of(y);
  if (c.shape_of(b) != Dims{s[1]}) return c.invalid("bias must have one value per output channel");
  Dims br(s.size(), 1);
  br[1] = s[1];
  y = c.tb().alu(Op::ADD, {y, c.tb().reshape(b, br)});
  return absl::OkStatus();
}

absl::Status conv(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* w, c.in(1));
  const Dims xs = c.shape_of(x), ws = c.shape_of(w);
  if (xs.size() < 3 || ws.size() != xs.size()) return c.invalid("X and W must be [N, C, D...] and [M, C/group, K...]");
  Dims kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(ws.begin() + 2, ws.end());
  ONNX_ASSIGN(Geometry g, geometry(c, Dims(xs.begin() + 2, xs.end()), kernel));
  ONNX_ASSIGN(const UOp* y, conv_core(c, x, w, g, c.attr_int("group", 1)));
  ONNX_TRY(add_bias(c, y));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status conv_transpose(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* w, c.in(1));
  TensorBuilder& tb = c.tb();
  const Dims xs = c.shape_of(x), ws = c.shape_of(w);
  if (xs.size() < 3 || ws.size() != xs.size()) return c.invalid("X and W must be [N, C, D...] and [C, M/group, K...]");
  const size_t sp = xs.size() - 2;
  const int64_t group = c.attr_int("group", 1), C = xs[1], Mg = ws[1];
  if (ws[0] != C || C % group) return c.invalid("channels do not match the weights and group");
  Dims kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(ws.begin() + 2, ws.end());
  Dims strides = c.attr_ints("strides"), dil = c.attr_ints("dilations"), outpad = c.attr_ints("output_padding");
  if (strides.empty()) strides.assign(sp, 1);
  if (dil.empty()) dil.assign(sp, 1);
  if (outpad.empty()) outpad.assign(sp, 0);
  std::vector<int64_t> pb(sp, 0), pe(sp, 0);
  std::vector<int64_t> pads = c.attr_ints("pads"), oshape = c.attr_ints("output_shape");
  std::string ap = c.attr_string("auto_pad", "NOTSET");
  if (!pads.empty() && pads.size() == 2 * sp)
    for (size_t i = 0; i < sp; ++i) pb[i] = pads[i], pe[i] = pads[i + sp];
  if (!oshape.empty() || ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    if (!oshape.empty() && oshape.size() != sp) oshape.erase(oshape.begin(), oshape.end() - static_cast<long>(sp));
    for (size_t i = 0; i < sp; ++i) {
      int64_t out = oshape.empty() ? xs[2 + i] * strides[i] : oshape[i];
      int64_t total = strides[i] * (xs[2 + i] - 1) + outpad[i] + (kernel[i] - 1) * dil[i] + 1 - out;
      // Floor division: a negative total (output_shape past the full size) grows the end.
      int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      if (ap == "SAME_UPPER") pb[i] = half, pe[i] = total - half;
      else pb[i] = total - half, pe[i] = half;
    }
  }
  // One placement per kernel offset k: Z_k[n, m, i] = sum_c x[n, c, i] w[c, m, k] lands at
  // output position i*s + k*d - pad_b. Each Z_k is spread by the stride (s-1 zeros after
  // each value), shifted by k*d and cropped / padded to the output; the placements sum.
  // (A stride-1 conv over the stride-dilated input would index through a mod that the
  // bounds pass cannot prove.)
  const int64_t N = xs[0], Cg = C / group;
  Dims full(sp), out_sp(sp);
  for (size_t i = 0; i < sp; ++i) {
    full[i] = strides[i] * (xs[2 + i] - 1) + outpad[i] + (kernel[i] - 1) * dil[i] + 1;
    out_sp[i] = full[i] - pb[i] - pe[i];
    if (out_sp[i] <= 0) return c.invalid("the output would be empty");
  }
  if (Dims(ws.begin() + 2, ws.end()) != kernel) return c.invalid("kernel_shape does not match the weights");
  // Z[n, g, m, I..., K...] = sum_c x[n, g, c, I..., 1...] * w[g, c, m, 1..., K...]
  Dims in_sp(xs.begin() + 2, xs.end());
  Dims xr = {N, group, Cg, 1};
  xr.insert(xr.end(), in_sp.begin(), in_sp.end());
  xr.insert(xr.end(), sp, 1);
  Dims wr = {1, group, Cg, Mg};
  wr.insert(wr.end(), sp, 1);
  wr.insert(wr.end(), kernel.begin(), kernel.end());
  const UOp* z = tb.reduce(tb.alu(Op::MUL, {tb.reshape(x, xr), tb.reshape(w, wr)}), ReduceOp::Add, {2});
  Dims zs = {N, group * Mg};
  zs.insert(zs.end(), in_sp.begin(), in_sp.end());
  zs.insert(zs.end(), kernel.begin(), kernel.end());
  z = tb.reshape(z, zs);
  const int64_t nk = numel_of(kernel);
  const UOp* acc = nullptr;
  for (int64_t flat = 0; flat < nk; ++flat) {
    std::vector<int64_t> k(sp);
    for (int64_t rem = flat, i = static_cast<int64_t>(sp) - 1; i >= 0; --i) k[i] = rem % kernel[i], rem /= kernel[i];
    std::vector<int64_t> b(zs.size(), 0), e = zs;
    for (size_t i = 0; i < sp; ++i) b[2 + sp + i] = k[i], e[2 + sp + i] = k[i] + 1;
    Dims ys = {N, group * Mg};
    ys.insert(ys.end(), in_sp.begin(), in_sp.end());
    // Offsets whose every value lands in the cropped padding add nothing.
    bool lands = true;
    for (size_t i = 0; i < sp; ++i) {
      const int64_t first = k[i] * dil[i] - pb[i], last = first + (in_sp[i] - 1) * strides[i];
      if (last < 0 || first >= out_sp[i]) lands = false;
    }
    if (!lands) continue;
    const UOp* y = tb.reshape(tb.shrink(z, b, e), ys);
    for (size_t i = 0; i < sp; ++i) {
      const size_t a = 2 + i;
      Dims s = tb.shape(y);
      if (strides[i] > 1) {
        // [.., I, ..] -> [.., I, 1, ..] expanded to [.., I, s, ..], all but the first of each
        // s zeroed, -> [.., I*s, ..]: value i at i*s. (An expand and a select rather than a
        // pad then reshape, whose index the bounds pass cannot follow through the windows.)
        Dims r = s;
        r.insert(r.begin() + a + 1, 1);
        Dims e = r;
        e[a + 1] = strides[i];
        HostTensor first = HostTensor::zeros(Scalar::Bool, {strides[i]});
        first.set(0, ConstValue::Bool(true));
        Dims fr(r.size(), 1);
        fr[a + 1] = strides[i];
        Math m(tb);
        const UOp* sel = tb.broadcast_to(tb.reshape(host_constant(c, std::move(first)), fr), e);
        const UOp* ye = tb.expand(tb.reshape(y, r), e);
        Dims flat_s = s;
        flat_s[a] = s[a] * strides[i];
        y = tb.reshape(m.where(sel, ye, m.k(ye, 0)), flat_s);
        s = flat_s;
      }
      // Value j now sits at j (j = i*s); it belongs at j + k*d - pad_b of an axis out_sp long.
      std::vector<int64_t> pb2(s.size(), 0), pe2(s.size(), 0);
      pb2[a] = k[i] * dil[i] - pb[i];
      pe2[a] = out_sp[i] - pb2[a] - s[a];
      y = pad_any(tb, y, pb2, pe2);
    }
    acc = acc ? tb.alu(Op::ADD, {acc, y}) : y;
  }
  Dims os = {N, group * Mg};
  os.insert(os.end(), out_sp.begin(), out_sp.end());
  const UOp* out = acc ? acc : tb.full(c.dtype_of(x), ConstValue::Float(0), os);
  ONNX_TRY(add_bias(c, out));
  c.out(0, out);
  return absl::OkStatus();
}

enum class PoolKind { Max, Average, Lp };

absl::Status pool(NodeContext& c, PoolKind kind) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  if (c.wants(1)) return c.unsupported("the Indices output");
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims xs = c.shape_of(x);
  if (xs.size() < 3) return c.invalid("X must be [N, C, D...]");
  const size_t sp = xs.size() - 2;
  Dims sp_in(xs.begin() + 2, xs.end());
  Dims kernel = c.attr_ints("kernel_shape");
  if (kernel.size() != sp) return c.invalid("kernel_shape must have one value per spatial axis");
  Geometry explicit_g;
  ONNX_ASSIGN(explicit_g, geometry(c, sp_in, kernel, false));
  ONNX_ASSIGN(Geometry g, geometry(c, sp_in, kernel, c.attr_int("ceil_mode", 0) != 0));
  std::vector<int64_t> axes;
  for (size_t i = 0; i < sp; ++i) axes.push_back(static_cast<int64_t>(2 + sp + i));
  auto finish = [&](const UOp* r) { return tb.reshape(r, Dims(tb.shape(r).begin(), tb.shape(r).begin() + 2 + sp)); };
  if (kind == PoolKind::Max) {
    const double lowest = x->dtype().is_float() ? -std::numeric_limits<double>::infinity()
                                                : reduce_identity(ReduceOp::Max, c.dtype_of(x)).to_double();
    const UOp* xp = pad_any(tb, x, spatial_pads(g.pad_b), spatial_pads(g.pad_e), lowest);
    c.out(0, finish(tb.reduce(windows(tb, xp, g), ReduceOp::Max, axes)));
    return absl::OkStatus();
  }
  if (!x->dtype().is_float()) return c.unsupported(cat("input of type ", scalar_name(c.dtype_of(x))));
  if (kind == PoolKind::Lp) {
    double p = static_cast<double>(c.attr_int("p", 2));
    const UOp* xp = pad_any(tb, m.pow(m.abs(x), m.k(x, p)), spatial_pads(g.pad_b), spatial_pads(g.pad_e));
    const UOp* s = tb.reduce(windows(tb, xp, g), ReduceOp::Add, axes);
    c.out(0, finish(m.pow(s, m.k(s, 1.0 / p))));
    return absl::OkStatus();
  }
  const UOp* xp = pad_any(tb, x, spatial_pads(g.pad_b), spatial_pads(g.pad_e));
  const UOp* sum = tb.reduce(windows(tb, xp, g), ReduceOp::Add, axes);
  // The divisor: how many values of the window count (the input, plus the explicit pads
  // with count_include_pad), computed by pooling a mask of ones.
  Dims ones_shape = {1, 1};
  ones_shape.insert(ones_shape.end(), sp_in.begin(), sp_in.end());
  const UOp* ones = tb.full(c.dtype_of(x), 1.0, ones_shape);
  if (c.attr_int("count_include_pad", 0) != 0) {
    ones = pad_any(tb, ones, spatial_pads(explicit_g.pad_b), spatial_pads(explicit_g.pad_e), 1.0);
    std::vector<int64_t> eb(sp, 0), ee(sp, 0);
    for (size_t i = 0; i < sp; ++i) ee[i] = g.pad_e[i] - explicit_g.pad_e[i];
    ones = pad_any(tb, ones, spatial_pads(eb), spatial_pads(ee));
  } else {
    ones = pad_any(tb, ones, spatial_pads(g.pad_b), spatial_pads(g.pad_e));
  }
  const UOp* count = tb.reduce(windows(tb, ones, g), ReduceOp::Add, axes);
  c.out(0, finish(m.div(sum, tb.broadcast_to(count, tb.shape(sum)))));
  return absl::OkStatus();
}

absl::Status global_pool(NodeContext& c, bool is_max) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims xs = c.shape_of(x);
  if (xs.size() < 3) return c.invalid("X must be [N, C, D...]");
  std::vector<int64_t> axes;
  int64_t count = 1;
  for (size_t i = 2; i < xs.size(); ++i) axes.push_back(static_cast<int64_t>(i)), count *= xs[i];
  Math m(c.tb());
  const UOp* r = m.reduce(x, is_max ? ReduceOp::Max : ReduceOp::Add, axes);
  c.out(0, is_max ? r : m.div(r, m.k(r, static_cast<double>(count))));
  return absl::OkStatus();
}

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
  if (size <= 0) return c.invalid("size");
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

// --- Resize / Upsample. Every axis is resampled on its own (the ONNX reference interpolates
// one axis at a time too): the host works out, for each output position, the source
// coordinate, its neighbours and their weights, and the graph applies that [O, W] matrix
// along the axis — as a gather when each row picks one element (nearest), as a weighted sum
// otherwise (linear, cubic).

struct ResizeAttrs {
  std::string mode = "nearest", ctm = "half_pixel", nearest_mode = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0;
};

// The source coordinate of output position x along one axis; nullopt: outside the crop
// (tf_crop_and_resize), where the output is the extrapolation value.
std::optional<double> resize_source(const ResizeAttrs& a, int64_t x, int64_t in_w, int64_t out_w, double scale,
                                    double roi_b, double roi_e) {
  const double xd = static_cast<double>(x), W = static_cast<double>(in_w);
  // The reference's "output_width": scale * W, not rounded (so align_corners downsampling
  // by 0.6 maps through 2.4 - 1, not through the integer size).
  const double out_f = scale * W;
  const std::string& m = a.ctm;
  if (m == "align_corners") return out_f == 1 ? 0.0 : xd * (W - 1) / (out_f - 1);
  if (m == "asymmetric") return xd / scale;
  if (m == "tf_half_pixel_for_nn") return (xd + 0.5) / scale;
  if (m == "pytorch_half_pixel") return out_f == 1 ? -0.5 : (xd + 0.5) / scale - 0.5;
  if (m == "half_pixel") return (xd + 0.5) / scale - 0.5;
  if (m == "half_pixel_symmetric") {
    const double adjustment = static_cast<double>(out_w) / out_f;
    const double offset = W / 2 * (1 - adjustment);
    return offset + (xd + 0.5) / scale - 0.5;
  }
  // tf_crop_and_resize
  double s = out_f == 1 ? (roi_e - roi_b) * (W - 1) / 2 : xd * (roi_e - roi_b) * (W - 1) / (out_f - 1);
  s += roi_b * (W - 1);
  if (s < 0 || s > W - 1) return std::nullopt;
  return s;
}

std::vector<double> resize_coeffs(const ResizeAttrs& a, double ratio) {
  if (a.mode == "nearest") {
    if (ratio == 1.0) return {0, 1};
    const std::string& n = a.nearest_mode;
    if (n == "round_prefer_floor") return {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};
    if (n == "round_prefer_ceil") return {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
    if (n == "floor") return {1, 0};
    return {0, 1};  // ceil
  }
  if (a.mode == "linear") return {1 - ratio, ratio};
  const double A = a.cubic_a, r = ratio, q = 1 - ratio;
  return {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
          ((A + 2) * q - (A + 3)) * q * q + 1, ((A * (q + 1) - 5 * A) * (q + 1) + 8 * A) * (q + 1) - 4 * A};
}

// The [out_w, in_w] matrix of one axis (row-major) and which rows are outside the crop.
struct AxisResample {
  std::vector<double> m;
  std::vector<bool> outside;
  bool identity = true;
  bool one_hot = true;
};

AxisResample axis_resample(const ResizeAttrs& a, int64_t in_w, int64_t out_w, double scale, double roi_b, double roi_e) {
  AxisResample r;
  r.m.assign(static_cast<size_t>(out_w * in_w), 0.0);
  r.outside.assign(static_cast<size_t>(out_w), false);
  if (out_w != in_w) r.identity = false;
  for (int64_t x = 0; x < out_w; ++x) {
    std::optional<double> src = resize_source(a, x, in_w, out_w, scale, roi_b, roi_e);
    if (!src) {
      r.outside[x] = true;
      r.identity = false;
      continue;
    }
    const double fl = std::floor(*src);
    std::vector<double> coeffs = resize_coeffs(a, *src == fl ? 1.0 : *src - fl);
    const int64_t n = static_cast<int64_t>(coeffs.size()), p = (n + 1) / 2;
    // The n positions of the edge-padded axis (length in_w + 2p) nearest to the source,
    // ties to the lower one, in increasing order.
    const double xp = *src + static_cast<double>(p);
    std::vector<int64_t> cand;
    for (int64_t i = 0; i < in_w + 2 * p; ++i) cand.push_back(i);
    std::stable_sort(cand.begin(), cand.end(), [&](int64_t u, int64_t v) {
      return std::abs(xp - static_cast<double>(u)) < std::abs(xp - static_cast<double>(v));
    });
    cand.resize(static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(cand.size()))));
    std::sort(cand.begin(), cand.end());
    if (a.exclude_outside) {
      double sum = 0;
      for (size_t j = 0; j < cand.size(); ++j) {
        int64_t idx = cand[j] - p;
        if (idx < 0 || idx >= in_w) coeffs[j] = 0;
        sum += coeffs[j];
      }
      for (double& cf : coeffs) cf /= sum;
    }
    int nonzero = 0;
    for (size_t j = 0; j < cand.size(); ++j) {
      const int64_t idx = std::clamp<int64_t>(cand[j] - p, 0, in_w - 1);
      r.m[x * in_w + idx] += coeffs[j];
    }
    for (int64_t i = 0; i < in_w; ++i) {
      const double v = r.m[x * in_w + i];
      if (v != 0) ++nonzero;
      if (v != 0 && v != 1) r.one_hot = false;
      if (v != (i == x ? 1.0 : 0.0)) r.identity = false;
    }
    if (nonzero != 1) r.one_hot = false;
  }
  return r;
}

absl::StatusOr<const UOp*> apply_resample(NodeContext& c, const UOp* x, int64_t axis, const AxisResample& r,
                                          int64_t out_w) {
  TensorBuilder& tb = c.tb();
  const Dims xs = c.shape_of(x);
  const int64_t in_w = xs[axis];
  if (r.one_hot) {
    HostTensor idx = HostTensor::zeros(Scalar::Int64, {out_w});
    for (int64_t o = 0; o < out_w; ++o)
      for (int64_t i = 0; i < in_w; ++i)
        if (r.m[o * in_w + i] != 0) idx.set(o, ConstValue::Int(i));
    return gather(c, x, host_constant(c, std::move(idx)), axis);
  }
  Scalar dt = x->dtype().scalar;
  if (!scalar_is_float(dt)) return c.unsupported(cat("mode '", c.attr_string("mode", "nearest"), "' on ", scalar_name(dt)));
  const Scalar wide = Math::at_least_f32(dt);
  HostTensor w = HostTensor::zeros(wide, {out_w, in_w});
  for (int64_t k = 0; k < out_w * in_w; ++k) w.set(k, ConstValue::Float(r.m[k]));
  Dims pre(xs.begin(), xs.begin() + axis), post(xs.begin() + axis + 1, xs.end());
  Dims xr = pre, wr(pre.size(), 1), out = pre;
  xr.push_back(1), xr.push_back(in_w), wr.push_back(out_w), wr.push_back(in_w), out.push_back(out_w);
  xr.insert(xr.end(), post.begin(), post.end());
  wr.insert(wr.end(), post.size(), 1);
  out.insert(out.end(), post.begin(), post.end());
  Math m(tb);
  const UOp* wn = tb.reshape(host_constant(c, std::move(w)), wr);
  const UOp* prod = tb.alu(Op::MUL, {tb.reshape(m.cast(x, wide), xr), wn});
  const UOp* y = tb.reshape(tb.reduce(prod, ReduceOp::Add, {static_cast<int64_t>(pre.size() + 1)}), out);
  return m.cast(y, dt);
}

// Resamples x to out_shape with per-axis scales (and, for tf_crop_and_resize, roi).
absl::StatusOr<const UOp*> resample(NodeContext& c, const UOp* x, const ResizeAttrs& a, const Dims& out_shape,
                                    const std::vector<double>& scales, const std::vector<double>& roi) {
  TensorBuilder& tb = c.tb();
  const Dims xs = c.shape_of(x);
  const size_t r = xs.size();
  const UOp* y = x;
  const UOp* outside = nullptr;
  Math m(tb);
  for (size_t i = 0; i < r; ++i) {
    if (out_shape[i] <= 0) return c.unsupported("an empty output (empty tensors are not supported)");
    double rb = roi.empty() ? 0 : roi[i], re = roi.empty() ? 1 : roi[r + i];
    AxisResample ar = axis_resample(a, xs[i], out_shape[i], scales[i], rb, re);
    if (ar.identity) continue;
    ONNX_ASSIGN(y, apply_resample(c, y, static_cast<int64_t>(i), ar, out_shape[i]));
    bool any = false;
    HostTensor mask = HostTensor::zeros(Scalar::Bool, {out_shape[i]});
    for (int64_t o = 0; o < out_shape[i]; ++o)
      if (ar.outside[o]) mask.set(o, ConstValue::Bool(true)), any = true;
    if (!any) continue;
    Dims mr(r, 1);
    mr[i] = out_shape[i];
    const UOp* mk = tb.reshape(host_constant(c, std::move(mask)), mr);
    outside = outside ? m.or_(tb.broadcast_to(outside, out_shape), tb.broadcast_to(mk, out_shape)) : mk;
  }
  if (outside)
    y = m.where(tb.broadcast_to(outside, out_shape), m.k(y, a.extrapolation), y);
  return y;
}

absl::Status resize(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims xs = c.shape_of(x);
  const size_t r = xs.size();
  ResizeAttrs a;
  a.mode = c.attr_string("mode", "nearest");
  if (a.mode != "nearest" && a.mode != "linear" && a.mode != "cubic") return c.invalid(cat("mode '", a.mode, "'"));
  if (c.attr_int("antialias", 0) != 0) return c.unsupported("antialias");
  const bool v10 = c.opset() < 11;
  a.ctm = v10 ? "asymmetric" : c.attr_string("coordinate_transformation_mode", "half_pixel");
  static const char* kModes[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                 "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
  if (std::find(std::begin(kModes), std::end(kModes), a.ctm) == std::end(kModes))
    return c.invalid(cat("coordinate_transformation_mode '", a.ctm, "'"));
  a.nearest_mode = v10 ? "floor" : c.attr_string("nearest_mode", "round_prefer_floor");
  if (a.nearest_mode != "round_prefer_floor" && a.nearest_mode != "round_prefer_ceil" && a.nearest_mode != "floor" &&
      a.nearest_mode != "ceil")
    return c.invalid(cat("nearest_mode '", a.nearest_mode, "'"));
  a.cubic_a = c.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = c.attr_int("exclude_outside", 0) != 0;
  a.extrapolation = c.attr_float("extrapolation_value", 0.0f);
  // axes (opset 18): the axes scales / sizes / roi speak of.
  std::vector<int64_t> axes;
  if (c.has_attr("axes")) {
    ONNX_ASSIGN(axes, c.axes(c.attr_ints("axes"), static_cast<int64_t>(r)));
  } else {
    for (size_t i = 0; i < r; ++i) axes.push_back(static_cast<int64_t>(i));
  }
  auto known_doubles = [&](int i) -> absl::StatusOr<std::vector<double>> {
    std::vector<double> v;
    if (!c.has(i)) return v;
    ONNX_ASSIGN(Dims s, c.shape(i));
    if (numel_of(s) == 0) return v;
    ONNX_ASSIGN(HostTensor t, c.constant(i));
    for (int64_t k = 0; k < t.numel(); ++k) v.push_back(t.get(k).to_double());
    return v;
  };
  std::vector<double> roi_in, scales_in, sizes_in;
  if (v10) {
    ONNX_ASSIGN(scales_in, known_doubles(1));
  } else {
    ONNX_ASSIGN(roi_in, known_doubles(1));
    ONNX_ASSIGN(scales_in, known_doubles(2));
    ONNX_ASSIGN(sizes_in, known_doubles(3));
  }
  const size_t na = axes.size();
  if (scales_in.empty() == sizes_in.empty()) return c.invalid("exactly one of scales and sizes must be given");
  if (!scales_in.empty() && scales_in.size() != na) return c.invalid("scales must have one value per axis");
  if (!sizes_in.empty() && sizes_in.size() != na) return c.invalid("sizes must have one value per axis");
  std::vector<double> scales(r, 1.0), roi;
  Dims out = xs;
  if (!scales_in.empty()) {
    for (size_t j = 0; j < na; ++j) {
      if (scales_in[j] <= 0) return c.invalid("scales must be positive");
      scales[axes[j]] = scales_in[j];
      out[axes[j]] = static_cast<int64_t>(std::floor(scales_in[j] * static_cast<double>(xs[axes[j]])));
    }
  } else {
    std::string policy = c.attr_string("keep_aspect_ratio_policy", "stretch");
    if (policy == "stretch") {
      for (size_t j = 0; j < na; ++j) {
        out[axes[j]] = static_cast<int64_t>(sizes_in[j]);
        scales[axes[j]] = sizes_in[j] / static_cast<double>(xs[axes[j]]);
      }
    } else if (policy == "not_larger" || policy == "not_smaller") {
      double s = policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0;
      for (size_t j = 0; j < na; ++j) {
        double q = sizes_in[j] / static_cast<double>(xs[axes[j]]);
        s = policy == "not_larger" ? std::min(s, q) : std::max(s, q);
      }
      for (size_t j = 0; j < na; ++j) {
        scales[axes[j]] = s;
        out[axes[j]] = static_cast<int64_t>(s * static_cast<double>(xs[axes[j]]) + 0.5);
      }
    } else {
      return c.invalid(cat("keep_aspect_ratio_policy '", policy, "'"));
    }
  }
  if (a.ctm == "tf_crop_and_resize") {
    if (roi_in.size() != 2 * na) return c.invalid("tf_crop_and_resize needs roi with two values per axis");
    roi.assign(2 * r, 0.0);
    for (size_t i = 0; i < r; ++i) roi[r + i] = 1.0;
    for (size_t j = 0; j < na; ++j) roi[axes[j]] = roi_in[j], roi[r + axes[j]] = roi_in[na + j];
  }
  ONNX_ASSIGN(const UOp* y, resample(c, x, a, out, scales, roi));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status upsample(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims xs = c.shape_of(x);
  ResizeAttrs a;
  a.mode = c.attr_string("mode", "nearest");
  if (a.mode != "nearest" && a.mode != "linear") return c.invalid(cat("mode '", a.mode, "'"));
  a.ctm = "asymmetric";
  a.nearest_mode = "floor";
  std::vector<double> scales;
  if (c.has(1)) {
    ONNX_ASSIGN(HostTensor t, c.constant(1));
    for (int64_t k = 0; k < t.numel(); ++k) scales.push_back(t.get(k).to_double());
  } else {
    for (float f : c.attr_floats("scales")) scales.push_back(f);
  }
  if (scales.size() != xs.size()) return c.invalid("scales must have one value per axis");
  Dims out = xs;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (scales[i] < 1) return c.invalid("scales must be >= 1");
    out[i] = static_cast<int64_t>(std::floor(scales[i] * static_cast<double>(xs[i])));
  }
  ONNX_ASSIGN(const UOp* y, resample(c, x, a, out, scales, {}));
  c.out(0, y);
  return absl::OkStatus();
}

// --- Integer and quantized MatMul / Conv: operands minus their zero points in int32, the
// product accumulated in int32; the QLinear forms then requantize.

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

void register_nn(Registry& r) {
  r["MatMul"] = {[](NodeContext& c) -> absl::Status {
                   ONNX_ASSIGN(const UOp* a, c.in(0));
                   ONNX_ASSIGN(const UOp* b, c.in(1));
                   ONNX_ASSIGN(const UOp* y, matmul(c, a, b));
                   c.out(0, y);
                   return absl::OkStatus();
                 },
                 {}};
  r["Gemm"] = {gemm, {"alpha", "beta", "transA", "transB"}};
  const std::vector<std::string> conv_attrs = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"};
  r["Conv"] = {conv, conv_attrs};
  std::vector<std::string> ct = conv_attrs;
  ct.push_back("output_padding");
  ct.push_back("output_shape");
  r["ConvTranspose"] = {conv_transpose, ct};
  r["MatMulInteger"] = {matmul_integer, {}};
  r["ConvInteger"] = {conv_integer, conv_attrs};
  r["QLinearMatMul"] = {qlinear_matmul, {}};
  r["QLinearConv"] = {qlinear_conv, conv_attrs};
  r["Resize"] = {resize, {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                          "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"}};
  r["Upsample"] = {upsample, {"mode", "scales"}};
  r["MaxPool"] = {[](NodeContext& c) { return pool(c, PoolKind::Max); },
                  {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"}};
  r["AveragePool"] = {[](NodeContext& c) { return pool(c, PoolKind::Average); },
                      {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"}};
  r["LpPool"] = {[](NodeContext& c) { return pool(c, PoolKind::Lp); },
                 {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "p", "pads", "strides"}};
  r["GlobalAveragePool"] = {[](NodeContext& c) { return global_pool(c, false); }, {}};
  r["GlobalMaxPool"] = {[](NodeContext& c) { return global_pool(c, true); }, {}};
}

void register_normalization(Registry& r) {
  r["BatchNormalization"] = {batch_norm, {"epsilon", "momentum", "training_mode", "spatial"}};
  r["InstanceNormalization"] = {instance_norm, {"epsilon"}};
  r["LayerNormalization"] = {layer_norm, {"axis", "epsilon", "stash_type"}};
  r["MeanVarianceNormalization"] = {mvn, {"axes"}};
  r["LRN"] = {lrn, {"alpha", "beta", "bias", "size"}};
}

}  // namespace uop::onnx_import
