// Tenants, their bearer tokens and their quotas. uopd started with --tokens-file serves
// only requests carrying `authorization: Bearer <token>` of a tenant listed there; each
// tenant sees its own sessions and buffers only, and has limits of its own (buffer bytes,
// open sessions, concurrent compiles, requests per second). Without a tokens file there
// is one anonymous tenant with no limits beyond the server's flags: nothing changes.
//
// The tokens file, one tenant per line ('#' starts a comment):
//
//   NAME TOKEN [bytes=N] [sessions=N] [compiles=N] [rps=R] [burst=N] [cache=shared|private]
//
//   alice  sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  bytes=1073741824 rps=50
//   bob    a-long-random-token-for-bob  sessions=4 compiles=1 cache=private
//
// NAME is [A-Za-z0-9_.-]+; TOKEN is the token itself or `sha256:` and the hex SHA-256 of
// it (so the file need not hold secrets). A limit left out, or 0, is no limit. rps may be
// fractional (0.5: one request every two seconds); burst defaults to max(1, rps).
// cache=private gives the tenant a compile cache namespace of its own: its kernels are
// keyed apart from everyone else's (no cross-tenant hits, no timing hints). The shared
// cache needs no such protection for correctness: its entries are keyed by digest and
// written only by the server's compiler, so no tenant can plant one.
//
// Tokens are compared by their SHA-256 (a hash-map lookup), never byte by byte.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace uop::server {

struct TenantQuota {
  uint64_t max_bytes = 0;      // buffer bytes held across all its sessions; 0: no limit
  uint64_t max_sessions = 0;   // open sessions; 0: no limit
  uint64_t max_compiles = 0;   // Compile / Run requests planning or compiling at once
  double requests_per_second = 0;  // token bucket refill rate; 0: no limit
  double burst = 0;                // bucket size
};

class Tenant {
 public:
  Tenant(std::string name, TenantQuota quota, bool private_cache);

  const std::string& name() const { return name_; }
  const TenantQuota& quota() const { return quota_; }
  // "" for the shared cache; otherwise what cache keys of this tenant are salted with.
  const std::string& cache_namespace() const { return cache_namespace_; }

  // Takes one request from the rate bucket: RESOURCE_EXHAUSTED naming the limit when it
  // is empty.
  absl::Status admit_request(absl::Time now);
  // A compile slot, held while the request plans and compiles.
  class CompileSlot {
   public:
    CompileSlot() = default;
    explicit CompileSlot(Tenant* t) : t_(t) {}
    CompileSlot(CompileSlot&& o) noexcept : t_(o.t_) { o.t_ = nullptr; }
    CompileSlot& operator=(CompileSlot&&) = delete;
    ~CompileSlot() {
      if (t_) --t_->compiles_;
    }

   private:
    Tenant* t_ = nullptr;
  };
  absl::StatusOr<CompileSlot> begin_compile();

  // Refusals by limit ("rps", "compiles", "sessions", "bytes"), for metrics.
  void count_rejection(std::string_view limit);
  std::map<std::string, uint64_t> rejections() const;
  uint64_t requests() const { return requests_.load(); }

 private:
  const std::string name_;
  const TenantQuota quota_;
  const std::string cache_namespace_;
  std::atomic<uint64_t> compiles_{0};
  std::atomic<uint64_t> requests_{0};
  mutable std::mutex mu_;
  double bucket_ = 0;  // guarded by mu_
  absl::Time refilled_ = absl::InfinitePast();
  std::map<std::string, uint64_t> rejections_;
};

class Tenants {
 public:
  // One anonymous tenant, no tokens, no limits: the server without --tokens-file.
  static std::unique_ptr<Tenants> anonymous();
  // The tokens file text; `source` names it in messages (INVALID_ARGUMENT with the line).
  static absl::StatusOr<std::unique_ptr<Tenants>> parse(std::string_view text, std::string_view source);
  static absl::StatusOr<std::unique_ptr<Tenants>> load(const std::string& path);

  // Whether tokens are checked at all.
  bool enabled() const { return enabled_; }

  // The tenant a request belongs to, from its `authorization` metadata values (zero or
  // more). UNAUTHENTICATED when auth is on and there is no valid bearer token; the message
  // never repeats the token. The anonymous tenant when auth is off.
  absl::StatusOr<Tenant*> authenticate(const std::vector<std::string_view>& authorization);

  // authenticate, then the tenant's request rate: what every RPC goes through.
  absl::StatusOr<Tenant*> admit(const std::vector<std::string_view>& authorization, absl::Time now);

  uint64_t auth_failures() const { return auth_failures_.load(); }
  std::vector<Tenant*> all() const;

 private:
  Tenants() = default;
  bool enabled_ = false;
  std::vector<std::unique_ptr<Tenant>> tenants_;
  absl::flat_hash_map<std::string, Tenant*> by_token_hash_;  // hex SHA-256 of the token
  std::atomic<uint64_t> auth_failures_{0};
};

// The name of the tenant without a tokens file (and what its sessions are owned by).
inline constexpr char kAnonymousTenant[] = "";

}  // namespace uop::server
