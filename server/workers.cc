// WorkerPool: its slots, and starting, watching, restarting and stopping the uop-worker
// processes it runs itself (remote workers register in server/remote_workers.cc). Process
// rules: only the supervisor thread forks; a child does nothing but async-signal-safe calls
// before exec; every process started is reaped exactly once, by whoever holds its handle's
// lock when it exits (the supervisor or on_failure).
#include "server/workers.h"

#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "compiler/support/strings.h"
#include "server/worker_process.h"
#include "server/workers_internal.h"

namespace uop {

namespace wv1 = uopd::worker::v1;

using workers_internal::kProbeTimeout;
using workers_internal::log;
using workers_internal::probe;
using workers_internal::ProbeResult;

namespace {

constexpr absl::Duration kSupervisorTick = absl::Milliseconds(100);
constexpr absl::Duration kRemoteProbeEvery = absl::Seconds(2);
constexpr absl::Duration kStableUptime = absl::Seconds(10);  // a worker up this long resets its backoff
constexpr absl::Duration kDeathGrace = absl::Seconds(2);     // a closed socket before a reapable exit
constexpr size_t kMaxStartupLine = 1024;
// uop-worker's answer when its device cannot be used: this line instead of LISTENING, then
// this exit status (worker/main.cc).
constexpr std::string_view kUnavailablePrefix = "UNAVAILABLE ";
constexpr int kExitDeviceUnavailable = 3;

// Codes a dying or unreachable worker produces (gRPC reports a reset connection as
// UNAVAILABLE, UNKNOWN "Stream removed" or INTERNAL "RST_STREAM", depending on timing).
bool transport_failure(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::shared_ptr<wv1::Worker::Stub> worker_stub(const std::string& address, const cluster_auth::Dialer& dial) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // A fresh channel per process: a dead worker's port may be reused by anyone.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return std::shared_ptr<wv1::Worker::Stub>(wv1::Worker::NewStub(dial.channel(address, args)));
}

// ---- WorkerHandle ----

std::string WorkerHandle::address() const {
  absl::MutexLock lock(&mu_);
  return address_;
}

std::string WorkerHandle::state() const {
  absl::MutexLock lock(&mu_);
  if (state_ != State::Up && !unavailable_.empty()) return "unavailable";
  switch (state_) {
    case State::Up: return "up";
    case State::Starting: return "starting";
    case State::Down: return "down";
  }
  return "down";
}

int64_t WorkerHandle::pid() const {
  absl::MutexLock lock(&mu_);
  return pid_;
}

uint64_t WorkerHandle::restarts() const {
  absl::MutexLock lock(&mu_);
  return restarts_;
}

std::string WorkerHandle::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

std::string WorkerHandle::describe() const {
  absl::MutexLock lock(&mu_);
  return describe_locked();
}

std::string WorkerHandle::describe_locked() const {
  if (embedded_) return pid_ ? cat("worker ", device_, " (pid ", pid_, ")") : cat("worker ", device_);
  return cat("worker ", device_, " at ", address_);
}

std::shared_ptr<wv1::Worker::Stub> WorkerHandle::stub() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::Up ? stub_ : nullptr;
}

std::shared_ptr<ExecLane> WorkerHandle::lane() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::Up && lane_ && lane_->served() ? lane_ : nullptr;
}

uint64_t WorkerHandle::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool WorkerHandle::has_program(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  return programs_.contains(key);
}

void WorkerHandle::note_program(const std::string& key, std::optional<uint64_t> generation) {
  absl::MutexLock lock(&mu_);
  if (generation && *generation != generation_) return;  // loaded into a process that is gone
  programs_.insert(key);
}

void WorkerHandle::forget_programs(std::span<const std::string> keys, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != generation_) return;  // a new process holds none of them anyway
  for (const std::string& k : keys) programs_.erase(k);
}

uint64_t WorkerHandle::new_buffer_id() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (drawn_left_ == 0) {
      if (getrandom(drawn_.data(), sizeof drawn_, 0) != static_cast<ssize_t>(sizeof drawn_)) continue;  // EINTR, or a short read
      drawn_left_ = drawn_.size();
    }
    const uint64_t id = drawn_[--drawn_left_];
    if (id != 0 && buffer_ids_.insert(id).second) return id;
  }
}

void WorkerHandle::release_buffer_ids(std::span<const uint64_t> ids, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (generation != generation_) return;
  for (uint64_t id : ids) buffer_ids_.erase(id);
}

void WorkerHandle::new_generation_locked() {
  ++generation_;
  programs_.clear();
  buffer_ids_.clear();
}

void WorkerHandle::connect_locked(const std::string& address) {
  address_ = address;
  stub_ = worker_stub(address, dial_);
  state_ = State::Up;
  up_since_ = absl::Now();
}

void WorkerHandle::lose_process_locked(const std::string& why) {
  new_generation_locked();
  stub_.reset();
  lane_.reset();
  state_ = State::Down;
  last_error_ = why;
  last_death_ = absl::Now();
  down_since_ = last_death_;
}

// ---- WorkerPool ----

WorkerPool::~WorkerPool() { shutdown(); }

std::vector<std::shared_ptr<WorkerHandle>> WorkerPool::handles() const {
  absl::MutexLock lock(&mu_);
  return handles_;
}

bool WorkerPool::stopping() const { return stopping_.load(); }

void WorkerPool::ensure_supervisor_locked() {
  if (!supervisor_.joinable() && !stopping()) supervisor_ = std::thread([this] { supervise(); });
}

absl::Status WorkerPool::start_embedded(const WorkerOptions& options) {
  if (options.worker_binary.empty()) return absl::InvalidArgumentError("no uop-worker binary given");
  if (options.embedded_cpu_workers < 0 || options.embedded_cuda_workers < 0)
    return absl::InvalidArgumentError("a negative number of embedded workers");
  // (device, handle id) of every embedded slot; CPU ids stay "embedded-<i>".
  std::vector<std::pair<std::string, std::string>> slots;
  for (int i = 0; i < options.embedded_cpu_workers; ++i) slots.emplace_back(cat("CPU:", i), cat("embedded-", i));
  for (int i = 0; i < options.embedded_cuda_workers; ++i) slots.emplace_back(cat("CUDA:", i), cat("embedded-cuda-", i));
  std::vector<std::shared_ptr<WorkerHandle>> started;
  {
    absl::MutexLock lock(&mu_);
    if (started_ || stopping()) return absl::FailedPreconditionError("the embedded workers were started already");
    for (const auto& h : handles_)
      for (const auto& [device, id] : slots)
        if (h->device() == device)
          return absl::AlreadyExistsError(cat("a remote worker serves ", h->device(), " already"));
    started_ = true;
    options_ = options;
    for (const auto& [device, id] : slots) {
      auto h = std::make_shared<WorkerHandle>(id, device, true);
      absl::MutexLock hl(&h->mu_);
      h->backoff_ = options.restart_backoff_min;
      h->restart_at_ = absl::InfinitePast();  // the supervisor starts it on its first round
      handles_.push_back(h);
      started.push_back(h);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ensure_supervisor_locked();
  }

  absl::Time deadline = absl::Now() + options.start_timeout + kSupervisorTick * 5;
  std::vector<std::string> errors;
  for (const auto& h : started) {
    absl::MutexLock lock(&h->mu_);
    auto settled = [&h]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return h->state_ == WorkerHandle::State::Up || h->failed_starts_ > 0 || !h->unavailable_.empty();
    };
    h->mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
    if (!h->unavailable_.empty()) continue;  // logged when it exited; the others serve
    if (h->state_ != WorkerHandle::State::Up)
      errors.push_back(h->last_error_.empty() ? cat("worker ", h->device_, " did not start in time") : h->last_error_);
  }
  if (errors.empty()) return absl::OkStatus();
  shutdown();
  return absl::UnavailableError(cat("cannot start the embedded workers: ", join(errors, "; ")));
}

bool WorkerPool::spawn_locked(WorkerHandle& h) {
  // --embedded=PID, not a parent of pid 1, tells the worker it was orphaned: uopd may be
  // pid 1 itself (a container without an init).
  std::vector<std::string> args = {options_.worker_binary, cat("--device=", h.device_), "--listen=127.0.0.1:0",
                                   cat("--embedded=", getpid())};
  if (options_.threads_per_worker > 0) args.push_back(cat("--threads=", options_.threads_per_worker));
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  // A lane of its own for each process: one that died takes its segment (and whatever a
  // slot of it held) along.
  std::shared_ptr<ExecLane> lane;
  if (options_.exec_lane) {
    auto made = ExecLane::create();
    if (made.ok()) {
      lane = std::move(*made);
      args.push_back(cat("--lane-fd=", lane->fd()));
    } else {
      log("no execute lane for worker ", h.device_, " (", made.status().message(), "): its calls go over gRPC");
    }
  }
  // The secret this process checks on every call, and the one it presents to the
  // scheduler's internal services, through a pipe it reads at start: never in argv or the
  // environment, where other users of the host could read them.
  const std::string secret = cluster_auth::random_secret();
  auto secret_fd = readable_pipe(cat(secret, "\n", dial_.secret));
  if (!secret_fd.ok()) {
    ++h.failed_starts_;
    schedule_restart_locked(h, cat("cannot start worker ", h.device_, ": ", secret_fd.status().message()));
    return false;
  }
  args.push_back(cat("--secret-fd=", *secret_fd));
  std::vector<int> inherit = {*secret_fd};
  if (lane) inherit.push_back(lane->fd());
  auto child = spawn_child(args, inherit);
  close(*secret_fd);
  if (!child.ok()) {
    ++h.failed_starts_;
    schedule_restart_locked(h, cat("cannot start worker ", h.device_, ": ", child.status().message()));
    return false;
  }
  h.pid_ = child->pid;
  h.dial_ = dial_.with_secret(secret);
  if (lane) lane->set_peer(child->pid);
  h.lane_ = std::move(lane);
  h.reaped_ = false;
  h.stdout_fd_ = child->stdout_fd;
  h.stdout_buf_.clear();
  h.state_ = WorkerHandle::State::Starting;
  h.start_deadline_ = absl::Now() + options_.start_timeout;
  ++h.starts_;
  return true;
}

bool WorkerPool::read_startup_output_locked(WorkerHandle& h) {
  char buf[512];
  for (;;) {
    ssize_t n = read(h.stdout_fd_, buf, sizeof buf);
    if (n > 0) {
      h.stdout_buf_.append(buf, static_cast<size_t>(n));
      if (h.stdout_buf_.size() > kMaxStartupLine) return false;  // the caller gives up on it
      continue;
    }
    return n == 0;  // EAGAIN: nothing more for now
  }
}

bool WorkerPool::reap_locked(WorkerHandle& h, bool block) {
  if (h.reaped_ || h.pid_ <= 0) return false;
  std::optional<std::string> how = reap_child(static_cast<pid_t>(h.pid_), block);
  if (!how) return false;  // still running
  h.reaped_ = true;
  bool starting = h.state_ == WorkerHandle::State::Starting;
  std::string why = cat("worker ", h.device_, " (pid ", h.pid_, ") ", *how, starting ? " while starting" : "");
  if (starting && h.unavailable_.empty()) {
    // Its last words may still sit in the pipe: an UNAVAILABLE line, read before the exit.
    if (h.stdout_fd_ >= 0) read_startup_output_locked(h);
    std::string_view out = h.stdout_buf_;
    if (out.rfind(kUnavailablePrefix, 0) == 0 && out.find('\n') != std::string_view::npos)
      h.unavailable_ = std::string(out.substr(kUnavailablePrefix.size(), out.find('\n') - kUnavailablePrefix.size()));
    else if (*how == cat("exited with status ", kExitDeviceUnavailable))
      h.unavailable_ = cat(why, ": its device is unavailable (see the worker's log)");
  }
  if (h.stdout_fd_ >= 0) {
    close(h.stdout_fd_);
    h.stdout_fd_ = -1;
  }
  if (starting) ++h.failed_starts_;
  h.pid_ = 0;
  schedule_restart_locked(h, why);
  return true;
}

void WorkerPool::schedule_restart_locked(WorkerHandle& h, const std::string& why) {
  bool was_up = h.state_ == WorkerHandle::State::Up;
  absl::Time now = absl::Now();
  if (!h.unavailable_.empty()) {
    // Starting it again would only say the same: the slot stays down, with its message.
    h.lose_process_locked(h.unavailable_);
    h.restart_at_ = absl::InfiniteFuture();
    log(why, ": ", h.unavailable_, "; not restarting it");
    return;
  }
  h.lose_process_locked(why);
  if (stopping() || h.retiring_) {
    h.restart_at_ = absl::InfiniteFuture();
    return;
  }
  // Back off from a worker that keeps dying; one that ran a while starts over quickly.
  if (was_up && now - h.up_since_ >= kStableUptime) h.backoff_ = options_.restart_backoff_min;
  absl::Duration wait = h.backoff_;
  h.backoff_ = std::min(h.backoff_ * 2, options_.restart_backoff_max);
  h.restart_at_ = now + wait;
  log(why, "; restarting it in ", absl::ToInt64Milliseconds(wait), " ms");
}

void WorkerPool::supervise() {
  while (!stopping()) {
    std::vector<pollfd> fds;
    std::vector<const WorkerHandle*> owner;
    for (const auto& h : handles()) {
      absl::MutexLock lock(&h->mu_);
      if (h->stdout_fd_ >= 0) {
        fds.push_back({h->stdout_fd_, POLLIN, 0});
        owner.push_back(h.get());
      }
    }
    // The startup lines wake us early; otherwise this is the ~100 ms reaping tick. A
    // stale fd (closed meanwhile by on_failure) only causes a harmless extra round.
    poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(kSupervisorTick)));
    if (stopping()) break;
    absl::Time now = absl::Now();
    {
      std::vector<std::shared_ptr<WorkerHandle>> hs = handles();
      for (const auto& h : hs) {
        bool readable = false;
        for (size_t k = 0; k < fds.size(); ++k) readable |= owner[k] == h.get() && fds[k].revents != 0;
        supervise_one(h, now, readable);
      }
    }
    retire_idle(now);
  }
}

void WorkerPool::supervise_one(const std::shared_ptr<WorkerHandle>& hp, absl::Time now, bool readable) {
  WorkerHandle& h = *hp;
  if (!h.embedded_) {
    bool due = false;
    {
      absl::MutexLock lock(&h.mu_);
      due = h.state_ == WorkerHandle::State::Down && !h.address_.empty() && now >= h.next_probe_;
      if (due) h.next_probe_ = now + kRemoteProbeEvery;
    }
    if (due) probe_remote(hp);
    return;
  }
  absl::MutexLock lock(&h.mu_);
  reap_locked(h, false);
  if (h.state_ == WorkerHandle::State::Starting && h.stdout_fd_ >= 0 && readable) {
    bool eof = read_startup_output_locked(h);
    auto nl = h.stdout_buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = h.stdout_buf_.substr(0, nl);
      close(h.stdout_fd_);  // the worker prints nothing else on stdout
      h.stdout_fd_ = -1;
      constexpr std::string_view kPrefix = "LISTENING ";
      if (line.rfind(kUnavailablePrefix, 0) == 0) {
        // It exits at once; reaping it (now or on a later round) settles the slot.
        h.unavailable_ = line.substr(kUnavailablePrefix.size());
        reap_locked(h, false);
      } else if (line.rfind(kPrefix, 0) == 0 && line.size() > kPrefix.size()) {
        h.connect_locked(line.substr(kPrefix.size()));
        if (h.starts_ > 1) ++h.restarts_;
        log(h.describe_locked(), " is up at ", h.address_);
      } else {
        kill(static_cast<pid_t>(h.pid_), SIGKILL);
        int64_t pid = h.pid_;
        reap_locked(h, true);
        h.last_error_ = cat("worker ", h.device_, " (pid ", pid, ") printed '", line.substr(0, 200),
                            "' instead of LISTENING HOST:PORT; killed it");
      }
    } else if (eof || h.stdout_buf_.size() > kMaxStartupLine) {
      // Exiting, or not a uop-worker: reaping or the startup deadline will say which.
      close(h.stdout_fd_);
      h.stdout_fd_ = -1;
    }
  }
  if (h.state_ == WorkerHandle::State::Starting && now >= h.start_deadline_) {
    int64_t pid = h.pid_;
    kill(static_cast<pid_t>(pid), SIGKILL);
    reap_locked(h, true);
    if (h.unavailable_.empty())
      h.last_error_ = cat("worker ", h.device_, " (pid ", pid, ") did not report LISTENING within ",
                        absl::FormatDuration(options_.start_timeout), "; killed it");
    log(h.last_error_);
  }
  if (h.state_ == WorkerHandle::State::Down && !stopping() && now >= h.restart_at_) spawn_locked(h);
}

std::shared_ptr<WorkerHandle> WorkerPool::find_locked(const std::string& device) const {
  for (const auto& x : handles_)
    if (x->device() == device && x->tenant_.empty()) return x;
  return nullptr;
}

absl::StatusOr<std::shared_ptr<WorkerHandle>> WorkerPool::worker_for(const std::string& device, absl::Duration wait,
                                                                     const std::string& tenant) {
  std::shared_ptr<WorkerHandle> h;
  std::vector<std::string> known;
  {
    absl::MutexLock lock(&mu_);
    if (isolation_ && !tenant.empty()) {
      auto mine = tenant_worker_locked(device, tenant, absl::Now());
      if (!mine.ok()) return mine.status();
      h = *mine;
    } else {
      for (const auto& x : handles_) {
        if (!x->tenant_.empty()) continue;
        known.push_back(x->device());
        if (x->device() == device) h = x;
      }
    }
  }
  if (!h)
    return absl::UnavailableError(cat("no worker serves device ", device, known.empty() ? std::string(" (there are none)")
                                                                          : cat(" (devices: ", join(known, ", "), ")")));
  h = lease(std::move(h));  // in use from here until the caller lets go
  absl::MutexLock lock(&h->mu_);
  h->last_used_ = absl::Now();
  auto ready = [&h, this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return h->state_ == WorkerHandle::State::Up || stopping() || !h->unavailable_.empty() || h->retiring_;
  };
  h->mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  if (h->state_ == WorkerHandle::State::Up) return h;
  const std::string& why = h->unavailable_.empty() ? h->last_error_ : h->unavailable_;
  return absl::UnavailableError(cat("no worker for device ", device, " is up", why.empty() ? std::string() : cat(": ", why)));
}

std::shared_ptr<WorkerHandle> WorkerPool::worker_by_id(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& x : handles_)
    if (x->id() == id) return lease(x);
  return nullptr;
}

std::shared_ptr<WorkerHandle> WorkerPool::lease(std::shared_ptr<WorkerHandle> h) {
  // The pointer returned shares ownership of a Lease (which keeps the handle alive) and
  // points at the handle: callers see a plain shared_ptr<WorkerHandle>, and the count
  // drops when its last copy goes.
  struct Lease {
    explicit Lease(std::shared_ptr<WorkerHandle> x) : h(std::move(x)) { h->leases_.fetch_add(1); }
    ~Lease() { h->leases_.fetch_sub(1); }
    std::shared_ptr<WorkerHandle> h;
  };
  WorkerHandle* raw = h.get();
  return std::shared_ptr<WorkerHandle>(std::make_shared<Lease>(std::move(h)), raw);
}

void WorkerPool::isolate_tenants(TenantIsolation isolation) {
  absl::MutexLock lock(&mu_);
  isolation_ = std::move(isolation);
}

absl::StatusOr<std::shared_ptr<WorkerHandle>> WorkerPool::tenant_worker_locked(const std::string& device,
                                                                               const std::string& tenant,
                                                                               absl::Time now) {
  for (const auto& x : handles_) {
    if (x->tenant_ != tenant || x->device() != device) continue;
    absl::MutexLock hl(&x->mu_);
    if (!x->retiring_) return x;
  }
  std::shared_ptr<WorkerHandle> slot = find_locked(device);
  if (!slot) {
    std::vector<std::string> known;
    for (const auto& x : handles_)
      if (x->tenant_.empty()) known.push_back(x->device());
    return absl::UnavailableError(cat("no worker serves device ", device, known.empty() ? std::string(" (there are none)")
                                                                          : cat(" (devices: ", join(known, ", "), ")")));
  }
  if (!slot->embedded()) {
    // A remote process is one process: it serves one tenant until that tenant is done.
    absl::MutexLock hl(&slot->mu_);
    if (slot->bound_tenant_.empty() || slot->bound_tenant_ == tenant) {
      if (slot->bound_tenant_.empty()) log(slot->describe_locked(), " now serves one tenant (tenant isolation)");
      slot->bound_tenant_ = tenant;
      return slot;
    }
    return absl::ResourceExhaustedError(cat("device ", device, " is a remote worker serving another tenant now (tenant ",
                                            "isolation: one tenant per worker process); retry once it is free"));
  }
  {
    absl::MutexLock hl(&slot->mu_);
    if (!slot->unavailable_.empty())
      return absl::UnavailableError(cat("no worker for device ", device, " is up: ", slot->unavailable_));
  }
  std::vector<std::shared_ptr<WorkerHandle>> live;
  for (const auto& x : handles_) {
    if (x->tenant_.empty()) continue;
    absl::MutexLock hl(&x->mu_);
    if (!x->retiring_) live.push_back(x);
  }
  if (live.size() >= isolation_->max_workers) {
    // Make room by retiring the idle process used longest ago.
    std::shared_ptr<WorkerHandle> oldest;
    absl::Time oldest_use = absl::InfiniteFuture();
    for (const auto& x : live) {
      if (x->leases_.load() > 0 || !idle_locked(x, x->tenant_, now, false)) continue;
      absl::MutexLock hl(&x->mu_);
      if (x->last_used_ < oldest_use) {
        oldest = x;
        oldest_use = x->last_used_;
      }
    }
    if (!oldest)
      return absl::ResourceExhaustedError(cat("all ", isolation_->max_workers, " tenant worker processes are in use ",
                                              "(--max-tenant-workers); retry once a tenant's sessions close"));
    absl::MutexLock hl(&oldest->mu_);
    retire_locked(*oldest, "to make room for another tenant's worker");
  }
  auto h = std::make_shared<WorkerHandle>(cat(slot->id(), "-tenant-", ++tenant_count_), device, true, tenant);
  {
    absl::MutexLock hl(&h->mu_);
    h->backoff_ = options_.restart_backoff_min;
    h->restart_at_ = absl::InfinitePast();  // the supervisor starts it on its next round
    h->last_used_ = now;
  }
  handles_.push_back(h);
  ensure_supervisor_locked();
  return h;
}

bool WorkerPool::idle_locked(const std::shared_ptr<WorkerHandle>& h, const std::string& tenant, absl::Time now,
                             bool for_a_while) const {
  {
    absl::MutexLock hl(&h->mu_);
    if (for_a_while && now - h->last_used_ < isolation_->idle) return false;
  }
  return !isolation_->in_use || !isolation_->in_use(tenant, h->device());
}

void WorkerPool::retire_locked(WorkerHandle& h, const std::string& why) {
  if (h.retiring_) return;
  h.retiring_ = true;
  h.restart_at_ = absl::InfiniteFuture();
  log(h.describe_locked(), " retired ", why);
  if (h.pid_ > 0 && !h.reaped_) kill(static_cast<pid_t>(h.pid_), SIGTERM);  // the supervisor reaps it
  h.lose_process_locked(cat(h.describe_locked(), " was retired (tenant isolation)"));
}

void WorkerPool::retire_idle(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!isolation_) return;
  for (auto it = handles_.begin(); it != handles_.end();) {
    const std::shared_ptr<WorkerHandle>& h = *it;
    // A request holds the pointer worker_for gave it for as long as it uses the worker.
    const bool held = h->leases_.load() > 0;
    if (h->tenant_.empty()) {
      if (!h->embedded_ && !held) {
        std::string bound;
        {
          absl::MutexLock hl(&h->mu_);
          bound = h->bound_tenant_;
        }
        if (!bound.empty() && idle_locked(h, bound, now, true)) {
          absl::MutexLock hl(&h->mu_);
          h->bound_tenant_.clear();
          log(h->describe_locked(), " is free for any tenant again");
        }
      }
      ++it;
      continue;
    }
    bool retiring, gone;
    {
      absl::MutexLock hl(&h->mu_);
      retiring = h->retiring_;
      gone = h->reaped_ || h->pid_ <= 0;
    }
    if (retiring && gone && !held) {
      it = handles_.erase(it);
      continue;
    }
    if (!retiring && !held && idle_locked(h, h->tenant_, now, true)) {
      absl::MutexLock hl(&h->mu_);
      retire_locked(*h, cat("after ", absl::FormatDuration(isolation_->idle), " unused"));
    }
    ++it;
  }
}

absl::Status WorkerPool::on_failure(const std::shared_ptr<WorkerHandle>& w, const absl::Status& rpc_status,
                                    std::optional<uint64_t> used_generation) {
  if (rpc_status.ok() || !transport_failure(rpc_status.code())) return rpc_status;
  const absl::StatusCode code = rpc_status.code();
  // Died and already noticed (by the supervisor or another caller).
  auto lost = [&](const std::string& why, bool restarting) {
    return absl::UnavailableError(cat(why.empty() ? cat("worker ", w->device(), " is not up") : why,
                                      "; the request was lost with it",
                                      restarting ? "; the worker is being restarted" : ""));
  };
  int64_t pid = 0;
  {
    absl::MutexLock lock(&w->mu_);
    if (used_generation && *used_generation != w->generation_) return lost(w->last_error_, w->embedded_);
    if (w->state_ != WorkerHandle::State::Up) return lost(w->last_error_, w->embedded_);
    pid = w->pid_;
    // A death noticed moments ago explains a lost connection better than anything else.
    if (code != absl::StatusCode::kDeadlineExceeded && absl::Now() - w->last_death_ < kDeathGrace * 2 &&
        !w->last_error_.empty())
      return lost(w->last_error_, w->embedded_);
  }
  std::shared_ptr<wv1::Worker::Stub> stub = w->embedded() ? w->stub() : worker_stub(w->address(), dial_);
  ProbeResult r = probe(stub.get(), kProbeTimeout);
  if (r.status.ok() && r.info.pid() == pid) {
    // Alive and answering: the failure was the call's own (a deadline, a cancellation).
    return absl::Status(code, cat(w->describe(), ": ", rpc_status.message()));
  }

  if (!w->embedded()) {
    absl::MutexLock lock(&w->mu_);
    if (r.status.ok()) {  // a new process answers at that address
      std::string why = cat(w->describe_locked(), " restarted (pid ", pid, " -> ", r.info.pid(), ")");
      w->lose_process_locked(why);
      w->pid_ = r.info.pid();
      w->connect_locked(w->address_);
      return lost(why, false);
    }
    std::string why = cat(w->describe_locked(), " is unreachable: ", r.status.message());
    // Not a new generation: the same process may come back with its buffers intact.
    w->state_ = WorkerHandle::State::Down;
    w->stub_.reset();
    w->last_error_ = why;
    w->down_since_ = absl::Now();
    w->next_probe_ = absl::Now() + kRemoteProbeEvery;
    log(why);
    return absl::UnavailableError(cat(why, " (the request failed with: ", rpc_status.message(), ")"));
  }

  // Embedded and not answering: a process that was killed is reapable within moments of
  // its sockets closing.
  absl::Time deadline = absl::Now() + kDeathGrace;
  for (;;) {
    {
      absl::MutexLock lock(&w->mu_);
      if (w->pid_ != pid || w->state_ != WorkerHandle::State::Up || reap_locked(*w, false))
        return lost(w->last_error_, true);
      if (absl::Now() >= deadline) {
        // Alive but deaf: it cannot serve anyone. Kill it and start again.
        std::string why = cat(w->describe_locked(), " stopped answering (", r.status.message(), "); killed it");
        kill(static_cast<pid_t>(pid), SIGKILL);
        reap_locked(*w, true);
        w->last_error_ = why;
        log(why);
        return lost(why, true);
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::vector<WorkerStatusSnapshot> WorkerPool::snapshot() const {
  std::vector<WorkerStatusSnapshot> out;
  for (const auto& h : handles()) {
    WorkerStatusSnapshot s;
    s.id = h->id();
    s.device = h->device();
    s.tenant = h->tenant();
    s.embedded = h->embedded();
    s.state = h->state();
    absl::MutexLock lock(&h->mu_);
    s.address = h->address_;
    s.pid = h->pid_;
    s.restarts = h->restarts_;
    s.generation = h->generation_;
    s.last_error = h->last_error_;
    out.push_back(std::move(s));
  }
  return out;
}

void WorkerPool::shutdown() {
  if (stopping_.exchange(true)) return;
  // No restarts from here on. The workers were forked by the supervisor, so its exit
  // already sends them SIGTERM (PR_SET_PDEATHSIG); the explicit signal covers the rest.
  std::thread supervisor;
  {
    absl::MutexLock lock(&mu_);
    supervisor = std::move(supervisor_);
  }
  if (supervisor.joinable()) supervisor.join();
  std::vector<std::shared_ptr<WorkerHandle>> hs = handles();
  for (const auto& h : hs) {
    absl::MutexLock lock(&h->mu_);
    if (!h->embedded_ || h->reaped_ || h->pid_ <= 0) continue;
    // Our idle connection would hold up the worker's drain (it waits for clients to hang up).
    h->stub_.reset();
    kill(static_cast<pid_t>(h->pid_), SIGTERM);
  }
  absl::Time deadline = absl::Now() + options_.stop_timeout;
  for (;;) {
    bool all = true;
    for (const auto& h : hs) {
      absl::MutexLock lock(&h->mu_);
      reap_locked(*h, false);
      all = all && (h->reaped_ || h->pid_ <= 0 || !h->embedded_);
    }
    if (all || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (const auto& h : hs) {
    absl::MutexLock lock(&h->mu_);
    if (h->embedded_ && !h->reaped_ && h->pid_ > 0) {
      log(h->describe_locked(), " did not stop within ", absl::FormatDuration(options_.stop_timeout),
          "; killing it");
      kill(static_cast<pid_t>(h->pid_), SIGKILL);
      reap_locked(*h, true);
    }
    if (h->stdout_fd_ >= 0) {
      close(h->stdout_fd_);
      h->stdout_fd_ = -1;
    }
    h->state_ = WorkerHandle::State::Down;
    h->stub_.reset();
    h->lane_.reset();
    h->last_error_ = cat(h->describe_locked(), " stopped: the scheduler is shutting down");
  }
}

}  // namespace uop
