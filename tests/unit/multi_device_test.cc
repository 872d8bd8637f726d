// Multi-device graphs (compiler/ir/README.md "Multi-device") lowered by the pipeline (the
// multi pass, rangeify, split_kernels: kernels per device, collectives, copies) and run by
// LocalRunner on 2 and 3 CPU devices, compared with the reference interpreter, which
// evaluates the same graph to its logical (unsharded) values.
//
// Inputs are small integers (differential.h small_ints), so float sums and products come
// out exact in any order: a reduction split into per-device partials plus an ALLREDUCE
// must then match the interpreter's one sequential fold bit for bit.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/pipeline.h"
#include "local/local_runner.h"
#include "tests/unit/compiler/differential.h"
#include "tests/unit/multi_graph.h"

namespace uop {
namespace {

using difftest::small_ints;

using testing::devices;
using testing::MultiGraph;
using testing::splits;

// Compiled (LocalRunner) against interpreted, every output exactly (signed zeros too).
void expect_same(LocalRunner& runner, MultiGraph& mg, const UOp* sink) {
  std::string why = difftest::check_graph(runner, mg.g(), sink, mg.inputs(),
                                          std::vector<difftest::OutputCheck>(sink->num_src(), difftest::OutputCheck{}));
  EXPECT_EQ(why, "");
}

// What the plan looks like: how many collectives and copies, and the devices kernels run on.
struct PlanShape {
  size_t collectives = 0, copies = 0;
  std::set<std::string> kernel_devices;
};
PlanShape plan_shape(Graph& g, const UOp* sink) {
  auto plan = plan_graph(g, sink);
  EXPECT_TRUE(plan.ok()) << plan.status();
  PlanShape s;
  if (!plan.ok()) return s;
  s.collectives = plan->collectives.size();
  s.copies = plan->copies.size();
  for (const KernelPlan& k : plan->kernels) s.kernel_devices.insert(k.device);
  return s;
}

struct Case {
  int ndev;
  Scalar dtype;
  int64_t rows;  // the sharded dim: ndev gives shards of one row
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return cat("dev", i.param.ndev, "_", scalar_name(i.param.dtype), "_rows", i.param.rows);
}

class MultiDevice : public ::testing::TestWithParam<Case> {
 protected:
  MultiDevice() : mg(g) {}
  std::vector<std::string> devs() const { return devices(GetParam().ndev); }
  HostTensor data(std::vector<int64_t> shape, uint64_t seed, int64_t lo = -3, int64_t hi = 3) {
    return small_ints(GetParam().dtype, std::move(shape), seed, lo, hi);
  }
  static LocalRunner& runner() {
    static LocalRunner r(2);
    return r;
  }
  Graph g;
  MultiGraph mg;
};

TEST_P(MultiDevice, ShardedElementwise) {
  const auto [n, dt, rows] = GetParam();
  const UOp* x = mg.sharded(data({rows, 5}, 1), 0, devs());
  const UOp* y = mg.sharded(data({rows, 5}, 2), 0, devs());
  // Device-less constants broadcast into every shard.
  const UOp* out = mg.alu(Op::ADD, {mg.alu(Op::MUL, {x, y}), mg.alu(Op::MAX, {x, mg.full(dt, 1, {rows, 5})})});
  const UOp* sink = mg.sink({out, mg.cast(mg.alu(Op::CMPLT, {x, y}), dt)});
  expect_same(runner(), mg, sink);
  PlanShape p = plan_shape(g, sink);
  EXPECT_EQ(p.collectives, 0u);
  EXPECT_EQ(p.kernel_devices.size(), static_cast<size_t>(n));
}

TEST_P(MultiDevice, ShardedOnAxis1WithMovement) {
  const auto [n, dt, rows] = GetParam();
  // [3, rows] sharded on axis 1; permuted (the axis follows), reshaped and padded on the
  // other axes, flipped along a kept axis, shrunk along another.
  const UOp* x = mg.sharded(data({3, rows}, 3), 1, devs());
  const UOp* t = mg.permute(x, {1, 0});                        // [rows, 3], shard axis 0
  const UOp* r = mg.reshape(t, {rows, 3, 1});                  // keeps dims up to the axis
  const UOp* e = mg.expand(r, {rows, 3, 2});
  const UOp* p = mg.pad(e, {0, 1, 0}, {0, 0, 2});              // [rows, 4, 4]
  const UOp* f = mg.flip(p, {false, true, false});
  const UOp* s = mg.shrink(f, {0, 1, 1}, {rows, 4, 3});         // [rows, 3, 2]
  expect_same(runner(), mg, mg.sink({s, mg.reduce(s, ReduceOp::Add, {1, 2})}));
}

TEST_P(MultiDevice, ReductionAcrossShardsIsAllreduce) {
  const auto [n, dt, rows] = GetParam();
  for (ReduceOp op : {ReduceOp::Add, ReduceOp::Mul, ReduceOp::Max, ReduceOp::Min}) {
    SCOPED_TRACE(reduce_op_name(op));
    Graph g2;
    MultiGraph m2(g2);
    // Products stay small and exact with factors in [-2, 2].
    const int64_t lo = op == ReduceOp::Mul ? -2 : -3, hi = op == ReduceOp::Mul ? 2 : 3;
    const UOp* x = m2.sharded(small_ints(dt, {rows, 4}, 11, lo, hi), 0, devs());
    const UOp* total = m2.reduce(x, op, {0});        // [1, 4], replicated: an ALLREDUCE
    const UOp* all = m2.reduce(x, op, {0, 1});       // [1, 1]
    const UOp* per_row = m2.reduce(x, op, {1});      // [rows, 1], stays sharded
    // The replicated result used with the sharded input again (softmax-like).
    const UOp* centered = m2.alu(Op::SUB, {x, m2.expand(total, {rows, 4})});
    const UOp* sink = m2.sink({total, all, per_row, centered});
    expect_same(runner(), m2, sink);
    PlanShape p = plan_shape(g2, sink);
    EXPECT_EQ(p.collectives, 2u);
    EXPECT_EQ(p.kernel_devices.size(), static_cast<size_t>(n));
  }
}

TEST_P(MultiDevice, ReplicatedParamsWithShardedBatch) {
  const auto [n, dt, rows] = GetParam();
  // A data-parallel layer: x [rows, 3] sharded on the batch, w [3, 2] and b [2] replicated;
  // y = x @ w + b per device, and the weight "gradient" x^T @ y summed over the batch
  // (a reduction over the shard axis: an ALLREDUCE).
  const UOp* x = mg.sharded(data({rows, 3}, 21), 0, devs());
  const UOp* w = mg.replicated(data({3, 2}, 22), devs());
  const UOp* b = mg.replicated(data({2}, 23), devs());
  const UOp* xw = mg.alu(Op::MUL, {mg.expand(mg.reshape(x, {rows, 3, 1}), {rows, 3, 2}),
                                   mg.expand(mg.reshape(w, {1, 3, 2}), {rows, 3, 2})});
  const UOp* y = mg.alu(Op::ADD, {mg.reshape(mg.reduce(xw, ReduceOp::Add, {1}), {rows, 2}),
                                  mg.expand(mg.reshape(b, {1, 2}), {rows, 2})});
  const UOp* gw = mg.reduce(mg.alu(Op::MUL, {mg.expand(mg.reshape(x, {rows, 3, 1}), {rows, 3, 2}),
                                             mg.expand(mg.reshape(y, {rows, 1, 2}), {rows, 3, 2})}),
                            ReduceOp::Add, {0});
  // A replicated operand next to a sharded one: each device takes its slice of it.
  const UOp* whole = mg.replicated(data({rows, 2}, 24), devs());
  const UOp* mixed = mg.alu(Op::SUB, {y, whole});
  const UOp* sink = mg.sink({y, gw, mg.alu(Op::ADD, {w, w}), mixed});
  expect_same(runner(), mg, sink);
  EXPECT_EQ(plan_shape(g, sink).collectives, 1u);
}

TEST_P(MultiDevice, CopyBetweenDevices) {
  const auto [n, dt, rows] = GetParam();
  const std::vector<std::string> d = devs();
  // A value computed on the last device, copied to the first and used there; a plain
  // input copied across as it is.
  const UOp* a = mg.input(data({rows, 3}, 31), d.back());
  const UOp* b = mg.input(data({rows, 3}, 32), d[0]);
  const UOp* twice = mg.alu(Op::ADD, {a, a});
  const UOp* there = mg.copy(twice, d[0]);
  const UOp* out = mg.alu(Op::MUL, {there, b});
  const UOp* moved = mg.copy(a, d[1]);
  const UOp* sink = mg.sink({out, mg.alu(Op::NEG, {moved})});
  expect_same(runner(), mg, sink);
  PlanShape p = plan_shape(g, sink);
  EXPECT_EQ(p.copies, 2u);
}

TEST_P(MultiDevice, MselectAndExplicitAllreduce) {
  const auto [n, dt, rows] = GetParam();
  const std::vector<std::string> d = devs();
  const UOp* x = mg.sharded(data({rows, 2}, 41), 0, d);
  const std::vector<int64_t> sp = splits(rows, n);
  // Device 1's shard, used on its own.
  const UOp* s1 = mg.mselect(x, 1, {sp[1], 2});
  const UOp* out1 = mg.alu(Op::MUL, {s1, s1});
  // An ALLREDUCE written in the graph: per-device partials (one row each) reduced.
  std::vector<const UOp*> parts;
  for (int i = 0; i < n; ++i) parts.push_back(mg.input(data({1, 3}, 50 + i, -2, 2), d[i]));
  const UOp* partials = mg.multi(parts, -1);
  std::vector<const UOp*> outs{out1};
  for (ReduceOp op : {ReduceOp::Add, ReduceOp::Mul, ReduceOp::Max, ReduceOp::Min}) {
    const UOp* all = mg.allreduce(partials, op, d, {1, 3});
    outs.push_back(all);
    // Device n-1's copy of the result, used there.
    outs.push_back(mg.alu(Op::ADD, {mg.mselect(all, n - 1, {1, 3}), mg.input(data({1, 3}, 60), d[n - 1])}));
  }
  expect_same(runner(), mg, mg.sink(outs));
}

TEST_P(MultiDevice, ShardedDirectOutputAndReplicatedOutput) {
  const auto [n, dt, rows] = GetParam();
  const UOp* x = mg.sharded(data({rows}, 71), 0, devs());
  const UOp* w = mg.replicated(data({rows}, 72), devs());
  expect_same(runner(), mg, mg.sink({x, w, mg.alu(Op::ADD, {x, w})}));
}

INSTANTIATE_TEST_SUITE_P(Devices, MultiDevice,
                         ::testing::Values(Case{2, Scalar::Float32, 7}, Case{2, Scalar::Int32, 2},
                                         Case{2, Scalar::Float64, 5}, Case{3, Scalar::Float32, 3},
                                         Case{3, Scalar::Int64, 7}, Case{3, Scalar::Float64, 4},
                                         Case{3, Scalar::Float16, 5}),
                         case_name);

// ---------------------------------------------------------------------------------------
// The interpreter's multi-device semantics, on values worked out by hand.

TEST(InterpMulti, LogicalValues) {
  Graph g;
  MultiGraph mg(g);
  const auto d = devices(2);
  const UOp* a = mg.input(HostTensor::of(Scalar::Float32, {2, 2}, {1, 2, 3, 4}), d[0]);
  const UOp* b = mg.input(HostTensor::of(Scalar::Float32, {1, 2}, {5, 6}), d[1]);
  const UOp* x = mg.multi({a, b}, 0);  // [[1, 2], [3, 4], [5, 6]]
  const UOp* all = mg.allreduce(mg.multi({mg.reduce(a, ReduceOp::Add, {0}), b}, -1), ReduceOp::Max, d, {1, 2});
  auto out = interpret(g, mg.sink({x, mg.mselect(x, 1, {1, 2}), all, mg.reduce(x, ReduceOp::Add, {0}),
                                   mg.mselect(all, 0, {1, 2})}),
                       mg.inputs());
  ASSERT_TRUE(out.ok()) << out.status();
  auto expect = [&](size_t i, std::vector<int64_t> shape, std::initializer_list<double> v) {
    CompareResult c = compare(HostTensor::of(Scalar::Float32, shape, v), (*out)[i], Tolerance::exact());
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  };
  expect(0, {3, 2}, {1, 2, 3, 4, 5, 6});
  expect(1, {1, 2}, {5, 6});
  expect(2, {1, 2}, {5, 6});  // max([4, 6], [5, 6])
  expect(3, {1, 2}, {9, 12});
  expect(4, {1, 2}, {5, 6});
}

TEST(InterpMulti, AllreduceNeedsADeviceForEachPart) {
  Graph g;
  MultiGraph mg(g);
  const auto d = devices(2);
  const UOp* a = mg.input(HostTensor::of(Scalar::Int32, {2}, {1, 2}), d[0]);
  const UOp* b = mg.input(HostTensor::of(Scalar::Int32, {2}, {3, 4}), d[1]);
  const UOp* bad = mg.allreduce(mg.multi({a, b}, -1), ReduceOp::Add, {d[0]}, {2});
  auto out = interpret(g, mg.sink({bad}), mg.inputs());
  EXPECT_FALSE(out.ok());
}

}  // namespace
}  // namespace uop
