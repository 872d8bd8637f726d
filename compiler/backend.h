// A backend: one compile target (the CPU through LLVM, a CUDA arch through NVRTC) behind
// one interface, so the planner, the service, the executor, uopc and Explain ask "which
// target, and what does it say" instead of branching on its name. A Backend object is a
// target configured for one arch: what names it in cache keys, whether it can compile
// here, its lowering (a schedule of kernel stages, compiler/pipeline.h), and how it turns
// LINEAR into source and into the object a worker loads.
//
// The registry lists the kinds of target by their wire name (Target.backend): each kind
// makes its Backend for an arch and says which devices run its code. Every built-in
// target is one line of backends/registry.cc; a test may register more.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/abi/kernel_abi.h"
#include "compiler/ir/digest.h"
#include "compiler/ir/uop.h"
#include "compiler/pipeline.h"

namespace uop {

// What a backend makes of one LINEAR.
struct CodeArtifact {
  std::string object;  // what a worker loads (a relocatable ELF, a cubin); empty after render()
  std::string source;  // the rendered text (LLVM IR, CUDA C): always after render(), after
                       // compile() when keep_source was asked
  KernelAbi abi;
  double render_ms = 0;
  double compile_ms = 0;
};

struct BackendCompileOptions {
  bool keep_source = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // The kind's wire name ("cpu", "cuda") and the arch this object compiles for ("host"'s
  // CPU name, "sm_90").
  virtual std::string_view name() const = 0;
  virtual std::string arch() const = 0;
  // The target in cache keys and artifacts (Artifact.target): the CPU's triple, cpu and
  // features; "cuda/sm_90".
  virtual std::string target_id() const = 0;
  // The code generator and what it was built with ("uopd-llvm-cpu/3 abi-3 llvm-19.1.7"):
  // part of every cache key, so a new code generator never hits an old artifact.
  virtual std::string build_id() const = 0;
  // Whatever else decides the artifact's bytes, as cache-key text ("vector_bits=512"; "").
  virtual std::string key_parts() const = 0;
  // OK when compile() can run here; else why not (render() and lower() always can).
  virtual absl::Status available() const = 0;
  // What compile() makes, in words ("ELF object", "cubin").
  virtual std::string_view object_kind() const = 0;

  // The lowering from a normalized kernel to LINEAR, in order; it ends with bounds,
  // linearize.
  virtual std::span<const KernelStage> schedule() const = 0;
  // LINEAR -> source text and the kernel's ABI (no object).
  virtual absl::StatusOr<CodeArtifact> render(const UOp* linear) const = 0;
  // LINEAR -> the object a worker loads. INVALID_ARGUMENT naming the node for a LINEAR
  // the backend cannot compile; available()'s status where it cannot compile here.
  virtual absl::StatusOr<CodeArtifact> compile(const UOp* linear, const BackendCompileOptions& options = {}) const = 0;
  // One line on an artifact: its size, kind and target, and what the object says of
  // itself where the backend can read it.
  virtual std::string inspect(const CodeArtifact& artifact) const = 0;

  // schedule() run on one normalized kernel (run_kernel_stages).
  absl::StatusOr<const UOp*> lower(Graph& g, const UOp* kernel, const PipelineOptions& opts = {},
                                   std::string_view kernel_name = {}) const;
  // The cache key of a kernel's artifact: everything that decides its bytes (the kernel,
  // target_id, build_id, key_parts, whether the source is kept, the loop schedule it is
  // compiled with: "" is the target's heuristic, which leaves the key what it is without
  // one), salted by a tenant's private namespace when not empty. Hex SHA-256. Two
  // schedules of one kernel are two keys; the kernel's digest is the same.
  std::string cache_key(const Digest& kernel, bool keep_source, std::string_view cache_namespace = {},
                        std::string_view schedule = {}) const;
  // target_id, build_id and key_parts, one to a line, worked out on first use (they are
  // fixed for the object's life; the CPU's target_id names every feature, some 1.5 KB
  // built anew on each call), and its SHA-256: what every key of this target starts from.
  const std::string& identity() const;
  const Digest& identity_digest() const;

 private:
  mutable std::once_flag identity_once_;
  mutable std::string identity_;
  mutable Digest identity_digest_;
};

// A kind of target, as the registry knows it.
struct BackendKind {
  std::string_view name;          // Target.backend on the wire: "cpu", "cuda"
  std::string_view default_arch;  // the arch a request that names none gets ("host", "sm_90")
  // Whether a device ("CUDA:0") holds its buffers where this target's code runs.
  std::function<bool(std::string_view device)> runs_on;
  // The backend for an arch; INVALID_ARGUMENT naming the arch for one it does not know.
  std::function<absl::StatusOr<std::shared_ptr<const Backend>>(std::string_view arch)> make;
  // The collective transport that reduces in this target's device memory ("nccl"), or ""
  // where collectives go through host memory.
  std::string_view device_collectives;
};

// Adds a kind (tests: a third target). The built-in ones are registered before any lookup.
void register_backend(BackendKind kind);
// Every kind, built-in first, in registration order.
std::vector<const BackendKind*> backend_kinds();
// The kind named `name` ("" is the first built-in, the CPU); UNIMPLEMENTED naming it and
// the known ones otherwise.
absl::StatusOr<const BackendKind*> find_backend(std::string_view name);
// The backend of kind `name` for `arch` ("" is the kind's default_arch).
absl::StatusOr<std::shared_ptr<const Backend>> make_backend(std::string_view name, std::string_view arch = {});
// The kind whose code runs on `device`: the first whose runs_on says so, else the CPU's.
const BackendKind& backend_for_device(std::string_view device);

}  // namespace uop
