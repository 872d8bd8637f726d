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
//
// Reloading (uopd: SIGHUP). Tenants::reload reads the file again and, only if the whole of
// it parses, makes it the configuration at once: new tenants and tokens are accepted, a
// token no longer listed is refused (UNAUTHENTICATED) from then on, changed limits apply
// to requests from then on. A tenant is the same tenant across reloads by its NAME: what
// it holds and uses (sessions, buffer bytes, compiles running, its rate bucket, its
// counters) carries over, whatever its token or limits became; a limit lowered below what
// it already holds refuses new requests and takes nothing away. A file that does not
// parse changes nothing (the error names the file and the line). A removed tenant's
// object lives on (requests it had in flight keep a valid Tenant*, and the tenant is
// revived with its usage if its name comes back); its sessions cannot be reached by any
// token any more and close when they idle out (--session-idle-timeout-s), freeing their
// buffers then. Every Tenant* handed out stays valid for the life of the Tenants.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
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
  uint64_t max_compiles = 0;   // Compile / Run / Explain requests planning or compiling at once
  double requests_per_second = 0;  // token bucket refill rate; 0: no limit
  double burst = 0;                // bucket size
};

class Tenant {
 public:
  Tenant(std::string name, TenantQuota quota, bool private_cache);

  const std::string& name() const { return name_; }
  // Copies: a reload (Tenants::reload) may change them while a request runs.
  TenantQuota quota() const;
  // "" for the shared cache; otherwise what cache keys (kernels and plans) of this tenant
  // are salted with.
  std::string cache_namespace() const;
  bool private_cache() const;

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

  // New limits and cache setting (a reload); the usage and counters stay. The rate bucket
  // keeps its level, capped at the new burst (full when the rate was unlimited before).
  void update(const TenantQuota& quota, bool private_cache);

  // Refusals by limit ("rps", "compiles", "sessions", "bytes"), for metrics.
  void count_rejection(std::string_view limit);
  std::map<std::string, uint64_t> rejections() const;
  uint64_t requests() const { return requests_.load(); }
  uint64_t compiles_running() const { return compiles_.load(); }

 private:
  const std::string name_;
  std::atomic<uint64_t> compiles_{0};
  std::atomic<uint64_t> requests_{0};
  mutable std::mutex mu_;
  TenantQuota quota_;          // guarded by mu_
  bool private_cache_ = false;  // guarded by mu_
  double bucket_ = 0;          // guarded by mu_
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

  // Reloading (see the top of this file). `fresh` is a parsed configuration (parse/load):
  // adopt makes it this one's, atomically for concurrent authenticate/admit calls, keeping
  // the Tenant objects of the names that stay. Returns a one-line summary ("4 tenants;
  // added erin; removed bob; changed alice, carol"). FAILED_PRECONDITION on the anonymous
  // configuration (nothing to reload) or for an anonymous `fresh`.
  absl::StatusOr<std::string> adopt(std::unique_ptr<Tenants> fresh);
  // load(path), then adopt; on any error the configuration is unchanged. Counted in
  // reloads().
  absl::StatusOr<std::string> reload(const std::string& path);
  // Reloads that took effect / that failed (the configuration was kept), for metrics.
  uint64_t reloads_ok() const { return reloads_ok_.load(); }
  uint64_t reloads_failed() const { return reloads_failed_.load(); }
  // Counts a failed reload that never reached adopt (a caller's own load).
  void count_failed_reload() { ++reloads_failed_; }

  uint64_t auth_failures() const { return auth_failures_.load(); }
  // The tenants configured now (not those removed by a reload).
  std::vector<Tenant*> all() const;

 private:
  Tenants() = default;
  bool enabled_ = false;
  mutable std::shared_mutex mu_;  // guards the three below; readers: every request
  std::vector<std::unique_ptr<Tenant>> tenants_;
  absl::flat_hash_map<std::string, Tenant*> by_token_hash_;  // hex SHA-256 of the token
  std::vector<std::unique_ptr<Tenant>> retired_;  // removed by a reload; kept alive (see above)
  std::atomic<uint64_t> auth_failures_{0};
  std::atomic<uint64_t> reloads_ok_{0}, reloads_failed_{0};
};

// The name of the tenant without a tokens file (and what its sessions are owned by).
inline constexpr char kAnonymousTenant[] = "";

}  // namespace uop::server
