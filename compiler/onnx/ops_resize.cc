// Resize and Upsample. Every axis is resampled on its own (the ONNX reference interpolates
// one axis at a time too): the host works out, for each output position, the source
// coordinate, its neighbours and their weights, and the graph applies that [O, W] matrix
// along the axis — as a gather when each row picks one element (nearest), as a weighted sum
// otherwise (linear, cubic).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

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
    ONNX_ASSIGN(HostTensor idx, c.zeros(Scalar::Int64, {out_w}));
    for (int64_t o = 0; o < out_w; ++o)
      for (int64_t i = 0; i < in_w; ++i)
        if (r.m[o * in_w + i] != 0) idx.set(o, ConstValue::Int(i));
    return gather(c, x, host_constant(c, std::move(idx)), axis);
  }
  Scalar dt = x->dtype().scalar;
  if (!scalar_is_float(dt)) return c.unsupported(cat("mode '", c.attr_string("mode", "nearest"), "' on ", scalar_name(dt)));
  const Scalar wide = Math::at_least_f32(dt);
  ONNX_ASSIGN(HostTensor w, c.zeros(wide, {out_w, in_w}));
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
    ONNX_ASSIGN(HostTensor mask, c.zeros(Scalar::Bool, {out_shape[i]}));
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

}  // namespace

void register_resize(Registry& r) {
  r["Resize"] = {resize, {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                          "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"}};
  r["Upsample"] = {upsample, {"mode", "scales"}};
}

}  // namespace uop::onnx_import
