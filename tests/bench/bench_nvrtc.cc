// bench_nvrtc: the CUDA backend's compile cost per kernel of the kernel corpus
// (kernel_corpus.h): the CUDA backend's lowering + render + NVRTC to a cubin for sm_90, and NVRTC
// alone, as ms_per_kernel. Needs no GPU; without NVRTC every benchmark skips with the
// reason. The GPU benchmarks against cuBLAS and cuMemcpyDtoD are in bench_cuda.cc.
#include <benchmark/benchmark.h>

#include "compiler/codegen/cuda.h"
#include "compiler/backends/cuda/cuda_backend.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "tests/bench/kernel_corpus.h"

namespace uop {
namespace {

void BM_NvrtcKernel(benchmark::State& state, const CorpusGraph* cg, bool nvrtc_only) {
  if (absl::Status s = nvrtc_status(); !s.ok()) {
    state.SkipWithError(cat("no NVRTC: ", s.message()).c_str());
    return;
  }
  auto target = *CudaTarget::parse("sm_90");
  Graph g;
  TensorBuilder tb(g);
  auto plan = plan_graph(g, cg->build(tb));
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  const CudaBackend backend(CudaTarget{"sm_90"});
  const KernelPlan& k = plan->kernels[0];
  auto linear = backend.lower(g, k.kernel, {}, k.name);
  if (!linear.ok()) {
    state.SkipWithError(std::string(linear.status().message()).c_str());
    return;
  }
  auto src = render_cuda(*linear);
  double ms = 0;
  for (auto _ : state) {
    if (nvrtc_only) {
      auto m = nvrtc_compile(src->source, target, CudaCompileOptions{.emit_ptx = false});
      if (!m.ok()) state.SkipWithError(std::string(m.status().message()).c_str());
      else ms += m->compile_ms;
    } else {
      Graph g2;
      const UOp* kernel = clone_into(g2, k.kernel);
      auto l = backend.lower(g2, kernel, {}, k.name);
      auto art = l.ok() ? compile_cuda(*l, target, CudaCompileOptions{.emit_ptx = false})
                        : absl::StatusOr<CudaArtifact>(l.status());
      if (!art.ok()) state.SkipWithError(std::string(art.status().message()).c_str());
      else ms += art->render_ms + art->compile_ms;
    }
  }
  state.counters["ms_per_kernel"] = benchmark::Counter(ms / std::max<int64_t>(state.iterations(), 1));
  state.SetLabel(cuda_build_id());
}

}  // namespace
}  // namespace uop

int main(int argc, char** argv) {
  for (const uop::CorpusGraph& cg : uop::kernel_corpus()) {
    benchmark::RegisterBenchmark(uop::cat("BM_CompileCuda/", cg.name).c_str(), uop::BM_NvrtcKernel, &cg, false)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(uop::cat("BM_NvrtcOnly/", cg.name).c_str(), uop::BM_NvrtcKernel, &cg, true)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
