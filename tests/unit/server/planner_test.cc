// The scheduler's planner (server/planner.h) without a server, over a memory-tier compile
// cache: a decoded graph becomes a Plan (kernels in order, buffers by role, inputs named
// by their node's digest, outputs with their shapes), cached by graph digest and cache
// namespace; its kernels compile once per cache key and come from the cache after; the
// compiled kernels, run in the plan's order on the plan's buffers, compute what the
// interpreter computes for the graph. Refusals: a graph the pipeline refuses, a kernel
// over --max-kernel-ops, a request whose deadline has passed.
#include "server/planner.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/support/strings.h"
#include "server/cache/memory_tier.h"
#include "tests/unit/compiler/passes/run_on_cpu.h"

namespace uop::server {
namespace {

std::unique_ptr<CompileCache> memory_cache() {
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(int64_t{64} << 20));
  return std::make_unique<CompileCache>(std::move(tiers));
}

// The graph as the server receives it: encoded, then decoded into a graph of its own.
std::shared_ptr<const DecodedGraph> wire(const UOp* root) {
  auto d = decode_binary(encode_binary(root));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::make_shared<const DecodedGraph>(std::move(*d)) : nullptr;
}

// softmax(x) over rows of a 4 x 6 input, and the row sums of x * x: two outputs.
struct TwoOutputs {
  Graph g;
  TensorBuilder tb{g};
  const UOp* x = tb.input(Scalar::Float32, {4, 6});
  const UOp* root;
  TwoOutputs() {
    const UOp* m = tb.reduce(x, ReduceOp::Max, {1});
    const UOp* e = tb.alu(Op::EXP2, {tb.alu(Op::SUB, {x, m})});
    const UOp* soft = tb.alu(Op::FDIV, {e, tb.reduce(e, ReduceOp::Add, {1})});
    root = tb.sink({soft, tb.reduce(tb.alu(Op::MUL, {x, x}), ReduceOp::Add, {1})});
  }
};

class PlannerTest : public ::testing::Test {
 protected:
  std::unique_ptr<CompileCache> cache_ = memory_cache();
  Planner planner_{PlannerOptions{}, cache_.get(), CpuTarget::host()};
};

TEST_F(PlannerTest, APlanNamesItsKernelsBuffersAndOutputs) {
  TwoOutputs t;
  bool cached = true;
  auto plan = planner_.plan(wire(t.root), &cached);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(cached);
  const Plan& p = **plan;
  EXPECT_EQ(p.graph, t.root->digest());
  EXPECT_FALSE(p.kernel_level);
  EXPECT_FALSE(p.multi_device());
  EXPECT_EQ(p.kernels.size(), 4u) << "max, sum, the division, the sum of squares";
  ASSERT_EQ(p.steps.size(), p.kernels.size());
  int inputs = 0, outputs = 0;
  for (const PlannedBuffer& b : p.buffers) {
    if (b.role == PlannedBuffer::Role::Input) {
      ++inputs;
      EXPECT_EQ(b.node, t.tb.buffer_of(t.x)->digest()) << "an input named by another node";
      EXPECT_EQ(b.elements, 24);
    }
    outputs += b.role == PlannedBuffer::Role::Output;
  }
  EXPECT_EQ(inputs, 1);
  EXPECT_EQ(outputs, 2);
  ASSERT_EQ(p.outputs.size(), 2u);
  EXPECT_EQ(p.outputs[0].shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(p.outputs[1].shape, (std::vector<int64_t>{4, 1}));
  for (const PlannedOutput& o : p.outputs) EXPECT_EQ(p.buffers[o.buffer].role, PlannedBuffer::Role::Output);
  for (const PlannedKernel& k : p.kernels) {
    ASSERT_FALSE(k.buffers.empty());
    EXPECT_NE(p.buffers[k.buffers[0]].role, PlannedBuffer::Role::Input) << k.name << " writes an input";
  }
}

// A plan is found again by the graph's digest (another decode of the same graph), within
// its cache namespace only.
TEST_F(PlannerTest, PlansAreCachedByDigestWithinANamespace) {
  TwoOutputs t;
  bool cached = true;
  auto first = planner_.plan(wire(t.root), &cached);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(cached);
  auto again = planner_.plan(wire(t.root), &cached);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(cached);
  EXPECT_EQ(again->get(), first->get()) << "the cached plan itself";
  auto other = planner_.plan(wire(t.root), &cached, "tenant-ns");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(cached) << "a private namespace found a shared plan";
  EXPECT_EQ(planner_.plan_hits(), 1u);
  EXPECT_EQ(planner_.plan_misses(), 2u);
  EXPECT_NE(planner_.cache_key(first->get()->kernels[0].digest, *planner_.host()), planner_.cache_key(first->get()->kernels[0].digest, *planner_.host(), "tenant-ns"));
}

// Compiled kernels run in the plan's order on its buffers compute the interpreter's values;
// a second compile of the plan comes from the cache.
TEST_F(PlannerTest, CompiledKernelsComputeTheGraph) {
  TwoOutputs t;
  bool cached = false;
  auto plan = planner_.plan(wire(t.root), &cached);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Plan& p = **plan;
  auto kernels = planner_.compile(p, planner_.host());
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  ASSERT_EQ(kernels->size(), p.kernels.size());
  for (const CompiledKernel& k : *kernels) EXPECT_EQ(k.outcome, CacheOutcome::Miss) << k.name;

  HostTensor x = HostTensor::random(Scalar::Float32, {24}, 5);
  std::vector<HostTensor> bufs;
  for (const PlannedBuffer& b : p.buffers)
    bufs.push_back(b.role == PlannedBuffer::Role::Input ? x : HostTensor::zeros(b.dtype, {b.elements}));
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    auto prog = CpuProgram::load(*(*kernels)[i].object, (*kernels)[i].abi);
    ASSERT_TRUE(prog.ok()) << prog.status();
    std::vector<HostTensor> slots;
    for (int b : p.kernels[i].buffers) slots.push_back(bufs[b]);
    absl::Status st = uop::testing::run_program(**prog, slots);
    ASSERT_TRUE(st.ok()) << p.kernels[i].name << ": " << st;
    for (size_t s = 0; s < slots.size(); ++s) bufs[p.kernels[i].buffers[s]] = slots[s];
  }
  auto want = interpret(t.g, t.root, {{t.tb.buffer_of(t.x), x}});
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t o = 0; o < p.outputs.size(); ++o) {
    HostTensor got = bufs[p.outputs[o].buffer];
    got.shape = (*want)[o].shape;
    CompareResult c = compare((*want)[o], got, Tolerance::for_dtype(Scalar::Float32));
    EXPECT_TRUE(c.ok) << "output " << o << ": " << c.message;
  }

  auto again = planner_.compile(p, planner_.host());
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t i = 0; i < again->size(); ++i) {
    EXPECT_EQ((*again)[i].outcome, CacheOutcome::Hit) << (*again)[i].name;
    EXPECT_EQ((*again)[i].tier, "memory");
    EXPECT_EQ((*again)[i].key, (*kernels)[i].key);
  }
}

TEST_F(PlannerTest, WhatItCannotPlanIsRefusedSayingWhy) {
  // Shapes that do not broadcast: the pipeline's verifier names the rule.
  {
    Graph g;
    TensorBuilder tb(g);
    const UOp* a = tb.input(Scalar::Float32, {3});
    const UOp* b = tb.input(Scalar::Float32, {4});
    bool cached = false;
    auto plan = planner_.plan(wire(g.make(Op::SINK, dtypes::void_, {g.alu(Op::ADD, {a, b})})), &cached);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  }
  // A request whose deadline has passed is not planned.
  {
    TwoOutputs t;
    Requester late;
    late.deadline = absl::InfinitePast();
    bool cached = false;
    auto plan = planner_.plan(wire(t.root), &cached, {}, late);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kDeadlineExceeded) << plan.status();
  }
  // A kernel over the bound never reaches LLVM.
  {
    PlannerOptions o;
    o.max_kernel_ops = 4;
    Planner small(o, cache_.get(), CpuTarget::host());
    TwoOutputs t;
    bool cached = false;
    auto plan = small.plan(wire(t.root), &cached);
    absl::Status st = plan.ok() ? small.compile(**plan, small.host()).status() : plan.status();
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_NE(st.message().find("--max-kernel-ops"), std::string::npos) << st;
  }
}

// bucket_collectives on hand-made plans: buffers 2i and 2i + 1 are gradient i on CPU:0
// and CPU:1 (`elements` floats each), kernel "g<i>" writes it, its allreduce follows, and
// kernel "u<i>" reads it and writes the next parameter (buffers after the gradients).
// Every kernel also reads its device's batch (the last two buffers): reading the same
// buffer orders nothing.
struct GradientPlan {
  Plan plan;
  explicit GradientPlan(const std::vector<int64_t>& elements, ReduceOp op = ReduceOp::Add) {
    const int n = static_cast<int>(elements.size());
    plan.buffers.resize(4 * n + 2);
    for (int b = 0; b < 4 * n + 2; ++b) plan.buffers[b].device = b % 2 ? "CPU:1" : "CPU:0";
    for (size_t i = 0; i < elements.size(); ++i) {
      const int b0 = static_cast<int>(2 * i), b1 = b0 + 1;
      plan.buffers[b0].elements = plan.buffers[b1].elements = elements[i];
      auto kernel = [&](const std::string& name, std::vector<int> buffers) {
        buffers.push_back(4 * n + buffers[0] % 2);  // the batch
        plan.steps.push_back({ScheduleStep::Kind::Kernel, plan.kernels.size()});
        plan.kernels.push_back({name, {}, {}, buffers, plan.buffers[buffers[0]].device, {buffers[0]}});
      };
      kernel(cat("g", i), {b0});
      kernel(cat("g", i), {b1});
      plan.steps.push_back({ScheduleStep::Kind::Collective, plan.collectives.size()});
      plan.collectives.push_back({op, Scalar::Float32, {{b0, b1}}});
      kernel(cat("u", i), {2 * n + b0, b0});
      kernel(cat("u", i), {2 * n + b1, b1});
    }
  }
  // The steps as text: kernels by name, a collective as [its segments' buffers].
  std::string steps() const {
    std::string out;
    for (const ScheduleStep& st : plan.steps) {
      if (!out.empty()) out += " ";
      if (st.kind == ScheduleStep::Kind::Kernel) {
        out += plan.kernels[st.index].name;
        continue;
      }
      std::vector<std::string> segs;
      for (const auto& seg : plan.collectives[st.index].segments) segs.push_back(cat(seg[0], "+", seg[1]));
      out += cat("[", join(segs, ","), "]");
    }
    return out;
  }
};

TEST(BucketCollectives, GradientsWaitForEachOtherAndTheUpdatesWaitForTheBucket) {
  GradientPlan p({10, 20, 30});
  bucket_collectives(p.plan, 1 << 20);
  EXPECT_EQ(p.steps(), "g0 g0 g1 g1 g2 g2 [0+1,2+3,4+5] u0 u0 u1 u1 u2 u2");
  ASSERT_EQ(p.plan.collectives.size(), 1u);
  EXPECT_EQ(p.plan.collectives[0].members(), (std::vector<int>{0, 1}));
}

TEST(BucketCollectives, ABucketStaysWithinTheCapPerMember) {
  GradientPlan p({100, 100, 100});  // 400 bytes each per member
  bucket_collectives(p.plan, 800);
  EXPECT_EQ(p.steps(), "g0 g0 g1 g1 g2 g2 [0+1,2+3] u0 u0 u1 u1 [4+5] u2 u2");
  GradientPlan one({1000, 10});  // larger than the cap alone: it goes alone
  bucket_collectives(one.plan, 800);
  EXPECT_EQ(one.steps(), "g0 g0 g1 g1 [0+1] u0 u0 [2+3] u1 u1");
}

TEST(BucketCollectives, NothingChangesWithoutACapOrWithOneCollective) {
  GradientPlan p({10, 20});
  const std::string before = p.steps();
  bucket_collectives(p.plan, 0);
  EXPECT_EQ(p.steps(), before);
  GradientPlan q({10});
  bucket_collectives(q.plan, 1 << 20);
  EXPECT_EQ(q.steps(), "g0 g0 [0+1] u0 u0");
}

TEST(BucketCollectives, OnlyTheSameOpDtypeAndDevicesShareABucket) {
  GradientPlan p({10, 20, 30});
  p.plan.collectives[1].op = ReduceOp::Max;
  bucket_collectives(p.plan, 1 << 20);
  EXPECT_EQ(p.steps(), "g0 g0 g1 g1 [0+1] u0 u0 g2 g2 [2+3] u1 u1 [4+5] u2 u2");
  GradientPlan q({10, 20});
  q.plan.buffers[3].device = "CPU:2";  // gradient 1 between CPU:0 and CPU:2
  bucket_collectives(q.plan, 1 << 20);
  EXPECT_EQ(q.steps(), "g0 g0 g1 g1 [0+1] u0 u0 [2+3] u1 u1");
}

// A gradient whose kernel reads an earlier one's update (a chain): its allreduce cannot
// join the bucket the update waits for, so the bucket closes before it.
TEST(BucketCollectives, ACollectiveThatNeedsAWaitingStepClosesTheBucket) {
  GradientPlan p({10, 20});
  // g1 (kernels 4, 5) reads u0's outputs (the next parameter 0: buffers 4 and 5).
  p.plan.kernels[4].buffers.push_back(4);
  p.plan.kernels[5].buffers.push_back(5);
  bucket_collectives(p.plan, 1 << 20);
  EXPECT_EQ(p.steps(), "g0 g0 [0+1] u0 u0 g1 g1 [2+3] u1 u1");
}

// order_steps: each step waits for the last writer of what it touches and for the readers
// since of what it writes, nothing else: a gradient's allreduce for its two kernels only
// (not for the other gradients' kernels, which may run beside it), an update for its
// gradient's allreduce (a bucket: for the bucket), and steps that share only the batch (a
// buffer everything reads) for nothing.
TEST(OrderSteps, EachStepWaitsForWhatLastWroteOrReadWhatItTouches) {
  GradientPlan p({10, 20});
  order_steps(p.plan);
  // g0 g0 [0+1] u0 u0 g1 g1 [2+3] u1 u1
  const std::vector<std::vector<int>> want = {{}, {}, {0, 1}, {2}, {2}, {}, {}, {5, 6}, {7}, {7}};
  EXPECT_EQ(p.plan.waits_for, want);
  GradientPlan b({10, 20});
  bucket_collectives(b.plan, 1 << 20);
  order_steps(b.plan);
  // g0 g0 g1 g1 [0+1,2+3] u0 u0 u1 u1
  const std::vector<std::vector<int>> bucketed = {{}, {}, {}, {}, {0, 1, 2, 3}, {4}, {4}, {4}, {4}};
  EXPECT_EQ(b.plan.waits_for, bucketed);
  // A kernel that writes what an earlier one read waits for that reader: u0 writing the
  // batch of CPU:0 (buffer 4) waits for every kernel that read it before.
  GradientPlan w({10});
  w.plan.kernels[2].buffers[0] = 4;  // u0 on CPU:0 now writes the batch
  w.plan.kernels[2].writes = {4};
  order_steps(w.plan);
  EXPECT_EQ(w.plan.waits_for[3], (std::vector<int>{0, 2}));
}

}  // namespace
}  // namespace uop::server
