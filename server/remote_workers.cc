// WorkerPool's remote half: workers started elsewhere that register by address
// (Registry.Register, server/registry_service.cc), the names they are given, and probing
// a remote slot that went down until it answers again.
#include "server/workers.h"

#include <algorithm>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "compiler/support/strings.h"
#include "server/workers_internal.h"

namespace uop {

using workers_internal::kProbeTimeout;
using workers_internal::log;
using workers_internal::probe;
using workers_internal::ProbeResult;

namespace {

// "CUDA:3" -> "CUDA"; "" for anything not KIND:N.
std::string kind_of(const std::string& device) {
  auto colon = device.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == device.size() || colon + 6 < device.size() ||
      device.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    return "";
  return device.substr(0, colon);
}

}  // namespace

void WorkerPool::probe_remote(const std::shared_ptr<WorkerHandle>& h) {
  std::string address = h->address();
  // A fresh channel: the old one may sit in a long reconnect backoff.
  auto stub = worker_stub(address, dial_);
  ProbeResult r = probe(stub.get(), kProbeTimeout);
  if (!r.status.ok()) return;
  absl::MutexLock lock(&h->mu_);
  if (h->state_ != WorkerHandle::State::Down || h->address_ != address) return;
  if (r.info.pid() != h->pid_) {
    h->new_generation_locked();  // a new process: what the old one held is gone
    h->pid_ = r.info.pid();
  }
  h->connect_locked(address);
  log(h->describe_locked(), " is reachable again (pid ", h->pid_, ")");
}

std::pair<std::shared_ptr<WorkerHandle>, std::string> WorkerPool::pick_auto_name_locked(const std::string& kind,
                                                                                        const std::string& instance,
                                                                                        const std::string& previous,
                                                                                        absl::Time now) {
  // A slot another instance gave up on: automatically named, remote, down for a while.
  auto reclaimable = [now](const std::shared_ptr<WorkerHandle>& h) {
    if (h->embedded()) return false;
    absl::MutexLock lock(&h->mu_);
    return !h->instance_.empty() && h->state_ != WorkerHandle::State::Up &&
           now - h->down_since_ >= kAutoNameReclaim;
  };
  // The instance's own name, whatever state its slot is in.
  for (const auto& h : handles_) {
    if (h->embedded() || kind_of(h->device()) != kind) continue;
    absl::MutexLock lock(&h->mu_);
    if (h->instance_ == instance) return {h, h->device()};
  }
  if (!previous.empty() && kind_of(previous) == kind) {
    auto h = find_locked(previous);
    if (!h || reclaimable(h)) return {h, previous};
  }
  for (uint64_t n = 0;; ++n) {
    std::string name = cat(kind, ":", n);
    auto h = find_locked(name);
    if (!h || reclaimable(h)) return {h, name};
  }
}

absl::StatusOr<std::string> WorkerPool::register_remote(const std::string& address, const std::string& device) {
  RemoteRegistration r;
  r.address = address;
  r.device = device;
  auto got = register_remote(r);
  if (!got.ok()) return got.status();
  return got->worker_id;
}

absl::StatusOr<RemoteRegistered> WorkerPool::register_remote(const RemoteRegistration& r) {
  const std::string& address = r.address;
  if (address.empty() || address.find(':') == std::string::npos)
    return absl::InvalidArgumentError(cat("a worker registers as HOST:PORT, got '", address, "'"));
  if (r.device.empty()) return absl::InvalidArgumentError("a worker registers with a device name");
  const std::string kind = kind_of(r.device);
  if (kind.empty()) return absl::InvalidArgumentError(cat("'", r.device, "' is not a device name (KIND:N)"));
  const bool automatic = r.name == "auto";
  const std::string wanted = r.name.empty() ? r.device : r.name;
  if (!automatic && kind_of(wanted) != kind)
    return absl::InvalidArgumentError(
        cat("a worker serving ", r.device, " registers as ", kind, ":N or auto, not as '", wanted, "'"));
  const std::string instance = r.instance.empty() ? address : r.instance;
  if (stopping()) return absl::UnavailableError("the scheduler is shutting down");
  auto stub = worker_stub(address, dial_);
  ProbeResult me = probe(stub.get(), kProbeTimeout * 3);
  if (!me.status.ok())
    return absl::UnavailableError(cat("cannot reach the worker at ", address, ": ", me.status.message()));
  if (me.info.device() != r.device)
    return absl::InvalidArgumentError(
        cat("the worker at ", address, " serves ", me.info.device(), ", not ", r.device, " as registered"));
  const int64_t pid = me.info.pid();

  // Holders of the slot found dead (address, pid): taken over on the next round.
  std::vector<std::pair<std::string, int64_t>> dead;
  for (int round = 0; round < 4; ++round) {
    std::string name, holder;
    int64_t holder_pid = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping()) return absl::UnavailableError("the scheduler is shutting down");
      std::shared_ptr<WorkerHandle> h;
      if (automatic) {
        std::tie(h, name) = pick_auto_name_locked(kind, instance, r.previous_name, absl::Now());
      } else {
        name = wanted;
        h = find_locked(name);
      }
      if (h && h->embedded())
        return absl::AlreadyExistsError(cat("device ", name, " is served by an embedded worker"));
      if (!h) {
        h = std::make_shared<WorkerHandle>(cat("remote-", ++remote_count_), name, false);
        handles_.push_back(h);
        ensure_supervisor_locked();  // to probe it again if it ever becomes unreachable
      }
      absl::MutexLock hl(&h->mu_);
      bool other = h->state_ == WorkerHandle::State::Up && h->address_ != address &&
                   std::find(dead.begin(), dead.end(), std::make_pair(h->address_, h->pid_)) == dead.end();
      if (other) {
        holder = h->address_;
        holder_pid = h->pid_;
      } else {
        bool same = h->address_ == address && h->pid_ == pid;
        if (!same || h->state_ != WorkerHandle::State::Up) {
          if (!same && h->pid_ != 0) {  // a process served this slot before: its buffers are not ours now
            h->new_generation_locked();
            ++h->restarts_;
          }
          h->pid_ = pid;
          h->address_ = address;
          h->dial_ = dial_;
          h->stub_ = stub;
          h->state_ = WorkerHandle::State::Up;
          h->up_since_ = absl::Now();
          h->local_device_ = r.device;
          h->instance_ = automatic ? instance : "";
          log(h->describe_locked(), " registered (pid ", h->pid_, ", generation ", h->generation_,
              name == r.device ? std::string() : cat(", its own device ", r.device),
              automatic ? cat(", instance ", instance) : std::string(), ")");
        } else {
          h->local_device_ = r.device;
          h->instance_ = automatic ? instance : "";
        }
        return RemoteRegistered{h->id(), name};
      }
    }
    // The slot is up with another worker: it keeps it while it answers as itself.
    ProbeResult r2 = probe(worker_stub(holder, dial_).get(), kProbeTimeout);
    if (r2.status.ok() && r2.info.pid() == holder_pid)
      return absl::AlreadyExistsError(cat(name, " is served by the worker at ", holder, " (pid ", holder_pid,
                                          "), which still answers",
                                          automatic ? cat(" (is instance ", instance, " given to two workers?)") : ""));
    dead.emplace_back(holder, holder_pid);
  }
  return absl::AbortedError("the workers changed while registering; register again");
}

}  // namespace uop
