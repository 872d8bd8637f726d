// The pipeline's bounds and checks (compiler/pipeline.h): keep_going asked after every
// stage and obeyed; a kernel over limits.kernel_ops refused naming the kernel and the
// limit, one at the limit lowered; a graph that a stage would grow past
// limits.graph_nodes stopped inside that stage, near the limit, not after it.
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "compiler/ir/tensor_builder.h"
#include "tests/unit/compiler/bomb_graphs.h"

namespace uop {
namespace {

bool contains(const absl::Status& s, std::string_view what) {
  return std::string_view(s.message().data(), s.message().size()).find(what) != std::string_view::npos;
}

using testing::shifted_sums;

// out = (x0 + ... + x[n-1]) * 2: one kernel of about 4n ops.
const UOp* sum_of(TensorBuilder& tb, int n) { return testing::sums_of_leaves(tb, 1, n, 2.0, 32); }

TEST(Pipeline, KernelOpsCountAVectorOpPerSixteenLanes) {
  Graph g;
  const UOp* a = g.cnst(DType(Scalar::Float32, 1), 1.0);
  const UOp* v = g.make(Op::VECTORIZE, DType(Scalar::Float32, 64), std::vector<const UOp*>(64, a));
  const UOp* w = g.alu(Op::ADD, {v, v});  // a <64 x float> add
  // CONST: 1, VECTORIZE of 64 lanes: 4, the add: 4.
  EXPECT_EQ(kernel_ops(w), 9u);
  EXPECT_EQ(kernel_ops(a), 1u);
}

TEST(Pipeline, KeepGoingIsAskedAfterEveryStageAndStopsThePipeline) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* root = sum_of(tb, 4);
  std::vector<std::string> seen;
  PipelineOptions po;
  po.trace = [&](std::string_view stage, std::string_view, const UOp*) { seen.emplace_back(stage); };
  int asked = 0;
  po.keep_going = [&]() -> absl::Status {
    if (++asked == 2) return absl::DeadlineExceededError("past the request's deadline");
    return absl::OkStatus();
  };
  auto plan = plan_graph(g, root, po);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kDeadlineExceeded) << plan.status();
  EXPECT_EQ(seen, (std::vector<std::string>{"verify", "multi"})) << "stopped after the second stage";

  // Lowering too: every stage, and the first refusal ends it.
  asked = -100;
  auto ok = plan_graph(g, root, po);
  ASSERT_TRUE(ok.ok()) << ok.status();
  seen.clear();
  asked = -1;  // the third check from here says stop
  auto linear = host_cpu_backend()->lower(g, ok->kernels[0].kernel, po, ok->kernels[0].name);
  EXPECT_EQ(linear.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(seen, (std::vector<std::string>{"optimize", "expand", "lower_reduce"}));
}

TEST(Pipeline, AKernelOverTheOpLimitIsRefusedNamingItAndTheLimit) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* root = sum_of(tb, 200);
  // Its largest size at any stage of lowering, with no limit.
  auto plan = plan_graph(g, root);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->kernels.size(), 1u);
  const KernelPlan& k = plan->kernels[0];
  size_t ops = kernel_ops(k.kernel);
  PipelineOptions measure;
  measure.trace = [&](std::string_view, std::string_view, const UOp* ir) { ops = std::max(ops, kernel_ops(ir)); };
  ASSERT_TRUE(host_cpu_backend()->lower(g, k.kernel, measure, k.name).ok());
  EXPECT_GT(ops, 600u);

  PipelineOptions po;
  po.limits.kernel_ops = ops;  // exactly its size: lowered
  po.limits.kernel_ops_name = "--max-kernel-ops";
  EXPECT_TRUE(host_cpu_backend()->lower(g, k.kernel, po, k.name).ok());
  po.limits.kernel_ops = ops - 1;  // one op less: refused, before any code is generated
  auto refused = host_cpu_backend()->lower(g, k.kernel, po, k.name);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(refused.status(), "--max-kernel-ops")) << refused.status();
  EXPECT_TRUE(contains(refused.status(), "kernel " + k.name)) << refused.status();

  // Far over it, planning refuses it already.
  po.limits.kernel_ops = 100;
  Graph g2;
  TensorBuilder tb2(g2);
  auto at_plan = plan_graph(g2, sum_of(tb2, 200), po);
  EXPECT_EQ(at_plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(at_plan.status(), "--max-kernel-ops")) << at_plan.status();
}

TEST(Pipeline, AGraphThatGrowsPastTheNodeLimitIsStoppedInsideTheStage) {
  // Seventy nodes whose rangeify would make 2^14 index expressions, some 200k nodes.
  Graph g;
  TensorBuilder tb(g);
  const int64_t n = int64_t{1} << 15;
  const UOp* root = shifted_sums(tb, 14, n);
  PipelineOptions po;
  po.limits.graph_nodes = 20'000;
  po.limits.graph_nodes_name = "--max-plan-nodes";
  auto plan = plan_graph(g, root, po);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_TRUE(contains(plan.status(), "--max-plan-nodes")) << plan.status();
  EXPECT_TRUE(contains(plan.status(), "rangeify")) << plan.status();
  // Stopped at the rule application that passed the limit, not at the stage's end.
  EXPECT_LT(g.size(), 21'000u);

  // Without the limit the same graph plans (it is legal, only costly).
  Graph g3;
  TensorBuilder tb3(g3);
  auto unbounded = plan_graph(g3, shifted_sums(tb3, 14, n));
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_GT(g3.size(), 100'000u);
}

}  // namespace
}  // namespace uop
