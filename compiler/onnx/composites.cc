// The composites of composites.h. Constants are spelled out with their meaning; the
// polynomial coefficients name their source.
#include "compiler/onnx/composites.h"

#include <cmath>
#include <numbers>

namespace uop::onnx_import {

namespace {
constexpr double kLog2E = std::numbers::log2e;
constexpr double kLn2 = std::numbers::ln2;
constexpr double kPi = std::numbers::pi;
}  // namespace

Scalar Math::at_least_f32(Scalar s) {
  return s == Scalar::Float16 || s == Scalar::BFloat16 ? Scalar::Float32 : s;
}

const UOp* Math::k(const UOp* like, double v) {
  Scalar s = like->dtype().scalar;
  if (s == Scalar::Bool) return tb_.full(s, ConstValue::Bool(v != 0), {});
  if (scalar_is_int(s)) return tb_.full(s, ConstValue::Int(static_cast<int64_t>(v)), {});
  return tb_.full(s, v, {});
}

const UOp* Math::div(const UOp* a, const UOp* b) {
  return tb_.alu(a->dtype().is_float() ? Op::FDIV : Op::IDIV, {a, b});
}

const UOp* Math::not_(const UOp* a) { return tb_.alu(Op::XOR, {a, k(a, 1)}); }

const UOp* Math::neg(const UOp* a) {
  // NEG on unsigned ints wraps, as ONNX's reference (NumPy) does.
  return tb_.alu(Op::NEG, {a});
}

const UOp* Math::exp(const UOp* x) {
  return in(at_least_f32(x->dtype().scalar), x, [&](const UOp* v) { return tb_.alu(Op::EXP2, {mul(v, k(v, kLog2E))}); });
}

const UOp* Math::log(const UOp* x) {
  return in(at_least_f32(x->dtype().scalar), x, [&](const UOp* v) { return mul(tb_.alu(Op::LOG2, {v}), k(v, kLn2)); });
}

const UOp* Math::abs(const UOp* x) {
  if (x->dtype().is_unsigned() || x->dtype().is_bool()) return x;
  // -0.0 < 0 is false, so -0.0 stays -0.0 here; NumPy gives +0.0. Both compare equal.
  return where(lt(x, k(x, 0)), neg(x), x);
}

const UOp* Math::sign(const UOp* x) {
  const UOp* zero = k(x, 0);
  const UOp* pos = where(lt(zero, x), k(x, 1), zero);
  if (x->dtype().is_unsigned()) return pos;
  const UOp* s = where(lt(x, zero), k(x, -1), pos);
  // NaN compares false both ways; NumPy's sign(NaN) is NaN.
  return x->dtype().is_float() ? where(ne(x, x), x, s) : s;
}

const UOp* Math::floor(const UOp* x) {
  const UOp* t = tb_.alu(Op::TRUNC, {x});
  return where(lt(x, t), sub(t, k(x, 1)), t);
}

const UOp* Math::ceil(const UOp* x) {
  const UOp* t = tb_.alu(Op::TRUNC, {x});
  return where(lt(t, x), add(t, k(x, 1)), t);
}

const UOp* Math::round_even(const UOp* x) {
  // x - floor(x) is exact, so the halfway test is exact too.
  const UOp* f = floor(x);
  const UOp* d = sub(x, f);
  const UOp* half = k(x, 0.5);
  const UOp* odd = ne(mul(floor(mul(f, half)), k(x, 2)), f);
  const UOp* up = or_(lt(half, d), and_(eq(d, half), odd));
  return where(up, add(f, k(x, 1)), f);
}

const UOp* Math::sigmoid(const UOp* x) {
  return in(at_least_f32(x->dtype().scalar), x, [&](const UOp* v) { return recip(add(k(v, 1), exp(neg(v)))); });
}

const UOp* Math::tanh(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) {
    // tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|): no overflow for any x.
    const UOp* e = exp(mul(abs(v), k(v, -2)));
    const UOp* t = div(sub(k(v, 1), e), add(k(v, 1), e));
    return where(lt(v, k(v, 0)), neg(t), t);
  });
}

const UOp* Math::erf(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) {
    // |x| < 1: the Maclaurin series 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), 16 terms
    // (the first one left out is below 1e-14).
    const UOp* z = mul(v, v);
    const int kTerms = 16;
    double fact = 1;
    std::vector<double> c;
    for (int n = 0; n < kTerms; ++n) {
      if (n > 0) fact *= n;
      c.push_back((n % 2 ? -1.0 : 1.0) / (fact * (2 * n + 1)));
    }
    const UOp* p = k(v, c.back());
    for (int n = kTerms - 2; n >= 0; --n) p = add(mul(p, z), k(v, c[n]));
    const UOp* series = mul(mul(p, v), k(v, 2 / std::sqrt(kPi)));
    // |x| >= 1: Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7, erf >= 0.84 there).
    const UOp* ax = abs(v);
    const UOp* t = recip(add(k(v, 1), mul(ax, k(v, 0.3275911))));
    const double a[] = {0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429};
    const UOp* q = k(v, a[4]);
    for (int i = 3; i >= 0; --i) q = add(mul(q, t), k(v, a[i]));
    const UOp* tail = sub(k(v, 1), mul(mul(q, t), exp(neg(z))));
    const UOp* far = where(lt(v, k(v, 0)), neg(tail), tail);
    return where(lt(ax, k(v, 1)), series, far);
  });
}

const UOp* Math::cos(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) { return tb_.alu(Op::SIN, {add(v, k(v, kPi / 2))}); });
}

const UOp* Math::tan(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) { return div(tb_.alu(Op::SIN, {v}), cos(v)); });
}

const UOp* Math::atan_wide(const UOp* v) {
  // Cephes atanf: reduce |x| to [0, tan(pi/8)] with atan(x) = pi/2 - atan(1/x) and
  // atan(x) = pi/4 + atan((x-1)/(x+1)), then a degree-9 odd polynomial (relative error
  // about 1e-7).
  const UOp* ax = abs(v);
  const UOp* big = lt(k(v, 2.414213562373095), ax);
  const UOp* mid = lt(k(v, 0.4142135623730950), ax);
  const UOp* xr = where(big, neg(recip(ax)), where(mid, div(sub(ax, k(v, 1)), add(ax, k(v, 1))), ax));
  const UOp* y0 = where(big, k(v, kPi / 2), where(mid, k(v, kPi / 4), k(v, 0)));
  const UOp* z = mul(xr, xr);
  const UOp* p = k(v, 8.05374449538e-2);
  p = add(mul(p, z), k(v, -1.38776856032e-1));
  p = add(mul(p, z), k(v, 1.99777106478e-1));
  p = add(mul(p, z), k(v, -3.33329491539e-1));
  const UOp* r = add(y0, add(mul(mul(p, z), xr), xr));
  return where(lt(v, k(v, 0)), neg(r), r);
}

const UOp* Math::atan(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) { return atan_wide(v); });
}

const UOp* Math::asin(const UOp* x) {
  // asin(x) = atan(x / sqrt(1 - x^2)); +-1 gives +-inf, whose atan is +-pi/2.
  return in(Scalar::Float64, x, [&](const UOp* v) { return atan_wide(div(v, sqrt(sub(k(v, 1), mul(v, v))))); });
}

const UOp* Math::acos(const UOp* x) {
  // acos(x) = 2 atan(sqrt((1 - x) / (1 + x))): no cancellation near x = 1.
  return in(Scalar::Float64, x, [&](const UOp* v) {
    return mul(k(v, 2), atan_wide(sqrt(div(sub(k(v, 1), v), add(k(v, 1), v)))));
  });
}

const UOp* Math::sinh(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) { return mul(sub(exp(v), exp(neg(v))), k(v, 0.5)); });
}

const UOp* Math::cosh(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) { return mul(add(exp(v), exp(neg(v))), k(v, 0.5)); });
}

const UOp* Math::asinh(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) {
    const UOp* ax = abs(v);
    const UOp* r = log(add(ax, sqrt(add(mul(ax, ax), k(v, 1)))));
    return where(lt(v, k(v, 0)), neg(r), r);
  });
}

const UOp* Math::acosh(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) { return log(add(v, sqrt(sub(mul(v, v), k(v, 1))))); });
}

const UOp* Math::atanh(const UOp* x) {
  return in(Scalar::Float64, x, [&](const UOp* v) {
    return mul(k(v, 0.5), log(div(add(k(v, 1), v), sub(k(v, 1), v))));
  });
}

const UOp* Math::pow(const UOp* x, const UOp* y) {
  Scalar t = x->dtype().scalar;
  if (scalar_is_float(t) && t != Scalar::Float16 && t != Scalar::BFloat16) return tb_.alu(Op::POW, {x, cast(y, t)});
  Scalar wide = scalar_is_float(t) ? Scalar::Float32 : Scalar::Float64;
  return cast(tb_.alu(Op::POW, {cast(x, wide), cast(y, wide)}), t);
}

const UOp* Math::fmod(const UOp* x, const UOp* y) {
  Scalar t = x->dtype().scalar;
  if (!scalar_is_float(t)) return tb_.alu(Op::MOD, {x, y});  // MOD's sign follows x
  const UOp* a = cast(x, Scalar::Float64);
  const UOp* b = cast(y, Scalar::Float64);
  return cast(sub(a, mul(tb_.alu(Op::TRUNC, {div(a, b)}), b)), t);
}

const UOp* Math::floor_mod(const UOp* x, const UOp* y) {
  const UOp* r = fmod(x, y);
  if (x->dtype().is_unsigned()) return r;
  const UOp* zero = k(x, 0);
  const UOp* fix = and_(ne(r, zero), ne(lt(r, zero), lt(y, zero)));
  return where(fix, add(r, y), r);
}

}  // namespace uop::onnx_import
