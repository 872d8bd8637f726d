// The pipeline's bounds and checks (compiler/pipeline.h): keep_going asked after every
// stage and obeyed; a kernel over limits.kernel_ops refused naming the kernel and the
// limit, one at the limit lowered; a graph that a stage would grow past
// limits.graph_nodes stopped inside that stage, near the limit, not after it; a kernel-level
// graph of several kernels (a SINK of CALLs) planned as those kernels on the graph's
// PARAMs, and its malformed bindings refused.
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

// A kernel over n float32s: out (slot 0) = f(ins...) elementwise, its PARAMs as they are
// in a kernel graph a client sends (slot 0 written, then the inputs).
const UOp* elementwise_kernel(Graph& g, const std::string& name, int64_t n, int inputs, Op op) {
  const DType f32(Scalar::Float32, 1);
  auto param = [&](int64_t slot) { return g.make(Op::PARAM, f32.ptr_to(AddrSpace::Global, n), {}, ParamArg{slot, n}); };
  const UOp* r = g.make(Op::RANGE, DType(Scalar::Index, 1), {g.cnst(DType(Scalar::Index, 1), ConstValue::Int(n))},
                        RangeArg{0, AxisType::Loop});
  std::vector<const UOp*> vals;
  for (int i = 1; i <= inputs; ++i) {
    const UOp* p = param(i);
    vals.push_back(g.make(Op::LOAD, f32, {p, g.make(Op::INDEX, f32, {p, r})}));
  }
  const UOp* v = inputs == 1 ? g.alu(op, {vals[0], vals[0]}) : g.alu(op, {vals[0], vals[1]});
  const UOp* out = param(0);
  const UOp* st = g.make(Op::STORE, DType(Scalar::Void, 1), {g.make(Op::INDEX, f32, {out, r}), v, r});
  return g.make(Op::SINK, DType(Scalar::Void, 1), {st}, KernelInfoArg{true, name});
}

constexpr int64_t kCallN = 8;

TEST(Pipeline, ASinkOfCallsIsItsKernelsOnTheGraphsParams) {
  const int64_t n = kCallN;
  Graph g;
  const DType f32(Scalar::Float32, 1);
  auto outer = [&](int64_t slot, int64_t size) {
    return g.make(Op::PARAM, f32.ptr_to(AddrSpace::Global, size), {}, ParamArg{slot, size});
  };
  const UOp* twice = elementwise_kernel(g, "twice", n, 1, Op::ADD);  // out = in + in
  const UOp* sum = elementwise_kernel(g, "sum", n, 2, Op::ADD);      // out = a + b
  auto call = [&](const UOp* body, std::vector<const UOp*> args) {
    args.insert(args.begin(), body);
    return g.make(Op::CALL, DType(Scalar::Void, 1), args, CallInfoArg{});
  };
  // a = x + x; b = a + x: slot 0 is x (only read), 1 is a, 2 is b.
  const UOp *x = outer(0, n), *a = outer(1, n), *b = outer(2, n);
  const UOp* root = g.make(Op::SINK, DType(Scalar::Void, 1), {call(twice, {a, x}), call(sum, {b, a, x})});
  auto plan = plan_graph(g, root);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->kernel_level);
  ASSERT_EQ(plan->kernels.size(), 2u);
  EXPECT_EQ(plan->kernels[0].name, "twice");
  EXPECT_EQ(plan->kernels[1].name, "sum");
  EXPECT_EQ(plan->kernels[0].buffers, (std::vector<const UOp*>{a, x}));
  EXPECT_EQ(plan->kernels[1].buffers, (std::vector<const UOp*>{b, a, x}));
  EXPECT_EQ(plan->kernels[0].writes, (std::vector<size_t>{0}));
  EXPECT_EQ(plan->kernels[1].writes, (std::vector<size_t>{0}));
  EXPECT_EQ(plan->params, (std::vector<const UOp*>{x, a, b}));
  EXPECT_EQ(kernel_graph_params(root), plan->params);
  EXPECT_EQ(plan->output_shapes, (std::vector<std::vector<int64_t>>{{n}, {n}, {n}}));
  // The same kernel alone is the same digest: one cache entry whichever way it comes.
  auto alone = plan_graph(g, twice);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->kernels[0].kernel->digest(), plan->kernels[0].kernel->digest());

  auto refused = [&](std::vector<const UOp*> calls, std::string_view says) {
    auto p = plan_graph(g, g.make(Op::SINK, DType(Scalar::Void, 1), calls));
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    EXPECT_TRUE(contains(p.status(), says)) << p.status();
  };
  refused({call(sum, {b, a})}, "the kernel has 3 buffer slots, the CALL binds 2 [plan.call]");
  refused({call(twice, {outer(1, n + 1), x})}, "slot 0 is ptr<float32, global, 8>, the PARAM bound to it ptr<float32, global, 9>");
  refused({call(sum, {b, x, x})}, "two of the kernel's slots [plan.call]");
  refused({call(twice, {outer(3, n), x})}, "slot 1 is missing or taken twice [plan.slots]");
  refused({call(root, {a, x})}, "a kernel-level CALL calls a kernel");
  refused({twice->src(0), call(sum, {b, a, x})}, "STOREs or CALLs of kernels, not both [plan.call]");
}

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
