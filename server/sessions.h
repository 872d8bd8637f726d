// Sessions and their buffers, as the scheduler keeps them. A session owns buffers on
// workers; it closes explicitly or after an idle timeout (a client's choice, clamped to
// the server's maximum), freeing them. Each session has a byte quota and a buffer count
// limit, and the server a limit on open sessions, so that even without tenants no client
// holds more than its share. A Run reserves the bytes its temporaries take on the workers
// against the same quotas (Reservation) for as long as it runs. Ids are 128-bit random hex: a buffer id names a buffer of one session only,
// and guessing another's is hopeless. The data lives on the worker of the buffer's device;
// the scheduler knows which worker (and which generation of it: a restarted worker has
// lost its buffers, and using one then is a clear error, not garbage).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/ir/dtype.h"

namespace uop {
struct DecodedGraph;  // compiler/ir/codec.h
}

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

// A model held by a session (server/models.h); its weights are buffers of the session.
struct HeldModel;

struct SessionOptions {
  uint64_t max_bytes = uint64_t{4} << 30;             // per session
  absl::Duration idle_timeout = absl::Minutes(10);    // when the client names none
  absl::Duration max_idle_timeout = absl::Hours(24);  // what a client may name
  uint64_t max_buffers = 4096;                        // per session
  uint64_t max_sessions = 1024;                       // open at once, all tenants
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

  // A session of `owner`; RESOURCE_EXHAUSTED naming the limit when it has all the
  // sessions it may, or the server has. `idle_timeout` is clamped to the maximum; zero or
  // less is the default.
  absl::StatusOr<std::string> open(std::vector<std::string> devices, absl::Duration idle_timeout, const SessionOwner& owner);
  // The calls below take the caller's tenant: a session of another tenant is NOT_FOUND.
  // NOT_FOUND naming the session when it does not exist (or timed out).
  absl::StatusOr<std::vector<std::string>> devices(const std::string& session, const std::string& tenant = "");
  // The session's devices with `device` first, `device` joining them when the session has
  // not used it before (a session grows onto the devices a CreateBuffer or a Run names; the
  // caller has checked that the server has it). Empty `device`: the session's first.
  absl::StatusOr<std::vector<std::string>> use_device(const std::string& session, const std::string& device,
                                                      const std::string& tenant = "");
  // Marks the session used now.
  absl::Status touch(const std::string& session, const std::string& tenant = "");

  // Bytes of a session's quota (and its tenant's) held for one Run: its intermediates,
  // the inline inputs staged on the workers and its outputs. Given back when it goes, but
  // for what add_buffer took over from it (outputs kept in the session). While a session
  // has one it is in use and never reaped as idle. Movable; one thread at a time.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { release(); }
    uint64_t bytes() const { return bytes_; }
    void release();

   private:
    friend class SessionManager;
    SessionManager* m_ = nullptr;
    std::string session_, tenant_;
    uint64_t bytes_ = 0;
  };
  // RESOURCE_EXHAUSTED naming the session's or the tenant's limit when `bytes` more do
  // not fit (`what` says what they are for), before anything is allocated.
  absl::StatusOr<Reservation> reserve(const std::string& session, uint64_t bytes, std::string_view what,
                                      const std::string& tenant = "");

  // Reserves `bytes` of the session's quota for a new buffer (RESOURCE_EXHAUSTED naming
  // the limit) and records it; the caller allocates it on the worker first.
  // The tenant's byte limit is checked too. With `from`, the bytes come out of that
  // reservation (a Run's output kept in the session), already checked.
  absl::StatusOr<std::string> add_buffer(const std::string& session, BufferInfo info, const std::string& tenant = "",
                                         Reservation* from = nullptr);
  absl::StatusOr<BufferInfo> buffer(const std::string& session, const std::string& buffer_id, const std::string& tenant = "");
  // Forgets the buffer and returns what the worker must free.
  absl::StatusOr<BufferInfo> remove_buffer(const std::string& session, const std::string& buffer_id,
                                           const std::string& tenant = "");
  // A model of the session: its id comes back (random, like a buffer's), and it goes
  // when the session does. A model id of another session or tenant is NOT_FOUND. The
  // `bytes` the scheduler holds for it (its graph) count against the session's and the
  // tenant's byte quotas like a buffer's (RESOURCE_EXHAUSTED naming the limit).
  absl::StatusOr<std::string> add_model(const std::string& session, std::shared_ptr<const HeldModel> model,
                                        uint64_t bytes, const std::string& tenant = "");
  absl::StatusOr<std::shared_ptr<const HeldModel>> model(const std::string& session, const std::string& model_id,
                                                         const std::string& tenant = "");

  // Puts `now` (a Run's output, on the worker) in the place of the session's buffer
  // `buffer_id` (RunRequest.assign): the id stays and names the new data; what it held
  // before is returned for the caller to free. The sizes match (the caller checked), so
  // the session's bytes do not change. NOT_FOUND when the buffer is gone meanwhile.
  absl::StatusOr<BufferInfo> replace_buffer(const std::string& session, const std::string& buffer_id, const BufferInfo& now,
                                            const std::string& tenant = "");
  // Graphs a session holds for later Runs to name by digest (RunRequest.hold_graph): the
  // last kMaxHeldGraphs, each counting `bytes` against the session's and the tenant's byte
  // quotas (RESOURCE_EXHAUSTED naming the limit) until it is displaced or the session
  // closes. Holding a digest again replaces its graph (and names).
  static constexpr size_t kMaxHeldGraphs = 8;
  absl::Status hold_graph(const std::string& session, const std::string& digest, std::shared_ptr<const DecodedGraph> g,
                          uint64_t bytes, const std::string& tenant = "");
  // NOT_FOUND naming the digest when the session holds no such graph.
  absl::StatusOr<std::shared_ptr<const DecodedGraph>> held_graph(const std::string& session, const std::string& digest,
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
    uint64_t reserved = 0;  // by runs in flight
  };
  // Drops a session's share of its owner's usage (mu_ held).
  void release_locked(const std::string& tenant, uint64_t buffers, uint64_t bytes, bool session);

  struct Session {
    std::string tenant;
    std::vector<std::string> devices;
    absl::Duration idle_timeout;
    absl::Time last_used;
    uint64_t bytes = 0;
    uint64_t reserved = 0;  // by runs in flight (Reservation)
    uint64_t runs = 0;      // reservations open
    absl::flat_hash_map<std::string, BufferInfo> buffers;
    absl::flat_hash_map<std::string, std::shared_ptr<const HeldModel>> models;
    struct HeldGraph {
      std::string digest;
      std::shared_ptr<const DecodedGraph> graph;
      uint64_t bytes = 0;
    };
    std::vector<HeldGraph> graphs;  // oldest first, at most kMaxHeldGraphs
  };
  // RESOURCE_EXHAUSTED when `bytes` more do not fit the session's or its owner's limit (mu_ held).
  absl::Status check_bytes_locked(const Session& s, const Owner& o, uint64_t bytes, std::string_view what) const;
  absl::StatusOr<Session*> find(const std::string& id, const std::string& tenant = "");  // mu_ held
  // A buffer of the session (and, in `owner`, the session); NOT_FOUND naming it. mu_ held.
  absl::StatusOr<BufferInfo*> find_buffer(const std::string& session, const std::string& buffer_id,
                                          const std::string& tenant, Session** owner = nullptr);

  SessionOptions opts_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_;
  absl::flat_hash_map<std::string, Owner> owners_;  // by tenant
};

// 128 random bits as 32 hex characters.
std::string random_id();

}  // namespace uop::server
