#include "compiler/backends/cpu/cpu_backend.h"

#include "compiler/passes/optimize.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {

CpuBackend::CpuBackend(CpuTarget target, int vector_bits)
    : target_(std::move(target)), vector_bits_(vector_bits > 0 ? vector_bits : target_.vector_bits()) {
  OptimizeOptions oo;
  oo.vector_bits = vector_bits_;
  schedule_ = {
      {"optimize", "per kernel: a loop schedule (the heuristic's or the one given): Upcast, Thread, reorder",
       [oo](Graph& g, const UOp* k) { return optimize_cpu(g, k, oo); },
       [oo](Graph& g, const UOp* k, std::string_view schedule, std::string* applied) {
         return optimize_cpu(g, k, oo, schedule, applied);
       }},
      expand_stage(),
      lower_reduce_stage(),
      symbolic_stage(),
      bounds_stage(),
      linearize_stage(),
  };
}

std::string CpuBackend::build_id() const { return compiler_build_id(); }

std::string CpuBackend::key_parts() const { return cat("vector_bits=", vector_bits_); }

absl::StatusOr<CodeArtifact> CpuBackend::render(const UOp* linear) const {
  // The LLVM IR is what LLVM is given before any optimization: O0 makes it without the
  // optimization pipeline's cost.
  ASSIGN_OR_RETURN(CpuArtifact art, compile_cpu(linear, target_, CpuCompileOptions{.opt_level = 0, .emit_ir_text = true}));
  return CodeArtifact{.source = std::move(art.ir_text), .abi = std::move(art.abi), .render_ms = art.render_ms};
}

absl::StatusOr<CodeArtifact> CpuBackend::compile(const UOp* linear, const BackendCompileOptions& options) const {
  ASSIGN_OR_RETURN(CpuArtifact art,
                   compile_cpu(linear, target_, CpuCompileOptions{.opt_level = 2, .emit_ir_text = options.keep_source}));
  return CodeArtifact{.object = std::move(art.object),
                      .source = std::move(art.ir_text),
                      .abi = std::move(art.abi),
                      .render_ms = art.render_ms,
                      .compile_ms = art.compile_ms};
}

std::string CpuBackend::inspect(const CodeArtifact& artifact) const {
  return cat(artifact.object.size(), " bytes of ", object_kind(), " for ", target_.cpu, " (", build_id(), ")");
}

std::shared_ptr<const CpuBackend> host_cpu_backend() {
  static const std::shared_ptr<const CpuBackend> host = std::make_shared<CpuBackend>(CpuTarget::host());
  return host;
}

BackendKind cpu_backend_kind() {
  return BackendKind{
      .name = "cpu",
      .default_arch = "host",
      .runs_on = [](std::string_view device) { return device.starts_with("CPU:") || device.starts_with("cpu:"); },
      .make = [](std::string_view arch) -> absl::StatusOr<std::shared_ptr<const Backend>> {
        if (arch != "host")
          return absl::InvalidArgumentError(cat("target cpu: arch '", arch, "' is not supported; the workers' CPU is used"));
        return host_cpu_backend();
      },
      .device_collectives = "",
  };
}

}  // namespace uop
