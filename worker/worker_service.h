// The worker's state and the Worker gRPC service over it (proto/worker.proto, docs/ARCHITECTURE.md, The service).
// WorkerRuntime is a plain class over one device backend (worker/device_backend.h: cpu or
// cuda): buffers by id under a byte budget, loaded programs by cache key, and Execute,
// which checks that every buffer a launch passes is at least as large as the kernel's ABI
// says before the backend runs it, so a launch can never make a kernel touch memory
// outside its buffers. Every launch is watched (launch_watchdog.h): one past the request's
// deadline, or whose caller went away, is stopped, and the worker is free again at once.
// WorkerService only decodes requests, calls the runtime and encodes the answers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/worker.grpc.pb.h"
#include "transport/exec_lane.h"
#include "worker/collectives/collective.h"
#include "worker/device_backend.h"
#include "worker/launch_watchdog.h"

namespace uop {

struct WorkerRuntimeOptions {
  std::string device = "CPU:0";
  std::string target;             // cpu: what Info reports as the CPU target id
  int threads = 0;                // cpu: <= 0, the machine's hardware threads
  uint64_t max_buffer_bytes = 0;  // 0: no budget
  // What loaded programs may hold together (each charged program_charge() bytes); past it
  // the least recently launched programs are unloaded. 0: no budget.
  uint64_t max_program_bytes = 0;
  // How collectives reach the scheduler's Rendezvous (its credentials); null: plaintext.
  std::shared_ptr<const cluster_auth::Dialer> rendezvous_dial;
  LaunchWatchdogOptions watchdog;  // how launches that must end are ended
};

struct LaunchSpec {
  std::string key;
  std::vector<uint64_t> buffer_ids;  // by slot; 0 for none
  std::vector<int64_t> vars;
  // Set instead of a program: this worker's part of a collective over buffer_ids (one, or
  // a bucket's in order), run where it stands among the launches (worker.proto's
  // Launch.collective); no program is looked up for it and it is not timed per launch.
  std::optional<CollectiveSpec> collective;
};

// A buffer an ExecuteBatch allocates: zeroed, then `data` written at its start.
struct BufferInit {
  uint64_t id = 0;
  uint64_t bytes = 0;
  std::string_view data;
};

// worker.proto's ExecuteRequest: what a cached Run needs of one worker in one round trip.
struct ExecuteBatch {
  std::vector<BufferInit> allocs;     // first, in order
  std::vector<LaunchSpec> launches;   // then in order
  std::vector<uint64_t> read_back;    // then each buffer whole
  std::vector<uint64_t> free_after;   // last, whatever happened before
  bool profile = false;               // time each launch (ExecuteResult::launch_ms)
};

struct ExecuteResult {
  // Programs the launches name that are not loaded (unloaded under the program budget
  // since the scheduler loaded them): when not empty, nothing of the batch happened, not
  // even its frees, so the caller can load them and send the same batch again.
  std::vector<std::string> missing_programs;
  double run_ms = 0;                 // the launches, the collectives among them apart
  double collective_ms = 0;          // the collectives among the launches
  std::vector<BufferSlice> outputs;  // one per read_back (they stay valid after the frees)
  std::vector<double> launch_ms;     // with ExecuteBatch::profile: one per launch, in order
};

struct WorkerInfo {
  std::string device, backend, target;
  int64_t pid = 0;
  uint64_t buffers = 0, buffer_bytes = 0, programs = 0;
  uint64_t program_bytes = 0;     // what the loaded programs are charged, together
  uint64_t programs_unloaded = 0; // under the program budget, since the worker started
  int threads = 0;
};

class WorkerRuntime {
 public:
  // On the CPU (a CpuBackend from options.target and options.threads).
  explicit WorkerRuntime(WorkerRuntimeOptions options);
  // On another device (worker/cuda/cuda_device.h).
  WorkerRuntime(WorkerRuntimeOptions options, std::unique_ptr<DeviceBackend> backend);

  // ALREADY_EXISTS for an id in use, INVALID_ARGUMENT for id 0 (it means "no buffer" in
  // a launch), RESOURCE_EXHAUSTED past the byte budget or when memory runs out.
  absl::Status alloc_buffer(uint64_t id, uint64_t bytes);
  // Unknown ids are skipped; returns how many buffers were freed.
  uint64_t free_buffers(std::span<const uint64_t> ids);
  // NOT_FOUND for an unknown id, OUT_OF_RANGE unless [offset, offset + size) is inside.
  absl::Status write_buffer(uint64_t id, uint64_t offset, std::string_view data);
  // [offset, offset + length), length 0 meaning to the end. Same errors as write_buffer.
  absl::StatusOr<BufferSlice> read_buffer(uint64_t id, uint64_t offset, uint64_t length) const;

  // Idempotent: a key already loaded is not loaded again. INVALID_ARGUMENT for an ABI
  // that does not parse or an object that does not link. Past the program budget, the
  // least recently launched (or loaded) programs other than this one are unloaded, their
  // keys appended to `unloaded`; a launch running one keeps it until it returns.
  absl::Status load_program(const std::string& key, std::string_view object, std::string_view abi_text,
                            std::vector<std::string>* unloaded = nullptr);
  bool has_program(const std::string& key) const;
  // What a program of `object_bytes` counts against the budget: its object and what
  // linking it costs beyond that (a JIT dylib, page-rounded sections; a CUDA module).
  static uint64_t program_charge(uint64_t object_bytes) { return object_bytes + kProgramOverheadBytes; }
  static constexpr uint64_t kProgramOverheadBytes = 64 << 10;

  // Runs the launches in order and stops at the first failure, whose message names the
  // launch; every program is looked up first (FAILED_PRECONDITION naming the first one not
  // loaded, nothing run). `cancelled`, if given, is asked between launches and while one runs (a caller
  // that went away does not keep the worker busy); at `deadline` the launch running is
  // stopped: DEADLINE_EXCEEDED, or CANCELLED, naming it. Returns the time spent running,
  // in milliseconds. With `launch_ms`, each launch is timed and its time appended there
  // (the device's own timer where its backend has one, else a monotonic clock around
  // the launch); without it nothing is timed per launch.
  absl::StatusOr<double> execute(std::span<const LaunchSpec> launches, const std::function<bool()>& cancelled = {},
                                 absl::Time deadline = absl::InfiniteFuture(),
                                 std::vector<double>* launch_ms = nullptr) const;

  // An ExecuteBatch: alloc_buffer + write_buffer for each of its allocs, the launches as
  // execute() runs them, read_buffer of each read_back buffer, then free_buffers of
  // free_after whether or not the rest succeeded (a failed run leaves no temporaries).
  // Stops at the first failure; its message says which step ("allocating buffer 7: ...").
  // First of all, the programs: a batch naming one not loaded does nothing and says which
  // (ExecuteResult::missing_programs).
  absl::StatusOr<ExecuteResult> execute(const ExecuteBatch& batch, const std::function<bool()>& cancelled = {},
                                        absl::Time deadline = absl::InfiniteFuture());

  // This worker's part of a collective over buffer `id` (in place): the buffer must hold
  // spec.elements values of spec.dtype. NOT_FOUND for an unknown buffer; otherwise
  // run_collective's errors (collective.h), each naming the buffer. `cancelled` is asked
  // while waiting for peers. Returns the time it took, in milliseconds.
  absl::StatusOr<double> collective(const CollectiveSpec& spec, uint64_t id,
                                    const std::function<bool()>& cancelled = {}) const;
  // The same over a bucket (spec.bucket): one buffer id per entry.
  absl::StatusOr<double> collective(const CollectiveSpec& spec, std::span<const uint64_t> ids,
                                    const std::function<bool()>& cancelled = {}) const;

  WorkerInfo info() const;
  const WorkerRuntimeOptions& options() const { return options_; }

 private:
  absl::StatusOr<std::shared_ptr<DeviceMemory>> find_buffer(uint64_t id) const;
  using Program = std::shared_ptr<const DeviceProgram>;
  // The program of each launch (null where not loaded), each marked as just used.
  std::vector<Program> resolve(std::span<const LaunchSpec> launches) const;
  // Returns the time spent running, the collectives' apart (added to *collective_ms).
  absl::StatusOr<double> run_launches(std::span<const LaunchSpec> launches, std::span<const Program> programs,
                                      const std::function<bool()>& cancelled, absl::Time deadline,
                                      std::vector<double>* launch_ms, double* collective_ms = nullptr) const;
  absl::Status run_launch(size_t index, const LaunchSpec& launch, const DeviceProgram& prog,
                          const std::function<bool()>& cancelled, absl::Time deadline, double* launch_ms) const;

  WorkerRuntimeOptions options_;
  // First, so it goes last: buffers and programs are the backend's.
  std::unique_ptr<DeviceBackend> backend_;
  mutable std::mutex mu_;  // guards the two tables and the byte count, never held while running
  struct BufferEntry {
    std::shared_ptr<DeviceMemory> memory;  // null while alloc_buffer allocates it
    uint64_t bytes = 0;                    // counted against the budget from the start
    uint64_t serial = 0;                   // which alloc_buffer call made the entry
  };
  absl::flat_hash_map<uint64_t, BufferEntry> buffers_;
  uint64_t next_serial_ = 0;
  struct ProgramEntry {
    Program program;
    uint64_t charge = 0;                      // program_charge of its object
    std::list<std::string>::iterator recent;  // its place in recent_
  };
  absl::flat_hash_map<std::string, ProgramEntry> programs_;
  // Loaded programs' keys, the most recently launched (or loaded) first: the budget
  // unloads from the back. Launches reorder it, hence mutable.
  mutable std::list<std::string> recent_;
  uint64_t program_bytes_ = 0;
  uint64_t programs_unloaded_ = 0;
  uint64_t buffer_bytes_ = 0;
  mutable LaunchWatchdog watchdog_;
};

// The gRPC adapter. Synchronous handlers on purpose: Execute blocks for as long as its
// kernels run, and the sync server gives each call its own thread (a callback handler
// would block gRPC's shared executor), and Server::Shutdown waits for them, which is
// what draining on SIGTERM needs.
class WorkerService final : public uopd::worker::v1::Worker::Service {
 public:
  explicit WorkerService(WorkerRuntime* runtime) : rt_(runtime) {}

  grpc::Status Info(grpc::ServerContext*, const uopd::worker::v1::InfoRequest*,
                    uopd::worker::v1::InfoResponse*) override;
  grpc::Status AllocBuffer(grpc::ServerContext*, const uopd::worker::v1::AllocBufferRequest*,
                           uopd::worker::v1::AllocBufferResponse*) override;
  grpc::Status FreeBuffers(grpc::ServerContext*, const uopd::worker::v1::FreeBuffersRequest*,
                           uopd::worker::v1::FreeBuffersResponse*) override;
  grpc::Status WriteBuffer(grpc::ServerContext*, grpc::ServerReader<uopd::worker::v1::WriteChunk>*,
                           uopd::worker::v1::WriteBufferResponse*) override;
  grpc::Status ReadBuffer(grpc::ServerContext*, const uopd::worker::v1::ReadBufferRequest*,
                          grpc::ServerWriter<uopd::worker::v1::ReadChunk>*) override;
  grpc::Status LoadProgram(grpc::ServerContext*, const uopd::worker::v1::LoadProgramRequest*,
                           uopd::worker::v1::LoadProgramResponse*) override;
  grpc::Status Execute(grpc::ServerContext*, const uopd::worker::v1::ExecuteRequest*,
                       uopd::worker::v1::ExecuteResponse*) override;
  // Blocks until every member has joined and the buffer holds the result, or the
  // collective failed (a peer died: UNAVAILABLE naming it; one never came or stalled:
  // DEADLINE_EXCEEDED), bounded by the request's timeout_ms and the call's deadline.
  grpc::Status Collective(grpc::ServerContext*, const uopd::worker::v1::CollectiveRequest*,
                          uopd::worker::v1::CollectiveResponse*) override;

  // Handlers running right now: what a drain waits for.
  int in_flight() const { return in_flight_.load(); }

 private:
  struct InFlight {
    explicit InFlight(std::atomic<int>& n) : n_(n) { n_.fetch_add(1); }
    ~InFlight() { n_.fetch_sub(1); }
    std::atomic<int>& n_;
  };
  WorkerRuntime* rt_;
  std::atomic<int> in_flight_{0};
};

// worker.proto's Execute on the runtime: what the gRPC handler and the execute lane both
// run, until `deadline` (the call's).
absl::Status run_execute(WorkerRuntime& rt, const uopd::worker::v1::ExecuteRequest& req,
                         uopd::worker::v1::ExecuteResponse* resp, const std::function<bool()>& cancelled,
                         absl::Time deadline);

// The execute lane's handler (transport/exec_lane.h, messages in transport/lane_messages.h):
// Execute as run_execute, Write and Read as write_buffer and read_buffer. INVALID_ARGUMENT
// for a request that is none of them; RESOURCE_EXHAUSTED for a reply that does not fit
// the slot (uopd asks only for what fits).
ExecLane::Handler lane_handler(WorkerRuntime* rt);

// Default and bounds for ReadBuffer's chunk_bytes: gRPC clients refuse messages over
// 4 MiB unless told otherwise.
inline constexpr uint32_t kDefaultReadChunkBytes = 1 << 20;
inline constexpr uint32_t kMaxReadChunkBytes = (4u << 20) - (64u << 10);

}  // namespace uop
