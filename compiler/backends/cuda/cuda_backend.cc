#include "compiler/backends/cuda/cuda_backend.h"

#include "compiler/passes/gpu_dims.h"
#include "compiler/passes/group_reduce.h"
#include "compiler/passes/optimize_gpu.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {

CudaBackend::CudaBackend(CudaTarget target, bool tensor_cores, int max_threads) : target_(std::move(target)) {
  GpuOptimizeOptions oo;
  oo.sm = target_.sm();
  oo.tensor_cores = tensor_cores;
  oo.max_threads = max_threads;
  schedule_ = {
      {"optimize", "per kernel: a loop schedule (the heuristic's or the one given): tensor cores, shared-memory GEMM "
       "tiles, group reduce, upcast, grid",
       [oo](Graph& g, const UOp* k) { return optimize_gpu(g, k, oo); },
       [oo](Graph& g, const UOp* k, std::string_view schedule, std::string* applied) {
         return optimize_gpu(g, k, oo, schedule, applied);
       }},
      {"group_reduce", "per kernel, GPU: reductions split across a block's threads through shared memory", group_reduce},
      expand_stage(),
      lower_reduce_stage(),
      symbolic_stage(),
      {"gpu_dims", "per kernel, GPU: Global / Local ranges -> SPECIAL blockIdx / threadIdx (launch dims)",
       [max_threads](Graph& g, const UOp* k) { return map_gpu_dims(g, k, max_threads); }},
      symbolic_stage(),
      bounds_stage(),
      linearize_stage(),
  };
}

absl::StatusOr<CodeArtifact> CudaBackend::render(const UOp* linear) const {
  ASSIGN_OR_RETURN(CudaSource src, render_cuda(linear));
  return CodeArtifact{.source = std::move(src.source), .abi = std::move(src.abi)};
}

absl::StatusOr<CodeArtifact> CudaBackend::compile(const UOp* linear, const BackendCompileOptions& options) const {
  ASSIGN_OR_RETURN(CudaArtifact art, compile_cuda(linear, target_, CudaCompileOptions{.emit_ptx = false}));
  CodeArtifact out{.object = std::move(art.cubin), .abi = std::move(art.abi), .render_ms = art.render_ms,
                   .compile_ms = art.compile_ms};
  if (options.keep_source) out.source = std::move(art.source);
  return out;
}

std::string CudaBackend::inspect(const CodeArtifact& artifact) const {
  std::string line = cat(artifact.object.size(), " bytes of ", object_kind(), " for ", target_.arch, " (", build_id(), ")");
  // What the cubin's own ELF header says: the SM it is for and the kernels it defines.
  if (auto info = inspect_cubin(artifact.object); info.ok())
    line = cat(line, ": ELF for sm_", info->sm, ", kernels ", join(info->kernels, ", "));
  return line;
}

BackendKind cuda_backend_kind() {
  return BackendKind{
      .name = "cuda",
      .default_arch = "sm_90",
      .runs_on = [](std::string_view device) { return device.starts_with("CUDA:") || device.starts_with("cuda:"); },
      .make = [](std::string_view arch) -> absl::StatusOr<std::shared_ptr<const Backend>> {
        ASSIGN_OR_RETURN(CudaTarget target, CudaTarget::parse(arch));
        return std::make_shared<CudaBackend>(std::move(target));
      },
      .device_collectives = "nccl",
  };
}

}  // namespace uop
