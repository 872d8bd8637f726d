// A third target, for tests only: what a new backend takes. Its directory is all of it;
// a test registers it with one line (register_backend(listing_backend_kind())). It lowers
// with the shared kernel stages only (no optimize: every range stays a loop) and its
// "object" is the LINEAR as explain prints it, so a test can read what was compiled.
#pragma once

#include "compiler/backend.h"

namespace uop::testing {

class ListingBackend : public Backend {
 public:
  ListingBackend();
  std::string_view name() const override { return "listing"; }
  std::string arch() const override { return "text"; }
  std::string target_id() const override { return "listing/text"; }
  std::string build_id() const override { return "uopd-listing/1"; }
  std::string key_parts() const override { return ""; }
  absl::Status available() const override { return absl::OkStatus(); }
  std::string_view object_kind() const override { return "listing"; }
  std::span<const KernelStage> schedule() const override { return schedule_; }
  absl::StatusOr<CodeArtifact> render(const UOp* linear) const override;
  absl::StatusOr<CodeArtifact> compile(const UOp* linear, const BackendCompileOptions& options = {}) const override;
  std::string inspect(const CodeArtifact& artifact) const override;

 private:
  std::vector<KernelStage> schedule_;
};

// Devices "LISTING:n"; the one arch "text".
BackendKind listing_backend_kind();

}  // namespace uop::testing
