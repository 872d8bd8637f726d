// plan_realize (compiler/passes/realize.h) on tensor graphs built by hand: what becomes a
// buffer. Every output and every CONTIGUOUS; a reduction read through a broadcasting
// EXPAND (softmax's max and sum) or a PAD; a padded operand of a reduction; a matmul's
// operand whose long elementwise chain its columns would recompute; a reduction read by
// two kernels; a reduction another one folds. Not realized, so fused
// into the kernel that reads it: elementwise values, a reduction with its elementwise
// prologue and epilogue, a reduction one kernel reads twice without broadcasting it, the
// EXPANDs inside a matmul. A graph whose shapes do not hold is refused with the shape
// error, not planned.
#include "compiler/passes/realize.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/container/flat_hash_set.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/tensor_builder.h"

namespace uop {
namespace {

using Set = absl::flat_hash_set<const UOp*>;

absl::StatusOr<Set> plan(Graph& g, const UOp* sink) {
  ShapeInference shapes(g);
  return plan_realize(sink, shapes);
}

// (x * 2 + 1) - x: one kernel, only the output.
TEST(PlanRealize, AnElementwiseChainIsOneKernel) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4, 8});
  const UOp* y = tb.alu(Op::ADD, {tb.alu(Op::MUL, {x, tb.full(Scalar::Float32, 2.0, {4, 8})}), tb.full(Scalar::Float32, 1.0, {4, 8})});
  const UOp* out = tb.alu(Op::SUB, {y, x});
  auto r = plan(g, tb.sink({out}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, Set{out});
}

// Every output is realized, and a CONTIGUOUS even where nothing else would make it one.
TEST(PlanRealize, OutputsAndContiguousAreRealized) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4, 8});
  const UOp* c = tb.contiguous(tb.alu(Op::MUL, {x, x}));
  const UOp* a = tb.alu(Op::ADD, {c, x});
  const UOp* b = tb.alu(Op::SUB, {x, x});
  auto r = plan(g, tb.sink({a, b}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (Set{a, b, c}));
}

// softmax over rows: the max and the sum are each read by every element of their row
// (through a broadcast): both realized, so three kernels.
TEST(PlanRealize, AReductionReadThroughABroadcastIsRealized) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {3, 5});
  const UOp* m = tb.reduce(x, ReduceOp::Max, {1});
  const UOp* e = tb.alu(Op::EXP2, {tb.alu(Op::SUB, {x, m})});
  const UOp* s = tb.reduce(e, ReduceOp::Add, {1});
  const UOp* out = tb.alu(Op::FDIV, {e, s});
  ASSERT_EQ(m->op(), Op::REDUCE_AXIS);
  ASSERT_EQ(s->op(), Op::REDUCE_AXIS);
  auto r = plan(g, tb.sink({out}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (Set{out, m, s}));
}

// sum(pad(x * x), axis 1): the padded operand of a reduction (a convolution's padded
// input) is realized, its elementwise source fused into it, so the reduction reads it
// without the pad's gate.
TEST(PlanRealize, APaddedOperandOfAReductionIsRealized) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4, 8});
  const UOp* p = tb.pad(tb.alu(Op::MUL, {x, x}), {0, 1}, {0, 1});
  const UOp* s = tb.reduce(p, ReduceOp::Add, {1});
  auto r = plan(g, tb.sink({s}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (Set{s, p}));
}

// A concatenation (two pads added) that a reduction reads through a permute: the sum of
// the pads is realized, not each pad.
TEST(PlanRealize, AConcatenationAReductionReadsIsRealized) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {4, 4});
  const UOp* b = tb.input(Scalar::Float32, {4, 4});
  const UOp* c = tb.alu(Op::ADD, {tb.pad(a, {0, 0}, {0, 4}), tb.pad(b, {0, 4}, {0, 0})});
  const UOp* s = tb.reduce(tb.permute(c, {1, 0}), ReduceOp::Add, {1});
  auto r = plan(g, tb.sink({s}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (Set{s, c}));
}

// pad(sum(x, axis 1)): fused, the reduction would run under the pad's gate over the
// padded shape; realized, the pad is a kernel of its own reading it.
TEST(PlanRealize, AReductionReadThroughAPadIsRealized) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4, 8});
  const UOp* s = tb.reduce(x, ReduceOp::Add, {1});
  const UOp* out = tb.pad(s, {1, 0}, {1, 0});
  auto r = plan(g, tb.sink({out}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (Set{out, s}));
}

// sum(x * 2, axis 1) + 1: the reduction with its prologue and epilogue stays one kernel.
TEST(PlanRealize, AReductionWithItsPrologueAndEpilogueIsOneKernel) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {3, 5});
  const UOp* s = tb.reduce(tb.alu(Op::MUL, {x, tb.full(Scalar::Float32, 2.0, {3, 5})}), ReduceOp::Add, {1});
  const UOp* out = tb.alu(Op::ADD, {s, tb.full(Scalar::Float32, 1.0, {3, 1})});
  auto r = plan(g, tb.sink({out}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, Set{out});
}

// A sum read by two outputs is computed once: realized. Read twice by one kernel, and not
// broadcast, it is not.
TEST(PlanRealize, AReductionReadByTwoKernelsIsRealizedOnce) {
  {
    Graph g;
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {3, 5});
    const UOp* s = tb.reduce(x, ReduceOp::Add, {1});
    const UOp* o1 = tb.alu(Op::MUL, {s, s});
    const UOp* o2 = tb.alu(Op::NEG, {s});
    auto r = plan(g, tb.sink({o1, o2}));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, (Set{o1, o2, s}));
  }
  {
    Graph g;
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {3, 5});
    const UOp* s = tb.reduce(x, ReduceOp::Add, {1});
    const UOp* out = tb.alu(Op::MUL, {s, s});
    auto r = plan(g, tb.sink({out}));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, Set{out});
  }
}

// A matmul's EXPANDs are below its reduction, not above it: one kernel.
TEST(PlanRealize, AMatmulIsOneKernel) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {4, 6});
  const UOp* b = tb.input(Scalar::Float32, {6, 3});
  const UOp* out = tb.matmul(a, b);
  auto r = plan(g, tb.sink({out}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, Set{out});
}

// A matmul's output pooled to a vector, sum(relu(a b), axis 0) (a convolution and its
// global average pool): the matmul's reduction is realized, a kernel of its own, and the
// pool reads its buffer, rather than the matmul running inside the pool's loop.
TEST(PlanRealize, AReductionAnotherOneFoldsIsRealized) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {4, 6});
  const UOp* b = tb.input(Scalar::Float32, {6, 3});
  const UOp* m = tb.matmul(a, b);
  const UOp* relu = tb.alu(Op::MAX, {m, tb.full(Scalar::Float32, 0.0, {4, 3})});
  const UOp* out = tb.reduce(relu, ReduceOp::Add, {0});
  auto r = plan(g, tb.sink({out}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 2u);
  EXPECT_TRUE(r->contains(out));
  const UOp* inner = nullptr;
  for (const UOp* u : *r)
    if (u != out) inner = u;
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(inner->op(), Op::REDUCE_AXIS) << "the matmul's reduction";
}

// A matmul's A computed by a chain of more than four ALU ops (a LayerNorm's scale and
// shift of x + y) is realized when the matmul repeats it along 16 output columns: fused,
// every column tile would compute it again. A short chain (relu), or the same long chain
// repeated along 4 columns only, stays fused.
TEST(PlanRealize, AMatmulOperandRecomputedPerColumnTileIsRealized) {
  auto case_of = [](int ops, int64_t columns) {
    Graph g;
    TensorBuilder tb(g);
    const UOp* x = tb.input(Scalar::Float32, {4, 6});
    const UOp* y = tb.input(Scalar::Float32, {4, 6});
    const UOp* a = tb.alu(Op::MAX, {x, tb.full(Scalar::Float32, 0.0, {4, 6})});  // 1 op
    if (ops > 1) {
      a = tb.alu(Op::ADD, {x, y});
      for (int i = 1; i < ops; ++i) a = tb.alu(i % 2 ? Op::MUL : Op::ADD, {a, y});
    }
    const UOp* out = tb.matmul(a, tb.input(Scalar::Float32, {6, columns}));
    auto r = plan(g, tb.sink({out}));
    EXPECT_TRUE(r.ok()) << r.status();
    return std::pair{r.ok() ? *r : Set{}, std::pair{a, out}};
  };
  auto [long_wide, lw] = case_of(6, 16);
  EXPECT_EQ(long_wide, (Set{lw.first, lw.second})) << "a 6-op chain repeated 16 times is realized";
  auto [short_wide, sw] = case_of(1, 16);
  EXPECT_EQ(short_wide, Set{sw.second}) << "relu is recomputed, not realized";
  auto [four_wide, fw] = case_of(4, 16);
  EXPECT_EQ(four_wide, Set{fw.second}) << "four ops are recomputed, not realized";
  auto [long_narrow, ln] = case_of(6, 4);
  EXPECT_EQ(long_narrow, Set{ln.second}) << "a chain repeated 4 times is recomputed";
}

// An EXPAND of a 3 x 5 value to 4 x 5 (3 is no broadcast dim): the shape error comes back.
TEST(PlanRealize, AGraphWhoseShapesDoNotHoldIsRefused) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {3, 5});
  const UOp* ok = tb.expand(tb.input(Scalar::Float32, {1, 5}), {4, 5});
  ASSERT_EQ(ok->op(), Op::EXPAND);
  const UOp* bad = g.make(Op::EXPAND, x->dtype(), {x, ok->src(1)});
  const UOp* out = g.alu(Op::ADD, {bad, ok});
  auto r = plan(g, g.make(Op::SINK, dtypes::void_, {out}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("[shape.expand]"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace uop
