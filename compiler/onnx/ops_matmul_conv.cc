// The float products and windows: MatMul, Gemm, Conv / ConvTranspose, and the pools, each a
// window view of the (padded) input (op_helpers.h windows_last: movement ops) reduced.
#include "compiler/onnx/ops_matmul_conv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

namespace uop::onnx_import {

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

namespace {

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

}  // namespace

absl::Status check_window_sizes(NodeContext& c, const Dims& kernel, const Dims& strides, const Dims& dilations) {
  // Positive, and small enough that window arithmetic (K * d, O * s, their sums with a
  // dimension) cannot overflow: a stride of 0 would divide by zero.
  constexpr int64_t kMax = int64_t{1} << 31;
  auto within = [&](const Dims& v) { return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x >= 1 && x < kMax; }); };
  if (!within(kernel)) return c.invalid("kernel_shape values must be at least 1 (and below 2^31)");
  if (!within(strides)) return c.invalid("strides must be at least 1 (and below 2^31)");
  if (!within(dilations)) return c.invalid("dilations must be at least 1 (and below 2^31)");
  return absl::OkStatus();
}

absl::StatusOr<Geometry> geometry(NodeContext& c, const Dims& in_spatial, Dims kernel, bool ceil_mode) {
  const size_t m = in_spatial.size();
  Geometry g;
  g.kernel = std::move(kernel);
  g.strides = c.attr_ints("strides");
  g.dilations = c.attr_ints("dilations");
  if (g.strides.empty()) g.strides.assign(m, 1);
  if (g.dilations.empty()) g.dilations.assign(m, 1);
  if (g.kernel.size() != m || g.strides.size() != m || g.dilations.size() != m)
    return c.invalid("kernel_shape, strides and dilations must have one value per spatial axis");
  ONNX_TRY(check_window_sizes(c, g.kernel, g.strides, g.dilations));
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

namespace {

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

}  // namespace

absl::StatusOr<const UOp*> conv_core(NodeContext& c, const UOp* x, const UOp* w, const Geometry& g, int64_t group) {
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims xs = c.shape_of(x), ws = c.shape_of(w);
  const size_t sp = ws.size() - 2;
  const int64_t N = xs[0], C = xs[1], M = ws[0];
  if (group < 1) return c.invalid("group must be at least 1");
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

namespace {

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

// A convolution's weights, known at import ([M, C, K...], group 1, output channels a
// positive multiple of 8, not made a tensor by an earlier node), stored in blocks of B output
// channels, the block's channels innermost ([M / B, C, K..., B], B 16 where it divides M,
// else 8), and viewed back as [M, C, K...]: the CPU's register tile reads one weight per
// output-channel row at each step of the reduction, so those rows then lie side by side
// instead of C * K elements apart (one cache line for 16 rows instead of 16), and a tile's
// rows (16 channels with AVX-512, 8 with AVX2) read one stretch of memory as the reduction
// goes, where with every channel innermost ([C, K..., M]) each step was M elements past the
// last: 2 KiB for ResNet-18's 512 channels, a page every other step and the hardware
// prefetcher lost. The view is a permute and a reshape: the kernel reads the same values
// at other addresses. uop bench p50, the same run, alternating: resnet18 134-140 -> 125-128
// ms, squeezenet1_1 58 -> 47, unet 41-42 -> 32-39 with [C, K..., M] over [M, C, K...]; a
// 512-channel 3x3 convolution on 7 x 7 (AVX2) 1.7 to 1.8 times faster, a 128-channel one
// on 28 x 28 1.1 to 1.2 times, with the blocks than with [C, K..., M] (the block's index,
// m / B, is what symbolic's divmod.factor recovers from the view's flat division). A
// model held by the server keeps the repacked buffer as its weight.
absl::StatusOr<const UOp*> conv_weights(NodeContext& c, int64_t group) {
  ONNX_ASSIGN(Value * v, c.value(1));
  if (group != 1 || !v->constant || v->node || v->constant->shape.size() < 3 ||
      v->constant->shape[0] < 8 || v->constant->shape[0] % 8 != 0)
    return c.in(1);
  if (v->repacked) return v->repacked;
  const HostTensor& w = *v->constant;
  const int64_t M = w.shape[0], rest = w.numel() / M, item = w.itemsize(), B = M % 16 == 0 ? 16 : 8;
  ONNX_TRY(c.state().spend(static_cast<uint64_t>(w.nbytes()), cat("the repacked weights of ", c.node().name())));
  Dims shape = {M / B};
  shape.insert(shape.end(), w.shape.begin() + 1, w.shape.end());
  shape.push_back(B);
  HostTensor t{w.dtype, shape, std::string(w.data.size(), '\0')};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < rest; ++r)
      std::memcpy(t.data.data() + ((m / B * rest + r) * B + m % B) * item, w.data.data() + (m * rest + r) * item,
                  static_cast<size_t>(item));
  // [M / B, C, K..., B] -> [M / B, B, C, K...] -> [M, C, K...]
  std::vector<int64_t> perm = {0, static_cast<int64_t>(shape.size()) - 1};
  for (size_t i = 1; i + 1 < shape.size(); ++i) perm.push_back(static_cast<int64_t>(i));
  v->repacked = c.tb().reshape(c.tb().permute(c.state().buffer_for(t), perm), w.shape);
  return v->repacked;
}

absl::Status conv(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* w, conv_weights(c, c.attr_int("group", 1)));
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
  if (group < 1) return c.invalid("group must be at least 1");
  if (ws[0] != C || C % group) return c.invalid("channels do not match the weights and group");
  Dims kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(ws.begin() + 2, ws.end());
  Dims strides = c.attr_ints("strides"), dil = c.attr_ints("dilations"), outpad = c.attr_ints("output_padding");
  if (strides.empty()) strides.assign(sp, 1);
  if (dil.empty()) dil.assign(sp, 1);
  if (outpad.empty()) outpad.assign(sp, 0);
  if (kernel.size() != sp || strides.size() != sp || dil.size() != sp || outpad.size() != sp)
    return c.invalid("kernel_shape, strides, dilations and output_padding must have one value per spatial axis");
  ONNX_TRY(check_window_sizes(c, kernel, strides, dil));
  for (int64_t p : outpad)
    if (p < 0 || p >= (int64_t{1} << 31)) return c.invalid("output_padding values must be in [0, 2^31)");
  std::vector<int64_t> pb(sp, 0), pe(sp, 0);
  std::vector<int64_t> pads = c.attr_ints("pads"), oshape = c.attr_ints("output_shape");
  std::string ap = c.attr_string("auto_pad", "NOTSET");
  if (!pads.empty() && pads.size() == 2 * sp)
    for (size_t i = 0; i < sp; ++i) pb[i] = pads[i], pe[i] = pads[i + sp];
  if (!oshape.empty() || ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    if (!oshape.empty() && oshape.size() < sp) return c.invalid("output_shape must have a value per spatial axis");
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
        ONNX_ASSIGN(HostTensor first, c.zeros(Scalar::Bool, {strides[i]}));
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
  // Realized: each placement is a select and a pad of Z, so a consumer that reads a window
  // of the output (a following Conv reads 9 taps of it) would fuse kernel-count times
  // that many placements into one kernel, past --max-kernel-ops for a modest U-Net.
  c.out(0, tb.contiguous(out));
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

}  // namespace

const std::vector<std::string>& conv_attrs() {
  static const std::vector<std::string> kAttrs = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"};
  return kAttrs;
}

void register_matmul_conv(Registry& r) {
  r["MatMul"] = {[](NodeContext& c) -> absl::Status {
                   ONNX_ASSIGN(const UOp* a, c.in(0));
                   ONNX_ASSIGN(const UOp* b, c.in(1));
                   ONNX_ASSIGN(const UOp* y, matmul(c, a, b));
                   c.out(0, y);
                   return absl::OkStatus();
                 },
                 {}};
  r["Gemm"] = {gemm, {"alpha", "beta", "transA", "transB"}};
  std::vector<std::string> ct = conv_attrs();
  r["Conv"] = {conv, ct};
  ct.push_back("output_padding");
  ct.push_back("output_shape");
  r["ConvTranspose"] = {conv_transpose, ct};
  r["MaxPool"] = {[](NodeContext& c) { return pool(c, PoolKind::Max); },
                  {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order", "strides"}};
  r["AveragePool"] = {[](NodeContext& c) { return pool(c, PoolKind::Average); },
                      {"auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides"}};
  r["LpPool"] = {[](NodeContext& c) { return pool(c, PoolKind::Lp); },
                 {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "p", "pads", "strides"}};
  r["GlobalAveragePool"] = {[](NodeContext& c) { return global_pool(c, false); }, {}};
  r["GlobalMaxPool"] = {[](NodeContext& c) { return global_pool(c, true); }, {}};
}

}  // namespace uop::onnx_import
