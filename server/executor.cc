#include "server/executor.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/backend.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"
#include "proto/worker.grpc.pb.h"
#include "transport/cluster_auth.h"
#include "transport/grpc_absl.h"
#include "transport/lane_messages.h"

namespace uop::server {
namespace {

namespace wpb = ::uopd::worker::v1;

using transport::from_grpc;
using transport::set_deadline;

// The wire names of worker.proto's CollectiveRequest.op.
const char* reduce_op_wire(ReduceOp op) {
  switch (op) {
    case ReduceOp::Add: return "add";
    case ReduceOp::Mul: return "mul";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

// "127.0.0.1" of "127.0.0.1:4000", "::1" of "[::1]:4000"; loopback names are one host.
std::string host_of(const std::string& address) {
  std::string h = address.substr(0, address.rfind(':'));
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0) return "loopback";
  return h;
}

// The dtypes NCCL reduces (worker/collectives/nccl_allreduce.h); the others go through
// shm or gloo even between CUDA workers.
bool nccl_has(Scalar t) {
  switch (t) {
    case Scalar::Int8: case Scalar::UInt8: case Scalar::Int32: case Scalar::UInt32: case Scalar::Int64:
    case Scalar::UInt64: case Scalar::Index: case Scalar::Float16: case Scalar::BFloat16: case Scalar::Float32:
    case Scalar::Float64:
      return true;
    default:
      return false;
  }
}

// An Execute through the worker's execute lane. nullopt when it does not go that way (the
// request or the reply it may bring would not fit a slot, or every slot is busy): the
// caller sends it over gRPC. `reply_bytes` bounds the outputs read back.
std::optional<absl::Status> execute_on_lane(ExecLane& lane, const wpb::ExecuteRequest& req, uint64_t reply_bytes,
                                            absl::Time deadline, wpb::ExecuteResponse* resp,
                                            const std::atomic<bool>* cancel = nullptr) {
  // The reply's framing: a tag and a length per output, and run_ms; a profiled one's
  // launch times are packed, 8 bytes each behind one tag and length; or, instead of all
  // that, the keys of programs missing (at most one per launch, 64 hex digits each).
  uint64_t launch_keys = 0;
  for (const wpb::Launch& l : req.launches()) launch_keys += l.key().size() + 16;
  const uint64_t reply_bound = std::max(reply_bytes + 16 * static_cast<uint64_t>(req.read_back_size()) + 16 +
                                            (req.profile() ? 8 * static_cast<uint64_t>(req.launches_size()) + 16 : 0),
                                        launch_keys);
  return Executor::call_on_lane(lane, lane::Kind::Execute, req, reply_bound, deadline, resp, cancel);
}

// Calls made side by side that stand or fall together (a collective's members, the
// Executes that carry a folded one): when one fails, stop_others() stops the rest, which
// would otherwise wait for it until their timeout. A lane call watches its flag(); a gRPC
// call's context, while attached, is cancelled.
class PeerCalls {
 public:
  explicit PeerCalls(size_t n) : flags_(new std::atomic<bool>[n]), contexts_(n, nullptr), stopped_(n, false) {
    for (size_t i = 0; i < n; ++i) flags_[i].store(false);
  }
  const std::atomic<bool>* flag(size_t i) const { return &flags_[i]; }
  // Cancelled at once when stop_others() came first.
  void attach(size_t i, grpc::ClientContext* ctx) {
    std::lock_guard l(mu_);
    contexts_[i] = ctx;
    if (stopped_[i]) ctx->TryCancel();
  }
  void detach(size_t i) {
    std::lock_guard l(mu_);
    contexts_[i] = nullptr;
  }
  // From a call that failed on its own: one we stopped stops nobody, so the first failure
  // is never taken for a consequence.
  void stop_others(size_t failed) {
    std::lock_guard l(mu_);
    if (stopped_[failed]) return;
    for (size_t j = 0; j < stopped_.size(); ++j) {
      if (j == failed || stopped_[j]) continue;
      stopped_[j] = true;
      flags_[j].store(true, std::memory_order_release);
      if (contexts_[j]) contexts_[j]->TryCancel();
    }
  }
  // A CANCELLED status of a call we stopped is a consequence of its peer's failure.
  bool stopped_by_us(size_t i, const absl::Status& s) const {
    std::lock_guard l(mu_);
    return stopped_[i] && s.code() == absl::StatusCode::kCancelled;
  }

 private:
  std::unique_ptr<std::atomic<bool>[]> flags_;
  mutable std::mutex mu_;
  std::vector<grpc::ClientContext*> contexts_;  // guarded by mu_
  std::vector<bool> stopped_;                   // guarded by mu_
};

}  // namespace

// What one run holds while its steps go: the worker of each device it uses, the worker
// buffer of each plan buffer, the launches not sent yet.
struct Executor::RunState {
  const Plan* plan = nullptr;
  const std::vector<CompiledKernel>* kernels = nullptr;
  absl::Time deadline;
  std::string session_device;  // where a single-device plan runs
  std::string tenant;          // whose workers (WorkerPool::worker_for)
  bool profile = false;        // the workers time each launch
  struct Device {
    std::string name;
    Worker w;
    // The process this run talks to; a failure or a program load is attributed to it,
    // not to a replacement that started meanwhile.
    uint64_t generation = 0;
    std::vector<uint64_t> temps;  // freed whatever happens
    // What goes with the next Execute: the buffers to allocate (small inline inputs with
    // their data), the launches since the last collective or copy, and at the end the
    // outputs to read back and the temporaries to free.
    wpb::ExecuteRequest pending;
    uint64_t pending_inline = 0;   // data bytes in pending.allocs
    uint64_t pending_out = 0;      // bytes of the buffers in pending.read_back
    wpb::ExecuteResponse answer;   // the last Execute's (its outputs)
    std::vector<size_t> pending_kernels;  // the plan kernel of each launch in pending
  };
  std::vector<Device> devices;  // in first-use order
  std::vector<size_t> device_of;  // per plan buffer: index into devices
  std::vector<uint64_t> ids;      // per plan buffer: the worker buffer
  std::vector<size_t> kernel_device;  // per plan kernel: index into devices
  RunOutcome out;
  std::mutex out_mu;  // out's collective counts, which collectives running side by side add to
  // A collective folded into its members' pending Executes (fold_collective): its live
  // group held from the fold until those Executes are done, which go together.
  struct Folded {
    std::string key, what;
    std::shared_ptr<LiveGroup> group;
    std::unique_lock<std::mutex> lock;  // group->run
    std::vector<size_t> devices;        // the members' devices
  };
  std::optional<Folded> folded;
};

absl::Status Executor::first_failure(RunState& rs, std::vector<std::pair<Worker, absl::Status>> failures,
                                     std::string_view what) {
  std::vector<absl::Status> told;
  size_t pick = 0;
  bool dead_found = false;
  for (size_t i = 0; i < failures.size(); ++i) {
    auto& [w, s] = failures[i];
    uint64_t generation = 0;
    for (const auto& d : rs.devices)
      if (d.w == w) generation = d.generation;
    told.push_back(failed(w, s, what, generation));
    // A worker that is gone explains why its peers failed too.
    if (!dead_found && (w->generation() != generation || w->state() != "up")) {
      pick = i;
      dead_found = true;
    }
  }
  const absl::Status& s = told[pick];
  return absl::Status(s.code(), cat(what, " on ", failures[pick].first->device(), ": ", s.message()));
}

absl::Status Executor::flush_launches(RunState& rs, std::vector<bool>* which) {
  // A folded collective's members go together: each waits in it for the others.
  bool folded = false;
  if (rs.folded) {
    for (size_t i : rs.folded->devices) folded |= !which || (*which)[i];
    if (folded && which)
      for (size_t i : rs.folded->devices) (*which)[i] = true;
  }
  std::vector<size_t> busy;
  for (size_t i = 0; i < rs.devices.size(); ++i) {
    if (which && !(*which)[i]) continue;
    const wpb::ExecuteRequest& p = rs.devices[i].pending;
    if (p.launches_size() > 0 || p.allocs_size() > 0 || p.read_back_size() > 0) busy.push_back(i);
  }
  if (busy.empty()) return absl::OkStatus();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<absl::Status> status(busy.size());
  // With a folded collective, a device that fails stops the others.
  PeerCalls peers(busy.size());
  auto execute = [&](size_t k) {
    RunState::Device& d = rs.devices[busy[k]];
    d.answer.Clear();
    if (rs.profile && d.pending.launches_size() > 0) d.pending.set_profile(true);
    if (std::shared_ptr<ExecLane> lane = d.w->lane()) {
      if (auto done = execute_on_lane(*lane, d.pending, d.pending_out, rs.deadline, &d.answer, peers.flag(k))) {
        lane_executes_.fetch_add(1, std::memory_order_relaxed);
        status[k] = *done;
        return;
      }
    }
    grpc_executes_.fetch_add(1, std::memory_order_relaxed);
    grpc::ClientContext ctx;
    set_deadline(ctx, rs.deadline);
    peers.attach(k, &ctx);
    auto st = stub(d.w);
    status[k] = st.ok() ? from_grpc((*st)->Execute(&ctx, d.pending, &d.answer)) : st.status();
    peers.detach(k);
  };
  // A folded collective runs while these Executes do.
  if (folded) collectives_running_.fetch_add(1, std::memory_order_relaxed);
  absl::Cleanup not_running = [&] {
    if (folded) collectives_running_.fetch_sub(1, std::memory_order_relaxed);
  };
  // A worker that unloaded a program this batch launches (its program budget, for a load
  // since this run's) did nothing: the programs are loaded again and the batch sent once
  // more. Missing again, the budget is too small for the programs of one batch.
  auto execute_loaded = [&](size_t k) {
    RunState::Device& d = rs.devices[busy[k]];
    execute(k);
    if (status[k].ok() && d.answer.missing_programs_size() > 0) {
      status[k] = load_missing(rs, busy[k]);
      if (status[k].ok()) execute(k);
      if (status[k].ok() && d.answer.missing_programs_size() > 0)
        status[k] = absl::ResourceExhaustedError(
            cat(d.w->describe(), " unloads kernels this run launches as fast as they are loaded: its program budget "
                                 "(uop-worker --max-program-bytes, uopd --worker-max-program-bytes) is smaller than the ",
                d.pending.launches_size(), " kernels of one Execute"));
    }
    if (!status[k].ok() && folded) peers.stop_others(k);
  };
  // Kernels of different devices between two collectives never share a buffer: they
  // run side by side.
  side_by_side(busy.size(), execute_loaded);
  double collective_ms = 0;
  for (size_t k = 0; k < busy.size(); ++k)
    if (status[k].ok()) collective_ms = std::max(collective_ms, rs.devices[busy[k]].answer.collective_ms());
  rs.out.run_ms += std::max(ms_since(t0) - collective_ms, 0.0);
  std::vector<std::pair<Worker, absl::Status>> failures;
  for (size_t k = 0; k < busy.size(); ++k) {
    RunState::Device& d = rs.devices[busy[k]];
    if (status[k].ok() && rs.profile && !d.pending_kernels.empty() &&
        d.answer.launch_ms_size() != static_cast<int>(d.pending_kernels.size()))
      status[k] = absl::InternalError(cat("the worker timed ", d.answer.launch_ms_size(), " of ",
                                          d.pending_kernels.size(), " launches"));
    if (status[k].ok()) {
      rs.out.kernels_run += d.pending_kernels.size();
      if (rs.profile) {
        for (int i = 0; i < d.answer.launch_ms_size(); ++i)
          rs.out.launch_times.push_back({d.pending_kernels[i], d.name, d.answer.launch_ms(i)});
        launches_timed_.fetch_add(d.answer.launch_ms_size(), std::memory_order_relaxed);
      }
      // Freed by the worker: nothing left for cleanup. (After a failure they stay listed:
      // a request that never reached the worker freed nothing.)
      if (d.pending.free_after_size() > 0) {
        absl::flat_hash_set<uint64_t> freed(d.pending.free_after().begin(), d.pending.free_after().end());
        std::erase_if(d.temps, [&](uint64_t id) { return freed.contains(id); });
        d.w->release_buffer_ids({d.pending.free_after().data(), static_cast<size_t>(d.pending.free_after_size())}, d.generation);
      }
    } else if (!peers.stopped_by_us(k, status[k])) {  // else the peer's failure says why
      failures.emplace_back(d.w, status[k]);
    }
    d.pending.Clear();
    d.pending_kernels.clear();
    d.pending_inline = 0;
    d.pending_out = 0;
  }
  std::string what = "running the kernels";
  if (folded) {
    // The folded collective is done with, one way or the other: its group is let go, and
    // dropped after a failure (its members dropped it too).
    RunState::Folded f = std::move(*rs.folded);
    rs.folded.reset();
    what = cat("running the kernels and ", f.what);
    if (failures.empty()) {
      collectives_run_.fetch_add(1, std::memory_order_relaxed);
      collectives_shm_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard l(rs.out_mu);
      rs.out.collective_ms += collective_ms;
      ++rs.out.collectives_run;
    } else {
      drop_live_group(f.key, f.group.get());
    }
  }
  if (failures.empty()) return absl::OkStatus();
  return first_failure(rs, std::move(failures), what);
}

struct Executor::LiveGroup {
  std::string name;       // cluster_auth::random_hex(16)
  std::string transport;
  std::vector<std::pair<std::string, uint64_t>> members;  // worker id and generation, by rank
  std::mutex run;         // one collective at a time: the members' calls must line up
  bool rendezvous_open = false;  // gloo: its keys' group at the Rendezvous, open while it lives
  uint64_t last_use = 0;
};

std::shared_ptr<Executor::LiveGroup> Executor::live_group(const std::string& key, const std::string& transport,
                                                          const std::vector<std::pair<std::string, uint64_t>>& members) {
  std::vector<std::shared_ptr<LiveGroup>> gone;
  std::shared_ptr<LiveGroup> g;
  {
    std::lock_guard l(groups_mu_);
    auto [it, added] = groups_.try_emplace(key);
    if (added) {
      it->second = std::make_shared<LiveGroup>();
      it->second->name = cluster_auth::random_hex(16);
      it->second->transport = transport;
      it->second->members = members;
      groups_formed_.fetch_add(1, std::memory_order_relaxed);
      // A group with a member process that is no more (its worker restarted since: the
      // same id, another generation) is torn down; so is the least recently used one past
      // kMaxLiveGroups.
      auto left = [&](const LiveGroup& other) {
        for (const auto& [id, generation] : other.members)
          for (const auto& [our_id, our_generation] : members)
            if (id == our_id && generation != our_generation) return true;
        return false;
      };
      for (auto i = groups_.begin(); i != groups_.end();) {
        if (i != it && left(*i->second)) {
          gone.push_back(std::move(i->second));
          groups_.erase(i++);
        } else {
          ++i;
        }
      }
      if (groups_.size() > kMaxLiveGroups) {
        auto oldest = groups_.end();
        for (auto i = groups_.begin(); i != groups_.end(); ++i)
          if (i != it && (oldest == groups_.end() || i->second->last_use < oldest->second->last_use)) oldest = i;
        gone.push_back(std::move(oldest->second));
        groups_.erase(oldest);
      }
    }
    it->second->last_use = ++group_clock_;
    g = it->second;
  }
  for (const auto& old : gone) {
    std::lock_guard l(old->run);  // after the collective it may be running
    if (old->rendezvous_open) collectives_.groups->close_group(old->name);
    old->rendezvous_open = false;
  }
  return g;
}

void Executor::drop_live_group(const std::string& key, const LiveGroup* g) {
  std::lock_guard l(groups_mu_);
  if (auto it = groups_.find(key); it != groups_.end() && it->second.get() == g) groups_.erase(it);
}

Executor::CollectiveCounts Executor::collective_counts() const {
  std::lock_guard l(groups_mu_);
  return {groups_formed_.load(),      groups_.size(),           collectives_running_.load(), collectives_run_.load(),
          collectives_shm_.load(), collectives_gloo_.load(), collectives_nccl_.load()};
}

// What every call of a collective shares: its members' names and processes, the group's
// key, the transport, the members' timeout.
struct Executor::CollectiveSetup {
  std::vector<int> members;  // plan buffers of one segment, in rank order
  std::vector<std::pair<std::string, uint64_t>> processes;  // worker id and generation, by rank
  std::string key;        // the live group's: tenant, member processes, transport
  std::string what;       // "allreduce 3 (add of float32 over CPU:0, CPU:1)"
  std::string transport;  // "shm", "gloo", "nccl"
  absl::Duration timeout;
  // shm and gloo groups live: formed by the first collective of their members, reused by
  // every later one. NCCL forms its communicator per call, under a name of its own, and
  // reduces a bucket's buffers one by one (device memory is not staged through a flat copy).
  bool live = false;
};

absl::StatusOr<Executor::CollectiveSetup> Executor::collective_setup(const RunState& rs, const PlannedCollective& c,
                                                                   size_t index) const {
  CollectiveSetup cs;
  cs.members = c.members();
  const std::vector<int>& members = cs.members;
  std::vector<std::string> names;
  bool one_host = true;
  // The transport that reduces in the members' device memory, when they all have the same
  // one (NCCL between GPUs; compiler/backend.h).
  std::string_view in_device = backend_for_device(rs.devices[rs.device_of[members[0]]].w->device()).device_collectives;
  // The group's identity: who asks, and the member processes in rank order.
  cs.key = cat(rs.tenant.size(), ":", rs.tenant);
  for (int b : members) {
    const RunState::Device& d = rs.devices[rs.device_of[b]];
    names.push_back(d.name);
    cs.processes.emplace_back(d.w->id(), d.generation);
    one_host &= host_of(d.w->address()) == host_of(rs.devices[rs.device_of[members[0]]].w->address());
    if (backend_for_device(d.w->device()).device_collectives != in_device) in_device = "";
    cs.key += cat("|", d.w->id(), "@", d.generation);
  }
  cs.what = cat("allreduce ", index, " (", reduce_op_wire(c.op), " of ", scalar_name(c.dtype),
                c.segments.size() > 1 ? cat(", a bucket of ", c.segments.size()) : std::string(), " over ",
                join(names, ", "), ")");
  // GPU workers reduce in GPU memory with NCCL (its unique id through the rendezvous),
  // where NCCL has the dtype; the rest by where the members are. A forced transport wins.
  cs.transport = collectives_.transport;
  if (cs.transport.empty())
    cs.transport =
        in_device == "nccl" && nccl_has(c.dtype) && !collectives_.rendezvous.empty() ? "nccl" : one_host ? "shm" : "gloo";
  if (cs.transport != "shm" && (collectives_.rendezvous.empty() || !collectives_.groups))
    return absl::FailedPreconditionError(cat(cs.what, cs.transport == "nccl"
                                                          ? ": nccl needs the rendezvous and this scheduler serves none"
                                                          : ": the workers are on different hosts and this scheduler serves no rendezvous"));
  absl::Duration left = rs.deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError(cat(cs.what, ": the request's deadline passed"));
  cs.timeout = std::min(collectives_.timeout, left);
  cs.key += cat("|", cs.transport);
  cs.live = cs.transport != "nccl";
  return cs;
}

wpb::CollectiveRequest Executor::member_request(const RunState& rs, const PlannedCollective& c, const CollectiveSetup& cs,
                                                const std::string& name, size_t call, size_t i) const {
  const Plan& plan = *rs.plan;
  wpb::CollectiveRequest req;
  req.set_group(name);
  req.set_rank(static_cast<int>(i));
  req.set_size(static_cast<int>(cs.members.size()));
  req.set_op(reduce_op_wire(c.op));
  req.set_dtype(std::string(scalar_name(c.dtype)));
  if (!cs.live || c.segments.size() == 1) {
    const int b = c.segments[call][i];
    req.set_buffer_id(rs.ids[b]);
    req.set_elements(static_cast<uint64_t>(plan.buffers[b].elements));
  } else {
    for (const std::vector<int>& seg : c.segments) {
      wpb::CollectiveBuffer* cb = req.add_bucket();
      cb->set_buffer_id(rs.ids[seg[i]]);
      cb->set_elements(static_cast<uint64_t>(plan.buffers[seg[i]].elements));
    }
  }
  req.set_keep_group(cs.live);
  req.set_transport(cs.transport);
  req.set_rendezvous(collectives_.rendezvous);
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(absl::ToInt64Milliseconds(cs.timeout), 1)));
  return req;
}

absl::StatusOr<std::optional<Executor::CollectiveSetup>> Executor::foldable(const RunState& rs, const PlannedCollective& c,
                                                                            size_t index) const {
  if (rs.folded || collectives_.sequential) return std::nullopt;
  ASSIGN_OR_RETURN(CollectiveSetup cs, collective_setup(rs, c, index));
  // One host's shared-memory ring between embedded workers, whose Executes can be stopped
  // (their lanes): a member that fails then stops the others at once.
  if (cs.transport != "shm" || !cs.live) return std::nullopt;
  std::vector<size_t> devices;
  for (int b : cs.members) {
    const size_t dev = rs.device_of[b];
    if (!rs.devices[dev].w->lane() || std::find(devices.begin(), devices.end(), dev) != devices.end()) return std::nullopt;
    devices.push_back(dev);
  }
  return cs;
}

std::vector<size_t> Executor::fold_collective(RunState& rs, const PlannedCollective& c, const CollectiveSetup& cs) {
  RunState::Folded f;
  f.key = cs.key;
  f.what = cs.what;
  f.group = live_group(cs.key, cs.transport, cs.processes);
  f.lock = std::unique_lock<std::mutex>(f.group->run);
  for (size_t i = 0; i < cs.members.size(); ++i) {
    f.devices.push_back(rs.device_of[cs.members[i]]);
    *rs.devices[f.devices.back()].pending.add_launches()->mutable_collective() = member_request(rs, c, cs, f.group->name, 0, i);
  }
  rs.folded = std::move(f);
  return rs.folded->devices;
}

absl::Status Executor::run_collective(RunState& rs, const PlannedCollective& c, size_t index) {
  ASSIGN_OR_RETURN(const CollectiveSetup cs, collective_setup(rs, c, index));
  const std::vector<int>& members = cs.members;
  const size_t n = members.size();
  const std::string& what = cs.what;
  const std::string& key = cs.key;
  const std::string& transport = cs.transport;
  const absl::Duration timeout = cs.timeout;
  const bool live = cs.live;
  std::shared_ptr<LiveGroup> group;
  std::string name;
  struct CloseRendezvous {
    RendezvousStore* store = nullptr;
    std::string name;
    ~CloseRendezvous() {
      if (store) store->close_group(name);
    }
  } close_rendezvous;
  std::unique_lock<std::mutex> group_lock;
  if (live) {
    group = live_group(key, transport, cs.processes);
    group_lock = std::unique_lock<std::mutex>(group->run);
    name = group->name;
    if (transport != "shm" && !group->rendezvous_open) {
      // Open for as long as the group lives: Gloo's members report a broken ring there.
      absl::Status opened = collectives_.groups->open_group(
          RendezvousGroup::for_members(name, static_cast<int>(n), absl::Hours(24 * 365)));
      if (!opened.ok()) {
        drop_live_group(key, group.get());
        return absl::Status(opened.code(), cat(what, ": ", opened.message()));
      }
      group->rendezvous_open = true;
    }
  }
  const size_t calls = live ? 1 : c.segments.size();
  for (size_t call = 0; call < calls; ++call) {
    if (!live) {
      // Unique among every collective any scheduler on this host runs, and unguessable:
      // only its members can find its keys at the rendezvous, open while they may need it.
      name = cluster_auth::random_hex(16);
      absl::Status opened =
          collectives_.groups->open_group(RendezvousGroup::for_members(name, static_cast<int>(n), timeout + absl::Seconds(10)));
      if (!opened.ok()) return absl::Status(opened.code(), cat(what, ": ", opened.message()));
      close_rendezvous.store = collectives_.groups;
      close_rendezvous.name = name;
    }
    // The members bound their own waits by `timeout`; this only catches a worker that
    // stopped answering altogether.
    const absl::Time ctx_deadline = std::min(rs.deadline, absl::Now() + timeout + absl::Seconds(5));
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    for (size_t i = 0; i < n; ++i) {
      ctxs.push_back(std::make_unique<grpc::ClientContext>());
      set_deadline(*ctxs.back(), ctx_deadline);
    }
    PeerCalls peers(n);
    for (size_t i = 0; i < n; ++i) peers.attach(i, ctxs[i].get());
    std::vector<absl::Status> status(n);
    auto member = [&](size_t i) {
      const RunState::Device& d = rs.devices[rs.device_of[members[i]]];
      const wpb::CollectiveRequest req = member_request(rs, c, cs, name, call, i);
      wpb::CollectiveResponse resp;
      // An embedded member waits in a slot of its execute lane: the collective costs no
      // gRPC round trip, which for a small bucket is most of its time.
      std::optional<absl::Status> on_lane;
      if (std::shared_ptr<ExecLane> lane = d.w->lane())
        on_lane = call_on_lane(*lane, lane::Kind::Collective, req, 64, ctx_deadline, &resp, peers.flag(i));
      absl::Status s;
      if (on_lane) {
        s = *on_lane;
      } else {
        auto st = stub(d.w);
        s = st.ok() ? from_grpc((*st)->Collective(ctxs[i].get(), req, &resp)) : st.status();
      }
      status[i] = s;
      // One member failed: the others cannot finish, so stop them waiting now.
      if (!s.ok()) peers.stop_others(i);
    };
    auto t0 = std::chrono::steady_clock::now();
    collectives_run_.fetch_add(1, std::memory_order_relaxed);
    (transport == "shm" ? collectives_shm_ : transport == "gloo" ? collectives_gloo_ : collectives_nccl_)
        .fetch_add(1, std::memory_order_relaxed);
    collectives_running_.fetch_add(1, std::memory_order_relaxed);
    side_by_side(n, member);
    collectives_running_.fetch_sub(1, std::memory_order_relaxed);
    {
      std::lock_guard l(rs.out_mu);  // collectives may run side by side (run_steps)
      rs.out.collective_ms += ms_since(t0);
    }
    std::vector<std::pair<Worker, absl::Status>> failures;
    for (size_t i = 0; i < n; ++i) {
      if (status[i].ok()) continue;
      if (peers.stopped_by_us(i, status[i])) continue;  // the peer's failure says why
      failures.emplace_back(rs.devices[rs.device_of[members[i]]].w, status[i]);
    }
    if (!failures.empty()) {
      // A group that failed is done for (its members dropped it): the next collective of
      // these members forms a new one, under a new name.
      if (live) {
        if (group->rendezvous_open) collectives_.groups->close_group(name);
        group->rendezvous_open = false;
        drop_live_group(key, group.get());
      }
      return first_failure(rs, std::move(failures), what);
    }
    if (close_rendezvous.store) {
      close_rendezvous.store->close_group(name);
      close_rendezvous.store = nullptr;
    }
  }
  std::lock_guard l(rs.out_mu);
  ++rs.out.collectives_run;
  return absl::OkStatus();
}

uint64_t Executor::run_bytes(const Plan& plan, const absl::flat_hash_map<int, BoundInput>& inputs) {
  uint64_t total = 0;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    auto in = inputs.find(static_cast<int>(i));
    if (in != inputs.end() && in->second.session_buffer) continue;
    const PlannedBuffer& pb = plan.buffers[i];
    const uint64_t elements = static_cast<uint64_t>(std::max<int64_t>(pb.elements, 0));
    const uint64_t width = scalar_bytes(pb.dtype);
    // Saturates: a sum past 2^64 is refused by any quota all the same.
    if (width != 0 && elements > (UINT64_MAX - total) / width) return UINT64_MAX;
    total += elements * width;
  }
  return total;
}

absl::StatusOr<size_t> Executor::device_index(RunState& rs, const std::string& named) {
  const std::string& d = rs.plan->multi_device() && !named.empty() ? named : rs.session_device;
  for (size_t i = 0; i < rs.devices.size(); ++i)
    if (rs.devices[i].name == d) return i;
  auto w = pool_->worker_for(d, absl::Seconds(10), rs.tenant);
  if (!w.ok()) return w.status();
  RunState::Device dev;
  dev.name = d;
  dev.w = *w;
  dev.generation = (*w)->generation();
  rs.devices.push_back(std::move(dev));
  return rs.devices.size() - 1;
}

// The run's temporaries are freed without waiting for the worker's answer: the reply
// carries nothing the run needs, and waiting would add a round trip to every Run. A
// worker that is gone has nothing to free.
void Executor::free_temporaries(RunState& rs) {
  for (auto& d : rs.devices) free_later(d.w, d.generation, d.temps);
}

absl::StatusOr<std::vector<Executor::StreamedInput>> Executor::bind_buffers(
    RunState& rs, const absl::flat_hash_map<int, BoundInput>& inputs) {
  const Plan& plan = *rs.plan;
  rs.ids.assign(plan.buffers.size(), 0);
  rs.device_of.assign(plan.buffers.size(), 0);
  std::vector<StreamedInput> streamed;
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlannedBuffer& pb = plan.buffers[i];
    ASSIGN_OR_RETURN(const size_t di, device_index(rs, pb.device));
    rs.device_of[i] = di;
    RunState::Device& d = rs.devices[di];
    auto in = inputs.find(static_cast<int>(i));
    if (in != inputs.end() && in->second.session_buffer) {
      const BufferInfo& b = *in->second.session_buffer;
      if (b.worker_id != d.w->id() || b.worker_generation != d.generation)
        return absl::UnavailableError(cat("buffer ", b.id, " on ", d.name, " was held by worker ", b.worker_id,
                                          ", which restarted since; its contents are lost"));
      rs.ids[i] = b.worker_buffer;
      continue;
    }
    rs.ids[i] = new_buffer_id(d.w);
    d.temps.push_back(rs.ids[i]);  // freed whatever happens (an id never allocated is skipped)
    // Outputs, intermediates and unbound kernel-level buffers start zeroed (workers zero
    // new buffers). They, and inline inputs up to kInlineBytes per Execute, are allocated
    // by the device's first Execute: a cached Run is one round trip per worker.
    std::string_view data;
    if (in != inputs.end() && in->second.tensor) data = in->second.tensor->data;
    if (data.size() <= kInlineBytes - d.pending_inline) {
      wpb::BufferInit* a = d.pending.add_allocs();
      a->set_buffer_id(rs.ids[i]);
      a->set_bytes(static_cast<uint64_t>(pb.elements) * scalar_bytes(pb.dtype));
      a->set_data(data.data(), data.size());
      d.pending_inline += data.size();
      rs.out.bytes_in += data.size();
      continue;
    }
    streamed.push_back({i, data});
  }
  return streamed;
}

// All at once: each write starts as soon as its allocation is answered (from gRPC's
// callback), so the Run waits once for allocations and writes together.
absl::Status Executor::stream_inputs(RunState& rs, const std::vector<StreamedInput>& streamed_inputs) {
  const Plan& plan = *rs.plan;
  const absl::Time deadline = rs.deadline;
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    void add() {
      std::lock_guard<std::mutex> l(mu);
      ++left;
    }
    void done() {
      std::lock_guard<std::mutex> l(mu);
      if (--left == 0) cv.notify_all();
    }
  } pending;
  // One client stream per inline input: its chunks back to back, the last with
  // WritesDone.
  class Writer final : public grpc::ClientWriteReactor<wpb::WriteChunk> {
   public:
    Writer(Pending* p, uint64_t id, std::string_view data) : p_(p), id_(id), data_(data) {}
    grpc::ClientContext ctx;
    wpb::WriteBufferResponse resp;
    absl::Status status;
    void start() {
      StartCall();
      next();
    }
    void OnWriteDone(bool ok) override {
      if (ok) next();  // else the call failed: OnDone says why
    }
    void OnDone(const grpc::Status& s) override {
      status = from_grpc(s);
      p_->done();
    }

   private:
    void next() {
      if (sent_ && at_ >= data_.size()) return;
      chunk_.set_buffer_id(id_);
      chunk_.set_offset(at_);
      std::string_view part = data_.substr(at_, kChunk);
      chunk_.mutable_data()->assign(part.data(), part.size());
      at_ += part.size();
      sent_ = true;
      if (at_ >= data_.size()) StartWriteLast(&chunk_, grpc::WriteOptions());
      else StartWrite(&chunk_);
    }
    Pending* p_;
    uint64_t id_;
    std::string_view data_;
    uint64_t at_ = 0;
    bool sent_ = false;
    wpb::WriteChunk chunk_;
  };
  struct Call {
    grpc::ClientContext ctx;
    wpb::AllocBufferRequest req;
    wpb::AllocBufferResponse resp;
    absl::Status status;
    std::shared_ptr<Stub> stub;
    std::string_view data;           // the input's bytes, written once allocated
    std::unique_ptr<Writer> writer;  // set (by the callback) when the write started
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (const auto& [i, data] : streamed_inputs) {
    const PlannedBuffer& pb = plan.buffers[i];
    auto call = std::make_unique<Call>();
    set_deadline(call->ctx, deadline);
    call->req.set_buffer_id(rs.ids[i]);
    call->req.set_bytes(static_cast<uint64_t>(pb.elements) * scalar_bytes(pb.dtype));
    call->data = data;
    Call* c = call.get();
    calls.push_back(std::move(call));
    auto st = stub(rs.devices[rs.device_of[i]].w);
    if (!st.ok()) {
      c->status = st.status();
      continue;
    }
    c->stub = *st;
    pending.add();
    c->stub->async()->AllocBuffer(&c->ctx, &c->req, &c->resp, [c, &pending, deadline](grpc::Status g) {
      c->status = from_grpc(g);
      if (c->status.ok()) {
        c->writer = std::make_unique<Writer>(&pending, c->req.buffer_id(), c->data);
        set_deadline(c->writer->ctx, deadline);
        pending.add();  // before this call's own done(): the count never passes 0 early
        c->stub->async()->WriteBuffer(&c->writer->ctx, &c->writer->resp, c->writer.get());
        c->writer->start();
      }
      pending.done();
    });
  }
  {
    std::unique_lock<std::mutex> l(pending.mu);
    pending.cv.wait(l, [&] { return pending.left == 0; });
  }
  for (size_t k = 0; k < streamed_inputs.size(); ++k) {
    const RunState::Device& d = rs.devices[rs.device_of[streamed_inputs[k].buffer]];
    absl::Status s = calls[k]->status;
    const char* what = "allocating a buffer";
    if (s.ok() && calls[k]->writer) {
      s = calls[k]->writer->status;
      what = "writing a buffer";
    }
    if (s.ok()) {
      rs.out.bytes_in += calls[k]->data.size();
      continue;
    }
    return failed(d.w, s, what, d.generation);
  }
  return absl::OkStatus();
}

absl::Status Executor::load_programs(RunState& rs) {
  const Plan& plan = *rs.plan;
  rs.kernel_device.assign(plan.kernels.size(), 0);
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const PlannedKernel& pk = plan.kernels[i];
    ASSIGN_OR_RETURN(const size_t di, pk.buffers.empty() ? device_index(rs, pk.device)
                                                          : absl::StatusOr<size_t>(rs.device_of[pk.buffers[0]]));
    rs.kernel_device[i] = di;
    const RunState::Device& d = rs.devices[di];
    const CompiledKernel& k = (*rs.kernels)[i];
    if (d.w->has_program(k.key)) continue;
    if (absl::Status s = load_program(rs, di, k); !s.ok()) return failed(d.w, s, cat("loading kernel ", k.name), d.generation);
  }
  return absl::OkStatus();
}

absl::Status Executor::load_program(const RunState& rs, size_t device, const CompiledKernel& k) {
  const RunState::Device& d = rs.devices[device];
  grpc::ClientContext ctx;
  set_deadline(ctx, rs.deadline);
  wpb::LoadProgramRequest req;
  req.set_key(k.key);
  req.set_object(*k.object);
  req.set_abi(k.abi.serialize());
  wpb::LoadProgramResponse resp;
  auto st = stub(d.w);
  absl::Status s = st.ok() ? from_grpc((*st)->LoadProgram(&ctx, req, &resp)) : st.status();
  if (!s.ok()) return s;
  program_loads_.fetch_add(1, std::memory_order_relaxed);
  d.w->note_program(k.key, d.generation);
  if (resp.unloaded_size() > 0) {
    programs_unloaded_.fetch_add(resp.unloaded_size(), std::memory_order_relaxed);
    d.w->forget_programs(std::vector<std::string>(resp.unloaded().begin(), resp.unloaded().end()), d.generation);
  }
  return absl::OkStatus();
}

absl::Status Executor::load_missing(const RunState& rs, size_t device) {
  const RunState::Device& d = rs.devices[device];
  const std::vector<std::string> missing(d.answer.missing_programs().begin(), d.answer.missing_programs().end());
  d.w->forget_programs(missing, d.generation);
  for (const std::string& key : missing) {
    const CompiledKernel* k = nullptr;
    for (const CompiledKernel& c : *rs.kernels)
      if (c.key == key) k = &c;
    if (!k) return absl::InternalError(cat("the worker asks for program ", key, ", which this run does not launch"));
    RETURN_IF_ERROR(load_program(rs, device, *k));
  }
  return absl::OkStatus();
}

absl::Status Executor::add_launch(RunState& rs, size_t kernel) {
  const Plan& plan = *rs.plan;
  const PlannedKernel& pk = plan.kernels[kernel];
  const CompiledKernel& ck = (*rs.kernels)[kernel];
  RunState::Device& d = rs.devices[rs.kernel_device[kernel]];
  d.pending_kernels.push_back(kernel);
  wpb::Launch* l = d.pending.add_launches();
  l->set_key(ck.key);
  std::vector<uint64_t> slots(ck.abi.num_buffers(), 0);
  for (const KernelParam& p : ck.abi.params) slots[p.slot] = rs.ids.at(pk.buffers.at(p.slot));
  for (uint64_t id : slots) l->add_buffer_ids(id);
  for (const KernelVar& v : ck.abi.vars) {
    auto it = plan.vars.find(v.name);
    if (it == plan.vars.end())
      return absl::InvalidArgumentError(cat("kernel ", pk.name, " needs variable ", v.name, ", which the graph does not bind"));
    l->add_vars(it->second);
  }
  return absl::OkStatus();
}

absl::Status Executor::run_copy(RunState& rs, const PlannedCopy& c) {
  const Plan& plan = *rs.plan;
  auto t0 = std::chrono::steady_clock::now();
  const PlannedBuffer& src = plan.buffers[c.src];
  const PlannedBuffer& dst = plan.buffers[c.dst];
  uint64_t bytes = static_cast<uint64_t>(std::min(src.elements, dst.elements)) * scalar_bytes(src.dtype);
  auto data = read(rs.devices[rs.device_of[c.src]].w, rs.ids[c.src], 0, bytes, rs.deadline);
  absl::Status s = data.ok() ? write(rs.devices[rs.device_of[c.dst]].w, rs.ids[c.dst], 0, *data, rs.deadline) : data.status();
  if (!s.ok()) s = absl::Status(s.code(), cat("copying ", rs.devices[rs.device_of[c.src]].name, " -> ",
                                             rs.devices[rs.device_of[c.dst]].name, ": ", s.message()));
  rs.out.run_ms += ms_since(t0);
  return s;
}

void Executor::side_by_side(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  std::mutex mu;
  std::condition_variable cv;
  size_t left = n - 1;  // guarded by mu
  for (size_t k = 1; k < n; ++k)
    helpers_.submit([&, k] {
      fn(k);
      std::lock_guard l(mu);
      if (--left == 0) cv.notify_all();
    });
  fn(0);
  std::unique_lock l(mu);
  cv.wait(l, [&] { return left == 0; });
}

absl::Status Executor::run_steps(RunState& rs) {
  const Plan& plan = *rs.plan;
  const bool overlap = !collectives_.sequential && plan.waits_for.size() == plan.steps.size();
  if (!overlap) {
    for (const ScheduleStep& st : plan.steps) {
      if (st.kind == ScheduleStep::Kind::Kernel) {
        RETURN_IF_ERROR(add_launch(rs, st.index));
        continue;
      }
      RETURN_IF_ERROR(flush_launches(rs));
      if (st.kind == ScheduleStep::Kind::Collective) {
        RETURN_IF_ERROR(run_collective(rs, plan.collectives[st.index], st.index));
      } else {
        RETURN_IF_ERROR(run_copy(rs, plan.copies[st.index]));
      }
    }
    return absl::OkStatus();
  }
  // The steps as the dependency graph Plan::waits_for says: a device's launches gather in
  // order until a step elsewhere needs one of them; a collective starts on a thread of its
  // own as soon as what it reduces is computed, and the launches that do not need its
  // result go on meanwhile (DDP's overlap of the allreduce with the rest of the backward
  // pass). Each step still waits for every step it depends on, so the bits are those of
  // the sequential order.
  enum class State { Waiting, Batched, Running, Done };
  std::vector<State> state(plan.steps.size(), State::Waiting);
  // A collective on a helper thread, until it is waited for.
  struct Running {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;  // guarded by mu
    absl::Status status;
    void wait() {
      std::unique_lock l(mu);
      cv.wait(l, [&] { return done; });
    }
    bool finished() {
      std::lock_guard l(mu);
      return done;
    }
  };
  std::vector<std::unique_ptr<Running>> running(plan.steps.size());
  std::vector<std::vector<int>> batched(rs.devices.size());  // per device: its steps in `pending`
  // A collective still running after a failure may wait for the live group a folded one
  // holds: the run is over, so the fold (never sent) lets go of it first.
  absl::Cleanup join_all = [&] {
    bool unfinished = false;
    for (auto& r : running) unfinished |= r && !r->finished();
    if (unfinished) rs.folded.reset();
    for (auto& r : running)
      if (r) r->wait();
  };
  // Sends the batches of the devices marked (with a folded collective's other members),
  // side by side, and waits for them.
  auto flush = [&](std::vector<bool> which) -> absl::Status {
    if (std::find(which.begin(), which.end(), true) == which.end()) return absl::OkStatus();
    RETURN_IF_ERROR(flush_launches(rs, &which));
    for (size_t device = 0; device < which.size(); ++device) {
      if (!which[device]) continue;
      for (int step : batched[device]) state[step] = State::Done;
      batched[device].clear();
    }
    return absl::OkStatus();
  };
  // Waits for a running collective. A folded one's batches go first: the running one may
  // need the live group the fold holds until they are back.
  auto finish = [&](int step) -> absl::Status {
    if (rs.folded) {
      std::vector<bool> members(rs.devices.size(), false);
      for (size_t dev : rs.folded->devices) members[dev] = true;
      if (absl::Status sent = flush(members); !sent.ok()) {
        rs.folded.reset();
        running[step]->wait();
        return sent;
      }
    }
    Running& r = *running[step];
    r.wait();
    state[step] = State::Done;
    return r.status;
  };
  // The devices whose pending Executes hold a batched step: a kernel's, or a folded
  // collective's members.
  auto batched_on = [&](int step) -> std::vector<size_t> {
    const ScheduleStep& b = plan.steps[step];
    if (b.kind == ScheduleStep::Kind::Kernel) return {rs.kernel_device[b.index]};
    return rs.folded ? rs.folded->devices : std::vector<size_t>{};
  };
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const ScheduleStep& st = plan.steps[s];
    const std::optional<size_t> here =
        st.kind == ScheduleStep::Kind::Kernel ? std::optional<size_t>(rs.kernel_device[st.index]) : std::nullopt;
    // A collective the next step needs has nothing to overlap. Where it can, it goes into
    // its members' Executes, between the launches it waits for and those that need it: a
    // data-parallel step is then one Execute per worker, not three round trips.
    const bool needed_next = st.kind == ScheduleStep::Kind::Collective && s + 1 < plan.steps.size() &&
                             std::binary_search(plan.waits_for[s + 1].begin(), plan.waits_for[s + 1].end(), static_cast<int>(s));
    std::optional<CollectiveSetup> fold;
    if (needed_next && std::none_of(plan.waits_for[s].begin(), plan.waits_for[s].end(),
                                    [&](int d) { return state[d] == State::Running; })) {
      ASSIGN_OR_RETURN(fold, foldable(rs, plan.collectives[st.index], st.index));
    }
    std::vector<bool> members(rs.devices.size(), false);
    if (fold)
      for (int b : fold->members) members[rs.device_of[b]] = true;
    // What this step waits for: launches batched on other devices are sent now (on its
    // own device, or a folded collective's, they run before it in the same Execute); a
    // running collective is waited for, after this device's batch, which does not need
    // it, has gone.
    std::vector<bool> to_send(rs.devices.size(), false);
    std::vector<int> to_finish;
    for (int d : plan.waits_for[s]) {
      if (state[d] == State::Batched) {
        const std::vector<size_t> on = batched_on(d);
        // A step on one of the devices it is batched on runs after it in that Execute
        // (a folded collective's members' Executes go together whenever they go).
        if (here && std::find(on.begin(), on.end(), *here) != on.end()) continue;
        for (size_t dev : on)
          if (!(fold && members[dev])) to_send[dev] = true;
      } else if (state[d] == State::Running) {
        if (here && !batched[*here].empty()) to_send[*here] = true;
        to_finish.push_back(d);
      }
    }
    // A collective or a copy reaches buffers outside any Execute: those still to be
    // allocated by a device's first Execute are allocated first. (A folded one runs in
    // the Execute, after its allocations.)
    if (!here && !fold)
      for (size_t dev = 0; dev < rs.devices.size(); ++dev)
        if (rs.devices[dev].pending.allocs_size() > 0) to_send[dev] = true;
    RETURN_IF_ERROR(flush(to_send));
    for (int d : to_finish)
      if (state[d] == State::Running) RETURN_IF_ERROR(finish(d));
    switch (st.kind) {
      case ScheduleStep::Kind::Kernel:
        RETURN_IF_ERROR(add_launch(rs, st.index));
        batched[*here].push_back(static_cast<int>(s));
        state[s] = State::Batched;
        break;
      case ScheduleStep::Kind::Collective: {
        if (fold) {
          for (size_t dev : fold_collective(rs, plan.collectives[st.index], *fold)) batched[dev].push_back(static_cast<int>(s));
          state[s] = State::Batched;
          break;
        }
        if (needed_next) {
          RETURN_IF_ERROR(run_collective(rs, plan.collectives[st.index], st.index));
          state[s] = State::Done;
          break;
        }
        auto r = std::make_unique<Running>();
        Running* rp = r.get();
        running[s] = std::move(r);
        state[s] = State::Running;
        helpers_.submit([this, &rs, &plan, &st, rp] {
          absl::Status done = run_collective(rs, plan.collectives[st.index], st.index);
          std::lock_guard l(rp->mu);
          rp->status = std::move(done);
          rp->done = true;
          rp->cv.notify_all();
        });
        break;
      }
      case ScheduleStep::Kind::Copy:
        RETURN_IF_ERROR(run_copy(rs, plan.copies[st.index]));
        state[s] = State::Done;
        break;
    }
  }
  // Every collective is done before the outputs are read (the launches still batched go
  // with the outputs' reads).
  absl::Status first = absl::OkStatus();
  for (size_t s = 0; s < plan.steps.size(); ++s)
    if (state[s] == State::Running) first.Update(finish(static_cast<int>(s)));
  return first;
}

absl::Status Executor::read_outputs(RunState& rs, const std::vector<bool>& keep) {
  const Plan& plan = *rs.plan;
  RunOutcome& out = rs.out;
  struct Reading {
    size_t device;
    int slot = -1;  // index into the device's read_back; -1: streamed
  };
  std::vector<Reading> reading(plan.outputs.size());
  std::vector<uint64_t> out_bytes(rs.devices.size(), 0);
  absl::flat_hash_set<uint64_t> streamed;
  for (size_t k = 0; k < plan.outputs.size(); ++k) {
    const PlannedOutput& o = plan.outputs[k];
    const PlannedBuffer& pb = plan.buffers[o.buffer];
    const size_t di = rs.device_of[o.buffer];
    RunState::Device& d = rs.devices[di];
    const uint64_t id = rs.ids[o.buffer];
    reading[k].device = di;
    const uint64_t buffer_bytes = static_cast<uint64_t>(pb.elements) * scalar_bytes(pb.dtype);
    if (keep[k]) {
      BufferInfo b;
      b.device = d.name;
      b.dtype = o.dtype;
      b.elements = static_cast<uint64_t>(pb.elements);
      b.bytes = buffer_bytes;
      b.worker_buffer = id;
      b.worker_id = d.w->id();
      b.worker_generation = d.generation;
      d.temps.erase(std::remove(d.temps.begin(), d.temps.end(), id), d.temps.end());
      out.kept[k] = b;
      continue;
    }
    if (buffer_bytes <= kInlineBytes - out_bytes[di]) {
      out_bytes[di] += buffer_bytes;
      reading[k].slot = d.pending.read_back_size();
      d.pending.add_read_back(id);
      d.pending_out += buffer_bytes;
    } else {
      streamed.insert(id);
    }
  }
  for (RunState::Device& d : rs.devices) {
    const wpb::ExecuteRequest& p = d.pending;
    if (p.launches_size() == 0 && p.allocs_size() == 0 && p.read_back_size() == 0) continue;  // freed after the run
    for (uint64_t id : d.temps)
      if (!streamed.contains(id)) d.pending.add_free_after(id);
  }
  RETURN_IF_ERROR(flush_launches(rs));
  for (size_t k = 0; k < plan.outputs.size(); ++k) {
    if (keep[k]) continue;
    const PlannedOutput& o = plan.outputs[k];
    RunState::Device& d = rs.devices[reading[k].device];
    HostTensor t;
    t.dtype = o.dtype;
    t.shape = o.shape;
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * scalar_bytes(o.dtype);
    if (reading[k].slot >= 0) {
      if (reading[k].slot >= d.answer.outputs_size() || d.answer.outputs(reading[k].slot).size() < bytes)
        return absl::InternalError(cat("worker ", d.w->id(), " returned ", d.answer.outputs_size(), " outputs, not output ",
                                       reading[k].slot, " of ", bytes, " bytes"));
      // Each output has its own slot (one buffer read back twice comes back twice): take it.
      t.data = std::move(*d.answer.mutable_outputs(reading[k].slot));
      t.data.resize(bytes);
    } else {
      ASSIGN_OR_RETURN(t.data, read(d.w, rs.ids[o.buffer], 0, bytes, rs.deadline));
    }
    out.bytes_out += t.data.size();
    out.outputs[k] = std::move(t);
  }
  return absl::OkStatus();
}

absl::StatusOr<RunOutcome> Executor::run(const std::string& device, const std::string& tenant, const Plan& plan,
                                         const std::vector<CompiledKernel>& kernels,
                                         const absl::flat_hash_map<int, BoundInput>& inputs, const std::vector<bool>& keep,
                                         absl::Time deadline, bool profile) {
  if (keep.size() != plan.outputs.size())
    return absl::InternalError(cat("run: ", keep.size(), " keep flags for ", plan.outputs.size(), " outputs"));
  RunState rs;
  rs.plan = &plan;
  rs.kernels = &kernels;
  rs.deadline = deadline;
  rs.session_device = device;
  rs.tenant = tenant;
  rs.profile = profile;
  rs.out.outputs.resize(plan.outputs.size());
  rs.out.kept.resize(plan.outputs.size());
  // Whatever happens from here, the run's temporaries go (kept outputs are none).
  absl::Cleanup free_temps = [&] { free_temporaries(rs); };
  ASSIGN_OR_RETURN(std::vector<StreamedInput> streamed, bind_buffers(rs, inputs));
  RETURN_IF_ERROR(stream_inputs(rs, streamed));
  RETURN_IF_ERROR(load_programs(rs));
  RETURN_IF_ERROR(run_steps(rs));
  RETURN_IF_ERROR(read_outputs(rs, keep));
  return std::move(rs.out);
}

}  // namespace uop::server
