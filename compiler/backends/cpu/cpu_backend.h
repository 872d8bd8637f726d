// The CPU target: kernels lowered with optimize_cpu's upcasts for the machine's vector
// registers, rendered to LLVM IR and compiled by LLVM (codegen/llvm_cpu.h) into the
// relocatable ELF object the worker's loader links (worker/cpu/cpu_program.h). Its arch
// is "host": the scheduler's own CPU, which is the workers'.
#pragma once

#include "compiler/backend.h"
#include "compiler/codegen/llvm_cpu.h"

namespace uop {

class CpuBackend : public Backend {
 public:
  // `vector_bits` 0: the target's (CpuTarget::vector_bits).
  explicit CpuBackend(CpuTarget target, int vector_bits = 0);

  std::string_view name() const override { return "cpu"; }
  std::string arch() const override { return target_.cpu; }
  std::string target_id() const override { return target_.id(); }
  std::string build_id() const override;
  std::string key_parts() const override;
  absl::Status available() const override { return absl::OkStatus(); }
  std::string_view object_kind() const override { return "ELF object"; }
  std::span<const KernelStage> schedule() const override { return schedule_; }
  absl::StatusOr<CodeArtifact> render(const UOp* linear) const override;
  absl::StatusOr<CodeArtifact> compile(const UOp* linear, const BackendCompileOptions& options = {}) const override;
  std::string inspect(const CodeArtifact& artifact) const override;

  const CpuTarget& target() const { return target_; }

 private:
  CpuTarget target_;
  int vector_bits_;
  std::vector<KernelStage> schedule_;
};

// The CPU of this process, made once.
std::shared_ptr<const CpuBackend> host_cpu_backend();

// The registry's entry (backends/registry.cc).
BackendKind cpu_backend_kind();

}  // namespace uop
