// The executor: runs a compiled plan on the worker of a device. It allocates what the run
// needs (outputs, intermediates, inline inputs) on the worker, writes inline inputs,
// loads the programs the worker lacks, launches the kernels in order, and reads the
// outputs back (or hands them to the session). Temporaries are freed whatever happens.
// A cached single-device Run with small tensors is one Execute round trip to the worker:
// the allocations, the inline inputs, the launches, the outputs read back and the frees
// all travel in it (worker.proto's ExecuteRequest). To a worker this uopd started, that
// Execute goes through the worker's execute lane (shared memory, transport/exec_lane.h) when
// it fits a slot and one is free, else over gRPC like every other call.
// A worker that fails mid-run is reported to the WorkerPool, and the client gets the
// pool's UNAVAILABLE status saying which worker and why.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"
#include "server/handler_threads.h"
#include "server/planner.h"
#include "server/rendezvous_service.h"
#include "server/sessions.h"
#include "server/workers.h"
#include "transport/lane_messages.h"

namespace google::protobuf {
class MessageLite;
}
namespace uopd::worker::v1 {
class CollectiveRequest;
}

namespace uop::server {

// What a plan buffer is bound to for one run.
struct BoundInput {
  const BufferInfo* session_buffer = nullptr;  // a buffer of the session, or
  const HostTensor* tensor = nullptr;          // inline data for this run
};

struct RunOutcome {
  // One entry per plan output: its data in `outputs`, or, for an output kept on its
  // worker, its buffer in `kept` (not yet recorded in the session).
  std::vector<HostTensor> outputs;
  std::vector<BufferInfo> kept;
  uint64_t kernels_run = 0;
  uint64_t collectives_run = 0;
  uint64_t bytes_in = 0, bytes_out = 0;      // moved to / from the workers
  double run_ms = 0;                         // kernels and copies (devices side by side)
  double collective_ms = 0;                  // collectives between the kernels
  // A profiled run only: every launch as its worker timed it, in the order they ran.
  struct LaunchTime {
    size_t kernel = 0;  // index into the plan's kernels
    std::string device;
    double ms = 0;
  };
  std::vector<LaunchTime> launch_times;
};

// How collectives between workers are run (docs/ARCHITECTURE.md, The service): members on one host reduce through
// shared memory, members on different hosts through Gloo, whose rendezvous is this
// scheduler's Rendezvous service.
struct CollectiveOptions {
  std::string rendezvous;  // host:port of the Rendezvous service; empty: only "shm" is possible
  // The store behind that service, where each collective's group is opened (its members,
  // its byte budget) before its members are called, and closed after: members set and get
  // keys only in a group that is open. Null: only "shm" is possible.
  RendezvousStore* groups = nullptr;
  // Bounds each member's wait for its peers: a member that died, stalled or never came
  // fails the step within it.
  absl::Duration timeout = absl::Seconds(30);
  // "" chooses by where the members are; "shm" or "gloo" forces one (gloo between workers
  // on one host too: what tests of the cross-host path run on one machine).
  std::string transport;
  // Run a plan's steps strictly one after another (uopd --sequential-steps): no collective
  // overlaps the launches after it. The bits are the same either way.
  bool sequential = false;
};

class Executor {
 public:
  explicit Executor(WorkerPool* pool, CollectiveOptions collectives = {})
      : pool_(pool), collectives_(std::move(collectives)) {}
  // Stops the thread that sends free_later's frees; those not sent yet are dropped (the
  // workers go with the scheduler).
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  void set_collective_options(CollectiveOptions o) { collectives_ = std::move(o); }

  // Runs the plan's steps in order. A single-device plan runs on `device` (the session's);
  // a multi-device one runs each kernel on the worker of its device ("CPU:1"), each
  // collective on all of its members at once, each copy as a read from one worker and a
  // write to another. Kernels of different devices between two collectives run side by
  // side. A worker that dies during a step fails the run with UNAVAILABLE naming it.
  // keep[i]: plan output i stays on its worker as a buffer for the session (else it is
  // read back). `tenant` picks its workers (WorkerPool::worker_for: its own processes
  // under tenant isolation). `profile`: the workers time every launch
  // (RunOutcome::launch_times); otherwise they are not asked to time anything.
  absl::StatusOr<RunOutcome> run(const std::string& device, const std::string& tenant, const Plan& plan,
                                 const std::vector<CompiledKernel>& kernels,
                                 const absl::flat_hash_map<int, BoundInput>& inputs, const std::vector<bool>& keep,
                                 absl::Time deadline, bool profile = false);
  // What run() allocates on the workers for one run: every plan buffer not bound to a
  // session buffer (intermediates, outputs, inline inputs, unbound kernel-level buffers).
  static uint64_t run_bytes(const Plan& plan, const absl::flat_hash_map<int, BoundInput>& inputs);

  // Buffer traffic for the buffer RPCs (and the run), in chunks of kChunk bytes: through
  // the worker's execute lane (transport/lane_messages.h) while it has one with a slot free,
  // else over gRPC. Failures come back as failed() says.
  using Worker = std::shared_ptr<WorkerHandle>;
  // `id` from new_buffer_id(w); released again when the allocation fails.
  absl::Status alloc(const Worker& w, uint64_t id, uint64_t bytes, absl::Time deadline);
  absl::Status write(const Worker& w, uint64_t id, uint64_t offset, std::string_view data, absl::Time deadline);
  // Writes into one worker buffer piece after piece (an Upload's chunks as they arrive).
  class BufferWriter {
   public:
    virtual ~BufferWriter() = default;
    // Writes `data` at `offset`, and may take its bytes. A failure means: stop writing;
    // finish() says why.
    virtual absl::Status write(uint64_t offset, std::string& data) = 0;
    // Waits for the writes still in flight: the first failure of all (as failed() says
    // it), or OK.
    virtual absl::Status finish() = 0;
  };
  std::unique_ptr<BufferWriter> open_writer(const Worker& w, uint64_t id, absl::Time deadline);
  absl::StatusOr<std::string> read(const Worker& w, uint64_t id, uint64_t offset, uint64_t length, absl::Time deadline);
  // Streams a read chunk by chunk to `sink` (a Download); stops early if sink returns false.
  // The sink may take the chunk's bytes (swap them out): a Download forwards them without
  // a copy.
  absl::Status read_into(const Worker& w, uint64_t id, uint64_t offset, uint64_t length, absl::Time deadline,
                         const std::function<bool(uint64_t offset, std::string& data)>& sink);
  // The ids are released for reuse once the worker freed them.
  // `generation`: the process the ids are of (default: the worker's current one).
  absl::Status free(const Worker& w, const std::vector<uint64_t>& ids, std::optional<uint64_t> generation = std::nullopt);
  // The same without waiting (nothing waits on a free): queued for a thread of the
  // executor's own, which sends them in order, so a Run's answer never waits for the
  // frees of the buffers it retired. Nothing is sent when `w` is no longer the process of
  // `generation` (its buffers are gone with it).
  void free_later(const Worker& w, uint64_t generation, const std::vector<uint64_t>& ids);
  // Returns once every free_later queued before the call has been sent and answered (or
  // failed): what a test waits on instead of time.
  void wait_for_frees();

  // One request of `kind` through `lane` and its answer parsed into `resp`; nullopt when
  // it does not go that way (the request, or the reply as `reply_bound` bounds it, does
  // not fit a slot, or every slot is busy): the caller sends it over gRPC. `cancel`, set
  // by another thread, abandons the call (CANCELLED).
  static std::optional<absl::Status> call_on_lane(ExecLane& lane, lane::Kind kind,
                                                  const google::protobuf::MessageLite& req, uint64_t reply_bound,
                                                  absl::Time deadline, google::protobuf::MessageLite* resp,
                                                  const std::atomic<bool>* cancel = nullptr);

  // Execute calls sent so far through execute lanes, and over gRPC.
  // Programs loaded onto workers, and unloaded by workers to stay under their program
  // budget (uop-worker --max-program-bytes), so far.
  struct ExecuteCounts {
    uint64_t lane = 0, grpc = 0;
    uint64_t program_loads = 0, programs_unloaded = 0;
  };
  ExecuteCounts execute_counts() const {
    return {lane_executes_.load(), grpc_executes_.load(), program_loads_.load(), programs_unloaded_.load()};
  }
  // Launches the workers timed for profiled runs, so far.
  uint64_t launches_timed() const { return launches_timed_.load(); }
  // Collective groups formed so far (each reused by every later collective of its device
  // set until a member leaves or a collective on it fails), those alive now, the
  // collectives whose members are running them now, and those run so far.
  struct CollectiveCounts {
    uint64_t groups_formed = 0, groups_alive = 0, running = 0;
    uint64_t run = 0;  // collectives run so far (a bucket is one)
    uint64_t shm = 0, gloo = 0, nccl = 0;  // of them, by the transport they ran over
  };
  CollectiveCounts collective_counts() const;

  // A fresh id for a buffer on `w` (the scheduler names them): random, so that an id
  // tells nothing about the others (WorkerHandle::new_buffer_id).
  static uint64_t new_buffer_id(const Worker& w) { return w->new_buffer_id(); }

  // The status to hand the client when an RPC to `w` failed: worker deaths go through the
  // pool (which names the worker and restarts it), other errors keep their code.
  absl::Status failed(const Worker& w, const absl::Status& s, std::string_view what,
                      std::optional<uint64_t> generation = std::nullopt);

  static constexpr uint64_t kChunk = 1 << 20;
  // Inline input bytes, and separately output bytes, one Execute carries to or from a
  // worker; a Run's larger inputs and outputs are streamed in kChunk chunks around it.
  static constexpr uint64_t kInlineBytes = 4 << 20;

  // The current process's stub, or UNAVAILABLE while the worker is not up.
  using Stub = ::uopd::worker::v1::Worker::Stub;
  static absl::StatusOr<std::shared_ptr<Stub>> stub(const Worker& w);

 private:
  struct RunState;
  // run()'s steps, in order. What they allocate on the workers is listed in the run's
  // temporaries, which run() frees once whatever happens (free_temporaries).
  // The device a plan buffer or kernel names (its own in a multi-device plan, else the
  // session's): its index in the run's devices, its worker taken on first use.
  absl::StatusOr<size_t> device_index(RunState& rs, const std::string& named);
  // An inline input too large to travel in a device's first Execute: its plan buffer and data.
  struct StreamedInput {
    size_t buffer;
    std::string_view data;
  };
  // Every plan buffer as a worker buffer on its device: a session buffer as it is (on that
  // worker, of this generation), everything else a new id, allocated by the device's first
  // Execute with its inline data where that fits; the inputs that do not are returned.
  absl::StatusOr<std::vector<StreamedInput>> bind_buffers(RunState& rs, const absl::flat_hash_map<int, BoundInput>& inputs);
  // Allocates and writes those, in chunks, before the first Execute.
  absl::Status stream_inputs(RunState& rs, const std::vector<StreamedInput>& streamed);
  // Each kernel's device, and the programs its worker does not have yet, loaded.
  absl::Status load_programs(RunState& rs);
  // One kernel onto the worker of rs.devices[device]; what the worker unloaded for it is forgotten.
  absl::Status load_program(const RunState& rs, size_t device, const CompiledKernel& k);
  // The programs an Execute found missing (d.answer), loaded again.
  absl::Status load_missing(const RunState& rs, size_t device);
  // The plan's steps: launches gather per device (add_launch) until a collective or a copy
  // needs their results; a collective runs beside the launches that do not need it.
  absl::Status run_steps(RunState& rs);
  absl::Status add_launch(RunState& rs, size_t kernel);
  absl::Status run_copy(RunState& rs, const PlannedCopy& c);
  // The outputs: handed over to the session (keep[i]; then not freed), or read back. Those
  // that fit come back with each device's last Execute, which also frees the run's
  // temporaries; larger ones are streamed after it.
  absl::Status read_outputs(RunState& rs, const std::vector<bool>& keep);
  void free_temporaries(RunState& rs);
  // Sends each device's gathered launches (only the devices `which` marks, when given) and
  // waits for them.
  // A folded collective's members are sent together: `which` gains them.
  absl::Status flush_launches(RunState& rs, std::vector<bool>* which = nullptr);
  // The collective's setup when it can go into its members' Executes: the members are
  // embedded workers of one host (shm, each with its lane) and the run folds nothing yet;
  // nullopt otherwise.
  struct CollectiveSetup;
  absl::StatusOr<std::optional<CollectiveSetup>> foldable(const RunState& rs, const PlannedCollective& c,
                                                          size_t index) const;
  // The collective as a launch in each member's pending Execute; the live group is held
  // until those Executes are done. Returns the members' devices.
  std::vector<size_t> fold_collective(RunState& rs, const PlannedCollective& c, const CollectiveSetup& cs);
  absl::Status run_collective(RunState& rs, const PlannedCollective& c, size_t index);
  absl::StatusOr<CollectiveSetup> collective_setup(const RunState& rs, const PlannedCollective& c, size_t index) const;
  // Member i's part of call `call` of the collective (a group not kept makes one call per
  // segment) in the group `name`.
  ::uopd::worker::v1::CollectiveRequest member_request(const RunState& rs, const PlannedCollective& c,
                                                       const CollectiveSetup& cs, const std::string& name, size_t call,
                                                       size_t i) const;
  // fn(0) on the calling thread and fn(1) ... fn(n - 1) on helper threads, side by side;
  // returns once every one has.
  void side_by_side(size_t n, const std::function<void(size_t)>& fn);
  // Picks what to tell the client from the failures of calls made side by side: a worker
  // that died explains the others' failures (a peer gone, a call cancelled).
  absl::Status first_failure(RunState& rs, std::vector<std::pair<Worker, absl::Status>> failures, std::string_view what);

  // The collective groups that live across runs: one per tenant, transport and member
  // processes (worker id and generation, in rank order), so a worker that restarts, or
  // another tenant, never finds an old group. Its name is 128 random bits that only the
  // scheduler and the members' workers see (never a client). A group one of whose
  // processes has been replaced goes when its members' next group forms; at most
  // kMaxLiveGroups live, the least recently used closed first.
  struct LiveGroup;
  static constexpr size_t kMaxLiveGroups = 64;
  std::shared_ptr<LiveGroup> live_group(const std::string& key, const std::string& transport,
                                        const std::vector<std::pair<std::string, uint64_t>>& members);
  void drop_live_group(const std::string& key, const LiveGroup* g);
  mutable std::mutex groups_mu_;
  std::map<std::string, std::shared_ptr<LiveGroup>> groups_;  // guarded by groups_mu_
  uint64_t group_clock_ = 0;                                   // guarded by groups_mu_
  std::atomic<uint64_t> groups_formed_{0}, collectives_running_{0}, collectives_run_{0};
  std::atomic<uint64_t> collectives_shm_{0}, collectives_gloo_{0}, collectives_nccl_{0};

  // free_later's queue and the thread that empties it, started by the first free_later.
  struct LaterFree {
    Worker w;
    uint64_t generation = 0;
    std::vector<uint64_t> ids;
  };
  void send_frees();  // the thread's loop
  std::mutex frees_mu_;
  std::condition_variable frees_cv_;
  std::deque<LaterFree> frees_;  // guarded by frees_mu_
  uint64_t frees_queued_ = 0, frees_done_ = 0;  // guarded by frees_mu_
  bool frees_stop_ = false;      // guarded by frees_mu_
  std::thread freer_;            // started under frees_mu_

  WorkerPool* pool_;
  CollectiveOptions collectives_;
  std::atomic<uint64_t> lane_executes_{0}, grpc_executes_{0};
  std::atomic<uint64_t> program_loads_{0}, programs_unloaded_{0};
  std::atomic<uint64_t> launches_timed_{0};
  // What runs beside a run's own thread (the other devices' Executes, a collective's
  // other members, a collective overlapping launches): threads kept for the next run, not
  // started for each, since a thread's start is tens of microseconds on a small VM and a
  // warm training step has several. Never capped: the members of one collective must all
  // run at once. Last, so that it stops first.
  HandlerThreads helpers_{std::numeric_limits<size_t>::max()};
};

}  // namespace uop::server
