#include "tests/unit/compiler/backends/listing/listing_backend.h"

#include "compiler/explain.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop::testing {

ListingBackend::ListingBackend()
    : schedule_{expand_stage(), lower_reduce_stage(), symbolic_stage(), bounds_stage(), linearize_stage()} {}

absl::StatusOr<CodeArtifact> ListingBackend::render(const UOp* linear) const {
  ASSIGN_OR_RETURN(KernelAbi abi, abi_of(linear));
  return CodeArtifact{.source = explain_text(linear), .abi = std::move(abi)};
}

absl::StatusOr<CodeArtifact> ListingBackend::compile(const UOp* linear, const BackendCompileOptions& options) const {
  ASSIGN_OR_RETURN(CodeArtifact art, render(linear));
  art.object = art.source;
  if (!options.keep_source) art.source.clear();
  return art;
}

std::string ListingBackend::inspect(const CodeArtifact& artifact) const {
  return cat(artifact.object.size(), " bytes of ", object_kind(), " for ", arch());
}

BackendKind listing_backend_kind() {
  return BackendKind{
      .name = "listing",
      .default_arch = "text",
      .runs_on = [](std::string_view device) { return device.starts_with("LISTING:"); },
      .make = [](std::string_view arch) -> absl::StatusOr<std::shared_ptr<const Backend>> {
        if (arch != "text") return absl::InvalidArgumentError(cat("target listing: arch '", arch, "' is not 'text'"));
        return std::make_shared<ListingBackend>();
      },
      .device_collectives = "",
  };
}

}  // namespace uop::testing
