#include "compiler/backend.h"

#include <algorithm>
#include <deque>
#include <mutex>

#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {

// The built-in kinds (backends/registry.cc).
std::vector<BackendKind> builtin_backends();

namespace {

struct Registry {
  std::mutex mu;
  std::deque<BackendKind> kinds;  // a deque: pointers handed out stay valid as kinds are added
};
Registry& registry() {
  static Registry* r = [] {
    auto* r = new Registry;
    for (BackendKind& k : builtin_backends()) r->kinds.push_back(std::move(k));
    return r;
  }();
  return *r;
}

}  // namespace

absl::StatusOr<const UOp*> Backend::lower(Graph& g, const UOp* kernel, const PipelineOptions& opts,
                                          std::string_view kernel_name) const {
  return run_kernel_stages(g, kernel, schedule(), opts, kernel_name);
}

const std::string& Backend::identity() const {
  std::call_once(identity_once_, [this] {
    identity_ = cat(target_id(), "\n", build_id(), "\n", key_parts());
    identity_digest_ = sha256(identity_);
  });
  return identity_;
}

const Digest& Backend::identity_digest() const {
  identity();
  return identity_digest_;
}

std::string Backend::cache_key(const Digest& kernel, bool keep_source, std::string_view cache_namespace,
                               std::string_view schedule) const {
  std::string material =
      cat("uopd-kernel-key/1\n", kernel.hex(), "\n", identity(), key_parts().empty() ? "" : " ", "keep_source=", keep_source);
  // The heuristic's schedule is the target's (build_id and key_parts name it), so the
  // default key has no schedule line; a given one is named by its text, which is
  // canonical (parse, then print, gives it back), length-prefixed so no text can end the line.
  if (!schedule.empty()) material = cat(material, "\nschedule=", schedule.size(), ":", schedule);
  // A private namespace only moves the key; the shared cache's keys stay what they were.
  if (!cache_namespace.empty()) material = cat(material, "\nnamespace=", cache_namespace);
  return sha256(material).hex();
}

void register_backend(BackendKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.mu);
  r.kinds.push_back(std::move(kind));
}

std::vector<const BackendKind*> backend_kinds() {
  Registry& r = registry();
  std::lock_guard<std::mutex> l(r.mu);
  std::vector<const BackendKind*> out;
  for (const BackendKind& k : r.kinds) out.push_back(&k);
  return out;
}

absl::StatusOr<const BackendKind*> find_backend(std::string_view name) {
  std::vector<const BackendKind*> kinds = backend_kinds();
  if (name.empty()) return kinds.front();
  std::vector<std::string> names;
  for (const BackendKind* k : kinds) {
    if (k->name == name) return k;
    names.emplace_back(k->name);
  }
  return absl::UnimplementedError(cat("target backend '", name, "' is not available on this server (", join(names, ", "), ")"));
}

absl::StatusOr<std::shared_ptr<const Backend>> make_backend(std::string_view name, std::string_view arch) {
  ASSIGN_OR_RETURN(const BackendKind* kind, find_backend(name));
  return kind->make(arch.empty() ? kind->default_arch : arch);
}

const BackendKind& backend_for_device(std::string_view device) {
  std::vector<const BackendKind*> kinds = backend_kinds();
  for (const BackendKind* k : kinds)
    if (k->runs_on && k->runs_on(device)) return *k;
  return *kinds.front();
}

std::vector<StageInfo> pipeline_stages() {
  std::vector<StageInfo> out(planning_stages().begin(), planning_stages().end());
  auto listed = [&](std::string_view name) {
    return std::find_if(out.begin(), out.end(), [&](const StageInfo& s) { return s.name == name; });
  };
  // Each backend's schedule merged in: a stage not listed yet goes right after the one
  // before it in that schedule, so every schedule reads in the list's order.
  const size_t lowering = out.size();
  for (const BackendKind* k : backend_kinds()) {
    auto b = k->make(k->default_arch);
    if (!b.ok()) continue;
    size_t at = lowering;
    for (const KernelStage& st : (*b)->schedule()) {
      auto it = std::find_if(out.begin() + lowering, out.end(), [&](const StageInfo& s) { return s.name == st.name; });
      if (it != out.end()) {
        at = std::max<size_t>(at, it - out.begin() + 1);
        continue;
      }
      // A planning stage a schedule runs again (symbolic) is listed once, where planning runs it.
      if (listed(st.name) != out.end()) continue;
      out.insert(out.begin() + at, StageInfo{st.name, st.what});
      ++at;
    }
  }
  out.push_back({"render", "per kernel: the backend's source (LLVM IR for the CPU, CUDA C for a GPU)"});
  out.push_back({"compile", "per kernel: the object a worker loads (relocatable ELF for the CPU, cubin for a GPU)"});
  return out;
}

}  // namespace uop
