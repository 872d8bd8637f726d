// The scalar semantics every backend must reproduce (eval.h documents them).
#include "compiler/ir/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace uop {
namespace {

ConstValue I(int64_t v) { return ConstValue::Int(v); }
ConstValue U(uint64_t v) { return ConstValue::UInt(v); }
ConstValue F(double v) { return ConstValue::Float(v); }

ConstValue eval(Op op, Scalar t, std::initializer_list<ConstValue> a) {
  auto r = eval_alu(op, t, std::span<const ConstValue>(a.begin(), a.size()));
  EXPECT_TRUE(r.has_value()) << op_name(op) << " on " << scalar_name(t);
  return r.value_or(ConstValue());
}

TEST(Eval, IntegerWraparound) {
  EXPECT_EQ(eval(Op::ADD, Scalar::Int8, {I(127), I(1)}), I(-128));
  EXPECT_EQ(eval(Op::MUL, Scalar::Int16, {I(300), I(300)}), I(90000 - 65536 * 1));
  EXPECT_EQ(eval(Op::SUB, Scalar::UInt8, {U(0), U(1)}), U(255));
  EXPECT_EQ(eval(Op::NEG, Scalar::UInt32, {U(1)}), U(0xffffffffu));
  EXPECT_EQ(eval(Op::ADD, Scalar::Int64, {I(INT64_MAX), I(1)}), I(INT64_MIN));
}

TEST(Eval, TruncatingDivisionAndZeroDivisors) {
  EXPECT_EQ(eval(Op::IDIV, Scalar::Int32, {I(-7), I(2)}), I(-3));
  EXPECT_EQ(eval(Op::MOD, Scalar::Int32, {I(-7), I(2)}), I(-1));
  EXPECT_EQ(eval(Op::MOD, Scalar::Int32, {I(7), I(-2)}), I(1));
  EXPECT_EQ(eval(Op::IDIV, Scalar::Int32, {I(5), I(0)}), I(0));
  EXPECT_EQ(eval(Op::MOD, Scalar::Int32, {I(5), I(0)}), I(5));
  EXPECT_EQ(eval(Op::IDIV, Scalar::Int32, {I(INT32_MIN), I(-1)}), I(INT32_MIN));
  EXPECT_EQ(eval(Op::MOD, Scalar::Int32, {I(INT32_MIN), I(-1)}), I(0));
  EXPECT_EQ(eval(Op::IDIV, Scalar::Int64, {I(INT64_MIN), I(-1)}), I(INT64_MIN));
  EXPECT_EQ(eval(Op::IDIV, Scalar::UInt8, {U(200), U(0)}), U(0));
  EXPECT_EQ(eval(Op::IDIV, Scalar::Index, {I(-9), I(4)}), I(-2));
}

TEST(Eval, Shifts) {
  EXPECT_EQ(eval(Op::SHL, Scalar::UInt8, {U(1), U(9)}), U(2));  // 9 mod 8 = 1
  EXPECT_EQ(eval(Op::SHR, Scalar::Int8, {I(-128), I(7)}), I(-1));
  EXPECT_EQ(eval(Op::SHR, Scalar::UInt8, {U(128), U(7)}), U(1));
}

TEST(Eval, NaNPropagation) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(eval(Op::MAX, Scalar::Float32, {F(nan), F(1)}).as_float()));
  EXPECT_TRUE(std::isnan(eval(Op::MIN, Scalar::Float32, {F(1), F(nan)}).as_float()));
  EXPECT_TRUE(std::isnan(eval(Op::ADD, Scalar::Float16, {F(nan), F(1)}).as_float()));
  EXPECT_EQ(eval(Op::CMPLT, Scalar::Float32, {F(nan), F(1)}), ConstValue::Bool(false));
  EXPECT_EQ(eval(Op::CMPEQ, Scalar::Float32, {F(nan), F(nan)}), ConstValue::Bool(false));
  EXPECT_EQ(eval(Op::CMPNE, Scalar::Float32, {F(nan), F(nan)}), ConstValue::Bool(true));
  // -0 < +0 for MAX / MIN.
  EXPECT_FALSE(std::signbit(eval(Op::MAX, Scalar::Float32, {F(-0.0), F(0.0)}).as_float()));
  EXPECT_TRUE(std::signbit(eval(Op::MIN, Scalar::Float32, {F(0.0), F(-0.0)}).as_float()));
}

TEST(Eval, HalfAndBFloatRounding) {
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10 in float16: round to even gives 1.
  EXPECT_EQ(eval(Op::ADD, Scalar::Float16, {F(1.0), F(std::ldexp(1, -11))}).as_float(), 1.0);
  // 1 + 3*2^-12 rounds up to 1 + 2^-10.
  EXPECT_EQ(round_to_float(1 + 3 * std::ldexp(1, -12), Scalar::Float16), 1 + std::ldexp(1, -10));
  EXPECT_EQ(round_to_float(65520.0, Scalar::Float16), INFINITY);  // past the largest half
  EXPECT_EQ(round_to_float(65519.0, Scalar::Float16), 65504.0);
  EXPECT_EQ(round_to_float(std::ldexp(1, -25), Scalar::Float16), 0.0);  // tie to even (0)
  EXPECT_EQ(round_to_float(std::ldexp(1.5, -25), Scalar::Float16), std::ldexp(1, -24));
  EXPECT_EQ(round_to_float(1.00390625, Scalar::BFloat16), 1.0);  // 1 + 2^-8 ties to 1
  EXPECT_EQ(round_to_float(1.01171875, Scalar::BFloat16), 1.015625);
  EXPECT_EQ(float_to_half_bits(1.0), 0x3c00);
  EXPECT_EQ(float_to_half_bits(-2.0), 0xc000);
  EXPECT_EQ(float_to_half_bits(65504.0), 0x7bff);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1, -24)), 0x0001);
  EXPECT_EQ(half_bits_to_double(0x3555), round_to_float(1.0 / 3, Scalar::Float16));
  EXPECT_EQ(float_to_bfloat_bits(1.0), 0x3f80);
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every finite half survives a round trip
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(float_to_half_bits(half_bits_to_double(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(Eval, FusedMulAcc) {
  float a = 1 + std::ldexp(1.0f, -12), c = -1;
  // a*a = 1 + 2^-11 + 2^-24: fused keeps the 2^-24 that a separate multiply would round off.
  double fused = eval(Op::MULACC, Scalar::Float32, {F(a), F(a), F(c)}).as_float();
  EXPECT_EQ(fused, std::ldexp(1.0, -11) + std::ldexp(1.0, -24));
}

TEST(Eval, CastSemantics) {
  EXPECT_EQ(cast_value(F(3.9), Scalar::Int32), I(3));
  EXPECT_EQ(cast_value(F(-3.9), Scalar::Int32), I(-3));
  EXPECT_EQ(cast_value(F(1e10), Scalar::Int32), I(INT32_MAX));
  EXPECT_EQ(cast_value(F(-1e10), Scalar::Int8), I(-128));
  EXPECT_EQ(cast_value(F(-5), Scalar::UInt8), U(0));
  EXPECT_EQ(cast_value(F(1e30), Scalar::UInt64), U(UINT64_MAX));
  EXPECT_EQ(cast_value(F(NAN), Scalar::Int64), I(0));
  EXPECT_EQ(cast_value(I(300), Scalar::UInt8), U(44));
  EXPECT_EQ(cast_value(I(-1), Scalar::UInt16), U(65535));
  EXPECT_EQ(cast_value(U(0xffffffffffffffffull), Scalar::Int64), I(-1));
  EXPECT_EQ(cast_value(F(NAN), Scalar::Bool), ConstValue::Bool(true));
  EXPECT_EQ(cast_value(F(-0.0), Scalar::Bool), ConstValue::Bool(false));
  EXPECT_EQ(cast_value(ConstValue::Bool(true), Scalar::Float16), F(1.0));
  EXPECT_EQ(cast_value(I(65536 + 16), Scalar::Float16), F(INFINITY));
  EXPECT_EQ(cast_value(I(2049), Scalar::Float16), F(2048));  // tie to even
  // int64 -> float32 must round once: 2^62 + 2^38 + 1 is just above a tie.
  int64_t big = (int64_t{1} << 62) + (int64_t{1} << 38) + 1;
  EXPECT_EQ(cast_value(I(big), Scalar::Float32).as_float(), std::ldexp(1.0, 62) + std::ldexp(1.0, 39));
  EXPECT_EQ(cast_value(I(big), Scalar::BFloat16).as_float(), std::ldexp(1.0, 62));
}

TEST(Eval, Bitcast) {
  EXPECT_EQ(bitcast_value(F(1.0), Scalar::Float32, Scalar::UInt32), U(0x3f800000));
  EXPECT_EQ(bitcast_value(I(-1), Scalar::Int16, Scalar::Float16)->as_float() != 0, true);
  EXPECT_EQ(bitcast_value(U(0x3c00), Scalar::UInt16, Scalar::Float16), F(1.0));
  EXPECT_EQ(bitcast_value(U(0x3f80), Scalar::UInt16, Scalar::BFloat16), F(1.0));
  EXPECT_FALSE(bitcast_value(F(1.0), Scalar::Float32, Scalar::Int64).has_value());
}

TEST(Eval, IsValueOf) {
  EXPECT_TRUE(is_value_of(I(127), Scalar::Int8));
  EXPECT_FALSE(is_value_of(I(128), Scalar::Int8));
  EXPECT_FALSE(is_value_of(U(1), Scalar::Int8));  // wrong kind
  EXPECT_TRUE(is_value_of(F(0.5), Scalar::Float16));
  EXPECT_FALSE(is_value_of(F(0.1), Scalar::Float16));
  EXPECT_TRUE(is_value_of(F(NAN), Scalar::BFloat16));
}

TEST(Eval, UndefinedCombinationsAreRefused) {
  ConstValue a[] = {I(1)};
  EXPECT_FALSE(eval_alu(Op::SIN, Scalar::Int32, a).has_value());
  ConstValue b[] = {F(1), F(2)};
  EXPECT_FALSE(eval_alu(Op::SHL, Scalar::Float32, b).has_value());
  EXPECT_FALSE(eval_alu(Op::ADD, Scalar::Float32, a).has_value());  // wrong arity
}

}  // namespace
}  // namespace uop
