#include "compiler/ir/eval.h"

#include <bit>
#include <cmath>
#include <limits>

namespace uop {
namespace {

using Kind = ConstValue::Kind;

// Wrap a 64-bit pattern into an integer type's range and return it as a value of that type.
ConstValue wrap_int(uint64_t bits, Scalar type) {
  int nb = scalar_bits(type);
  if (nb < 64) bits &= (uint64_t{1} << nb) - 1;
  if (scalar_is_unsigned_int(type)) return ConstValue::UInt(bits);
  if (nb < 64 && (bits >> (nb - 1)) & 1) bits |= ~((uint64_t{1} << nb) - 1);  // sign extend
  return ConstValue::Int(static_cast<int64_t>(bits));
}

struct FormatInfo { int precision, emin, emax; };
FormatInfo format_of(Scalar s) {
  switch (s) {
    case Scalar::Float16: return {11, -14, 15};
    case Scalar::BFloat16: return {8, -126, 127};
    case Scalar::Float32: return {24, -126, 127};
    default: return {53, -1022, 1023};
  }
}

// An integer as a double rounded to odd at 53 bits, so that a second rounding to any
// precision <= 51 bits is a correct single rounding of the integer.
double int_to_double_round_odd(uint64_t mag, bool neg) {
  double d;
  if (mag < (uint64_t{1} << 53)) {
    d = static_cast<double>(mag);
  } else {
    int shift = 64 - std::countl_zero(mag) - 53;
    uint64_t keep = mag >> shift;
    if (mag & ((uint64_t{1} << shift) - 1)) keep |= 1;
    d = std::ldexp(static_cast<double>(keep), shift);
  }
  return neg ? -d : d;
}

double int_to_float(ConstValue v, Scalar to) {
  bool neg = false;
  uint64_t mag;
  if (v.kind() == Kind::Int) {
    int64_t i = v.as_int();
    neg = i < 0;
    mag = neg ? (~static_cast<uint64_t>(i) + 1) : static_cast<uint64_t>(i);
  } else {
    mag = v.kind() == Kind::Bool ? (v.as_bool() ? 1 : 0) : v.as_uint();
  }
  if (to == Scalar::Float64) {
    double d = static_cast<double>(mag);  // one correct rounding
    return neg ? -d : d;
  }
  return round_to_float(int_to_double_round_odd(mag, neg), to);
}

ConstValue float_to_int(double d, Scalar to) {
  if (std::isnan(d)) return scalar_is_unsigned_int(to) ? ConstValue::UInt(0) : ConstValue::Int(0);
  d = std::trunc(d);
  int nb = scalar_bits(to);
  if (scalar_is_unsigned_int(to)) {
    double maxp1 = std::ldexp(1.0, nb);  // 2^nb
    if (d <= 0) return ConstValue::UInt(0);
    if (d >= maxp1) return ConstValue::UInt(nb == 64 ? UINT64_MAX : (uint64_t{1} << nb) - 1);
    return ConstValue::UInt(static_cast<uint64_t>(d));
  }
  double lim = std::ldexp(1.0, nb - 1);  // 2^(nb-1)
  if (d >= lim) return ConstValue::Int(nb == 64 ? INT64_MAX : (int64_t{1} << (nb - 1)) - 1);
  if (d < -lim) return ConstValue::Int(nb == 64 ? INT64_MIN : -(int64_t{1} << (nb - 1)));
  return ConstValue::Int(static_cast<int64_t>(d));
}

std::optional<ConstValue> eval_float(Op op, Scalar t, std::span<const ConstValue> a) {
  auto R = [t](double x) { return ConstValue::Float(round_to_float(x, t)); };
  auto B = [](bool b) { return ConstValue::Bool(b); };
  double x = a[0].as_float();
  double y = a.size() > 1 ? a[1].as_float() : 0;
  switch (op) {
    case Op::NEG: return R(-x);
    case Op::EXP2: return R(std::exp2(x));
    case Op::LOG2: return R(std::log2(x));
    case Op::SIN: return R(std::sin(x));
    case Op::SQRT: return R(std::sqrt(x));
    case Op::RECIPROCAL: return R(1.0 / x);
    case Op::TRUNC: return R(std::trunc(x));
    case Op::ADD: return R(x + y);
    case Op::SUB: return R(x - y);
    case Op::MUL: return R(x * y);
    case Op::FDIV: return R(x / y);
    case Op::POW: return R(std::pow(x, y));
    case Op::MAX:
    case Op::MIN: {
      if (std::isnan(x) || std::isnan(y)) return R(std::numeric_limits<double>::quiet_NaN());
      if (x == y) {  // only the signs of zeros can differ
        bool pick_x = op == Op::MAX ? !std::signbit(x) : std::signbit(x);
        return R(pick_x ? x : y);
      }
      return R(op == Op::MAX ? (x > y ? x : y) : (x < y ? x : y));
    }
    case Op::CMPLT: return B(x < y);
    case Op::CMPNE: return B(x != y);
    case Op::CMPEQ: return B(x == y);
    case Op::MULACC: {
      if (t == Scalar::Float64) return ConstValue::Float(std::fma(x, y, a[2].as_float()));
      // x*y is exact in double for every narrower format. The sum is rounded to odd at 53
      // bits (TwoSum gives the exact error), which makes the final rounding a single one.
      double z = a[2].as_float(), p = x * y, s = p + z;
      if (std::isfinite(s)) {
        double bb = s - p, err = (p - (s - bb)) + (z - bb);
        if (err != 0 && (std::bit_cast<uint64_t>(s) & 1) == 0)
          s = std::nextafter(s, err > 0 ? INFINITY : -INFINITY);
      }
      return R(s);
    }
    default: return std::nullopt;
  }
}

std::optional<ConstValue> eval_int(Op op, Scalar t, std::span<const ConstValue> a) {
  const bool is_signed = scalar_is_signed_int(t);
  const int nb = scalar_bits(t);
  auto W = [t](uint64_t bits) { return wrap_int(bits, t); };
  auto B = [](bool b) { return ConstValue::Bool(b); };
  uint64_t x = a[0].bits();
  uint64_t y = a.size() > 1 ? a[1].bits() : 0;
  int64_t sx = static_cast<int64_t>(x), sy = static_cast<int64_t>(y);
  switch (op) {
    case Op::NEG: return W(~x + 1);
    case Op::ADD: return W(x + y);
    case Op::SUB: return W(x - y);
    case Op::MUL: return W(x * y);
    case Op::IDIV:
      if (y == 0) return W(0);
      if (is_signed) {
        if (nb == 64 && sx == INT64_MIN && sy == -1) return W(x);
        return W(static_cast<uint64_t>(sx / sy));  // narrower types cannot overflow in int64
      }
      return W(x / y);
    case Op::MOD:
      if (y == 0) return W(x);
      if (is_signed) {
        if (sy == -1) return W(0);
        return W(static_cast<uint64_t>(sx % sy));
      }
      return W(x % y);
    case Op::MAX: return W(is_signed ? (sx > sy ? x : y) : (x > y ? x : y));
    case Op::MIN: return W(is_signed ? (sx < sy ? x : y) : (x < y ? x : y));
    case Op::CMPLT: return B(is_signed ? sx < sy : x < y);
    case Op::CMPNE: return B(x != y);
    case Op::CMPEQ: return B(x == y);
    case Op::AND: return W(x & y);
    case Op::OR: return W(x | y);
    case Op::XOR: return W(x ^ y);
    case Op::SHL: return W(x << (y % nb));
    case Op::SHR: {
      int s = static_cast<int>(y % nb);
      return W(is_signed ? static_cast<uint64_t>(sx >> s) : (x >> s));
    }
    case Op::MULACC: return W(x * y + a[2].bits());
    default: return std::nullopt;
  }
}

std::optional<ConstValue> eval_bool(Op op, std::span<const ConstValue> a) {
  bool x = a[0].as_bool();
  bool y = a.size() > 1 ? a[1].as_bool() : false;
  auto B = [](bool b) { return ConstValue::Bool(b); };
  switch (op) {
    case Op::AND: return B(x && y);
    case Op::OR: return B(x || y);
    case Op::XOR: case Op::CMPNE: return B(x != y);
    case Op::CMPEQ: return B(x == y);
    case Op::CMPLT: return B(!x && y);
    case Op::MAX: return B(x || y);
    case Op::MIN: return B(x && y);
    default: return std::nullopt;
  }
}

}  // namespace

double round_to_precision(double x, int precision, int emin, int emax) {
  if (!std::isfinite(x) || x == 0) return x;
  int e;
  std::frexp(x, &e);  // |x| = m * 2^e, m in [0.5, 1): the unit exponent is e - 1
  int exp = std::max(e - 1, emin);
  double ulp = std::ldexp(1.0, exp - (precision - 1));
  double r = std::nearbyint(x / ulp) * ulp;  // x / ulp is exact; nearbyint rounds to even
  if (std::fabs(r) >= std::ldexp(1.0, emax + 1)) return std::copysign(INFINITY, x);
  return r;
}

double round_to_float(double x, Scalar to) {
  if (to == Scalar::Float64) return x;
  if (to == Scalar::Float32) return static_cast<double>(static_cast<float>(x));
  FormatInfo f = format_of(to);
  if (std::isnan(x)) return x;
  return round_to_precision(x, f.precision, f.emin, f.emax);
}

uint16_t float_to_half_bits(double x) {
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;
  double m = std::fabs(round_to_float(x, Scalar::Float16));
  if (std::isinf(m)) return sign | 0x7c00;
  if (m == 0) return sign;
  int e;
  double frac = std::frexp(m, &e);  // m = frac * 2^e
  int biased = e - 1 + 15;
  if (biased <= 0) return sign | static_cast<uint16_t>(std::ldexp(m, 24));  // subnormal
  uint16_t mant = static_cast<uint16_t>(std::ldexp(frac * 2 - 1, 10));
  return sign | static_cast<uint16_t>(biased << 10) | mant;
}

double half_bits_to_double(uint16_t h) {
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

uint16_t float_to_bfloat_bits(double x) {
  if (std::isnan(x)) return 0x7fc0;
  float f = static_cast<float>(round_to_float(x, Scalar::BFloat16));
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
}

double bfloat_bits_to_double(uint16_t b) {
  return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(b) << 16));
}

uint64_t value_to_bits(ConstValue v, Scalar type) {
  switch (type) {
    case Scalar::Float16: return float_to_half_bits(v.as_float());
    case Scalar::BFloat16: return float_to_bfloat_bits(v.as_float());
    case Scalar::Float32: {
      float f = static_cast<float>(v.as_float());
      return std::bit_cast<uint32_t>(f);
    }
    case Scalar::Float64: return v.bits();
    case Scalar::Bool: return v.as_bool() ? 1 : 0;
    default: {
      int nb = scalar_bits(type);
      return nb >= 64 ? v.bits() : v.bits() & ((uint64_t{1} << nb) - 1);
    }
  }
}

ConstValue bits_to_value(uint64_t bits, Scalar type) {
  switch (type) {
    case Scalar::Float16: return ConstValue::Float(half_bits_to_double(static_cast<uint16_t>(bits)));
    case Scalar::BFloat16: return ConstValue::Float(bfloat_bits_to_double(static_cast<uint16_t>(bits)));
    case Scalar::Float32: return ConstValue::Float(std::bit_cast<float>(static_cast<uint32_t>(bits)));
    case Scalar::Float64: return ConstValue::Float(std::bit_cast<double>(bits));
    case Scalar::Bool: return ConstValue::Bool((bits & 1) != 0);
    default: return wrap_int(bits, type);
  }
}

ConstValue cast_value(ConstValue v, Scalar to) {
  if (to == Scalar::Void) return ConstValue::Int(0);  // no value; callers refuse void constants
  if (to == Scalar::Bool) {
    if (v.kind() == Kind::Float) return ConstValue::Bool(v.as_float() != 0);  // NaN != 0
    return ConstValue::Bool(v.bits() != 0);
  }
  if (scalar_is_float(to)) {
    if (v.kind() == Kind::Float) return ConstValue::Float(round_to_float(v.as_float(), to));
    return ConstValue::Float(int_to_float(v, to));
  }
  if (v.kind() == Kind::Float) return float_to_int(v.as_float(), to);
  if (v.kind() == Kind::Bool) return wrap_int(v.as_bool() ? 1 : 0, to);
  return wrap_int(v.bits(), to);
}

std::optional<ConstValue> bitcast_value(ConstValue v, Scalar from, Scalar to) {
  if (scalar_bits(from) != scalar_bits(to) || from == Scalar::Bool || to == Scalar::Bool)
    return std::nullopt;
  return bits_to_value(value_to_bits(v, from), to);
}

bool is_value_of(ConstValue v, Scalar type) {
  if (v.kind() != ConstValue::kind_of(type)) return false;
  if (v.kind() == Kind::Bool) return v.bits() <= 1;
  if (v.kind() == Kind::Float) {
    double d = v.as_float();
    return std::isnan(d) || round_to_float(d, type) == d;
  }
  return cast_value(v, type) == v;  // wraps to itself: in range
}

ConstValue reduce_identity(ReduceOp op, Scalar t) {
  const int nb = scalar_bits(t);
  const uint64_t sign = nb >= 64 ? uint64_t{1} << 63 : uint64_t{1} << (nb - 1);
  const bool is_signed = scalar_is_signed_int(t);
  switch (op) {
    case ReduceOp::Add: return cast_value(ConstValue::Int(0), t);
    case ReduceOp::Mul: return cast_value(ConstValue::Int(1), t);
    case ReduceOp::Max:
      if (scalar_is_float(t)) return ConstValue::Float(-INFINITY);
      if (t == Scalar::Bool) return ConstValue::Bool(false);
      return bits_to_value(is_signed ? sign : 0, t);
    case ReduceOp::Min:
      if (scalar_is_float(t)) return ConstValue::Float(INFINITY);
      if (t == Scalar::Bool) return ConstValue::Bool(true);
      return bits_to_value(is_signed ? sign - 1 : ~uint64_t{0}, t);
  }
  return ConstValue();
}

Op reduce_combine_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Add: return Op::ADD;
    case ReduceOp::Mul: return Op::MUL;
    case ReduceOp::Max: return Op::MAX;
    case ReduceOp::Min: return Op::MIN;
  }
  return Op::ADD;
}

std::optional<ConstValue> eval_alu(Op op, Scalar t, std::span<const ConstValue> args) {
  const OpInfo& info = op_info(op);
  if (static_cast<int>(args.size()) != info.min_src) return std::nullopt;
  if (op == Op::WHERE) return args[0].as_bool() ? args[1] : args[2];
  if (t == Scalar::Void) return std::nullopt;
  if (t == Scalar::Bool) return eval_bool(op, args);
  if (scalar_is_float(t)) return eval_float(op, t, args);
  return eval_int(op, t, args);
}

}  // namespace uop
