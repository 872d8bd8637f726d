// lower_reduce (compiler/passes/lower_reduce.h) on kernels built by hand: a STORE or END
// closing several ranges becomes nested single-range ENDs, the first range outermost; a
// REDUCE becomes a DEFINE_REG accumulator, set to the identity inside the loops around the
// reduction, updated under an END of its own loops and read after them (a float sum of
// products with MULACC); each reduction gets its own register. Each lowered kernel, taken
// on to LINEAR and run by the CPU backend, computes what the interpreter computes on the
// kernel before the pass. Kernels already lowered come back as they are. RangeSets, which
// says where the accumulator is set, on its own. A REDUCE over no range folds its value
// into the identity (a float sum of -0.0 is +0.0), as the interpreter does.
#include "compiler/passes/lower_reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "compiler/passes/linearize.h"
#include "tests/unit/compiler/passes/kernel_builder.h"
#include "tests/unit/compiler/passes/run_on_cpu.h"

namespace uop {
namespace {

using testing::KernelBuilder;

void expect_same_values(Graph& g, const UOp* before, const UOp* lowered, const std::vector<std::pair<Scalar, int64_t>>& slots) {
  auto linear = linearize(g, lowered);
  ASSERT_TRUE(linear.ok()) << linear.status();
  testing::expect_cpu_matches_interpreter(before, *linear, slots);
}

// The STORE into the accumulator `acc`'s slot whose value is (or is not) a constant.
std::vector<const UOp*> stores_into(const UOp* k, const UOp* acc) {
  std::vector<const UOp*> out;
  for (const UOp* s : testing::nodes_of(k, Op::STORE)) {
    const UOp* after = s->src(0)->src(0);
    if (after->op() == Op::AFTER && after->src(0) == acc) out.push_back(s);
  }
  return out;
}

// The sources of an AFTER past its passthrough.
std::vector<const UOp*> deps_of(const UOp* after) { return {after->src().begin() + 1, after->src().end()}; }

// out[5 i + j] = in[5 i + j] + 1, the STORE closing i and j: END(END(STORE, j), i).
TEST(LowerReduce, AStoreClosingSeveralRangesBecomesNestedEnds) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 15);
  const UOp* in = k.param(1, dtypes::int32, 15);
  const UOp* i = k.range(3);
  const UOp* j = k.range(5);
  const UOp* at = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(5)), j);
  const UOp* before = k.sink({k.store(out, at, k.alu(Op::ADD, k.load(in, at), k.i32(1)), {i, j})});
  auto after = lower_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ((*after)->num_src(), 1u);
  const UOp* outer = (*after)->src(0);
  ASSERT_EQ(outer->op(), Op::END);
  ASSERT_EQ(outer->num_src(), 2u);
  EXPECT_EQ(outer->src(1), i) << "the first range is the outermost loop";
  const UOp* inner = outer->src(0);
  ASSERT_EQ(inner->op(), Op::END);
  ASSERT_EQ(inner->num_src(), 2u);
  EXPECT_EQ(inner->src(1), j);
  ASSERT_EQ(inner->src(0)->op(), Op::STORE);
  EXPECT_EQ(inner->src(0)->num_src(), 2u) << "the STORE closes no range itself";
  expect_same_values(k.g, before, *after, {{Scalar::Int32, 15}, {Scalar::Int32, 15}});
}

// An END closing two ranges nests the same way.
TEST(LowerReduce, AnEndClosingSeveralRangesIsNested) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 6);
  const UOp* i = k.range(2);
  const UOp* j = k.range(3);
  const UOp* body = k.g.make(Op::STORE, dtypes::void_, {k.g.make(Op::INDEX, dtypes::int32, {out, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(3)), j)}), k.i32(4)});
  const UOp* before = k.sink({k.g.make(Op::END, dtypes::void_, {body, i, j})});
  auto after = lower_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  const UOp* outer = (*after)->src(0);
  ASSERT_EQ(outer->op(), Op::END);
  ASSERT_EQ(outer->num_src(), 2u);
  EXPECT_EQ(outer->src(1), i);
  ASSERT_EQ(outer->src(0)->op(), Op::END);
  EXPECT_EQ(outer->src(0)->src(1), j);
  EXPECT_EQ(outer->src(0)->src(0), body);
  expect_same_values(k.g, before, *after, {{Scalar::Int32, 6}});
}

// out[i] = max over r of in[6 i + r]: the accumulator is set to int32's least value inside
// loop i (its AFTER names i), updated under END(.., r) (its AFTER names the set and r) and
// read after that END.
TEST(LowerReduce, AReduceBecomesAnAccumulatorSetUpdatedAndReadInItsPlace) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 4);
  const UOp* in = k.param(1, dtypes::int32, 24);
  const UOp* i = k.range(4);
  const UOp* r = k.range(6, AxisType::Reduce);
  const UOp* m = k.reduce(ReduceOp::Max, k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(6)), r)), {r});
  const UOp* before = k.sink({k.store(out, i, m, {i})});
  auto after = lower_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(testing::nodes_of(*after, Op::REDUCE).empty());
  auto regs = testing::nodes_of(*after, Op::DEFINE_REG);
  ASSERT_EQ(regs.size(), 1u);
  const UOp* acc = regs[0];
  EXPECT_EQ(acc->dtype().addrspace, AddrSpace::Reg);
  EXPECT_EQ(acc->arg_as<DefineRegArg>().size, 1);

  auto sets = stores_into(*after, acc);
  ASSERT_EQ(sets.size(), 2u) << "one store sets the accumulator, one updates it";
  const UOp* init = sets[0]->src(1)->const_value() ? sets[0] : sets[1];
  const UOp* update = init == sets[0] ? sets[1] : sets[0];
  ASSERT_NE(init->src(1)->const_value(), nullptr);
  EXPECT_EQ(init->src(1)->const_value()->to_int(), std::numeric_limits<int32_t>::min()) << "Max's identity";
  EXPECT_EQ(deps_of(init->src(0)->src(0)), std::vector<const UOp*>{i}) << "set once per output, inside loop i";
  EXPECT_EQ(deps_of(update->src(0)->src(0)), (std::vector<const UOp*>{init, r})) << "updated after the set, in loop r";
  EXPECT_EQ(update->src(1)->op(), Op::MAX);

  // The update is closed by END(.., r), and the value stored to out is read after that END.
  const UOp* loop = nullptr;
  for (const UOp* e : testing::nodes_of(*after, Op::END))
    if (e->src(0) == update) loop = e;
  ASSERT_NE(loop, nullptr) << "no END closes the update";
  EXPECT_EQ(loop->src(1), r);
  const UOp* stored = nullptr;
  for (const UOp* s : testing::nodes_of(*after, Op::STORE))
    if (s->src(0)->src(0) == out) stored = s->src(1);
  ASSERT_NE(stored, nullptr);
  ASSERT_EQ(stored->op(), Op::LOAD);
  EXPECT_EQ(stored->src(0), acc);
  const UOp* read_after = stored->src(1)->src(0);
  ASSERT_EQ(read_after->op(), Op::AFTER);
  EXPECT_EQ(deps_of(read_after), std::vector<const UOp*>{loop});

  expect_same_values(k.g, before, *after, {{Scalar::Int32, 4}, {Scalar::Int32, 24}});
}

// A float sum of products accumulates with MULACC (a * b + acc); the accumulator of a full
// reduction (no loop around it) is set with nothing to wait for, to 0.
TEST(LowerReduce, AFloatSumOfProductsAccumulatesWithMulacc) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 1);
  const UOp* a = k.param(1, dtypes::float32, 16);
  const UOp* b = k.param(2, dtypes::float32, 16);
  const UOp* r = k.range(16, AxisType::Reduce);
  const UOp* dot = k.reduce(ReduceOp::Add, k.alu(Op::MUL, k.load(a, r), k.load(b, r)), {r});
  const UOp* before = k.sink({k.store(out, k.ix(0), dot, {})});
  auto after = lower_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(testing::nodes_of(*after, Op::MULACC).size(), 1u);
  auto regs = testing::nodes_of(*after, Op::DEFINE_REG);
  ASSERT_EQ(regs.size(), 1u);
  int sets = 0;
  for (const UOp* s : stores_into(*after, regs[0])) {
    if (!s->src(1)->const_value()) continue;
    ++sets;
    EXPECT_EQ(s->src(1)->const_value()->to_double(), 0.0);
    EXPECT_TRUE(deps_of(s->src(0)->src(0)).empty()) << "a full reduction's set waits on no loop";
  }
  EXPECT_EQ(sets, 1);
  expect_same_values(k.g, before, *after, {{Scalar::Float32, 1}, {Scalar::Float32, 16}, {Scalar::Float32, 16}});
}

// Two reductions in one kernel (a sum and a product over different loops): two registers
// with different ids, and both values right.
TEST(LowerReduce, EachReductionGetsItsOwnRegister) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::int32, 3);
  const UOp* in = k.param(1, dtypes::int32, 12);
  const UOp* i = k.range(3);
  const UOp* r = k.range(4, AxisType::Reduce);
  const UOp* s = k.range(4, AxisType::Reduce);
  const UOp* at_r = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(4)), r);
  const UOp* at_s = k.alu(Op::ADD, k.alu(Op::MUL, i, k.ix(4)), s);
  const UOp* sum = k.reduce(ReduceOp::Add, k.load(in, at_r), {r});
  const UOp* mx = k.reduce(ReduceOp::Max, k.load(in, at_s), {s});
  const UOp* before = k.sink({k.store(out, i, k.alu(Op::ADD, sum, mx), {i})});
  auto after = lower_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  auto regs = testing::nodes_of(*after, Op::DEFINE_REG);
  ASSERT_EQ(regs.size(), 2u);
  EXPECT_NE(regs[0]->arg_as<DefineRegArg>().id, regs[1]->arg_as<DefineRegArg>().id);
  expect_same_values(k.g, before, *after, {{Scalar::Int32, 3}, {Scalar::Int32, 12}});
}

// Already lowered (single-range ENDs, no REDUCE): the kernel itself comes back.
// out[i] = sum over no range of in[i] * 0.0: -0.0 where in[i] < 0, and 0.0 + -0.0 is +0.0;
// bit for bit (a plain comparison takes -0.0 for +0.0).
TEST(LowerReduce, AReduceOverNoRangeStartsFromTheIdentity) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 16);
  const UOp* in = k.param(1, dtypes::float32, 16);
  const UOp* i = k.range(16);
  const UOp* v = k.alu(Op::MUL, k.load(in, i), k.f32(0));
  const UOp* before = k.sink({k.store(out, i, k.reduce(ReduceOp::Add, v, {}), {i})});
  auto lowered = lower_reduce(k.g, before);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  auto linear = linearize(k.g, *lowered);
  ASSERT_TRUE(linear.ok()) << linear.status();
  std::vector<HostTensor> want = testing::params_for({{Scalar::Float32, 16}, {Scalar::Float32, 16}}), got = want;
  ASSERT_TRUE(interpret_kernel(before, testing::pointers(want), {}).ok());
  ASSERT_TRUE(testing::run_on_cpu(*linear, got).ok());
  int negative = 0;
  for (int64_t j = 0; j < 16; ++j) {
    negative += want[1].get(j).as_float() < 0;
    EXPECT_EQ(want[0].get_bits(j), 0u) << "the interpreter's +0.0 at " << j;
    EXPECT_EQ(got[0].get_bits(j), want[0].get_bits(j)) << "element " << j << " of " << want[1].get(j).str();
  }
  EXPECT_GT(negative, 0) << "some input is negative, so some product is -0.0";
}

TEST(LowerReduce, AKernelAlreadyLoweredIsLeftAlone) {
  KernelBuilder k;
  const UOp* out = k.param(0, dtypes::float32, 4);
  const UOp* r = k.range(4);
  const UOp* body = k.g.make(Op::STORE, dtypes::void_, {k.g.make(Op::INDEX, dtypes::float32, {out, r}), k.f32(2)});
  const UOp* before = k.sink({k.g.make(Op::END, dtypes::void_, {body, r})});
  auto after = lower_reduce(k.g, before);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, before);
}

// The ranges a value varies with: those it reaches, sorted by axis id, less those a REDUCE
// or END on the way closes.
TEST(RangeSets, AreTheRangesReachedLessThoseClosedOnTheWay) {
  KernelBuilder k;
  const UOp* in = k.param(1, dtypes::int32, 64);
  const UOp* i = k.range(4);
  const UOp* j = k.range(4);
  const UOp* r = k.range(4, AxisType::Reduce);
  const UOp* v = k.load(in, k.alu(Op::ADD, k.alu(Op::MUL, k.alu(Op::ADD, k.alu(Op::MUL, j, k.ix(4)), i), k.ix(4)), r));
  RangeSets sets;
  EXPECT_EQ(sets.of(v), (std::vector<const UOp*>{i, j, r})) << "sorted by axis id, not by where they appear";
  const UOp* red = k.reduce(ReduceOp::Add, v, {r});
  EXPECT_EQ(sets.of(red), (std::vector<const UOp*>{i, j}));
  EXPECT_EQ(sets.of(k.alu(Op::ADD, red, k.load(in, i))), (std::vector<const UOp*>{i, j})) << "i once";
  EXPECT_TRUE(sets.of(k.i32(3)).empty());
}

}  // namespace
}  // namespace uop
