// The scheduler's workers (docs/ARCHITECTURE.md, The service): uop-worker processes it starts itself (embedded
// mode, one per CPU or CUDA device slot) and workers started elsewhere that registered by
// address.
// A WorkerHandle is one device slot; the process behind it may change: every time it dies
// the handle's generation goes up (the buffers and programs it held are gone) and an
// embedded worker is started again in the background, with backoff. A supervisor thread
// reaps dead embedded workers even when no RPC is in flight, and it is the only thread
// that forks them (PR_SET_PDEATHSIG follows the forking *thread*, so it must outlive them).
// A worker that finds its device unusable at start (no CUDA driver, no GPU: it prints
// `UNAVAILABLE <why>` and exits with status 3) makes its slot unavailable for good: it is
// not restarted, and worker_for answers UNAVAILABLE with the worker's message at once.
// A remote slot has a cluster-wide name (its device(): what sessions, buffers and plans
// say), which is the worker's own device unless it registered under another name or asked
// for one ("auto": the lowest free name of its kind, kept for the same instance). Remote
// workers register again every few seconds (a heartbeat); a registration of the process
// that already serves the slot changes nothing.
// Every call to a worker is authenticated (transport/cluster_auth.h): an embedded worker
// checks a random secret made for its process and handed to it at start through an
// inherited pipe (never argv or the environment), a remote one the cluster secret (or
// mutual TLS). Buffer ids on a worker are 64 random bits, so that knowing one id tells
// nothing about another.
//
// Tenant isolation (WorkerPool::isolate_tenants, on whenever uopd has a tokens file): a
// tenant's buffers and kernels live only in worker processes that serve that tenant alone,
// so neither a bug in the bounds proof nor a kernel that escapes it can reach another
// tenant's memory. An embedded slot (CPU:0, CUDA:1) then gets one process per tenant that
// uses it, started on the tenant's first request for the device, capped in number
// (TenantIsolation::max_workers: at the cap an idle one is retired to make room, else the request is
// RESOURCE_EXHAUSTED naming the limit) and retired once idle (no session of the tenant on
// the device, no request holding it) for TenantIsolation::idle. A remote worker cannot be
// multiplied: it serves one tenant at a time, bound on first use and released the same
// way once idle; meanwhile another tenant's request for it is RESOURCE_EXHAUSTED.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker.grpc.pb.h"
#include "transport/cluster_auth.h"
#include "transport/exec_lane.h"

namespace uop {

struct WorkerOptions {
  std::string worker_binary;  // path to uop-worker
  int embedded_cpu_workers = 2;
  int embedded_cuda_workers = 0;  // CUDA:0 .. CUDA:N-1, each started with --device=CUDA:i
  int threads_per_worker = 0;  // 0: the worker's default (hardware threads)
  std::vector<std::string> extra_args;  // passed to every embedded worker, e.g. --max-buffer-bytes=N
  // Execute and buffer traffic to embedded workers through shared memory
  // (transport/exec_lane.h) rather than gRPC.
  bool exec_lane = true;
  absl::Duration start_timeout = absl::Seconds(15);  // until the LISTENING line
  absl::Duration restart_backoff_min = absl::Milliseconds(100);
  absl::Duration restart_backoff_max = absl::Seconds(5);
  absl::Duration stop_timeout = absl::Seconds(5);  // shutdown: SIGTERM, then SIGKILL
};

// Tenant isolation (see the top of this file).
struct TenantIsolation {
  size_t max_workers = 8;                        // embedded tenant processes at once
  absl::Duration idle = absl::Minutes(2);        // unused this long, a tenant's process is retired
  // Whether `tenant` has a session on `device` (SessionManager::uses_device): a worker of
  // a tenant with one is never retired.
  std::function<bool(const std::string& tenant, const std::string& device)> in_use;
};

// What a remote worker sends Registry.Register (proto/worker.proto RegisterRequest).
struct RemoteRegistration {
  std::string address;        // HOST:PORT where the scheduler reaches it
  std::string device;         // its own device, checked against what its Info says
  std::string name;           // "" (= device), "KIND:N" of the device's kind, or "auto"
  std::string instance;       // auto: its stable identity; empty: the address
  std::string previous_name;  // auto: the name it was given before, kept when still free
};

struct RemoteRegistered {
  std::string worker_id;
  std::string name;  // the slot's (cluster-wide) device name
};

struct WorkerStatusSnapshot {
  std::string id, device, address, state;
  std::string tenant;  // the tenant the process serves alone (tenant isolation); "" shared
  int64_t pid = 0;
  uint64_t restarts = 0;
  uint64_t generation = 0;
  bool embedded = false;
  std::string last_error;
};

class WorkerHandle {
 public:
  const std::string& id() const { return id_; }
  const std::string& device() const { return device_; }
  bool embedded() const { return embedded_; }
  // The tenant this embedded process serves alone (tenant isolation), "" for a shared slot.
  const std::string& tenant() const { return tenant_; }
  std::string address() const;
  std::string state() const;  // "up", "starting", "down" or "unavailable"
  int64_t pid() const;        // 0 when no process is known
  uint64_t restarts() const;
  std::string last_error() const;
  // "worker CPU:0 (pid 1234)" or "worker CPU:2 at host:port", for messages.
  std::string describe() const;

  // The stub of the current process; null while the worker is not up. Shared so that a
  // restart replacing it does not pull it from under a call in progress.
  std::shared_ptr<uopd::worker::v1::Worker::Stub> stub() const;
  // The execute lane to the current process: an embedded worker's, once it serves it;
  // null otherwise (then Execute goes through stub()). Shared for the same reason.
  std::shared_ptr<ExecLane> lane() const;
  uint64_t generation() const;

  // A buffer id for the current process: 64 bits from the OS's CSPRNG (drawn ahead), never 0, drawn
  // again while it equals one handed out for this generation and not released (the
  // worker refuses an id in use, and a failed run frees what it tried to allocate, so an
  // id must never be handed out twice).
  uint64_t new_buffer_id();
  // The ids are free again (their buffers were freed). Ignored for another generation:
  // a new process holds none of the old one's ids.
  void release_buffer_ids(std::span<const uint64_t> ids, uint64_t generation);

  // What the scheduler loaded on this worker, cleared whenever the generation changes.
  // With a generation, a record for an older process is ignored.
  bool has_program(const std::string& key) const;
  void note_program(const std::string& key, std::optional<uint64_t> generation = std::nullopt);
  // The worker unloaded these (its program budget): the next Run that needs one loads it.
  void forget_programs(std::span<const std::string> keys, uint64_t generation);

  WorkerHandle(std::string id, std::string device, bool embedded, std::string tenant = "")
      : id_(std::move(id)), device_(std::move(device)), tenant_(std::move(tenant)), embedded_(embedded) {}

 private:
  friend class WorkerPool;
  enum class State { Starting, Up, Down };

  std::string describe_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void connect_locked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Another process: nothing loaded, no buffer ids in use.
  void new_generation_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The process behind the handle is gone: new generation, nothing loaded, no stub.
  void lose_process_locked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string id_, device_, tenant_;
  const bool embedded_;
  // Tenant isolation: when a request last took this worker; for a remote slot, the tenant it
  // is bound to ("" none); for a tenant process, whether it is being retired (stopped, never
  // restarted, dropped from the pool once reaped).
  absl::Time last_used_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::atomic<int> leases_{0};  // pointers worker_for / worker_by_id handed out that still live
  std::string bound_tenant_ ABSL_GUARDED_BY(mu_);
  bool retiring_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::Down;
  std::string address_ ABSL_GUARDED_BY(mu_);
  int64_t pid_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t restarts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  // Set when the worker said at start that its device cannot be used: its message. The
  // slot stays down from then on.
  std::string unavailable_ ABSL_GUARDED_BY(mu_);
  absl::Time last_death_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::shared_ptr<uopd::worker::v1::Worker::Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ExecLane> lane_ ABSL_GUARDED_BY(mu_);  // made for each embedded process
  absl::flat_hash_set<std::string> programs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> buffer_ids_ ABSL_GUARDED_BY(mu_);  // handed out, not released
  // Random ids drawn ahead, 32 to a getrandom call (256 bytes, which it never cuts short):
  // a run of 100 kernels draws about as many, and a system call each was a twentieth of
  // its time in uopd.
  std::array<uint64_t, 32> drawn_ ABSL_GUARDED_BY(mu_){};
  size_t drawn_left_ ABSL_GUARDED_BY(mu_) = 0;
  // How stub_ reaches the process: the pool's dialer, with an embedded process's own secret.
  cluster_auth::Dialer dial_ ABSL_GUARDED_BY(mu_);

  // Embedded only: the process being started or running, and when to start the next one.
  bool reaped_ ABSL_GUARDED_BY(mu_) = true;        // pid_ has been waited for (or there is none)
  int stdout_fd_ ABSL_GUARDED_BY(mu_) = -1;        // open while starting
  std::string stdout_buf_ ABSL_GUARDED_BY(mu_);    // until the LISTENING line
  absl::Time start_deadline_ ABSL_GUARDED_BY(mu_);
  absl::Time restart_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time up_since_ ABSL_GUARDED_BY(mu_);
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  uint64_t starts_ ABSL_GUARDED_BY(mu_) = 0;       // processes started
  uint64_t failed_starts_ ABSL_GUARDED_BY(mu_) = 0;
  // Remote only: when to probe a down worker next.
  absl::Time next_probe_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time down_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // when it was last seen to go down
  // Remote only: the device the worker itself serves (its Info), which differs from
  // device_ for a worker registered under another name; and, for an automatic name, the
  // instance the name belongs to (empty for a name the worker chose).
  std::string local_device_ ABSL_GUARDED_BY(mu_);
  std::string instance_ ABSL_GUARDED_BY(mu_);
};

class WorkerPool {
 public:
  // `dial`: how to reach workers: mutual TLS when it has credentials, and the secret that
  // workers registering from elsewhere check (the cluster secret). Embedded workers are
  // dialled the same way with a secret of their own instead, and are handed dial.secret
  // to present to the scheduler's internal services (their collectives' Rendezvous).
  explicit WorkerPool(cluster_auth::Dialer dial = {}) : dial_(std::move(dial)) {}
  ~WorkerPool();  // shutdown()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts options.embedded_cpu_workers uop-worker processes, "CPU:0", "CPU:1", ..., then
  // options.embedded_cuda_workers, "CUDA:0", ..., and waits until each is up. If one cannot
  // start (no binary, no LISTENING line within start_timeout) every worker it started is
  // stopped again and the error names it. A CUDA worker whose device is unavailable is no
  // such failure: its slot is marked unavailable and the others serve.
  absl::Status start_embedded(const WorkerOptions& options);

  // Registry.Register: reaches the worker at `r.address` (Info; INVALID_ARGUMENT if it says
  // it serves another device than `r.device`, UNAVAILABLE if it cannot be reached) and
  // serves a slot with it:
  //  - name "" or "KIND:N" (the device's kind): that slot. ALREADY_EXISTS when an embedded
  //    worker serves it, or a worker at another address that still answers Info with the
  //    pid the slot knows (two live workers never take a name from each other in turn).
  //  - name "auto": the slot already named for `r.instance` (the address if empty), else
  //    `r.previous_name` if free, else the lowest free KIND:N. Free: no slot has the name,
  //    or an automatically named remote slot has been down for kAutoNameReclaim (its
  //    instance did not come back; the slot moves to a new generation).
  // The process already serving the slot (same address and pid) registering again is a
  // no-op (a heartbeat; a slot marked down comes back up with its generation); another
  // process replaces it with a new generation.
  absl::StatusOr<RemoteRegistered> register_remote(const RemoteRegistration& r);
  // The same with name "" (the worker's device is its name): returns the worker id.
  absl::StatusOr<std::string> register_remote(const std::string& address, const std::string& device);

  // How long an automatically named remote slot must have been down before another
  // instance may take its name.
  static constexpr absl::Duration kAutoNameReclaim = absl::Seconds(60);

  // The worker for `device` (names are exact: "CPU:0", "CUDA:0"), waiting up to `wait`
  // while it (re)starts. UNAVAILABLE naming the device and the last error if none is up,
  // at once for an unavailable device (with the worker's message).
  // With tenant isolation, `tenant` picks (or starts, see the top of this file) the
  // tenant's own process for the device; "" is the shared slot, for calls that touch no
  // tenant's data (Info).
  absl::StatusOr<std::shared_ptr<WorkerHandle>> worker_for(const std::string& device,
                                                           absl::Duration wait = absl::Seconds(10),
                                                           const std::string& tenant = "");
  // The handle with this id (WorkerHandle::id, as BufferInfo records it), if the pool still
  // has it: what freeing a buffer goes to, whatever process now serves its device.
  std::shared_ptr<WorkerHandle> worker_by_id(const std::string& id) const;

  // Turns tenant isolation on (see the top of this file). Call once, before any request.
  void isolate_tenants(TenantIsolation isolation);

  // Call after an RPC to `w` failed. The worker's own answers (INVALID_ARGUMENT, NOT_FOUND,
  // ...) come back unchanged. For a transport failure it finds out whether the worker is
  // dead: an embedded process that exited is reaped and described ("worker CPU:0 (pid
  // 1234) killed by signal 9 (SIGKILL)"), one that no longer answers is killed; a remote
  // one that does not answer is marked down. A dead worker's slot moves to a new
  // generation and an embedded one restarts in the background. Returns what to hand the
  // client: UNAVAILABLE saying which worker and why, or (worker alive and answering) the
  // RPC's own code with the worker named. `used_generation`, if given, is the generation
  // the failed call went to: a worker that already restarted since is reported as dead.
  absl::Status on_failure(const std::shared_ptr<WorkerHandle>& w, const absl::Status& rpc_status,
                          std::optional<uint64_t> used_generation = std::nullopt);

  std::vector<WorkerStatusSnapshot> snapshot() const;

  // SIGTERM every embedded worker, wait up to stop_timeout, SIGKILL the rest, reap them
  // all: no orphans, no zombies. Drain the scheduler's own calls first. Idempotent.
  void shutdown();

 private:
  void supervise();
  void supervise_one(const std::shared_ptr<WorkerHandle>& h, absl::Time now, bool readable);
  bool spawn_locked(WorkerHandle& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu_);
  bool reap_locked(WorkerHandle& h, bool block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu_);
  // Reads what a starting worker has printed so far; true at end of file.
  bool read_startup_output_locked(WorkerHandle& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu_);
  void schedule_restart_locked(WorkerHandle& h, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu_);
  void probe_remote(const std::shared_ptr<WorkerHandle>& h);
  // Tenant isolation: the tenant's process for an embedded slot (made if need be), or the
  // remote slot bound to the tenant.
  absl::StatusOr<std::shared_ptr<WorkerHandle>> tenant_worker_locked(const std::string& device, const std::string& tenant,
                                                                     absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether nobody but the pool holds `h`, `tenant` has no session on its device and, with
  // `for_a_while`, it has not been taken for TenantIsolation::idle. Locks h's mutex.
  bool idle_locked(const std::shared_ptr<WorkerHandle>& h, const std::string& tenant, absl::Time now,
                   bool for_a_while) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `h` as handed to a caller: while any copy of the result lives, h counts as in use.
  static std::shared_ptr<WorkerHandle> lease(std::shared_ptr<WorkerHandle> h);
  // Stops (SIGTERM) a tenant process for good; the supervisor reaps it and drops it.
  static void retire_locked(WorkerHandle& h, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu_);
  // One supervisor round of tenant isolation: retire idle tenant processes, release idle
  // remote bindings, drop retired processes that have been reaped.
  void retire_idle(absl::Time now);
  std::shared_ptr<WorkerHandle> find_locked(const std::string& device) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // register_remote's choice for name "auto": a slot to take (null: none yet) and its name.
  std::pair<std::shared_ptr<WorkerHandle>, std::string> pick_auto_name_locked(const std::string& kind,
                                                                              const std::string& instance,
                                                                              const std::string& previous,
                                                                              absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::shared_ptr<WorkerHandle>> handles() const;
  void ensure_supervisor_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool stopping() const;

  const cluster_auth::Dialer dial_;
  WorkerOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<WorkerHandle>> handles_ ABSL_GUARDED_BY(mu_);
  uint64_t remote_count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tenant_count_ ABSL_GUARDED_BY(mu_) = 0;  // tenant processes made, for their ids
  std::optional<TenantIsolation> isolation_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stopping_{false};  // read under handle locks, so not under mu_
  std::thread supervisor_ ABSL_GUARDED_BY(mu_);  // started by the first start_embedded or register_remote
};

// A channel to a worker with the message limits the worker protocol needs, dialled as
// `dial` says (TLS, the secret the worker checks).
std::shared_ptr<uopd::worker::v1::Worker::Stub> worker_stub(const std::string& address, const cluster_auth::Dialer& dial);

}  // namespace uop
