// Shape and movement operators: Reshape, Transpose, Squeeze / Unsqueeze, Flatten, Concat,
// Split, Slice, Pad, Expand, Tile, Depth/SpaceToDepth, and the ones whose result is known
// at import (Shape, Size, Constant, ConstantOfShape, Range, EyeLike) plus masks (Trilu).
#include <cmath>
#include <limits>

#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

absl::Status reshape(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  std::vector<int64_t> want;
  if (c.opset() < 5) want = c.attr_ints("shape");
  else {
    ONNX_ASSIGN(want, c.ints(1));
  }
  const Dims& s = c.shape_of(x);
  bool allowzero = c.attr_int("allowzero", 0) != 0;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == 0 && !allowzero) {
      if (i >= s.size()) return c.invalid("a 0 in the shape has no input dim to copy");
      want[i] = s[i];
    }
    if (want[i] == -1) {
      if (infer >= 0) return c.invalid("more than one -1 in the shape");
      infer = static_cast<int64_t>(i);
    } else if (want[i] < 0) {
      return c.invalid(cat("dim ", want[i], " in the shape"));
    } else {
      known *= want[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel_of(s) % known) return c.invalid("cannot infer the -1 dim");
    want[infer] = numel_of(s) / known;
  }
  if (numel_of(want) != numel_of(s)) return c.invalid(cat("cannot reshape ", shape_str(s), " to ", shape_str(want)));
  c.out(0, c.tb().reshape(x, want));
  return absl::OkStatus();
}

absl::Status transpose(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  int64_t r = static_cast<int64_t>(c.shape_of(x).size());
  std::vector<int64_t> perm = c.attr_ints("perm");
  if (perm.empty())
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != r) return c.invalid("perm must list every axis");
  ONNX_ASSIGN(perm, c.axes(perm, r));
  c.out(0, c.tb().permute(x, perm));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> axes_input_or_attr(NodeContext& c, int input, int since) {
  if (c.opset() >= since) {
    if (!c.has(input)) return std::vector<int64_t>{};
    return c.ints(input);
  }
  return c.attr_ints("axes");
}

absl::Status squeeze(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims& s = c.shape_of(x);
  ONNX_ASSIGN(auto axes, axes_input_or_attr(c, 1, 13));
  ONNX_ASSIGN(axes, c.axes(axes, static_cast<int64_t>(s.size())));
  Dims out;
  for (size_t i = 0; i < s.size(); ++i) {
    bool listed = std::find(axes.begin(), axes.end(), static_cast<int64_t>(i)) != axes.end();
    if (listed && s[i] != 1) return c.invalid(cat("axis ", i, " has size ", s[i], ", not 1"));
    if (listed || (axes.empty() && s[i] == 1)) continue;
    out.push_back(s[i]);
  }
  c.out(0, c.tb().reshape(x, out));
  return absl::OkStatus();
}

absl::Status unsqueeze(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims& s = c.shape_of(x);
  ONNX_ASSIGN(auto axes, axes_input_or_attr(c, 1, 13));
  const int64_t r = static_cast<int64_t>(s.size() + axes.size());
  ONNX_ASSIGN(axes, c.axes(axes, r));
  Dims out;
  size_t k = 0;
  for (int64_t i = 0; i < r; ++i) {
    if (std::find(axes.begin(), axes.end(), i) != axes.end()) out.push_back(1);
    else out.push_back(s[k++]);
  }
  c.out(0, c.tb().reshape(x, out));
  return absl::OkStatus();
}

absl::Status flatten(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims& s = c.shape_of(x);
  int64_t r = static_cast<int64_t>(s.size());
  int64_t a = c.attr_int("axis", 1);
  if (a < -r || a > r) return c.invalid(cat("axis ", a, " for rank ", r));
  if (a < 0) a += r;
  Dims out = {numel_of(Dims(s.begin(), s.begin() + a)), numel_of(Dims(s.begin() + a, s.end()))};
  c.out(0, c.tb().reshape(x, out));
  return absl::OkStatus();
}

absl::Status concat_op(NodeContext& c) {
  std::vector<const UOp*> xs;
  for (int i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) continue;
    ONNX_ASSIGN(Dims s, c.shape(i));
    if (numel_of(s) == 0 && s.size() == 1) continue;  // an empty shape piece ([0])
    ONNX_ASSIGN(const UOp* x, c.in(i));
    xs.push_back(x);
  }
  if (xs.empty()) return c.invalid("needs inputs");
  const int64_t r = static_cast<int64_t>(c.shape_of(xs[0]).size());
  if (r == 0) return c.invalid("the inputs are scalars: there is no axis to concatenate along");
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", 0), r));
  std::vector<const UOp*> parts;
  for (const UOp* x : xs) {
    Dims s = c.shape_of(x);
    if (static_cast<int64_t>(s.size()) != r) return c.invalid("inputs of different ranks");
    for (int64_t i = 0; i < r; ++i)
      if (i != axis && s[i] != c.shape_of(xs[0])[i]) return c.invalid("inputs differ outside the axis");
    if (c.dtype_of(x) != c.dtype_of(xs[0])) return c.invalid("inputs of different types");
    if (s[axis] > 0) parts.push_back(x);
  }
  if (parts.empty()) return c.unsupported("every input is empty");
  c.out(0, concat(c.tb(), parts, axis));
  return absl::OkStatus();
}

absl::Status split(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims& s = c.shape_of(x);
  if (s.empty()) return c.invalid("the input is a scalar: there is no axis to split");
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", 0), static_cast<int64_t>(s.size())));
  std::vector<int64_t> sizes;
  if (c.opset() >= 13) {
    if (c.has(1)) {
      ONNX_ASSIGN(sizes, c.ints(1));
    }
  } else {
    sizes = c.attr_ints("split");
  }
  const int64_t n = s[axis];
  if (sizes.empty()) {
    int64_t parts = c.has_attr("num_outputs") ? c.attr_int("num_outputs", 1) : c.num_outputs();
    if (parts != c.num_outputs()) return c.invalid("num_outputs is not the number of outputs");
    if (parts < 1) return c.invalid("no outputs");
    int64_t each = (n + parts - 1) / parts;
    for (int64_t i = 0, left = n; i < parts; ++i, left -= each) sizes.push_back(std::min(each, left));
  }
  int64_t total = 0;
  for (int64_t v : sizes) {
    if (v < 0 || v > n - total) return c.invalid("split sizes must be non-negative and add up to the axis");
    total += v;
  }
  if (total != n || static_cast<int>(sizes.size()) != c.num_outputs()) return c.invalid("split sizes do not add up");
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    c.out(static_cast<int>(i), slice_axis(c.tb(), x, axis, at, at + sizes[i], 1));
    at += sizes[i];
  }
  return absl::OkStatus();
}

absl::Status slice(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims s = c.shape_of(x);
  const int64_t r = static_cast<int64_t>(s.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = c.attr_ints("starts");
    ends = c.attr_ints("ends");
    axes = c.attr_ints("axes");
  } else {
    ONNX_ASSIGN(starts, c.ints(1));
    ONNX_ASSIGN(ends, c.ints(2));
    if (c.has(3)) {
      ONNX_ASSIGN(axes, c.ints(3));
    }
    if (c.has(4)) {
      ONNX_ASSIGN(steps, c.ints(4));
    }
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return c.invalid("starts, ends, axes and steps differ in length");
  ONNX_ASSIGN(axes, c.axes(axes, r));
  const UOp* y = x;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t n = s[axes[i]], st = steps[i];
    if (st == 0) return c.invalid("step 0");
    auto clampv = [&](int64_t v) {
      if (v < 0) v = v < -n ? (st > 0 ? 0 : -1) : v + n;
      if (st > 0) return std::min(v, n);
      return std::min(v, n - 1);
    };
    int64_t b = clampv(starts[i]), e = clampv(ends[i]);
    if (st > 0 ? e <= b : b <= e) {
      // An empty result is kept as an import-time value (shape arithmetic slices to nothing).
      Dims out = s;
      out[axes[i]] = 0;
      c.out_constant(0, HostTensor::zeros(c.dtype_of(x), out));
      return absl::OkStatus();
    }
    y = slice_axis(c.tb(), y, axes[i], b, e, st);
  }
  c.out(0, y);
  return absl::OkStatus();
}

// Pads one axis by `b` before and `e` after (both >= 0) in reflect or edge mode.
const UOp* pad_mode_axis(TensorBuilder& tb, const UOp* x, int64_t axis, int64_t b, int64_t e, bool reflect) {
  const int64_t n = tb.shape(x)[axis];
  std::vector<const UOp*> parts;
  std::vector<bool> flip(tb.shape(x).size(), false);
  flip[axis] = true;
  auto edge = [&](int64_t at, int64_t count) {
    Dims to = tb.shape(x);
    to[axis] = count;
    return tb.expand(slice_axis(tb, x, axis, at, at + 1, 1), to);
  };
  if (b > 0) parts.push_back(reflect ? tb.flip(slice_axis(tb, x, axis, 1, b + 1, 1), flip) : edge(0, b));
  parts.push_back(x);
  if (e > 0) parts.push_back(reflect ? tb.flip(slice_axis(tb, x, axis, n - 1 - e, n - 1, 1), flip) : edge(n - 1, e));
  return concat(tb, parts, axis);
}

absl::Status pad(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims s = c.shape_of(x);
  const int64_t r = static_cast<int64_t>(s.size());
  std::string mode = c.attr_string("mode", "constant");
  std::vector<int64_t> pads;
  double value = 0;
  const UOp* value_node = nullptr;
  if (c.opset() < 11) {
    pads = c.attr_ints("pads");
    value = c.attr_float("value", 0);
  } else {
    ONNX_ASSIGN(pads, c.ints(1));
    if (c.has(2)) {
      ONNX_ASSIGN(Value * v, c.value(2));
      if (v->constant) value = v->constant->get(0).to_double();
      else {
        ONNX_ASSIGN(value_node, c.in(2));
        value_node = c.tb().reshape(value_node, {});
      }
    }
  }
  std::vector<int64_t> axes;
  if (c.has(3)) {
    ONNX_ASSIGN(axes, c.ints(3));
    ONNX_ASSIGN(axes, c.axes(axes, r));
  } else {
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  }
  const int64_t na = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * na) return c.invalid("pads must have two values per axis");
  std::vector<int64_t> b(r, 0), e(r, 0);
  for (int64_t i = 0; i < na; ++i) b[axes[i]] = pads[i], e[axes[i]] = pads[i + na];
  TensorBuilder& tb = c.tb();
  // Negative pads crop first.
  std::vector<int64_t> cb(r, 0), ce = s;
  bool crop = false;
  for (int64_t i = 0; i < r; ++i) {
    if (b[i] < 0) cb[i] = -b[i], b[i] = 0, crop = true;
    if (e[i] < 0) ce[i] = s[i] + e[i], e[i] = 0, crop = true;
  }
  const UOp* y = crop ? tb.shrink(x, cb, ce) : x;
  if (mode == "constant") {
    const UOp* p = tb.pad(y, b, e);
    if (value != 0 || value_node) {
      Math m(tb);
      const UOp* mask = tb.pad(tb.full(Scalar::Bool, ConstValue::Bool(true), tb.shape(y)), b, e);
      p = m.where(mask, p, value_node ? value_node : m.k(p, value));
    }
    y = p;
  } else if (mode == "reflect" || mode == "edge") {
    for (int64_t i = 0; i < r; ++i) {
      if (b[i] == 0 && e[i] == 0) continue;
      if (mode == "reflect" && (b[i] >= tb.shape(y)[i] || e[i] >= tb.shape(y)[i]))
        return c.unsupported("reflect pads as large as the dim");
      y = pad_mode_axis(tb, y, i, b[i], e[i], mode == "reflect");
    }
  } else {
    return c.unsupported(cat("mode '", mode, "'"));
  }
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status expand(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(auto shape, c.ints(1));
  ONNX_ASSIGN(Dims out, c.broadcast({c.shape_of(x), shape}));
  c.out(0, c.tb().broadcast_to(x, out));
  return absl::OkStatus();
}

absl::Status tile(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(auto reps, c.ints(1));
  Dims s = c.shape_of(x);
  if (reps.size() != s.size()) return c.invalid("repeats must have one value per axis");
  TensorBuilder& tb = c.tb();
  const UOp* y = x;
  for (size_t i = 0; i < s.size(); ++i) {
    if (reps[i] == 1) continue;
    if (reps[i] < 1) return c.unsupported("repeats below 1 (empty tensors are not supported)");
    Dims cur = tb.shape(y);
    Dims a = cur, bb = cur;
    a.insert(a.begin() + i, 1);
    bb.insert(bb.begin() + i, reps[i]);
    Dims out = cur;
    out[i] *= reps[i];
    y = tb.reshape(tb.expand(tb.reshape(y, a), bb), out);
  }
  c.out(0, y);
  return absl::OkStatus();
}

HostTensor int64_vector(const std::vector<int64_t>& v) {
  HostTensor t = HostTensor::zeros(Scalar::Int64, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set(static_cast<int64_t>(i), ConstValue::Int(v[i]));
  return t;
}

absl::Status shape(NodeContext& c) {
  ONNX_ASSIGN(Dims s, c.shape(0));
  int64_t r = static_cast<int64_t>(s.size());
  int64_t b = c.attr_int("start", 0), e = c.attr_int("end", r);
  if (b < 0) b += r;
  if (e < 0) e += r;
  b = std::clamp<int64_t>(b, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  c.out_constant(0, int64_vector(e > b ? Dims(s.begin() + b, s.begin() + e) : Dims{}));
  return absl::OkStatus();
}

absl::Status constant(NodeContext& c) {
  if (c.has_attr("value")) {
    ONNX_ASSIGN(HostTensor t, c.attr_tensor("value"));
    c.out_constant(0, std::move(t));
  } else if (c.has_attr("value_float")) {
    c.out_constant(0, HostTensor::of(Scalar::Float32, {}, {c.attr_float("value_float", 0)}));
  } else if (c.has_attr("value_floats")) {
    auto f = c.attr_floats("value_floats");
    HostTensor t = HostTensor::zeros(Scalar::Float32, {static_cast<int64_t>(f.size())});
    for (size_t i = 0; i < f.size(); ++i) t.set(static_cast<int64_t>(i), ConstValue::Float(f[i]));
    c.out_constant(0, std::move(t));
  } else if (c.has_attr("value_int")) {
    HostTensor t = HostTensor::zeros(Scalar::Int64, {});
    t.set(0, ConstValue::Int(c.attr_int("value_int", 0)));
    c.out_constant(0, std::move(t));
  } else if (c.has_attr("value_ints")) {
    c.out_constant(0, int64_vector(c.attr_ints("value_ints")));
  } else {
    return c.unsupported("only tensor, float(s) and int(s) values");
  }
  return absl::OkStatus();
}

absl::Status constant_of_shape(NodeContext& c) {
  ONNX_ASSIGN(auto shape, c.ints(0));
  HostTensor v = HostTensor::zeros(Scalar::Float32, {});
  if (c.has_attr("value")) {
    ONNX_ASSIGN(v, c.attr_tensor("value"));
  }
  if (v.numel() != 1) return c.invalid("value must hold one element");
  if (numel_of(shape) == 0) return c.unsupported("an empty shape (empty tensors are not supported)");
  c.out(0, c.tb().full(v.dtype, v.get(0), shape));
  return absl::OkStatus();
}

absl::Status range(NodeContext& c) {
  ONNX_ASSIGN(HostTensor start, c.constant(0));
  ONNX_ASSIGN(HostTensor limit, c.constant(1));
  ONNX_ASSIGN(HostTensor delta, c.constant(2));
  Scalar dt = start.dtype;
  double s = start.get(0).to_double(), l = limit.get(0).to_double(), d = delta.get(0).to_double();
  if (d == 0) return c.invalid("delta 0");
  const double steps = std::ceil((l - s) / d);
  if (!(steps < 0x1p62 && steps > -0x1p62)) return c.invalid(cat("start ", s, ", limit ", l, " and delta ", d, " make no valid length"));
  int64_t n = std::max<int64_t>(static_cast<int64_t>(steps), 0);
  if (n == 0) return c.unsupported("an empty range (empty tensors are not supported)");
  ONNX_ASSIGN(HostTensor t, c.zeros(dt, {n}));
  for (int64_t i = 0; i < n; ++i) {
    if (scalar_is_float(dt)) t.set(i, ConstValue::Float(s + static_cast<double>(i) * d));
    else t.set(i, ConstValue::Int(start.get(0).to_int() + i * delta.get(0).to_int()));
  }
  c.out_constant(0, std::move(t));
  return absl::OkStatus();
}

absl::Status trilu(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  Dims s = c.shape_of(x);
  if (s.size() < 2) return c.invalid("needs rank 2 or more");
  int64_t k = 0;
  if (c.has(1)) {
    ONNX_ASSIGN(double kv, c.scalar(1));
    k = static_cast<int64_t>(kv);
  }
  bool upper = c.attr_int("upper", 1) != 0;
  int64_t n = s[s.size() - 2], m = s.back();
  ONNX_ASSIGN(HostTensor mask, c.zeros(Scalar::Bool, {n, m}));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) mask.set(i * m + j, ConstValue::Bool(upper ? j - i >= k : j - i <= k));
  Math mm(c.tb());
  const UOp* mk = c.tb().broadcast_to(host_constant(c, mask), s);
  c.out(0, mm.where(mk, x, mm.k(x, 0)));
  return absl::OkStatus();
}

absl::Status eye_like(NodeContext& c) {
  ONNX_ASSIGN(Dims s, c.shape(0));
  ONNX_ASSIGN(Scalar in_dt, c.dtype(0));
  if (s.size() != 2) return c.invalid("needs rank 2");
  Scalar dt = in_dt;
  if (c.has_attr("dtype")) {
    auto d = scalar_from_onnx(static_cast<int>(c.attr_int("dtype", 0)));
    if (!d) return c.unsupported("dtype");
    dt = *d;
  }
  int64_t k = c.attr_int("k", 0);
  ONNX_ASSIGN(HostTensor t, c.zeros(dt, s));
  for (int64_t i = 0; i < s[0]; ++i)
    if (i + k >= 0 && i + k < s[1]) t.set(i * s[1] + i + k, ConstValue::Int(1));
  c.out_constant(0, std::move(t));
  return absl::OkStatus();
}

absl::Status dropout(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  if (c.has(2)) {
    ONNX_ASSIGN(double training, c.scalar(2));
    if (training != 0) return c.unsupported("training mode (random masks)");
  }
  if (c.opset() < 7 && c.attr_int("is_test", 0) == 0) return c.unsupported("training mode (random masks)");
  c.out(0, x);
  if (c.wants(1)) c.out(1, c.tb().full(Scalar::Bool, ConstValue::Bool(true), c.shape_of(x)));
  return absl::OkStatus();
}

absl::Status depth_to_space(NodeContext& c, bool to_space) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  Dims s = c.shape_of(x);
  if (s.size() != 4) return c.invalid("needs rank 4");
  int64_t b = c.attr_int("blocksize", 0);
  if (b <= 0) return c.invalid("blocksize");
  int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  TensorBuilder& tb = c.tb();
  if (to_space) {
    if (C % (b * b)) return c.invalid("channels not divisible by blocksize^2");
    bool crd = c.attr_string("mode", "DCR") == "CRD";
    const UOp* y = crd ? tb.permute(tb.reshape(x, {N, C / (b * b), b, b, H, W}), {0, 1, 4, 2, 5, 3})
                       : tb.permute(tb.reshape(x, {N, b, b, C / (b * b), H, W}), {0, 3, 4, 1, 5, 2});
    c.out(0, tb.reshape(y, {N, C / (b * b), H * b, W * b}));
  } else {
    if (H % b || W % b) return c.invalid("spatial dims not divisible by blocksize");
    const UOp* y = tb.permute(tb.reshape(x, {N, C, H / b, b, W / b, b}), {0, 3, 5, 1, 2, 4});
    c.out(0, tb.reshape(y, {N, C * b * b, H / b, W / b}));
  }
  return absl::OkStatus();
}

}  // namespace

void register_shape_ops(Registry& r) {
  r["Reshape"] = {reshape, {"allowzero", "shape"}};
  r["Transpose"] = {transpose, {"perm"}};
  r["Squeeze"] = {squeeze, {"axes"}};
  r["Unsqueeze"] = {unsqueeze, {"axes"}};
  r["Flatten"] = {flatten, {"axis"}};
  r["Concat"] = {concat_op, {"axis"}};
  r["Split"] = {split, {"axis", "split", "num_outputs"}};
  r["Slice"] = {slice, {"starts", "ends", "axes"}};
  r["Pad"] = {pad, {"mode", "pads", "value"}};
  r["Expand"] = {expand, {}};
  r["Tile"] = {tile, {}};
  r["Shape"] = {shape, {"start", "end"}};
  r["Size"] = {[](NodeContext& c) -> absl::Status {
                 ONNX_ASSIGN(Dims s, c.shape(0));
                 HostTensor t = HostTensor::zeros(Scalar::Int64, {});
                 t.set(0, ConstValue::Int(numel_of(s)));
                 c.out_constant(0, std::move(t));
                 return absl::OkStatus();
               },
               {}};
  r["Constant"] = {constant, {"value", "value_float", "value_floats", "value_int", "value_ints"}};
  r["ConstantOfShape"] = {constant_of_shape, {"value"}};
  r["Range"] = {range, {}};
  r["Trilu"] = {trilu, {"upper"}};
  r["EyeLike"] = {eye_like, {"dtype", "k"}};
  r["Dropout"] = {dropout, {"seed", "ratio", "is_test"}};
  r["DepthToSpace"] = {[](NodeContext& c) { return depth_to_space(c, true); }, {"blocksize", "mode"}};
  r["SpaceToDepth"] = {[](NodeContext& c) { return depth_to_space(c, false); }, {"blocksize"}};
}

}  // namespace uop::onnx_import
