// unit_ranges (compiler/passes/unit_ranges.h) on kernels built by hand with size-1 and
// size-0 loops: a RANGE of one iteration becomes the index 0 and leaves the STORE, REDUCE
// and END that closed it; a REDUCE over a loop that never runs becomes its identity; a
// STORE over such a loop leaves the SINK. Loops of two or more iterations stay as they
// are, and each rewritten kernel computes what the interpreter computes on the original.
#include "compiler/passes/unit_ranges.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "tests/unit/compiler/passes/interp_check.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

using testing::KernelBuilder;

bool is_range_of(const UOp* u, int64_t end) {
  return u->op() == Op::RANGE && u->src(0)->const_value() && u->src(0)->const_value()->to_int() == end;
}

// out[i + j] = in[i + j] * 2 over i < 4, j < 1: j is the index 0 and the STORE closes i alone.
TEST(UnitRanges, ARangeOfOneIterationBecomesZeroAndIsNoLongerClosed) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 4);
  const UOp* in = k.param(1, dtypes::float32, 4);
  const UOp* i = k.range(4);
  const UOp* j = k.range(1);
  const UOp* at = k.alu(Op::ADD, i, j);
  const UOp* before = k.sink({k.store(out, at, k.alu(Op::MUL, k.load(in, at), k.f32(2)), {i, j})});
  auto after = drop_unit_ranges(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::count_of(*after, [](const UOp* u) { return is_range_of(u, 1); }), 0);
  auto stores = testing::nodes_of(*after, Op::STORE);
  ASSERT_EQ(stores.size(), 1u);
  ASSERT_EQ(stores[0]->num_src(), 3u) << "the STORE closes i only";
  EXPECT_EQ(stores[0]->src(2), i);
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 4}, {Scalar::Float32, 4}});
}

// out[i] = sum over r < 1 of in[i + r]: the REDUCE closes nothing more (its value is in[i]).
TEST(UnitRanges, AReduceOverOneIterationKeepsItsValue) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 3);
  const UOp* in = k.param(1, dtypes::int32, 3);
  const UOp* i = k.range(3);
  const UOp* r = k.range(1);
  const UOp* sum = k.reduce(ReduceOp::Add, k.load(in, k.alu(Op::ADD, i, r)), {r});
  const UOp* before = k.sink({k.store(out, i, sum, {i})});
  auto after = drop_unit_ranges(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::count_of(*after, [](const UOp* u) { return is_range_of(u, 1); }), 0);
  for (const UOp* red : testing::nodes_of(*after, Op::REDUCE)) EXPECT_EQ(red->num_src(), 1u) << "it closes no range";
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Int32, 3}, {Scalar::Int32, 3}});
}

// out[i] = max over r < 0 of in[r]: no iteration, so the value stored is Max's identity.
TEST(UnitRanges, AReduceOverALoopThatNeverRunsIsItsIdentity) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 2);
  const UOp* in = k.param(1, dtypes::float32, 2);
  const UOp* i = k.range(2);
  const UOp* r = k.range(int64_t{0});
  const UOp* m = k.reduce(ReduceOp::Max, k.load(in, r), {r});
  const UOp* before = k.sink({k.store(out, i, m, {i})});
  auto after = drop_unit_ranges(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(testing::nodes_of(*after, Op::REDUCE).empty());
  auto stores = testing::nodes_of(*after, Op::STORE);
  ASSERT_EQ(stores.size(), 1u);
  const ConstValue* v = stores[0]->src(1)->const_value();
  ASSERT_NE(v, nullptr) << "the stored value is a constant";
  EXPECT_TRUE(std::isinf(v->to_double()) && v->to_double() < 0) << "Max's identity is -inf";
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Float32, 2}, {Scalar::Float32, 2}});
}

// Two stores, one over a loop of no iterations: that one leaves the SINK, the other stays.
TEST(UnitRanges, AStoreOverALoopThatNeverRunsLeavesTheSink) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 4);
  const UOp* i = k.range(4);
  const UOp* e = k.range(int64_t{0});
  const UOp* kept = k.store(out, i, k.i32(7), {i});
  const UOp* before = k.sink({kept, k.store(out, e, k.i32(9), {e})});
  auto after = drop_unit_ranges(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ((*after)->op(), Op::SINK);
  ASSERT_EQ((*after)->num_src(), 1u);
  EXPECT_EQ((*after)->src(0), kept);
  EXPECT_EQ((*after)->arg(), before->arg()) << "the kernel keeps its info";
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Int32, 4}});
}

// An END that closed only a loop of one iteration is gone: what it closed stands in for it.
TEST(UnitRanges, AnEndWithNothingLeftToCloseIsItsBody) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 1);
  const UOp* j = k.range(1);
  const UOp* body = k.store(out, j, k.i32(5), {});
  const UOp* before = k.sink({k.g.make(Op::END, dtypes::void_, {body, j})});
  auto after = drop_unit_ranges(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(testing::nodes_of(*after, Op::END).empty());
  EXPECT_TRUE(testing::nodes_of(*after, Op::RANGE).empty());
  ASSERT_EQ((*after)->num_src(), 1u);
  EXPECT_EQ((*after)->src(0)->op(), Op::STORE);
  testing::expect_interpreter_agrees(before, *after, {{Scalar::Int32, 1}});
}

// Loops of two or more iterations (and a variable one) are not unit ranges: the kernel
// itself comes back.
TEST(UnitRanges, LoopsThatRunMoreThanOnceAreLeftAlone) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 64);
  const UOp* i = k.range(2);
  const UOp* n = k.range(k.var("n", 1, 32));
  const UOp* r = k.range(4);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(32)), n);
  const UOp* before = k.sink({k.store(out, at, k.reduce(ReduceOp::Add, k.f32(1), {r}), {i, n})});
  auto after = drop_unit_ranges(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, before);
}

}  // namespace
}  // namespace uop
