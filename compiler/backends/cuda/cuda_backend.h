// A CUDA target: kernels lowered for one GPU architecture (optimize_gpu's tensor cores,
// group reduce, upcasts and grid; shared-memory reductions; parallel ranges mapped to
// blockIdx / threadIdx), rendered to CUDA C and compiled by NVRTC into a cubin
// (codegen/cuda.h). No GPU is needed to compile: the scheduler compiles for any arch
// wherever libnvrtc loads; where it does not, available() says why and render() still works.
#pragma once

#include "compiler/backend.h"
#include "compiler/codegen/cuda.h"

namespace uop {

class CudaBackend : public Backend {
 public:
  // `max_threads`: threads per block the lowering may use.
  explicit CudaBackend(CudaTarget target, bool tensor_cores = true, int max_threads = 256);

  std::string_view name() const override { return "cuda"; }
  std::string arch() const override { return target_.arch; }
  std::string target_id() const override { return target_.id(); }
  std::string build_id() const override { return cuda_build_id(); }
  std::string key_parts() const override { return ""; }
  absl::Status available() const override { return nvrtc_status(); }
  std::string_view object_kind() const override { return "cubin"; }
  std::span<const KernelStage> schedule() const override { return schedule_; }
  absl::StatusOr<CodeArtifact> render(const UOp* linear) const override;
  absl::StatusOr<CodeArtifact> compile(const UOp* linear, const BackendCompileOptions& options = {}) const override;
  std::string inspect(const CodeArtifact& artifact) const override;

  const CudaTarget& target() const { return target_; }

 private:
  CudaTarget target_;
  std::vector<KernelStage> schedule_;
};

// The registry's entry (backends/registry.cc).
BackendKind cuda_backend_kind();

}  // namespace uop
