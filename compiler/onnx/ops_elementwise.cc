// Elementwise operators: arithmetic, comparisons and logic (operands broadcast NumPy-style),
// unary math through composites.h, activations, Clip, Cast / CastLike, Where.
#include <cmath>
#include <limits>

#include "compiler/onnx/op_helpers.h"

namespace uop::onnx_import {

namespace {

using Unary = std::function<const UOp*(Math&, const UOp*)>;
using Binary = std::function<const UOp*(Math&, const UOp*, const UOp*)>;

bool is_float(const UOp* x) { return x->dtype().is_float(); }

Handler unary(Unary f, bool floats_only = false) {
  return [f, floats_only](NodeContext& c) -> absl::Status {
    ONNX_ASSIGN(const UOp* x, c.in(0));
    if (floats_only && !is_float(x)) return c.unsupported(cat("input of type ", scalar_name(c.dtype_of(x))));
    Math m(c.tb());
    c.out(0, f(m, x));
    return absl::OkStatus();
  };
}

Handler binary(Binary f) {
  return [f](NodeContext& c) -> absl::Status {
    ONNX_ASSIGN(const UOp* a, c.in(0));
    ONNX_ASSIGN(const UOp* b, c.in(1));
    ONNX_ASSIGN(auto xs, broadcast_all(c, {a, b}));
    Math m(c.tb());
    c.out(0, f(m, xs[0], xs[1]));
    return absl::OkStatus();
  };
}

// Sum, Mean, Max, Min: any number of inputs, broadcast together.
Handler variadic(Binary f, bool mean = false) {
  return [f, mean](NodeContext& c) -> absl::Status {
    ONNX_ASSIGN(auto xs, all_inputs(c));
    if (xs.empty()) return c.invalid("needs at least one input");
    ONNX_ASSIGN(xs, broadcast_all(c, xs));
    Math m(c.tb());
    const UOp* acc = xs[0];
    for (size_t i = 1; i < xs.size(); ++i) acc = f(m, acc, xs[i]);
    if (mean) acc = m.div(acc, m.k(acc, static_cast<double>(xs.size())));
    c.out(0, acc);
    return absl::OkStatus();
  };
}

// An activation with float attributes read once per node.
using Act = std::function<const UOp*(Math&, const UOp*, NodeContext&)>;
Handler activation(Act f) {
  return [f](NodeContext& c) -> absl::Status {
    ONNX_ASSIGN(const UOp* x, c.in(0));
    if (!is_float(x)) return c.unsupported(cat("input of type ", scalar_name(c.dtype_of(x))));
    Math m(c.tb());
    c.out(0, f(m, x, c));
    return absl::OkStatus();
  };
}

absl::Status cast_to(NodeContext& c, Scalar to) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  Math m(c.tb());
  Scalar from = c.dtype_of(x);
  if (from == to) {
    c.out(0, x);
  } else if (to == Scalar::BFloat16 && scalar_is_float(from) && c.opset() < 19) {
    // Before opset 19 ONNX's reference truncates float32 to bfloat16 (keeps the high 16
    // bits) rather than rounding; NaN stays NaN by forcing a mantissa bit.
    TensorBuilder& tb = c.tb();
    const UOp* f = m.cast(x, Scalar::Float32);
    const UOp* hi = m.cast(tb.alu(Op::SHR, {tb.bitcast(f, Scalar::UInt32), m.k(tb.bitcast(f, Scalar::UInt32), 16)}), Scalar::UInt16);
    hi = m.where(m.ne(f, f), m.or_(hi, m.k(hi, 0x40)), hi);
    c.out(0, tb.bitcast(hi, Scalar::BFloat16));
  } else if (to == Scalar::Bool) {
    c.out(0, m.ne(x, m.k(x, 0)));
  } else if (scalar_is_float(from) && scalar_is_float(to) && (from == Scalar::Float16 || from == Scalar::BFloat16 ||
                                                               to == Scalar::Float16 || to == Scalar::BFloat16) &&
             from != Scalar::Float32 && to != Scalar::Float32) {
    c.out(0, m.cast(m.cast(x, Scalar::Float32), to));  // via float32, exact in both directions
  } else {
    c.out(0, m.cast(x, to));
  }
  return absl::OkStatus();
}

absl::Status clip(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  Math m(c.tb());
  const UOp* y = x;
  if (c.opset() < 11) {
    float lo = c.attr_float("min", -std::numeric_limits<float>::infinity());
    float hi = c.attr_float("max", std::numeric_limits<float>::infinity());
    if (!std::isinf(lo)) y = m.max(y, m.k(y, lo));
    if (!std::isinf(hi)) y = m.min(y, m.k(y, hi));
  } else {
    if (c.has(1)) {
      ONNX_ASSIGN(const UOp* lo, c.in(1));
      y = m.max(y, c.tb().broadcast_to(lo, c.shape_of(x)));
    }
    if (c.has(2)) {
      ONNX_ASSIGN(const UOp* hi, c.in(2));
      y = m.min(y, c.tb().broadcast_to(hi, c.shape_of(x)));
    }
  }
  c.out(0, y);
  return absl::OkStatus();
}

absl::Status where(NodeContext& c) {
  ONNX_ASSIGN(const UOp* cond, c.in(0));
  ONNX_ASSIGN(const UOp* a, c.in(1));
  ONNX_ASSIGN(const UOp* b, c.in(2));
  if (c.dtype_of(cond) != Scalar::Bool) return c.invalid("condition must be bool");
  ONNX_ASSIGN(auto xs, broadcast_all(c, {cond, a, b}));
  c.out(0, c.tb().alu(Op::WHERE, {xs[0], xs[1], xs[2]}));
  return absl::OkStatus();
}

absl::Status prelu(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* slope, c.in(1));
  ONNX_ASSIGN(auto xs, broadcast_all(c, {x, slope}));
  Math m(c.tb());
  c.out(0, m.where(m.lt(xs[0], m.k(xs[0], 0)), m.mul(xs[0], xs[1]), xs[0]));
  return absl::OkStatus();
}

absl::Status bitshift(NodeContext& c) {
  ONNX_ASSIGN(const UOp* a, c.in(0));
  ONNX_ASSIGN(const UOp* b, c.in(1));
  ONNX_ASSIGN(auto xs, broadcast_all(c, {a, b}));
  std::string dir = c.attr_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") return c.invalid("direction must be LEFT or RIGHT");
  c.out(0, c.tb().alu(dir == "LEFT" ? Op::SHL : Op::SHR, {xs[0], xs[1]}));
  return absl::OkStatus();
}

absl::Status mod(NodeContext& c) {
  ONNX_ASSIGN(const UOp* a, c.in(0));
  ONNX_ASSIGN(const UOp* b, c.in(1));
  ONNX_ASSIGN(auto xs, broadcast_all(c, {a, b}));
  Math m(c.tb());
  bool f = c.attr_int("fmod", 0) != 0;
  if (is_float(a) && !f) return c.invalid("fmod must be 1 for floats");
  c.out(0, f ? m.fmod(xs[0], xs[1]) : m.floor_mod(xs[0], xs[1]));
  return absl::OkStatus();
}

absl::Status isinf(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  Math m(c.tb());
  const double inf = std::numeric_limits<double>::infinity();
  const UOp* pos = m.eq(x, m.k(x, inf));
  const UOp* neg = m.eq(x, m.k(x, -inf));
  bool p = c.attr_int("detect_positive", 1) != 0, n = c.attr_int("detect_negative", 1) != 0;
  const UOp* r = p && n ? m.or_(pos, neg) : p ? pos : n ? neg : m.ne(x, x) /* NaN-free false */;
  if (!p && !n) r = m.and_(m.eq(x, x), m.ne(x, x));
  c.out(0, r);
  return absl::OkStatus();
}

// A quantization parameter (scale or zero point) laid out to broadcast against x: a scalar
// or one-element tensor as is, a 1-D tensor along `axis`.
absl::StatusOr<const UOp*> per_axis(NodeContext& c, const UOp* p, const Dims& xs, int64_t axis) {
  const Dims ps = c.shape_of(p);
  if (numel_of(ps) == 1) return c.tb().reshape(p, {});
  ONNX_ASSIGN(axis, c.axis(axis, static_cast<int64_t>(xs.size())));
  if (ps.size() != 1 || ps[0] != xs[axis]) return c.unsupported("scale / zero point that is neither a scalar nor 1-D along axis (block quantization)");
  Dims r(xs.size(), 1);
  r[axis] = ps[0];
  return c.tb().reshape(p, r);
}

// Integer limits of a quantized type.
absl::StatusOr<std::pair<double, double>> quant_range(NodeContext& c, Scalar s) {
  switch (s) {
    case Scalar::UInt8: return std::pair<double, double>{0, 255};
    case Scalar::Int8: return std::pair<double, double>{-128, 127};
    case Scalar::UInt16: return std::pair<double, double>{0, 65535};
    case Scalar::Int16: return std::pair<double, double>{-32768, 32767};
    default: return c.unsupported(cat("quantizing to ", scalar_name(s)));
  }
}

// y = saturate(round_half_even(x / scale) + zero_point), in float32.
const UOp* quantize(Math& m, const UOp* x, const UOp* scale, const UOp* zp, Scalar to, std::pair<double, double> lim) {
  const UOp* xf = m.cast(x, Scalar::Float32);
  const UOp* q = m.round_even(m.div(xf, m.cast(scale, Scalar::Float32)));
  if (zp) q = m.add(q, m.cast(zp, Scalar::Float32));
  q = m.min(m.max(q, m.k(q, lim.first)), m.k(q, lim.second));
  return m.cast(q, to);
}

absl::Status quantize_linear(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* scale, c.in(1));
  if (c.attr_int("saturate", 1) != 1) return c.unsupported("saturate = 0");
  Math m(c.tb());
  const Dims xs = c.shape_of(x);
  const int64_t axis = c.attr_int("axis", 1);  // checked by per_axis, where it matters
  ONNX_ASSIGN(scale, per_axis(c, scale, xs, axis));
  const UOp* zp = nullptr;
  Scalar to = Scalar::UInt8;
  if (c.has(2)) {
    ONNX_ASSIGN(zp, c.in(2));
    to = c.dtype_of(zp);
    ONNX_ASSIGN(zp, per_axis(c, zp, xs, axis));
  }
  ONNX_ASSIGN(auto lim, quant_range(c, to));
  c.out(0, quantize(m, x, scale, zp, to, lim));
  return absl::OkStatus();
}

absl::Status dequantize_linear(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  ONNX_ASSIGN(const UOp* scale, c.in(1));
  Math m(c.tb());
  const Dims xs = c.shape_of(x);
  const int64_t axis = c.attr_int("axis", 1);  // checked by per_axis, where it matters
  ONNX_ASSIGN(scale, per_axis(c, scale, xs, axis));
  const Scalar dt = c.dtype_of(scale);
  if (!scalar_is_float(dt)) return c.invalid("x_scale must be a float tensor");
  if (!scalar_is_int(c.dtype_of(x))) return c.unsupported(cat("dequantizing ", scalar_name(c.dtype_of(x))));
  // (x - zero_point) as float32 (exact for 8/16-bit ints and int32 differences the
  // reference also computes in float32), times the scale.
  const UOp* v = m.cast(x, Scalar::Float32);
  if (c.has(2)) {
    ONNX_ASSIGN(const UOp* zp, c.in(2));
    ONNX_ASSIGN(zp, per_axis(c, zp, xs, axis));
    v = m.sub(v, m.cast(zp, Scalar::Float32));
  }
  c.out(0, m.cast(m.mul(v, m.cast(scale, Scalar::Float32)), dt));
  return absl::OkStatus();
}

// DynamicQuantizeLinear: uint8 with scale (max(0, max x) - min(0, min x)) / 255 and the zero
// point that maps 0 exactly.
absl::Status dynamic_quantize_linear(NodeContext& c) {
  ONNX_ASSIGN(const UOp* x, c.in(0));
  TensorBuilder& tb = c.tb();
  Math m(tb);
  const Dims xs = c.shape_of(x);
  std::vector<int64_t> all;
  for (size_t a = 0; a < xs.size(); ++a) all.push_back(static_cast<int64_t>(a));
  const UOp* xf = m.cast(x, Scalar::Float32);
  const UOp* lo = tb.reshape(all.empty() ? xf : m.reduce(xf, ReduceOp::Min, all), {});
  const UOp* hi = tb.reshape(all.empty() ? xf : m.reduce(xf, ReduceOp::Max, all), {});
  lo = m.min(lo, m.k(lo, 0));
  hi = m.max(hi, m.k(hi, 0));
  const UOp* scale = m.div(m.sub(hi, lo), m.k(hi, 255));
  const UOp* zp0 = m.sub(m.k(lo, 0), m.div(lo, scale));
  const UOp* zpf = m.round_even(m.min(m.max(zp0, m.k(zp0, 0)), m.k(zp0, 255)));
  const UOp* zp = m.cast(zpf, Scalar::UInt8);
  if (c.wants(0)) c.out(0, quantize(m, x, scale, zpf, Scalar::UInt8, {0, 255}));
  if (c.wants(1)) c.out(1, scale);
  if (c.wants(2)) c.out(2, zp);
  return absl::OkStatus();
}

// Hann / Hamming / Blackman windows: a function of the size only, computed here.
absl::Status window(NodeContext& c, const std::vector<double>& a) {
  ONNX_ASSIGN(double size_v, c.scalar(0));
  const int64_t n = static_cast<int64_t>(size_v);
  if (n <= 0) return c.unsupported("size 0 (empty tensors are not supported)");
  std::optional<Scalar> dt = scalar_from_onnx(static_cast<int>(c.attr_int("output_datatype", 1)));
  if (!dt) return c.unsupported("output_datatype");
  const bool periodic = c.attr_int("periodic", 1) != 0;
  const double N = periodic ? static_cast<double>(n) : static_cast<double>(n - 1);
  ONNX_ASSIGN(HostTensor t, c.zeros(*dt, {n}));
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    for (size_t k = 0; k < a.size(); ++k)
      v += (k % 2 ? -1 : 1) * a[k] * std::cos(2 * M_PI * static_cast<double>(k) * static_cast<double>(i) / N);
    t.set(i, scalar_is_float(*dt) ? ConstValue::Float(v) : ConstValue::Int(static_cast<int64_t>(v)));
  }
  c.out_constant(0, std::move(t));
  return absl::OkStatus();
}

}  // namespace

void register_elementwise(Registry& r) {
  r["QuantizeLinear"] = {quantize_linear, {"axis", "saturate"}};
  r["DequantizeLinear"] = {dequantize_linear, {"axis"}};
  r["DynamicQuantizeLinear"] = {dynamic_quantize_linear, {}};
  r["HannWindow"] = {[](NodeContext& c) { return window(c, {0.5, 0.5}); }, {"output_datatype", "periodic"}};
  r["HammingWindow"] = {[](NodeContext& c) { return window(c, {25.0 / 46, 21.0 / 46}); }, {"output_datatype", "periodic"}};
  r["BlackmanWindow"] = {[](NodeContext& c) { return window(c, {0.42, 0.5, 0.08}); }, {"output_datatype", "periodic"}};
  auto add = [](Math& m, const UOp* a, const UOp* b) { return m.add(a, b); };
  auto mx = [](Math& m, const UOp* a, const UOp* b) {
    // NaN wins, as NumPy's maximum.
    const UOp* v = m.max(a, b);
    if (!a->dtype().is_float()) return v;
    return m.where(m.ne(a, a), a, m.where(m.ne(b, b), b, v));
  };
  auto mn = [](Math& m, const UOp* a, const UOp* b) {
    const UOp* v = m.min(a, b);
    if (!a->dtype().is_float()) return v;
    return m.where(m.ne(a, a), a, m.where(m.ne(b, b), b, v));
  };
  r["Add"] = {binary(add), {}};
  r["Sub"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.sub(a, b); }), {}};
  r["Mul"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.mul(a, b); }), {}};
  r["Div"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.div(a, b); }), {}};
  r["Pow"] = {[](NodeContext& c) -> absl::Status {
                ONNX_ASSIGN(const UOp* a, c.in(0));
                ONNX_ASSIGN(const UOp* b, c.in(1));
                std::vector<Dims> shapes = {c.shape_of(a), c.shape_of(b)};
                ONNX_ASSIGN(Dims out, c.broadcast(shapes));
                Math m(c.tb());
                c.out(0, m.pow(c.tb().broadcast_to(a, out), c.tb().broadcast_to(b, out)));
                return absl::OkStatus();
              },
              {}};
  r["Mod"] = {mod, {"fmod"}};
  r["Equal"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.eq(a, b); }), {}};
  r["Less"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.lt(a, b); }), {}};
  r["Greater"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.lt(b, a); }), {}};
  r["LessOrEqual"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.or_(m.lt(a, b), m.eq(a, b)); }), {}};
  r["GreaterOrEqual"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.or_(m.lt(b, a), m.eq(a, b)); }), {}};
  r["And"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.and_(a, b); }), {}};
  r["Or"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.or_(a, b); }), {}};
  r["Xor"] = {binary([](Math& m, const UOp* a, const UOp* b) { return m.tb().alu(Op::XOR, {a, b}); }), {}};
  r["BitShift"] = {bitshift, {"direction"}};
  r["Sum"] = {variadic(add), {}};
  r["Mean"] = {variadic(add, true), {}};
  r["Max"] = {variadic(mx), {}};
  r["Min"] = {variadic(mn), {}};
  r["Where"] = {where, {}};
  r["Clip"] = {clip, {"min", "max"}};
  r["PRelu"] = {prelu, {}};

  r["Not"] = {unary([](Math& m, const UOp* x) { return m.not_(x); }), {}};
  r["Neg"] = {unary([](Math& m, const UOp* x) { return m.neg(x); }), {}};
  r["Abs"] = {unary([](Math& m, const UOp* x) { return m.abs(x); }), {}};
  r["Sign"] = {unary([](Math& m, const UOp* x) { return m.sign(x); }), {}};
  r["Identity"] = {unary([](Math&, const UOp* x) { return x; }), {}};
  r["Exp"] = {unary([](Math& m, const UOp* x) { return m.exp(x); }, true), {}};
  r["Log"] = {unary([](Math& m, const UOp* x) { return m.log(x); }, true), {}};
  r["Sqrt"] = {unary([](Math& m, const UOp* x) { return m.sqrt(x); }, true), {}};
  r["Reciprocal"] = {unary([](Math& m, const UOp* x) { return m.recip(x); }, true), {}};
  r["Floor"] = {unary([](Math& m, const UOp* x) { return m.floor(x); }, true), {}};
  r["Ceil"] = {unary([](Math& m, const UOp* x) { return m.ceil(x); }, true), {}};
  r["Round"] = {unary([](Math& m, const UOp* x) { return m.round_even(x); }, true), {}};
  r["Sin"] = {unary([](Math& m, const UOp* x) { return m.in(Scalar::Float64, x, [&](const UOp* v) { return m.tb().alu(Op::SIN, {v}); }); }, true), {}};
  r["Cos"] = {unary([](Math& m, const UOp* x) { return m.cos(x); }, true), {}};
  r["Tan"] = {unary([](Math& m, const UOp* x) { return m.tan(x); }, true), {}};
  r["Asin"] = {unary([](Math& m, const UOp* x) { return m.asin(x); }, true), {}};
  r["Acos"] = {unary([](Math& m, const UOp* x) { return m.acos(x); }, true), {}};
  r["Atan"] = {unary([](Math& m, const UOp* x) { return m.atan(x); }, true), {}};
  r["Sinh"] = {unary([](Math& m, const UOp* x) { return m.sinh(x); }, true), {}};
  r["Cosh"] = {unary([](Math& m, const UOp* x) { return m.cosh(x); }, true), {}};
  r["Asinh"] = {unary([](Math& m, const UOp* x) { return m.asinh(x); }, true), {}};
  r["Acosh"] = {unary([](Math& m, const UOp* x) { return m.acosh(x); }, true), {}};
  r["Atanh"] = {unary([](Math& m, const UOp* x) { return m.atanh(x); }, true), {}};
  r["Erf"] = {unary([](Math& m, const UOp* x) { return m.erf(x); }, true), {}};
  r["IsNaN"] = {unary([](Math& m, const UOp* x) { return m.ne(x, x); }, true), {}};
  r["IsInf"] = {isinf, {"detect_negative", "detect_positive"}};
  r["Cast"] = {[](NodeContext& c) -> absl::Status {
                 std::optional<Scalar> to = scalar_from_onnx(static_cast<int>(c.attr_int("to", 0)));
                 if (!to) return c.unsupported(cat("cast to ", onnx_type_name(static_cast<int>(c.attr_int("to", 0)))));
                 return cast_to(c, *to);
               },
               {"to", "saturate"}};
  r["CastLike"] = {[](NodeContext& c) -> absl::Status {
                     ONNX_ASSIGN(Scalar to, c.dtype(1));
                     return cast_to(c, to);
                   },
                   {"saturate"}};
}

void register_activations(Registry& r) {
  r["Relu"] = {unary([](Math& m, const UOp* x) { return m.max(x, m.k(x, 0)); }), {}};
  r["Sigmoid"] = {unary([](Math& m, const UOp* x) { return m.sigmoid(x); }, true), {}};
  r["Tanh"] = {unary([](Math& m, const UOp* x) { return m.tanh(x); }, true), {}};
  r["LeakyRelu"] = {activation([](Math& m, const UOp* x, NodeContext& c) {
                      return m.where(m.lt(x, m.k(x, 0)), m.mul(x, m.k(x, c.attr_float("alpha", 0.01f))), x);
                    }),
                    {"alpha"}};
  r["Elu"] = {activation([](Math& m, const UOp* x, NodeContext& c) {
                const UOp* a = m.k(x, c.attr_float("alpha", 1.0f));
                return m.where(m.lt(x, m.k(x, 0)), m.mul(a, m.sub(m.exp(x), m.k(x, 1))), x);
              }),
              {"alpha"}};
  r["Selu"] = {activation([](Math& m, const UOp* x, NodeContext& c) {
                 const UOp* a = m.k(x, c.attr_float("alpha", 1.67326319217681884765625f));
                 const UOp* g = m.k(x, c.attr_float("gamma", 1.05070102214813232421875f));
                 const UOp* neg = m.sub(m.mul(a, m.exp(x)), a);
                 return m.mul(g, m.where(m.lt(m.k(x, 0), x), x, neg));
               }),
               {"alpha", "gamma"}};
  r["Celu"] = {activation([](Math& m, const UOp* x, NodeContext& c) {
                 const UOp* a = m.k(x, c.attr_float("alpha", 1.0f));
                 const UOp* neg = m.mul(a, m.sub(m.exp(m.div(x, a)), m.k(x, 1)));
                 return m.add(m.max(x, m.k(x, 0)), m.min(m.k(x, 0), neg));
               }),
               {"alpha"}};
  r["HardSigmoid"] = {activation([](Math& m, const UOp* x, NodeContext& c) {
                        const UOp* y = m.add(m.mul(x, m.k(x, c.attr_float("alpha", 0.2f))), m.k(x, c.attr_float("beta", 0.5f)));
                        return m.max(m.k(x, 0), m.min(m.k(x, 1), y));
                      }),
                      {"alpha", "beta"}};
  r["HardSwish"] = {activation([](Math& m, const UOp* x, NodeContext&) {
                      const UOp* y = m.add(m.mul(x, m.k(x, 1.0 / 6)), m.k(x, 0.5));
                      return m.mul(x, m.max(m.k(x, 0), m.min(m.k(x, 1), y)));
                    }),
                    {}};
  r["Softplus"] = {activation([](Math& m, const UOp* x, NodeContext&) {
                     // max(x, 0) + log(1 + exp(-|x|)): no overflow for large x.
                     return m.add(m.max(x, m.k(x, 0)), m.log(m.add(m.k(x, 1), m.exp(m.neg(m.abs(x))))));
                   }),
                   {}};
  r["Softsign"] = {activation([](Math& m, const UOp* x, NodeContext&) { return m.div(x, m.add(m.k(x, 1), m.abs(x))); }), {}};
  r["ThresholdedRelu"] = {activation([](Math& m, const UOp* x, NodeContext& c) {
                            return m.where(m.lt(m.k(x, c.attr_float("alpha", 1.0f)), x), x, m.k(x, 0));
                          }),
                          {"alpha"}};
  r["Shrink"] = {[](NodeContext& c) -> absl::Status {
                   ONNX_ASSIGN(const UOp* x, c.in(0));
                   Math m(c.tb());
                   const UOp* l = m.k(x, c.attr_float("lambd", 0.5f));
                   const UOp* b = m.k(x, c.attr_float("bias", 0.0f));
                   const UOp* neg = m.k(x, -c.attr_float("lambd", 0.5f));
                   c.out(0, m.where(m.lt(x, neg), m.add(x, b), m.where(m.lt(l, x), m.sub(x, b), m.k(x, 0))));
                   return absl::OkStatus();
                 },
                 {"lambd", "bias"}};
}

}  // namespace uop::onnx_import
