// Reductions (ReduceSum ... ReduceLogSumExp), Softmax / LogSoftmax / Hardmax, ArgMax /
// ArgMin and CumSum. Reduced axes stay as 1 in the IR (REDUCE_AXIS keeps them) and are
// dropped by a reshape when keepdims is 0.
#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

enum class Kind { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

absl::Status reduce(NodeContext& c, Kind kind) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims s = c.shape_of(x);
  const int64_t r = static_cast<int64_t>(s.size());
  std::vector<int64_t> axes;
  bool axes_from_input = (kind == Kind::Sum && c.opset() >= 13) || c.opset() >= 18;
  if (axes_from_input) {
    if (c.has(1)) {
      ONNX_ASSIGN(axes, c.ints(1));
    }
  } else {
    axes = c.attr_ints("axes");
  }
  if (axes.empty() && c.attr_int("noop_with_empty_axes", 0) != 0) {
    c.out(0, x);
    return absl::OkStatus();
  }
  if (axes.empty())
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  ONNX_ASSIGN(axes, c.axes(axes, r));
  bool keep = c.attr_int("keepdims", 1) != 0;
  Math m(c.tb());
  const bool flt = x->dtype().is_float();
  if (!flt && (kind == Kind::L2 || kind == Kind::LogSum || kind == Kind::LogSumExp || kind == Kind::Mean))
    if (kind != Kind::Mean) return c.unsupported(cat("input of type ", scalar_name(c.dtype_of(x))));
  const UOp* y = nullptr;
  int64_t count = 1;
  for (int64_t a : axes) count *= s[a];
  switch (kind) {
    case Kind::Sum: y = m.reduce(x, ReduceOp::Add, axes); break;
    case Kind::Mean: y = m.div(m.reduce(x, ReduceOp::Add, axes), m.k(x, static_cast<double>(count))); break;
    case Kind::Max: y = m.reduce(x, ReduceOp::Max, axes); break;
    case Kind::Min: y = m.reduce(x, ReduceOp::Min, axes); break;
    case Kind::Prod: y = m.reduce(x, ReduceOp::Mul, axes); break;
    case Kind::L1: y = m.reduce(m.abs(x), ReduceOp::Add, axes); break;
    case Kind::L2: y = m.sqrt(m.reduce(m.mul(x, x), ReduceOp::Add, axes)); break;
    case Kind::SumSquare: y = m.reduce(m.mul(x, x), ReduceOp::Add, axes); break;
    case Kind::LogSum: y = m.log(m.reduce(x, ReduceOp::Add, axes)); break;
    case Kind::LogSumExp: {
      const UOp* mx = m.reduce(x, ReduceOp::Max, axes);
      // A max of -inf (all -inf) would make x - max NaN; use 0 there.
      const UOp* safe = m.where(m.eq(mx, m.k(mx, -INFINITY)), m.k(mx, 0), mx);
      const UOp* e = m.exp(m.sub(x, c.tb().broadcast_to(safe, s)));
      y = m.add(m.log(m.reduce(e, ReduceOp::Add, axes)), safe);
      break;
    }
  }
  if (!keep) {
    Dims out;
    for (int64_t i = 0; i < r; ++i)
      if (std::find(axes.begin(), axes.end(), i) == axes.end()) out.push_back(s[i]);
    y = c.tb().reshape(y, out);
  }
  c.out(0, y);
  return absl::OkStatus();
}

enum class SoftKind { Softmax, LogSoftmax, Hardmax };

// The first index of the max along `axis` as a bool one-hot mask (kept dims).
const UOp* argbest_index(NodeContext& c, const UOp* x, int64_t axis, bool is_max, bool last) {
  Math m(c.tb());
  const Dims s = c.shape_of(x);
  const UOp* best = m.reduce(x, is_max ? ReduceOp::Max : ReduceOp::Min, {axis});
  const UOp* hit = m.eq(x, c.tb().broadcast_to(best, s));
  Dims ishape(s.size(), 1);
  ishape[axis] = s[axis];
  const UOp* idx = c.tb().broadcast_to(iota(c, s[axis], Scalar::Int64, ishape), s);
  if (last) return m.reduce(m.where(hit, idx, m.k(idx, -1)), ReduceOp::Max, {axis});
  return m.reduce(m.where(hit, idx, m.k(idx, s[axis])), ReduceOp::Min, {axis});
}

absl::Status soft(NodeContext& c, SoftKind kind) {
  ONNX_ASSIGN(const UOp* x0, c.in(0));
  const Dims s = c.shape_of(x0);
  const int64_t r = static_cast<int64_t>(s.size());
  TensorBuilder& tb = c.tb();
  const UOp* x = x0;
  int64_t axis;
  if (c.opset() < 13) {
    ONNX_ASSIGN(int64_t a, c.axis(c.attr_int("axis", 1), r));
    x = tb.reshape(x, {numel_of(Dims(s.begin(), s.begin() + a)), numel_of(Dims(s.begin() + a, s.end()))});
    axis = 1;
  } else {
    ONNX_ASSIGN(axis, c.axis(c.attr_int("axis", -1), r));
  }
  Math m(tb);
  const Dims xs = tb.shape(x);
  const UOp* y;
  if (kind == SoftKind::Hardmax) {
    const UOp* first = argbest_index(c, x, axis, true, false);
    Dims ishape(xs.size(), 1);
    ishape[axis] = xs[axis];
    const UOp* idx = tb.broadcast_to(iota(c, xs[axis], Scalar::Int64, ishape), xs);
    y = m.cast(m.eq(idx, tb.broadcast_to(first, xs)), c.dtype_of(x));
  } else {
    const UOp* shifted = m.sub(x, tb.broadcast_to(m.reduce(x, ReduceOp::Max, {axis}), xs));
    const UOp* e = m.exp(shifted);
    const UOp* sum = tb.broadcast_to(m.reduce(e, ReduceOp::Add, {axis}), xs);
    y = kind == SoftKind::Softmax ? m.div(e, sum) : m.sub(shifted, m.log(sum));
  }
  c.out(0, tb.reshape(y, s));
  return absl::OkStatus();
}

absl::Status arg(NodeContext& c, bool is_max) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims s = c.shape_of(x);
  ONNX_ASSIGN(int64_t axis, c.axis(c.attr_int("axis", 0), static_cast<int64_t>(s.size())));
  const UOp* y = argbest_index(c, x, axis, is_max, c.attr_int("select_last_index", 0) != 0);
  if (c.attr_int("keepdims", 1) == 0) y = c.tb().reshape(y, with_axis_removed(s, axis));
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status cumsum(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  const Dims s = c.shape_of(x);
  ONNX_ASSIGN(double av, c.scalar(1));
  ONNX_ASSIGN(int64_t axis, c.axis(static_cast<int64_t>(av), static_cast<int64_t>(s.size())));
  bool excl = c.attr_int("exclusive", 0) != 0, rev = c.attr_int("reverse", 0) != 0;
  const int64_t n = s[axis];
  // out[i] = sum over j of x[j] where mask[j, i]: j <= i (j < i exclusive; >= / > reversed).
  ONNX_ASSIGN(HostTensor mask, c.zeros(Scalar::Bool, {n, n}));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < n; ++i) {
      bool in = rev ? (excl ? j > i : j >= i) : (excl ? j < i : j <= i);
      mask.set(j * n + i, ConstValue::Bool(in));
    }
  Dims xr = s;
  xr.insert(xr.begin() + axis + 1, 1);
  Dims mr(s.size() + 1, 1);
  mr[axis] = n;
  mr[axis + 1] = n;
  mask.shape = {n, n};
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const UOp* mk = tb.reshape(host_constant(c, mask), mr);
  const UOp* xe = tb.reshape(x, xr);
  Dims full = xr;
  full[axis + 1] = n;
  const UOp* picked = m.where(tb.broadcast_to(mk, full), tb.broadcast_to(xe, full), m.k(x, 0));
  c.out(0, tb.reshape(m.reduce(picked, ReduceOp::Add, {axis}), s));
  return absl::OkStatus();
}

}  // namespace

void register_reductions(Registry& r) {
  const std::vector<std::string> ra = {"axes", "keepdims", "noop_with_empty_axes"};
  r["ReduceSum"] = {[](NodeContext& c) { return reduce(c, Kind::Sum); }, ra};
  r["ReduceMean"] = {[](NodeContext& c) { return reduce(c, Kind::Mean); }, ra};
  r["ReduceMax"] = {[](NodeContext& c) { return reduce(c, Kind::Max); }, ra};
  r["ReduceMin"] = {[](NodeContext& c) { return reduce(c, Kind::Min); }, ra};
  r["ReduceProd"] = {[](NodeContext& c) { return reduce(c, Kind::Prod); }, ra};
  r["ReduceL1"] = {[](NodeContext& c) { return reduce(c, Kind::L1); }, ra};
  r["ReduceL2"] = {[](NodeContext& c) { return reduce(c, Kind::L2); }, ra};
  r["ReduceLogSum"] = {[](NodeContext& c) { return reduce(c, Kind::LogSum); }, ra};
  r["ReduceLogSumExp"] = {[](NodeContext& c) { return reduce(c, Kind::LogSumExp); }, ra};
  r["ReduceSumSquare"] = {[](NodeContext& c) { return reduce(c, Kind::SumSquare); }, ra};
  r["Softmax"] = {[](NodeContext& c) { return soft(c, SoftKind::Softmax); }, {"axis"}};
  r["LogSoftmax"] = {[](NodeContext& c) { return soft(c, SoftKind::LogSoftmax); }, {"axis"}};
  r["Hardmax"] = {[](NodeContext& c) { return soft(c, SoftKind::Hardmax); }, {"axis"}};
  r["ArgMax"] = {[](NodeContext& c) { return arg(c, true); }, {"axis", "keepdims", "select_last_index"}};
  r["ArgMin"] = {[](NodeContext& c) { return arg(c, false); }, {"axis", "keepdims", "select_last_index"}};
  r["CumSum"] = {cumsum, {"exclusive", "reverse"}};
}

}  // namespace uop::onnx_import
