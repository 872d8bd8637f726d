// Kernel identity (docs/ARCHITECTURE.md, The IR and The pipeline: normalize): a normalized kernel's digest names the
// computation, not the buffers it runs on, the names a client gave, or the order in which
// nodes were built. So the same computation on two buffers, in one graph or in two, is one
// digest and one compile; a different computation is a different digest.
#include <gtest/gtest.h>

#include <set>

#include "compiler/ir/codec.h"
#include "tests/unit/compiler/differential.h"

namespace uop {
namespace {

using namespace difftest;

std::vector<Digest> kernel_digests(Graph& g, const UOp* root) {
  auto plan = plan_graph(g, root);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<Digest> d;
  if (plan.ok())
    for (const KernelPlan& k : plan->kernels) d.push_back(k.kernel->digest());
  return d;
}

// (x + 1) * x, then summed over the last axis: two kernels' worth of work on one input.
const UOp* computation(TensorBuilder& tb, const UOp* x, double k = 1.0) {
  const UOp* y = tb.alu(Op::MUL, {tb.alu(Op::ADD, {x, tb.full(x->dtype().scalar, k, {})}), x});
  return tb.reduce(y, ReduceOp::Add, {1});
}

TEST(Dedup, SameComputationOnTwoBuffersInOneGraph) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {4, 6});
  const UOp* b = tb.input(Scalar::Float32, {4, 6});
  const UOp* sink = tb.sink({computation(tb, a), computation(tb, b)});
  auto d = kernel_digests(g, sink);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], d[1]);

  LocalRunner runner;
  std::vector<KernelReport> report;
  Inputs in = random_inputs(tb, {a, b}, 1);
  auto got = runner.run(g, sink, in, &report);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(report.size(), 2u);
  EXPECT_TRUE(report[0].compiled);
  EXPECT_FALSE(report[1].compiled) << "the second buffer reuses the first one's program";
  EXPECT_EQ(check_graph(runner, g, sink, in), "");  // and the shared program is right for both
}

TEST(Dedup, SameComputationInTwoGraphs) {
  LocalRunner runner;
  std::vector<Digest> first;
  for (int graph = 0; graph < 2; ++graph) {
    Graph g;
    TensorBuilder tb(g);
    // The second graph has other inputs first, so its buffers get other UNIQUE ids.
    if (graph == 1) tb.input(Scalar::Int8, {3});
    if (graph == 1) tb.input(Scalar::Float32, {4, 6});
    const UOp* x = tb.input(Scalar::Float32, {4, 6});
    const UOp* sink = tb.sink({computation(tb, x)});
    auto d = kernel_digests(g, sink);
    if (graph == 0) first = d;
    else EXPECT_EQ(d, first);
    RunStats stats;
    EXPECT_EQ(check_graph(runner, g, sink, random_inputs(tb, {x}, 7 + graph), {}, &stats), "");
    EXPECT_EQ(stats.compiled, graph == 0 ? 1 : 0);
  }
}

TEST(Dedup, DifferentComputationsAreDifferentKernels) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4, 6});
  const UOp* y = tb.input(Scalar::Float32, {4, 6});
  const UOp* i = tb.input(Scalar::Int32, {4, 6});
  const UOp* w = tb.input(Scalar::Float32, {4, 7});
  std::vector<std::pair<std::string, const UOp*>> variants = {
      {"base", computation(tb, x)},
      {"another constant", computation(tb, x, 2.0)},
      {"another dtype", computation(tb, i)},
      {"another shape", computation(tb, w)},
      {"another reduce op", tb.reduce(tb.alu(Op::MUL, {tb.alu(Op::ADD, {x, tb.full(Scalar::Float32, 1.0, {})}), x}), ReduceOp::Max, {1})},
      {"another axis", tb.reduce(tb.alu(Op::MUL, {tb.alu(Op::ADD, {x, tb.full(Scalar::Float32, 1.0, {})}), x}), ReduceOp::Add, {0})},
      {"x - y", tb.alu(Op::SUB, {x, y})},
      {"x - y*y", tb.alu(Op::SUB, {x, tb.alu(Op::MUL, {y, y})})},
      {"x - flip(y)", tb.alu(Op::SUB, {x, tb.flip(y, {true, false})})},
      {"x - x", tb.alu(Op::SUB, {x, x})},
  };
  std::vector<const UOp*> outs;
  for (auto& v : variants) outs.push_back(v.second);
  auto d = kernel_digests(g, tb.sink(outs));
  ASSERT_EQ(d.size(), variants.size());
  for (size_t a = 0; a < d.size(); ++a)
    for (size_t b = a + 1; b < d.size(); ++b)
      EXPECT_NE(d[a], d[b]) << variants[a].first << " and " << variants[b].first << " share a digest";
  // y - x is x - y with the buffers swapped: PARAM slots follow first use, so one kernel.
  auto swapped = kernel_digests(g, tb.sink({tb.alu(Op::SUB, {x, y}), tb.alu(Op::SUB, {y, x})}));
  ASSERT_EQ(swapped.size(), 2u);
  EXPECT_EQ(swapped[0], swapped[1]);
}

TEST(Dedup, GraphNamesDoNotChangeDigests) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {4, 6});
  const UOp* b = tb.input(Scalar::Float32, {6});
  const UOp* out = tb.alu(Op::ADD, {computation(tb, a), tb.reduce(b, ReduceOp::Max, {0})});
  const UOp* sink = tb.sink({out, tb.alu(Op::NEG, {b})});
  const std::vector<Digest> want = kernel_digests(g, sink);
  ASSERT_EQ(want.size(), 3u);

  const std::vector<Names> namings = {
      {},
      {{"a", a}, {"b", b}, {"out", out}},
      {{"weights", b}, {"activations", a}, {"result", sink}, {"also b", b}},
  };
  for (size_t n = 0; n < namings.size(); ++n) {
    for (bool json : {false, true}) {
      auto d = json ? decode_json(encode_json(sink, namings[n])) : decode_binary(encode_binary(sink, namings[n]));
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_EQ(d->names.size(), namings[n].size());
      EXPECT_EQ(d->root->digest(), sink->digest()) << "naming " << n << (json ? " (json)" : " (binary)");
      EXPECT_EQ(kernel_digests(*d->graph, d->root), want) << "naming " << n << (json ? " (json)" : " (binary)");
    }
  }
}

// The same graph built node by node in two different orders, in two arenas.
TEST(Dedup, ConstructionOrderDoesNotChangeDigests) {
  auto build = [](Graph& g, bool reversed) {
    auto dev = [&] { return g.make(Op::DEVICE, dtypes::void_, {}, DeviceArg{{"CPU:0"}}); };
    auto buffer = [&](int64_t id) {
      return g.make(Op::BUFFER, dtypes::float32, {g.make(Op::UNIQUE, dtypes::void_, {}, IntArg{id}), dev()}, BufferArg{12});
    };
    auto shape = [&](std::vector<ConstValue> v) {
      uint32_t n = static_cast<uint32_t>(v.size());
      return g.make(Op::VCONST, dtypes::index.vec(n), {}, VConstArg{std::move(v)});
    };
    // Make the leaves (and some junk nobody uses) in an order that depends on `reversed`.
    const UOp *b0, *b1, *two;
    if (reversed) {
      g.cnst(dtypes::int8, 5.0);
      two = g.cnst(dtypes::float32, 2.0);
      b1 = buffer(1);
      b0 = buffer(0);
    } else {
      b0 = buffer(0);
      b1 = buffer(1);
      two = g.cnst(dtypes::float32, 2.0);
    }
    const UOp* s34 = shape({ConstValue::Int(3), ConstValue::Int(4)});
    const UOp* x = g.make(Op::RESHAPE, dtypes::float32, {b0, s34});
    const UOp* y = g.make(Op::RESHAPE, dtypes::float32, {b1, s34});
    const UOp* k = g.make(Op::EXPAND, dtypes::float32,
                          {g.make(Op::RESHAPE, dtypes::float32, {two, shape({ConstValue::Int(1), ConstValue::Int(1)})}), s34});
    const UOp* prod = reversed ? g.alu(Op::MUL, {y, k}) : nullptr;
    const UOp* sum = g.alu(Op::ADD, {x, y});
    if (!reversed) prod = g.alu(Op::MUL, {y, k});
    const UOp* red = g.make(Op::REDUCE_AXIS, dtypes::float32, {sum}, ReduceAxisArg{ReduceOp::Max, {1}});
    return g.make(Op::SINK, dtypes::void_, {prod, red, sum});
  };
  Graph g1, g2;
  const UOp* r1 = build(g1, false);
  const UOp* r2 = build(g2, true);
  EXPECT_EQ(r1->digest(), r2->digest());
  auto d1 = kernel_digests(g1, r1), d2 = kernel_digests(g2, r2);
  EXPECT_EQ(d1.size(), 3u);
  EXPECT_EQ(d1, d2);
}

// Inputs made in the other order get other UNIQUE ids: another graph (other buffers), but
// the same kernels.
TEST(Dedup, InputOrderChangesTheGraphNotTheKernels) {
  auto build = [](Graph& g, bool swap) {
    TensorBuilder tb(g);
    const UOp *a, *b;
    if (swap) b = tb.input(Scalar::Int32, {5, 3}), a = tb.input(Scalar::Int32, {5, 3});
    else a = tb.input(Scalar::Int32, {5, 3}), b = tb.input(Scalar::Int32, {5, 3});
    return tb.sink({tb.alu(Op::SHL, {a, b}), tb.reduce(tb.alu(Op::XOR, {b, a}), ReduceOp::Min, {0})});
  };
  Graph g1, g2;
  const UOp* r1 = build(g1, false);
  const UOp* r2 = build(g2, true);
  EXPECT_NE(r1->digest(), r2->digest());
  EXPECT_EQ(kernel_digests(g1, r1), kernel_digests(g2, r2));
  std::set<Digest> distinct;
  for (const Digest& d : kernel_digests(g1, r1)) distinct.insert(d);
  EXPECT_EQ(distinct.size(), 2u);
}

}  // namespace
}  // namespace uop
