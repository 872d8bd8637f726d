// The CUDA backend without a GPU: every kernel of the corpus (tests/gpu/cuda_corpus.h:
// the CPU kernel corpus, every ALU op / CAST / BITCAST on every dtype, tensor-core
// matmuls, a runtime batch) lowered for the GPU, rendered to CUDA C and compiled by NVRTC
// for sm_80 and sm_90. The cubin is checked with our own ELF reader (inspect_cubin:
// e_machine EM_CUDA = 190, the SM in e_flags, the kernel's symbol), the PTX for its
// .entry. Running the kernels is cuda_gpu_test's job (tests/gpu).
#include <gtest/gtest.h>

#include <string>

#include "compiler/codegen/cuda.h"
#include "compiler/ir/printer.h"
#include "compiler/backends/cuda/cuda_backend.h"
#include "compiler/ir/tensor_builder.h"
#include "compiler/passes/loop_schedule.h"
#include "compiler/pipeline.h"
#include "tests/gpu/cuda_corpus.h"

namespace uop {
namespace {

bool has_op(const UOp* linear, Op op) {
  for (const UOp* u : linear->src())
    if (u->op() == op) return true;
  return false;
}

TEST(CudaTarget, ParsesArchesAndNamesThemInCacheKeys) {
  auto t = CudaTarget::parse("sm_90");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->id(), "cuda/sm_90");
  EXPECT_EQ(t->sm(), 90);
  EXPECT_EQ(CudaTarget::parse("sm_90a")->sm(), 90);
  for (const char* bad : {"", "sm_6", "sm_60", "compute_80", "sm_8x", "sm_1000"})
    EXPECT_FALSE(CudaTarget::parse(bad).ok()) << bad;
  EXPECT_NE(cuda_build_id().find("nvrtc-"), std::string::npos);
}

TEST(Cubin, InspectRefusesWhatIsNotACudaElf) {
  EXPECT_FALSE(inspect_cubin("").ok());
  EXPECT_FALSE(inspect_cubin(std::string(64, '\0')).ok());
  std::string elf(64, '\0');
  elf[0] = 0x7f, elf[1] = 'E', elf[2] = 'L', elf[3] = 'F', elf[4] = 2, elf[5] = 1;
  elf[18] = 62;  // EM_X86_64
  auto r = inspect_cubin(elf);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("EM_CUDA"), std::string::npos);
  // Section headers pointing past the end are refused, not read.
  elf[18] = static_cast<char>(190);
  elf[40] = 0x10, elf[58] = 64, elf[60] = 5;
  EXPECT_FALSE(inspect_cubin(elf).ok());
}

// render_cuda verifies the LINEAR before it emits C: bad LINEAR gets the verifier's
// status (node, rule, path); a valid one the backend cannot emit gets its own rule.
TEST(RenderCuda, RefusesBadLinearWithTheVerifiersStatus) {
  Graph g;
  const UOp* out = g.make(Op::PARAM, dtypes::float32.ptr_to(AddrSpace::Global, 4), {}, ParamArg{0, 4});
  const UOp* four = g.idx(4);
  const UOp* r = g.make(Op::RANGE, dtypes::index, {four}, RangeArg{0, AxisType::Loop, true});
  const UOp* one = g.cnst(dtypes::float32, 1.0);
  const UOp* x = g.alu(Op::ADD, {one, one});  // listed inside the loop below
  const UOp* in_loop = g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, dtypes::float32, {out, r}), one});
  const UOp* end = g.make(Op::END, dtypes::void_, {in_loop, r});
  const UOp* zero = g.idx(0);
  const UOp* after = g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, dtypes::float32, {out, zero}), x});
  auto bad = render_cuda(g.make(Op::LINEAR, dtypes::void_,
                                {out, four, one, zero, r, x, in_loop->src(0), in_loop, end, after->src(0), after}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("outside the RANGE / IF that computes it [linear.scope]; path: "),
            std::string::npos) << bad.status();
  // The same kernel with the value computed before the loop renders.
  auto good = render_cuda(g.make(Op::LINEAR, dtypes::void_,
                                 {out, four, one, zero, x, r, in_loop->src(0), in_loop, end, after->src(0), after}));
  ASSERT_TRUE(good.ok()) << good.status();
  // Valid LINEAR, but more shared memory than the backend allows.
  const UOp* smem = g.make(Op::DEFINE_LOCAL, dtypes::float32.ptr_to(AddrSpace::Local, 1 << 20));
  const UOp* st = g.make(Op::STORE, dtypes::void_, {g.make(Op::INDEX, dtypes::float32, {smem, zero}), one});
  auto big = render_cuda(g.make(Op::LINEAR, dtypes::void_, {smem, zero, one, st->src(0), st}));
  ASSERT_FALSE(big.ok());
  EXPECT_NE(std::string(big.status().message()).find("(DEFINE_LOCAL)"), std::string::npos) << big.status();
  EXPECT_NE(std::string(big.status().message()).find("[cuda.local]"), std::string::npos) << big.status();
}

class CudaCorpus : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (absl::Status s = nvrtc_status(); !s.ok()) GTEST_SKIP() << "no NVRTC here: " << std::string(s.message());
  }
};

// Every kernel of every case: the GPU lowering, CUDA C, one NVRTC module per case (the
// kernels under distinct entries), each entry in the cubin and the PTX; and the first
// kernel of each case through compile_cuda, the path the service takes.
TEST_P(CudaCorpus, EveryKernelRendersAndCompiles) {
  auto target = CudaTarget::parse(GetParam());
  ASSERT_TRUE(target.ok());
  int kernels = 0;
  for (cudatest::Case& c : cudatest::corpus()) {
    SCOPED_TRACE(c.name);
    auto plan = plan_graph(*c.g, c.sink);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::string module(cuda_prelude());
    std::vector<std::string> entries;
    for (size_t i = 0; i < plan->kernels.size(); ++i) {
      const KernelPlan& k = plan->kernels[i];
      auto linear = CudaBackend(*target).lower(*c.g, k.kernel, {}, k.name);
      ASSERT_TRUE(linear.ok()) << k.name << ": " << linear.status();
      std::string entry = cat("k", i);
      auto src = render_cuda(*linear, entry, /*with_prelude=*/false);
      ASSERT_TRUE(src.ok()) << k.name << ": " << src.status();
      ASSERT_TRUE(src->abi.gpu.has_value());
      EXPECT_GE(src->threads_per_block, 1);
      EXPECT_LE(src->threads_per_block, 1024);
      module += src->source;
      entries.push_back(entry);
      if (i == 0) {
        auto art = compile_cuda(*linear, *target);
        ASSERT_TRUE(art.ok()) << k.name << ": " << art.status() << "\n" << src->source << "\n"
                              << print_tree(*linear);
        auto info = inspect_cubin(art->cubin);
        ASSERT_TRUE(info.ok()) << info.status();
        EXPECT_EQ(info->sm, target->sm());
        EXPECT_NE(std::find(info->kernels.begin(), info->kernels.end(), "uop_kernel"), info->kernels.end());
        EXPECT_NE(art->ptx.find(".entry uop_kernel"), std::string::npos);
        auto abi = parse_abi(art->abi.serialize());
        ASSERT_TRUE(abi.ok()) << abi.status();
        EXPECT_EQ(*abi, art->abi);
      }
    }
    auto m = nvrtc_compile(module, *target, {}, cat(c.name, ".cu"));
    ASSERT_TRUE(m.ok()) << m.status();
    auto info = inspect_cubin(m->cubin);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->sm, target->sm());
    EXPECT_NE(m->ptx.find(cat(".target ", target->arch)), std::string::npos);
    for (const std::string& e : entries) {
      EXPECT_NE(std::find(info->kernels.begin(), info->kernels.end(), e), info->kernels.end()) << e << " not in the cubin";
      EXPECT_NE(m->ptx.find(cat(".entry ", e, "(")), std::string::npos) << e << " not in the PTX";
    }
    kernels += static_cast<int>(entries.size());
  }
  EXPECT_GT(kernels, 100);
}

INSTANTIATE_TEST_SUITE_P(Arches, CudaCorpus, ::testing::Values("sm_80", "sm_90"),
                         [](const auto& info) { return std::string(info.param); });

// What the heuristics chose shows in the LINEAR and the PTX.
struct Lowered {
  const UOp* linear = nullptr;
  CudaArtifact art;
};
Lowered lower_one(cudatest::Case& c, size_t kernel, const std::string& arch) {
  auto plan = plan_graph(*c.g, c.sink);
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto target = CudaTarget::parse(arch);
  auto linear = CudaBackend(*target).lower(*c.g, plan->kernels.at(kernel).kernel, {}, "");
  EXPECT_TRUE(linear.ok()) << linear.status();
  if (!linear.ok()) return {};
  auto art = compile_cuda(*linear, *target);
  EXPECT_TRUE(art.ok()) << art.status();
  if (!art.ok()) return {*linear, {}};
  return {*linear, *std::move(art)};
}

cudatest::Case find_case(const std::string& name) {
  for (cudatest::Case& c : cudatest::corpus())
    if (c.name == name) return std::move(c);
  ADD_FAILURE() << "no case " << name;
  return {};
}

TEST_F(CudaCorpus, HalfMatmulUsesTheTensorCoresOnSm80AndNewer) {
  for (const char* arch : {"sm_80", "sm_90"}) {
    for (const char* name : {"matmul_f16", "matmul_bf16", "matmul_f16_batched", "matmul_f16_to_f32"}) {
      cudatest::Case c = find_case(name);
      Lowered l = lower_one(c, 0, arch);
      ASSERT_NE(l.linear, nullptr);
      ASSERT_TRUE(l.art.abi.gpu.has_value()) << name;
      EXPECT_TRUE(has_op(l.linear, Op::WMMA)) << name << " " << arch;
      EXPECT_NE(l.art.ptx.find("mma.sync.aligned.m16n8k16"), std::string::npos) << name;
      EXPECT_EQ(l.art.abi.gpu->block[0].eval({}), 32) << "a warp per tile";
    }
  }
  // sm_75 has no m16n8k16 bf16 / this rule: the plain path.
  cudatest::Case c = find_case("matmul_f16");
  auto plan = plan_graph(*c.g, c.sink);
  auto linear = CudaBackend(CudaTarget{"sm_75"}).lower(*c.g, plan->kernels[0].kernel, {}, "");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_FALSE(has_op(*linear, Op::WMMA));
}

TEST_F(CudaCorpus, ReductionsFoldInSharedMemory) {
  for (const char* name : {"sum_rows", "sum_all", "max_rows"}) {
    cudatest::Case c = find_case(name);
    Lowered l = lower_one(c, 0, "sm_90");
    ASSERT_NE(l.linear, nullptr);
    ASSERT_TRUE(l.art.abi.gpu.has_value()) << name;
    EXPECT_TRUE(has_op(l.linear, Op::DEFINE_LOCAL)) << name;
    EXPECT_TRUE(has_op(l.linear, Op::BARRIER)) << name;
    EXPECT_NE(l.art.ptx.find("bar.sync"), std::string::npos) << name;
    EXPECT_NE(l.art.ptx.find(".shared"), std::string::npos) << name;
    EXPECT_GE(l.art.abi.gpu->block[0].eval({}), 32) << name;
  }
}

TEST_F(CudaCorpus, ElementwiseKernelsLoadAndStoreVectors) {
  cudatest::Case c = find_case("add");
  Lowered l = lower_one(c, 0, "sm_90");
  ASSERT_NE(l.linear, nullptr);
  ASSERT_TRUE(l.art.abi.gpu.has_value());
  EXPECT_TRUE(l.art.ptx.find("ld.global.nc.v4.f32") != std::string::npos ||
              l.art.ptx.find("ld.global.v4.f32") != std::string::npos)
      << l.art.ptx;
  EXPECT_NE(l.art.ptx.find("st.global.v4.f32"), std::string::npos);
  // 256 x 256 floats, 4 per thread: 16384 threads in blocks of 256.
  GpuDims d = l.art.abi.eval_gpu({});
  int64_t threads = 1;
  for (int i = 0; i < 3; ++i) threads *= d.grid[i] * d.block[i];
  EXPECT_EQ(threads, 256 * 256 / 4);
}

TEST_F(CudaCorpus, TheGridOfARuntimeBatchIsALaunchExprOverItsVariable) {
  cudatest::Case c = find_case("symbolic_batch_1");
  Lowered l = lower_one(c, 0, "sm_80");
  ASSERT_NE(l.linear, nullptr);
  ASSERT_TRUE(l.art.abi.gpu.has_value());
  const KernelAbi& abi = l.art.abi;
  ASSERT_EQ(abi.vars.size(), 1u);
  ASSERT_TRUE(abi.gpu.has_value());
  bool uses_var = false;
  for (const LaunchExpr& e : abi.gpu->grid)
    for (const LaunchExpr::Term& t : e.terms()) uses_var |= t.kind == LaunchExpr::Term::Kind::Var;
  EXPECT_TRUE(uses_var) << abi.serialize();
  // More work for a larger batch, nothing for an empty one.
  int64_t small = 1, large = 1;
  std::vector<int64_t> v1 = {1}, v300 = {300};
  for (int i = 0; i < 3; ++i) small *= abi.eval_gpu(v1).grid[i], large *= abi.eval_gpu(v300).grid[i];
  EXPECT_LT(small, large);
  std::vector<int64_t> v0 = {0};
  EXPECT_TRUE(abi.eval_gpu(v0).empty());
}

// The GEMMs bench_cuda runs (4096^3): the heuristic's tile and each tile it gives as a
// schedule lower (the bounds proof included) and compile for sm_80 and sm_90; the PTX
// stages through shared memory, synchronizes once per k step and accumulates with fused
// multiply-adds (float32) or mma.sync (float16); the launch is one block per tile of C.
TEST(CudaGemmTiles, TheBenchmarkedTilesCompileForSm80AndSm90) {
  struct C { Scalar dtype; const char* schedule; };
  for (const char* arch : {"sm_80", "sm_90"}) {
    for (const C& c : {C{Scalar::Float32, ""}, C{Scalar::Float32, "tile(128,128,8,8,8)"}, C{Scalar::Float32, "tile(64,64,8,4,4)"},
                       C{Scalar::Float32, "tile(128,64,8,8,4)"}, C{Scalar::Float32, "tile(64,128,16,4,8)"},
                       C{Scalar::Float16, ""}, C{Scalar::Float16, "tc_tile(64,64,32,32,32)"}, C{Scalar::Float16, "tc(4)"}}) {
      const char* schedule = c.schedule;
      const bool half = c.dtype == Scalar::Float16;
      SCOPED_TRACE(cat(arch, " ", schedule, half ? " f16" : " f32"));
      Graph g;
      TensorBuilder tb(g);
      const UOp* sink = tb.sink({tb.matmul(tb.input(c.dtype, {4096, 4096}), tb.input(c.dtype, {4096, 4096}))});
      auto plan = plan_graph(g, sink);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->kernels.size(), 1u);
      auto target = CudaTarget::parse(arch);
      ASSERT_TRUE(target.ok());
      PipelineOptions opts;
      opts.schedule = schedule;
      std::string applied;
      opts.applied_schedule = &applied;
      auto linear = CudaBackend(*target).lower(g, plan->kernels[0].kernel, opts, "gemm");
      ASSERT_TRUE(linear.ok()) << linear.status();
      if (*schedule) EXPECT_EQ(applied, schedule);
      else EXPECT_EQ(applied, half ? "tc_tile(128,128,32,64,32)" : "tile(128,128,8,8,8)") << "4096^3 takes the largest tile";
      auto art = compile_cuda(*linear, *target);
      ASSERT_TRUE(art.ok()) << art.status();
      if (applied.starts_with("tc(")) {
        EXPECT_NE(art->ptx.find("mma.sync.aligned.m16n8k16"), std::string::npos);
        continue;
      }
      EXPECT_NE(art->ptx.find(".shared"), std::string::npos);
      EXPECT_NE(art->ptx.find("bar.sync"), std::string::npos);
      EXPECT_NE(art->ptx.find(half ? "mma.sync.aligned.m16n8k16" : "fma.rn.f32"), std::string::npos);
      auto tile = parse_loop_schedule(applied);
      ASSERT_TRUE(tile.ok());
      const std::vector<int64_t>& t = tile->steps.at(0).order;
      GpuDims d = art->abi.eval_gpu({});
      EXPECT_EQ(d.grid[0] * d.grid[1], (4096 / t[0]) * (4096 / t[1]));
      EXPECT_EQ(d.block[0] * d.block[1], (t[0] / t[3]) * (t[1] / t[4]) * (half ? 32 : 1));
    }
  }
}

}  // namespace
}  // namespace uop
