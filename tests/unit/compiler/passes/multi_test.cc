// multi (compiler/passes/multi.h) on multi-device tensor graphs built by hand: a graph
// without MULTI comes back as it is; element-wise ops and reductions over other axes run
// per shard, on the shard's device; a reduction over the shard axis becomes per-shard
// partials combined by an ALLREDUCE, replicated; what the pass cannot shard is refused
// with multi.unsupported. Values: the interpreter on the lowered single-device graph,
// its parts put together, against the interpreter on the multi-device graph (which
// evaluates it to its logical values).
#include "compiler/passes/multi.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/shape.h"
#include "tests/unit/compiler/passes/kernel_builder.h"
#include "tests/unit/multi_graph.h"

namespace uop {
namespace {

using testing::devices;
using testing::MultiGraph;

HostTensor ints(std::vector<int64_t> shape, int64_t seed) {
  HostTensor t = HostTensor::zeros(Scalar::Float32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, ConstValue::Float(static_cast<double>((i * 7 + seed) % 11) - 5));
  return t;
}

// The lowered graph's outputs, each put together from its parts (shards along axis 0 are
// concatenated, which in row-major order is their data one after another; a replicated
// output is its part 0), against the interpreter on the original graph.
void expect_logical_values(MultiGraph& mg, const UOp* original, const MultiLowered& lowered) {
  auto want = interpret(mg.g(), original, mg.inputs());
  ASSERT_TRUE(want.ok()) << want.status();
  auto parts = interpret(mg.g(), lowered.sink, mg.inputs());
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(lowered.outputs.size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    const MultiLowered::Output& out = lowered.outputs[o];
    ASSERT_TRUE(out.axis == -1 || out.axis == 0) << "the test puts axis-0 shards together only";
    HostTensor got = (*parts)[out.parts[0]];
    if (out.axis == 0)
      for (size_t p = 1; p < out.parts.size(); ++p) got.data += (*parts)[out.parts[p]].data;
    got.shape = (*want)[o].shape;
    ASSERT_EQ(got.numel(), (*want)[o].numel()) << "output " << o;
    CompareResult c = compare((*want)[o], got, Tolerance::for_dtype(Scalar::Float32));
    EXPECT_TRUE(c.ok) << "output " << o << ": " << c.message;
  }
}

TEST(Multi, AGraphWithoutMultiIsLeftAlone) {
  Graph g;
  MultiGraph mg(g);
  const UOp* x = mg.input(ints({3, 4}, 1), "CPU:0");
  const UOp* sink = mg.sink({mg.alu(Op::ADD, {x, x}), mg.reduce(x, ReduceOp::Max, {1})});
  ShapeInference shapes(g);
  auto lowered = lower_multi(g, sink, shapes);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->sink, sink);
  ASSERT_EQ(lowered->outputs.size(), 2u);
  for (size_t o = 0; o < 2; ++o) {
    EXPECT_EQ(lowered->outputs[o].parts, std::vector<size_t>{o});
    EXPECT_EQ(lowered->outputs[o].axis, -1);
  }
}

// x sharded by rows over 2 devices; 2x + 1 and a sum over columns run per shard: no
// MULTI left, no collective, one part per device, each on its device.
TEST(Multi, ElementwiseAndOtherAxesRunPerShard) {
  Graph g;
  MultiGraph mg(g);
  const std::vector<std::string> devs = devices(2);
  const UOp* x = mg.sharded(ints({6, 4}, 2), 0, devs);
  const UOp* y = mg.alu(Op::ADD, {mg.alu(Op::MUL, {x, mg.full(Scalar::Float32, 2, {6, 4})}), mg.full(Scalar::Float32, 1, {6, 4})});
  const UOp* rows = mg.reduce(y, ReduceOp::Add, {1});
  const UOp* sink = mg.sink({y, rows});
  ShapeInference shapes(g);
  auto lowered = lower_multi(g, sink, shapes);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(testing::count_of(lowered->sink, [](const UOp* u) { return u->op() == Op::MULTI; }), 0);
  EXPECT_EQ(testing::count_of(lowered->sink, [](const UOp* u) { return u->op() == Op::ALLREDUCE; }), 0);
  ASSERT_EQ(lowered->outputs.size(), 2u);
  for (const MultiLowered::Output& out : lowered->outputs) {
    EXPECT_EQ(out.axis, 0);
    ASSERT_EQ(out.parts.size(), 2u);
    for (size_t d = 0; d < 2; ++d) {
      const UOp* dev = device_of(lowered->sink->src(out.parts[d]));
      ASSERT_NE(dev, nullptr);
      EXPECT_EQ(dev->arg_as<DeviceArg>().devices, std::vector<std::string>{devs[d]});
    }
  }
  expect_logical_values(mg, sink, *lowered);
}

// A sum over the shard axis: partials per shard and an ALLREDUCE, the result replicated.
TEST(Multi, AReductionOverTheShardAxisIsAnAllreduce) {
  Graph g;
  MultiGraph mg(g);
  const UOp* x = mg.sharded(ints({6, 4}, 3), 0, devices(3));
  const UOp* sink = mg.sink({mg.reduce(x, ReduceOp::Add, {0})});
  ShapeInference shapes(g);
  auto lowered = lower_multi(g, sink, shapes);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(testing::count_of(lowered->sink, [](const UOp* u) { return u->op() == Op::MULTI; }) - testing::count_of(lowered->sink, [](const UOp* u) { return u->op() == Op::ALLREDUCE; }), 0)
      << "a MULTI left other than the partials the ALLREDUCE combines";
  EXPECT_GE(testing::count_of(lowered->sink, [](const UOp* u) { return u->op() == Op::ALLREDUCE; }), 1);
  ASSERT_EQ(lowered->outputs.size(), 1u);
  EXPECT_EQ(lowered->outputs[0].axis, -1);
  expect_logical_values(mg, sink, *lowered);
}

// What would change the shards' meaning is refused, naming what: padding or flipping the
// shard axis, shards of different axes together, a single-device tensor with shards.
TEST(Multi, WhatCannotBeShardedIsRefused) {
  auto expect_refused = [](Graph& g, const UOp* sink, const std::string& what) {
    ShapeInference shapes(g);
    auto lowered = lower_multi(g, sink, shapes);
    ASSERT_FALSE(lowered.ok()) << what;
    EXPECT_EQ(lowered.status().code(), absl::StatusCode::kInvalidArgument) << lowered.status();
    EXPECT_NE(lowered.status().message().find("[multi.unsupported]"), std::string::npos) << lowered.status();
    EXPECT_NE(lowered.status().message().find(what), std::string::npos) << lowered.status();
  };
  {
    Graph g;
    MultiGraph mg(g);
    const UOp* x = mg.sharded(ints({4, 4}, 1), 0, devices(2));
    expect_refused(g, mg.sink({mg.pad(x, {1, 0}, {0, 0})}), "padding along the shard axis");
  }
  {
    Graph g;
    MultiGraph mg(g);
    const UOp* x = mg.sharded(ints({4, 4}, 1), 0, devices(2));
    expect_refused(g, mg.sink({mg.flip(x, {true, false})}), "flipping the shard axis");
  }
  {
    Graph g;
    MultiGraph mg(g);
    const UOp* a = mg.sharded(ints({4, 4}, 1), 0, devices(2));
    const UOp* b = mg.sharded(ints({4, 4}, 2), 1, devices(2));
    expect_refused(g, mg.sink({mg.alu(Op::ADD, {a, b})}), "different axes");
  }
  {
    Graph g;
    MultiGraph mg(g);
    const UOp* a = mg.sharded(ints({4, 4}, 1), 0, devices(2));
    const UOp* single = mg.input(ints({4, 4}, 2), "CPU:0");
    expect_refused(g, mg.sink({mg.alu(Op::ADD, {a, single})}), "single-device tensor");
  }
}

}  // namespace
}  // namespace uop
