// tensor_cores (compiler/passes/tensor_cores.h) on matmul kernels built by hand: a
// float16 or bfloat16 matmul whose M, N, K are multiples of 16, 8, 16 (or N, M, K: the
// operands trade roles) becomes WMMA (the instruction of its input type) reduced over
// K / 16; anything else comes back as the
// very kernel it was (float32 inputs, an M that is no multiple of 16, a product of values
// that both move with m). The WMMA kernel's values need a GPU: tests/gpu runs them
// against the interpreter.
#include "compiler/passes/tensor_cores.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

using testing::KernelBuilder;

using testing::matmul;

void expect_wmma(const UOp* kernel, const char* instruction) {
  std::vector<const UOp*> wmma = testing::nodes_of(kernel, Op::WMMA);
  ASSERT_FALSE(wmma.empty()) << "no WMMA";
  for (const UOp* w : wmma) EXPECT_EQ(w->arg_as<WmmaArg>().name, instruction);
  EXPECT_EQ(wmma[0]->dtype().count, 4u) << "four float32 accumulator lanes per lane";
}

TEST(TensorCores, AHalfMatmulBecomesWmma) {
  KernelBuilder k;
  const UOp* before = matmul(k, dtypes::float16, 32, 16, 32);
  auto after = use_tensor_cores(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_NE(*after, before);
  expect_wmma(*after, kWmmaF16);
  // The reduction runs over K / 16 steps of one WMMA each.
  bool k_over_16 = false;
  for (const UOp* r : testing::nodes_of(*after, Op::RANGE))
    if (r->arg_as<RangeArg>().type == AxisType::Reduce && r->src(0)->const_value() &&
        r->src(0)->const_value()->to_int() == 2)
      k_over_16 = true;
  EXPECT_TRUE(k_over_16) << "no Reduce range of K / 16 = 2";
}

TEST(TensorCores, ABfloat16MatmulUsesItsInstruction) {
  KernelBuilder k;
  auto after = use_tensor_cores(k.g, matmul(k, dtypes::bfloat16, 16, 8, 16));
  ASSERT_TRUE(after.ok()) << after.status();
  expect_wmma(*after, kWmmaBF16);
}

// M = 24 is no multiple of 16, but N = 16 is and M is one of 8: the rule computes the
// transposed product, the operands trading roles.
TEST(TensorCores, TheOperandsMayTradeRoles) {
  KernelBuilder k;
  const UOp* before = matmul(k, dtypes::float16, 24, 16, 16);
  auto after = use_tensor_cores(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_NE(*after, before);
  expect_wmma(*after, kWmmaF16);
}

TEST(TensorCores, WhatTheRuleDoesNotCoverIsLeftAlone) {
  struct Case {
    const char* why;
    DType in;
    int64_t M, N, K;
    bool same_side;
  };
  for (const Case& c : {Case{"float32 inputs", dtypes::float32, 32, 16, 32, false},
                        Case{"neither M nor N a multiple of 16", dtypes::float16, 24, 12, 32, false},
                        Case{"N not a multiple of 8", dtypes::float16, 32, 12, 32, false},
                        Case{"K not a multiple of 16", dtypes::float16, 32, 16, 24, false},
                        Case{"both operands move with m", dtypes::float16, 16, 16, 16, true}}) {
    KernelBuilder k;
    const UOp* before = matmul(k, c.in, c.M, c.N, c.K, c.same_side);
    auto after = use_tensor_cores(k.g, before);
    ASSERT_TRUE(after.ok()) << c.why << ": " << after.status();
    EXPECT_EQ(*after, before) << c.why;
  }
}

}  // namespace
}  // namespace uop
