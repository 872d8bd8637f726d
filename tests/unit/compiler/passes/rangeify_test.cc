// rangeify (compiler/passes/rangeify.h) on tensor graphs built by hand: one BUFFERIZE
// per output of the SINK, in order, over a RANGE per dim; no movement op and no
// REDUCE_AXIS left (indices instead, REDUCE over Reduce ranges); PAD reads gated loads;
// a root that is no SINK refused. The values of what it makes are checked one stage on,
// where the kernels can run (split_kernels_test: split, normalized, interpreted).
#include "compiler/passes/rangeify.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "compiler/interp/interp.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/tensor_builder.h"
#include "tests/unit/compiler/passes/kernel_builder.h"

namespace uop {
namespace {

bool is_movement(const UOp* u) {
  switch (u->op()) {
    case Op::RESHAPE: case Op::PERMUTE: case Op::EXPAND: case Op::PAD: case Op::SHRINK: case Op::FLIP: return true;
    default: return false;
  }
}

TEST(Rangeify, OneBufferizePerOutputAndNoMovementOpLeft) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {2, 3, 4});
  const UOp* moved = tb.flip(tb.shrink(tb.permute(x, {2, 0, 1}), {1, 0, 0}, {4, 2, 3}), {true, false, true});
  const UOp* total = tb.reduce(tb.reshape(moved, {3, 6}), ReduceOp::Add, {1});
  const UOp* sink = tb.sink({moved, total});
  ShapeInference shapes(g);
  auto r = rangeify(g, sink, shapes);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->sink->op(), Op::SINK);
  ASSERT_EQ(r->sink->num_src(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(r->sink->src(i)->op(), Op::BUFFERIZE) << "output " << i;
  EXPECT_EQ(testing::count_of(r->sink, is_movement), 0) << "a movement op left";
  EXPECT_EQ(testing::count_of(r->sink, [](const UOp* u) { return u->op() == Op::REDUCE_AXIS; }), 0);
  EXPECT_EQ(testing::count_of(r->sink, [](const UOp* u) { return u->op() == Op::REDUCE; }), 1);
  EXPECT_EQ(testing::count_of(r->sink, [](const UOp* u) {
              return u->op() == Op::RANGE && u->arg_as<RangeArg>().type == AxisType::Reduce;
            }),
            1)
      << "the reduced dim of 6 is one Reduce range";
  // The first output's BUFFERIZE: its value and one RANGE per dim (3, 2, 3).
  const UOp* b = r->sink->src(0);
  ASSERT_EQ(b->num_src(), 4u);
  for (size_t d = 1; d < 4; ++d) EXPECT_EQ(b->src(d)->op(), Op::RANGE);
  EXPECT_TRUE(r->var_values.empty());
}

// PAD: the loads below it are gated (an INDEX with a gate) and the padding is selected.
TEST(Rangeify, PadGatesTheLoadsBelowIt) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {3});
  ShapeInference shapes(g);
  auto r = rangeify(g, tb.sink({tb.pad(x, {2}, {1})}), shapes);
  ASSERT_TRUE(r.ok()) << r.status();
  int gated = testing::count_of(r->sink, [](const UOp* u) { return u->op() == Op::INDEX && u->num_src() == 3; });
  EXPECT_GE(gated, 1) << "a load of the padded input without a gate";
  EXPECT_EQ(testing::count_of(r->sink, is_movement), 0);
}

TEST(Rangeify, ARootThatIsNoSinkIsRefused) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {3});
  ShapeInference shapes(g);
  auto r = rangeify(g, tb.alu(Op::ADD, {x, x}), shapes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("SINK"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace uop
