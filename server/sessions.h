// Sessions and their buffers, as the scheduler keeps them. A session owns buffers on
// workers; it closes explicitly or after an idle timeout, freeing them. Each session has a
// byte quota. Ids are 128-bit random hex: a buffer id names a buffer of one session only,
// and guessing another's is hopeless. The data lives on the worker of the buffer's device;
// the scheduler knows which worker (and which generation of it: a restarted worker has
// lost its buffers, and using one then is a clear error, not garbage).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/ir/dtype.h"

namespace uop::server {

struct BufferInfo {
  std::string id;
  std::string device;
  Scalar dtype = Scalar::Float32;
  uint64_t elements = 0;
  uint64_t bytes = 0;
  uint64_t worker_buffer = 0;      // the id the worker knows it by
  std::string worker_id;
  uint64_t worker_generation = 0;  // of the worker when it was allocated
};

struct SessionOptions {
  uint64_t max_bytes = uint64_t{4} << 30;             // per session
  absl::Duration idle_timeout = absl::Minutes(10);
  uint64_t max_buffers = 100000;                      // per session
};

// Who owns a session (server/auth.h: the tenant; "" without tokens) and that owner's
// limits across all of its sessions (0: none). A session is found only by its owner:
// anyone else gets the NOT_FOUND of a session that does not exist.
struct SessionOwner {
  std::string tenant;
  uint64_t max_sessions = 0;
  uint64_t max_bytes = 0;
};

// What one tenant holds now.
struct TenantUsage {
  uint64_t sessions = 0, buffers = 0, bytes = 0;
};

class SessionManager {
 public:
  explicit SessionManager(SessionOptions opts);

  std::string create(std::vector<std::string> devices, absl::Duration idle_timeout);
  // A session of `owner`; RESOURCE_EXHAUSTED naming the limit when it has all the
  // sessions it may.
  absl::StatusOr<std::string> open(std::vector<std::string> devices, absl::Duration idle_timeout, const SessionOwner& owner);
  // The calls below take the caller's tenant: a session of another tenant is NOT_FOUND.
  // NOT_FOUND naming the session when it does not exist (or timed out).
  absl::StatusOr<std::vector<std::string>> devices(const std::string& session, const std::string& tenant = "");
  // Marks the session used now.
  absl::Status touch(const std::string& session, const std::string& tenant = "");

  // Reserves `bytes` of the session's quota for a new buffer (RESOURCE_EXHAUSTED naming
  // the limit) and records it; the caller allocates it on the worker first.
  // The tenant's byte limit is checked too.
  absl::StatusOr<std::string> add_buffer(const std::string& session, BufferInfo info, const std::string& tenant = "");
  absl::StatusOr<BufferInfo> buffer(const std::string& session, const std::string& buffer_id, const std::string& tenant = "");
  // Forgets the buffer and returns what the worker must free.
  absl::StatusOr<BufferInfo> remove_buffer(const std::string& session, const std::string& buffer_id,
                                           const std::string& tenant = "");
  // Forgets the session and returns its buffers for the caller to free on the workers.
  absl::StatusOr<std::vector<BufferInfo>> close(const std::string& session, const std::string& tenant = "");
  // Closes sessions idle past their timeout; returns their buffers.
  std::vector<BufferInfo> reap_idle(absl::Time now);

  uint64_t sessions() const;
  uint64_t buffers() const;
  uint64_t bytes() const;
  TenantUsage usage(const std::string& tenant) const;
  // Whether one of `tenant`'s sessions names `device` (what keeps the tenant's worker for it
  // alive under tenant isolation, server/workers.h). A scan of the sessions: called by the
  // worker supervisor a few times a second, not per request.
  bool uses_device(const std::string& tenant, const std::string& device) const;
  // New limits for a tenant (a tokens file reload, server/auth.h); what it holds stays,
  // and a limit now below it refuses new sessions / buffers only. open() also takes its
  // owner's limits at each call.
  void set_limits(const SessionOwner& owner);

 private:
  struct Owner {
    uint64_t max_sessions = 0, max_bytes = 0;
    TenantUsage used;
  };
  // Drops a session's share of its owner's usage (mu_ held).
  void release_locked(const std::string& tenant, uint64_t buffers, uint64_t bytes, bool session);

  struct Session {
    std::string tenant;
    std::vector<std::string> devices;
    absl::Duration idle_timeout;
    absl::Time last_used;
    uint64_t bytes = 0;
    absl::flat_hash_map<std::string, BufferInfo> buffers;
  };
  absl::StatusOr<Session*> find(const std::string& id, const std::string& tenant = "");  // mu_ held

  SessionOptions opts_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_;
  absl::flat_hash_map<std::string, Owner> owners_;  // by tenant
};

// 128 random bits as 32 hex characters.
std::string random_id();

}  // namespace uop::server
