// linearize (compiler/passes/linearize.h) on small kernels built by hand and lowered by
// lower_reduce, its input stage: the loop nest comes from the ENDs, every op sits in the
// innermost loop among the ranges it depends on (loop-invariant work before the loop),
// sibling loops follow each other, each op is listed once, the result is deterministic and
// passes the linear-stage verifier, and the LINEAR computes what the interpreter computes
// on the kernel it came from. A kernel whose loops are not closed by ENDs is refused with
// linearize.loops.
#include "compiler/passes/linearize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "compiler/interp/interp.h"
#include "compiler/ir/verifier.h"
#include "compiler/passes/lower_reduce.h"
#include "tests/unit/compiler/passes/kernel_builder.h"
#include "tests/unit/compiler/passes/run_on_cpu.h"

namespace uop {
namespace {

using testing::KernelBuilder;

// The position in `linear` of the first op `pred` holds for; -1 when there is none.
int position(const UOp* linear, const std::function<bool(const UOp*)>& pred) {
  for (size_t i = 0; i < linear->num_src(); ++i)
    if (pred(linear->src(i))) return static_cast<int>(i);
  return -1;
}
int position_of(const UOp* linear, const UOp* u) {
  return position(linear, [u](const UOp* x) { return x == u; });
}
// The END closing `r`.
int end_of(const UOp* linear, const UOp* r) {
  return position(linear, [r](const UOp* x) { return x->op() == Op::END && x->src(1) == r; });
}
// The LOAD reading PARAM `slot`.
int load_of(const UOp* linear, int64_t slot) {
  return position(linear, [slot](const UOp* x) {
    return x->op() == Op::LOAD && x->src(0)->op() == Op::PARAM && x->src(0)->arg_as<ParamArg>().slot == slot;
  });
}

absl::StatusOr<const UOp*> lower_and_linearize(Graph& g, const UOp* kernel) {
  auto lowered = lower_reduce(g, kernel);
  if (!lowered.ok()) return lowered.status();
  return linearize(g, *lowered);
}

// out[i, j] = a[i, j] * s[i] + c[0] * 2 over a 3 x 5 nest: c's load and the product with 2
// come before both loops, s's load inside loop i before loop j opens, a's inside loop j;
// loop j closes before loop i.
TEST(Linearize, OpsSitInTheInnermostLoopTheyDependOn) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 15);
  const UOp* a = k.param(1, dtypes::float32, 15);
  const UOp* s = k.param(2, dtypes::float32, 3);
  const UOp* c = k.param(3, dtypes::float32, 1);
  const UOp* i = k.range(3);
  const UOp* j = k.range(5);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(5)), j);
  const UOp* invariant = k.alu(Op::MUL, k.load(c, k.ix(0)), k.f32(2));
  const UOp* v = k.alu(Op::ADD, k.alu(Op::MUL, k.load(a, at), k.load(s, i)), invariant);
  const UOp* kernel = k.sink({k.store(out, at, v, {i, j})});

  auto linear = lower_and_linearize(k.g, kernel);
  ASSERT_TRUE(linear.ok()) << linear.status();
  const UOp* l = *linear;
  ASSERT_EQ(l->op(), Op::LINEAR);
  const int ri = position_of(l, i), rj = position_of(l, j);
  ASSERT_GE(ri, 0);
  ASSERT_GE(rj, 0);
  EXPECT_LT(ri, rj) << "loop j nests inside loop i";
  EXPECT_LT(load_of(l, 3), ri) << "the loop-invariant load is hoisted out of both loops";
  EXPECT_LT(position_of(l, invariant), ri) << "and so is what is computed from it alone";
  const int ls = load_of(l, 2);
  EXPECT_GT(ls, ri);
  EXPECT_LT(ls, rj) << "s[i] is loaded once per i, outside loop j";
  EXPECT_GT(load_of(l, 1), rj);
  const int ej = end_of(l, j), ei = end_of(l, i);
  ASSERT_GE(ej, 0);
  ASSERT_GE(ei, 0);
  EXPECT_LT(load_of(l, 1), ej);
  EXPECT_LT(ej, ei) << "the inner loop closes first";
  EXPECT_EQ(ei, static_cast<int>(l->num_src()) - 1);

  // Each op once.
  std::vector<const UOp*> ops(l->src().begin(), l->src().end());
  std::sort(ops.begin(), ops.end());
  EXPECT_EQ(std::adjacent_find(ops.begin(), ops.end()), ops.end()) << "an op listed twice";

  VerifyOptions vo;
  vo.stage = Stage::Linear;
  absl::Status verified = verify(k.g, l, vo);
  EXPECT_TRUE(verified.ok()) << verified;

  // Deterministic: the same kernel gives the same LINEAR (the same node, under hash consing).
  auto again = lower_and_linearize(k.g, kernel);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, l);

  testing::expect_cpu_matches_interpreter(kernel, l, {{Scalar::Float32, 15}, {Scalar::Float32, 15}, {Scalar::Float32, 3}, {Scalar::Float32, 1}});
}

// Two loops that share nothing follow each other: one closes before the other opens.
TEST(Linearize, SiblingLoopsAreSequential) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 8);
  const UOp* in = k.param(1, dtypes::int32, 8);
  const UOp* r1 = k.range(4);
  const UOp* r2 = k.range(4);
  const UOp* first = k.store(out, r1, k.alu(Op::ADD, k.load(in, r1), k.i32(1)), {r1});
  const UOp* second = k.store(out, k.alu(Op::ADD, r2, k.ix(4)), k.alu(Op::MUL, k.load(in, k.alu(Op::ADD, r2, k.ix(4))), k.i32(3)), {r2});
  const UOp* kernel = k.sink({first, second});
  auto linear = lower_and_linearize(k.g, kernel);
  ASSERT_TRUE(linear.ok()) << linear.status();
  const int open1 = position_of(*linear, r1), close1 = end_of(*linear, r1);
  const int open2 = position_of(*linear, r2), close2 = end_of(*linear, r2);
  ASSERT_TRUE(open1 >= 0 && close1 >= 0 && open2 >= 0 && close2 >= 0);
  EXPECT_TRUE(close1 < open2 || close2 < open1) << "sibling loops nested or interleaved";
  testing::expect_cpu_matches_interpreter(kernel, *linear, {{Scalar::Int32, 8}, {Scalar::Int32, 8}});
}

// A reduction, lowered to an accumulator: the accumulator is set before the reduce loop,
// updated in it and read after it closes; the sums match the interpreter's.
TEST(Linearize, AReductionsAccumulatorIsReadAfterItsLoop) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 4);
  const UOp* in = k.param(1, dtypes::float32, 24);
  const UOp* i = k.range(4);
  const UOp* r = k.range(6, AxisType::Reduce);
  const UOp* sum = k.reduce(ReduceOp::Add, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(6)), r)), {r});
  const UOp* kernel = k.sink({k.store(out, i, sum, {i})});
  auto linear = lower_and_linearize(k.g, kernel);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(position(*linear, [](const UOp* u) { return u->op() == Op::REDUCE; }), -1) << "a REDUCE left in LINEAR";
  const int acc = position(*linear, [](const UOp* u) { return u->op() == Op::DEFINE_REG; });
  const int store_out = position(*linear, [&](const UOp* u) {
    return u->op() == Op::STORE && u->src(0)->op() == Op::INDEX && u->src(0)->src(0) == out;
  });
  ASSERT_GE(acc, 0);
  EXPECT_LT(acc, position_of(*linear, r));
  EXPECT_GT(store_out, end_of(*linear, r)) << "the sum is stored before its loop is done";
  EXPECT_LT(store_out, end_of(*linear, i));
  testing::expect_cpu_matches_interpreter(kernel, *linear, {{Scalar::Float32, 4}, {Scalar::Float32, 24}});
}

// out[a, b, c] = sum over k of in[k, c] (2 x 3 x 4, k < 5): the reduction varies with the
// innermost loop c only, so its loop depends on fewer loops than c's does; it still nests
// inside c (recomputed for each a and b), and the sums match the interpreter's.
TEST(Linearize, AReductionInvariantInOuterLoopsNestsInsideTheLoopItVariesWith) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 24);
  const UOp* in = k.param(1, dtypes::float32, 20);
  const UOp* a = k.range(2);
  const UOp* b = k.range(3);
  const UOp* c = k.range(4);
  const UOp* r = k.range(5, AxisType::Reduce);
  const UOp* sum = k.reduce(ReduceOp::Add, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, r, k.ix(4)), c)), {r});
  const UOp* at = k.alu(Op::ADD, k.alu(Op::ADD, k.alu(Op::MUL, a, k.ix(12)), k.alu(Op::MUL, b, k.ix(4))), c);
  const UOp* kernel = k.sink({k.store(out, at, sum, {a, b, c})});
  auto linear = lower_and_linearize(k.g, kernel);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_LT(position_of(*linear, c), position_of(*linear, r));
  EXPECT_LT(end_of(*linear, r), end_of(*linear, c));
  testing::expect_cpu_matches_interpreter(kernel, *linear, {{Scalar::Float32, 24}, {Scalar::Float32, 20}});
}

// A kernel that was not lowered (its STORE closes its ranges itself; no END does) has loops
// linearize cannot place: refused, naming the rule, not a LINEAR that drops the loop.
TEST(Linearize, RangesNoEndClosesAreRefused) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 4);
  const UOp* r = k.range(4);
  const UOp* kernel = k.sink({k.store(out, r, k.f32(1), {r})});
  auto linear = linearize(k.g, kernel);
  ASSERT_FALSE(linear.ok());
  EXPECT_EQ(linear.status().code(), absl::StatusCode::kInvalidArgument) << linear.status();
  EXPECT_NE(linear.status().message().find("[linearize.loops]"), std::string::npos) << linear.status();
}

}  // namespace
}  // namespace uop
