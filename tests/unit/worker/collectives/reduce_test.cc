// reduce.h against eval_alu, bit for bit (any NaN matching any NaN), for every op on
// every dtype: random operands plus the edges (NaN, -0 / +0, +-inf, subnormals, the
// largest values, integer wraparound), every length up to past a vector's tail, and the
// in-place form Gloo uses (out == a).
#include "worker/collectives/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"
#include "tests/unit/worker/collectives/collective_testing.h"

namespace uop {
namespace {

using testing::is_nan_bits;
using testing::load_bits;
using testing::mix;

constexpr ReduceOp kOps[] = {ReduceOp::Add, ReduceOp::Mul, ReduceOp::Max, ReduceOp::Min};
constexpr Scalar kTypes[] = {Scalar::Bool,   Scalar::Int8,    Scalar::Int16,    Scalar::Int32,   Scalar::Int64,
                             Scalar::UInt8,  Scalar::UInt16,  Scalar::UInt32,   Scalar::UInt64,  Scalar::Float16,
                             Scalar::BFloat16, Scalar::Float32, Scalar::Float64, Scalar::Index};

// Bit patterns worth trying for a type: zeros of both signs, infinities, NaNs (quiet and
// signalling, both signs), the smallest subnormal, the largest finite values, one, and
// for integers the extremes that wrap.
std::vector<uint64_t> edge_bits(Scalar t) {
  std::vector<double> floats = {0.0, -0.0, INFINITY, -INFINITY, std::nan(""), -std::nan(""), 1.0, -1.0, 0.5, 3.0, 65504.0,
                                -65504.0, 3.3895313892515355e38, 1e-40, -1e-40, 5.960464477539063e-08, 1e308, 1e-310};
  std::vector<uint64_t> out;
  if (scalar_is_float(t)) {
    for (double d : floats) out.push_back(value_to_bits(cast_value(ConstValue::Float(d), t), t));
    // Raw patterns: a signalling NaN and the largest finite value of the type itself.
    int nb = scalar_bits(t);
    uint64_t exp_all = t == Scalar::Float16 ? 0x7c00 : t == Scalar::BFloat16 ? 0x7f80 : t == Scalar::Float32 ? 0x7f800000 : 0x7ff0000000000000ull;
    out.push_back(exp_all | 1);
    out.push_back(exp_all - 1);
    out.push_back((uint64_t{1} << (nb - 1)) | 1);  // the negative smallest subnormal
    return out;
  }
  if (t == Scalar::Bool) return {0, 1, 2, 3, 0xff};  // only the low bit counts
  int nb = scalar_bits(t);
  uint64_t mask = nb == 64 ? ~uint64_t{0} : (uint64_t{1} << nb) - 1;
  uint64_t sign = uint64_t{1} << (nb - 1);
  for (uint64_t b : {uint64_t{0}, uint64_t{1}, uint64_t{2}, mask, mask - 1, sign, sign - 1, sign + 1, uint64_t{0x5a5a5a5a5a5a5a5a}})
    out.push_back(b & mask);
  return out;
}

uint64_t eval_bits(ReduceOp op, Scalar t, uint64_t a, uint64_t b) {
  ConstValue args[2] = {bits_to_value(a, t), bits_to_value(b, t)};
  auto r = eval_alu(reduce_combine_op(op), t, args);
  return value_to_bits(*r, t);
}

std::string show(Scalar t, uint64_t bits) {
  return cat("0x", [&] {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(bits));
    return std::string(buf);
  }(), " (", bits_to_value(bits, t).str(), ")");
}

// Runs the combine on (a, b) pairs and compares each element with eval_alu.
void check_pairs(ReduceOp op, Scalar t, const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  auto fn = combine_function(op, t);
  ASSERT_TRUE(fn.ok()) << fn.status();
  const int es = scalar_bytes(t);
  size_t n = a.size();
  std::vector<uint8_t> x(n * es), y(n * es), out(n * es);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(x.data() + i * es, &a[i], es);
    std::memcpy(y.data() + i * es, &b[i], es);
  }
  (*fn)(out.data(), x.data(), y.data(), n);
  (*fn)(x.data(), x.data(), y.data(), n);  // in place, as Gloo calls it
  for (size_t i = 0; i < n; ++i) {
    uint64_t want = eval_bits(op, t, a[i], b[i]);
    for (const auto* buf : {&out, &x}) {
      uint64_t got = load_bits(buf->data(), t, i);
      if (got == want || (is_nan_bits(t, got) && is_nan_bits(t, want))) continue;
      FAIL() << reduce_op_wire_name(op) << " on " << scalar_name(t) << ": " << show(t, a[i]) << " , " << show(t, b[i])
             << " gives " << show(t, got) << ", eval_alu " << show(t, want) << (buf == &x ? " (in place)" : "");
    }
  }
}

TEST(CombineTest, UndefinedOpsAreRefusedLikeEvalAlu) {
  for (ReduceOp op : kOps) {
    for (Scalar t : kTypes) {
      ConstValue args[2] = {bits_to_value(1, t), bits_to_value(1, t)};
      bool defined = eval_alu(reduce_combine_op(op), t, args).has_value();
      auto fn = combine_function(op, t);
      EXPECT_EQ(fn.ok(), defined) << reduce_op_wire_name(op) << " " << scalar_name(t);
      if (!fn.ok()) {
        EXPECT_EQ(fn.status().code(), absl::StatusCode::kInvalidArgument);
      }
    }
  }
  EXPECT_FALSE(combine_function(ReduceOp::Add, Scalar::Void).ok());
}

TEST(CombineTest, EveryEdgePairMatchesEvalAlu) {
  for (ReduceOp op : kOps) {
    for (Scalar t : kTypes) {
      if (!combine_function(op, t).ok()) continue;
      std::vector<uint64_t> e = edge_bits(t), a, b;
      for (uint64_t x : e)
        for (uint64_t y : e) a.push_back(x), b.push_back(y);
      check_pairs(op, t, a, b);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CombineTest, RandomPairsMatchEvalAlu) {
  for (ReduceOp op : kOps) {
    for (Scalar t : kTypes) {
      if (!combine_function(op, t).ok()) continue;
      const int nb = scalar_bits(t);
      const uint64_t mask = nb >= 64 ? ~uint64_t{0} : (uint64_t{1} << nb) - 1;
      std::vector<uint64_t> a, b;
      for (uint64_t i = 0; i < 20000; ++i) {
        uint64_t h = mix(i * 4 + static_cast<uint64_t>(op) + static_cast<uint64_t>(t) * 1000003);
        uint64_t g = mix(h);
        // Random bits are mostly huge or tiny for floats; every fourth pair has nearby
        // exponents (the same top bits), where additions round the most.
        if (scalar_is_float(t) && i % 4 == 0) g = (h & ~(mask >> 4)) | (g & (mask >> 4));
        a.push_back(h & mask);
        b.push_back(g & mask);
      }
      check_pairs(op, t, a, b);
      if (HasFatalFailure()) return;
    }
  }
}

// Every float16 value against a few partners: the format is small enough to walk.
TEST(CombineTest, EveryFloat16AndBFloat16Value) {
  for (Scalar t : {Scalar::Float16, Scalar::BFloat16}) {
    for (ReduceOp op : kOps) {
      std::vector<uint64_t> a, b;
      for (uint64_t x = 0; x < 0x10000; ++x) {
        for (uint64_t y : {uint64_t{0x3c00}, uint64_t{0x0001}, uint64_t{0x8000}, mix(x) & 0xffff, (x + 1) & 0xffff}) {
          a.push_back(x);
          b.push_back(y);
        }
      }
      check_pairs(op, t, a, b);
      if (HasFatalFailure()) return;
    }
  }
}

// Lengths 0..67 at odd offsets: the vector loops' tails and unaligned starts.
TEST(CombineTest, TailsAndUnalignedStarts) {
  for (Scalar t : {Scalar::Float32, Scalar::Float16, Scalar::Int64, Scalar::UInt8, Scalar::Float64}) {
    for (ReduceOp op : kOps) {
      auto fn = *combine_function(op, t);
      const int es = scalar_bytes(t);
      for (size_t n = 0; n <= 67; ++n) {
        std::vector<uint8_t> x((n + 1) * es + 8), y((n + 1) * es + 8), out((n + 1) * es + 8, 0xee);
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(mix(i + n)), y[i] = static_cast<uint8_t>(mix(i * 3 + n));
        (*fn)(out.data() + es, x.data() + es, y.data() + es, n);
        for (size_t i = 0; i < n; ++i) {
          uint64_t got = load_bits(out.data() + es, t, i);
          uint64_t want = eval_bits(op, t, load_bits(x.data() + es, t, i), load_bits(y.data() + es, t, i));
          ASSERT_TRUE(got == want || (is_nan_bits(t, got) && is_nan_bits(t, want))) << scalar_name(t) << " n=" << n << " i=" << i;
        }
        for (int i = 0; i < es; ++i) ASSERT_EQ(out[i], 0xee) << "wrote before the start";
        for (size_t i = (n + 1) * es; i < out.size(); ++i) ASSERT_EQ(out[i], 0xee) << "wrote past the end";
      }
    }
  }
}

TEST(CombineTest, WireNames) {
  for (ReduceOp op : kOps) EXPECT_EQ(reduce_op_from_wire(reduce_op_wire_name(op)), op);
  EXPECT_FALSE(reduce_op_from_wire("sum").has_value());
  EXPECT_FALSE(reduce_op_from_wire("Add").has_value());
}

}  // namespace
}  // namespace uop
