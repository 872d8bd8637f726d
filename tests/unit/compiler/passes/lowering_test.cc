// The lowering stages (rangeify, split_kernels, normalize, lower_reduce, linearize,
// bounds) checked without any backend: every planned kernel is run by the kernel-level
// interpreter and the result compared with the tensor-level interpreter on the original
// graph. Also: fusion decisions (how many kernels), kernel dedup by digest, the bounds
// proof refusing an out-of-bounds kernel, and LINEAR passing the linear-stage verifier.
#include <gtest/gtest.h>

#include "compiler/interp/interp.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/ir/verifier.h"
#include "compiler/passes/bounds.h"
#include "compiler/passes/linearize.h"
#include "compiler/passes/lower_reduce.h"
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/pipeline.h"

namespace uop {
namespace {

// Runs a plan kernel by kernel through the kernel-level interpreter.
std::vector<HostTensor> run_plan(Graph& g, const UOp* root, const GraphPlan& plan,
                                 const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
  absl::flat_hash_map<const UOp*, HostTensor> mem(inputs.begin(), inputs.end());
  absl::flat_hash_map<std::string, int64_t> vars;
  for (auto& [v, value] : plan.var_values) vars[v->arg_as<DefineVarArg>().name] = value;
  for (const KernelPlan& k : plan.kernels) {
    std::vector<HostTensor*> params;
    for (const UOp* b : k.buffers) {
      if (!mem.contains(b)) mem.emplace(b, HostTensor::zeros(b->dtype().scalar, {b->arg_as<BufferArg>().size}));
      params.push_back(&mem.at(b));
    }
    absl::Status s = interpret_kernel(k.kernel, params, vars);
    EXPECT_TRUE(s.ok()) << k.name << ": " << s;
  }
  std::vector<HostTensor> out;
  for (const UOp* o : plan.outputs) {  // a kernel with nothing to do (zero-size) was dropped
    if (!mem.contains(o)) mem.emplace(o, HostTensor::zeros(o->dtype().scalar, {o->arg_as<BufferArg>().size}));
    out.push_back(mem.at(o));
  }
  return out;
}

// Plans `sink`, runs the plan through the interpreter, compares with interpret(); also
// lowers every kernel to LINEAR and verifies it. Returns the plan.
GraphPlan check_lowering(Graph& g, TensorBuilder& tb, const UOp* sink, std::vector<const UOp*> inputs, uint64_t seed = 1) {
  absl::flat_hash_map<const UOp*, HostTensor> in;
  for (const UOp* x : inputs) {
    const UOp* buf = tb.buffer_of(x);
    in[buf] = HostTensor::random(buf->dtype().scalar, {buf->arg_as<BufferArg>().size}, seed++);
  }
  auto plan = plan_graph(g, sink);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  auto want = interpret(g, sink, in);
  EXPECT_TRUE(want.ok()) << want.status();
  auto got = run_plan(g, sink, *plan, in);
  for (size_t i = 0; i < got.size(); ++i) {
    HostTensor t = got[i];
    t.shape = (*want)[i].shape;
    CompareResult c = compare((*want)[i], t, Tolerance::for_dtype(t.dtype));
    EXPECT_TRUE(c.ok) << "output " << i << ": " << c.message;
  }
  for (const KernelPlan& k : plan->kernels) {
    auto linear = host_cpu_backend()->lower(g, k.kernel, {}, k.name);
    EXPECT_TRUE(linear.ok()) << k.name << ": " << linear.status();
    if (!linear.ok()) continue;
    VerifyOptions vo;
    vo.stage = Stage::Linear;
    absl::Status s = verify(g, *linear, vo);
    EXPECT_TRUE(s.ok()) << k.name << ": " << s;
  }
  return *plan;
}

TEST(Lowering, ElementwiseChainIsOneKernel) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {3, 4});
  const UOp* b = tb.input(Scalar::Float32, {4});
  const UOp* t = tb.alu(Op::MUL, {tb.alu(Op::ADD, {a, b}), tb.full(Scalar::Float32, 1.5, {})});
  t = tb.alu(Op::MAX, {t, tb.full(Scalar::Float32, 0.0, {})});
  GraphPlan p = check_lowering(g, tb, tb.sink({t}), {a, b});
  EXPECT_EQ(p.kernels.size(), 1u);
}

TEST(Lowering, ReductionWithPrologueAndEpilogueIsOneKernel) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {5, 7});
  const UOp* s = tb.reduce(tb.alu(Op::MUL, {x, x}), ReduceOp::Add, {1});
  const UOp* out = tb.alu(Op::SQRT, {s});
  GraphPlan p = check_lowering(g, tb, tb.sink({out}), {x});
  EXPECT_EQ(p.kernels.size(), 1u);
}

TEST(Lowering, SoftmaxRealizesBroadcastReductions) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {4, 9});
  const UOp* m = tb.reduce(x, ReduceOp::Max, {1});
  const UOp* e = tb.alu(Op::EXP2, {tb.alu(Op::SUB, {x, m})});
  const UOp* s = tb.reduce(e, ReduceOp::Add, {1});
  const UOp* out = tb.alu(Op::FDIV, {e, s});
  GraphPlan p = check_lowering(g, tb, tb.sink({out}), {x});
  EXPECT_EQ(p.kernels.size(), 3u);  // max, sum (which recomputes e), the division
}

TEST(Lowering, MatmulIsOneKernel) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* a = tb.input(Scalar::Float32, {6, 5});
  const UOp* b = tb.input(Scalar::Float32, {5, 7});
  GraphPlan p = check_lowering(g, tb, tb.sink({tb.matmul(a, b)}), {a, b});
  EXPECT_EQ(p.kernels.size(), 1u);
}

TEST(Lowering, MovementOpsInCombination) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Int32, {2, 3, 4});
  const UOp* y = tb.permute(x, {2, 0, 1});                      // 4,2,3
  y = tb.pad(y, {1, 0, 2}, {0, 1, 1});                           // 5,3,6
  y = tb.shrink(y, {0, 1, 1}, {4, 3, 6});                        // 4,2,5
  y = tb.flip(y, {true, false, true});
  y = tb.reshape(y, {8, 5});
  y = tb.alu(Op::ADD, {y, tb.reduce(y, ReduceOp::Max, {0})});    // broadcast a reduction back
  check_lowering(g, tb, tb.sink({y, tb.reduce(y, ReduceOp::Add, {0, 1})}), {x});
}

TEST(Lowering, PadShrinkFlipIsProvenInBounds) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {2, 3});
  const UOp* y = tb.flip(tb.shrink(tb.pad(x, {1, 0}, {0, 2}), {0, 1}, {3, 5}), {true, true});
  check_lowering(g, tb, tb.sink({y}), {x});
}

TEST(Lowering, SizeZeroAndOneDims) {
  Graph g;
  TensorBuilder tb(g);
  const UOp* x = tb.input(Scalar::Float32, {1, 6, 1});
  const UOp* z = tb.input(Scalar::Float32, {0, 3});
  check_lowering(g, tb, tb.sink({tb.alu(Op::NEG, {x}), tb.reduce(x, ReduceOp::Mul, {1}),
                                 tb.alu(Op::ADD, {z, z}), tb.reduce(z, ReduceOp::Add, {0})}),
                 {x, z});
}

TEST(Lowering, SameComputationOnOtherBuffersIsOneKernel) {
  auto digests = [](bool swap_order, int scale) {
    Graph g;
    TensorBuilder tb(g);
    const UOp *a, *b;
    if (swap_order) {
      b = tb.input(Scalar::Float32, {16});
      a = tb.input(Scalar::Float32, {16});
    } else {
      a = tb.input(Scalar::Float32, {16});
      b = tb.input(Scalar::Float32, {16});
    }
    const UOp* k = tb.full(Scalar::Float32, scale, {});
    auto plan = plan_graph(g, tb.sink({tb.alu(Op::MUL, {a, k}), tb.alu(Op::MUL, {b, k})}));
    EXPECT_TRUE(plan.ok());
    std::vector<Digest> d;
    for (auto& kp : plan->kernels) d.push_back(kp.kernel->digest());
    return d;
  };
  auto one = digests(false, 2);
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(one[0], one[1]);                 // two buffers, one kernel
  EXPECT_EQ(digests(true, 2), one);          // another graph, built in another order
  EXPECT_NE(digests(false, 3)[0], one[0]);   // another computation
}

TEST(Lowering, BoundsProofRefusesOutOfBoundsKernel) {
  Graph g;
  DType p16 = dtypes::float32.ptr_to(AddrSpace::Global, 16);
  const UOp* out = g.make(Op::PARAM, p16, {}, ParamArg{0, 16});
  const UOp* in = g.make(Op::PARAM, p16, {}, ParamArg{1, 16});
  const UOp* r = g.make(Op::RANGE, dtypes::index, {g.idx(16)}, RangeArg{0, AxisType::Loop, false});
  auto kernel = [&](const UOp* read_at, const UOp* gate) {
    std::vector<const UOp*> src{in, read_at};
    if (gate) src.push_back(gate);
    const UOp* ld = gate ? g.make(Op::LOAD, dtypes::float32, {in, g.make(Op::INDEX, dtypes::float32, src), g.cnst(dtypes::float32, 0.0)})
                         : g.make(Op::LOAD, dtypes::float32, {in, g.make(Op::INDEX, dtypes::float32, src)});
    const UOp* st = g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, dtypes::float32, {out, r}), ld, r});
    return g.make(Op::SINK, dtypes::void_, {st}, KernelInfoArg{true, "k"});
  };
  const UOp* past = g.alu(Op::ADD, {r, g.idx(1)});  // reads in[16] on the last iteration
  absl::Status s = check_bounds(g, *lower_reduce(g, kernel(past, nullptr)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bounds.unproven"), std::string::npos) << s;
  // The pipeline refuses it too, before anything is compiled.
  auto plan = plan_graph(g, kernel(past, nullptr));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(host_cpu_backend()->lower(g, plan->kernels[0].kernel).ok());
  // Under a gate that implies the bound, the same access is proven safe.
  EXPECT_TRUE(check_bounds(g, *lower_reduce(g, kernel(past, g.alu(Op::CMPLT, {past, g.idx(16)})))).ok());
  EXPECT_TRUE(check_bounds(g, *lower_reduce(g, kernel(r, nullptr))).ok());
}

}  // namespace
}  // namespace uop
