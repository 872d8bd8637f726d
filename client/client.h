// The C++ client of uopd: a small library over the Uopd gRPC service (proto/uopd.proto)
// that takes and gives IR nodes and HostTensors, so a program can compile, run and explain
// graphs remotely without LLVM, CUDA or the generated protobuf headers (the stub lives
// behind detail::Connection in client.cc).
//
//   auto client = Client::connect({.address = "127.0.0.1:7070"});
//   auto session = (*client)->create_session();
//   auto result = session->run(g.root, g.names, {{"x", HostTensor::random(...)}});
//
// Every call returns absl::Status: the gRPC status the server sent, same code and message
// (status_from_grpc), or a client-side check of what came back (DATA_LOSS, INTERNAL).
// Each request carries ClientOptions::deadline. Buffers travel in chunks of
// ClientOptions::chunk_bytes (1 MiB) over the streaming Upload / Download calls.
//
// A Client and its Sessions may be used from several threads at once (gRPC stubs are
// thread-safe), except that closing, moving or destroying a Session is for one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/codec.h"

namespace uop::client {

// Where uopd listens by default (its --listen default); the one place the port is named.
inline constexpr char kDefaultAddress[] = "127.0.0.1:7070";
// Bulk data moves in chunks of this size unless ClientOptions says otherwise.
inline constexpr uint32_t kDefaultChunkBytes = 1u << 20;
// The server takes chunks up to 4 MiB; gRPC's default message limit counts the whole
// message, so the data stays a little under it to leave room for ids and offsets.
inline constexpr uint32_t kMaxChunkBytes = (4u << 20) - (4u << 10);

struct ClientOptions {
  std::string address = kDefaultAddress;  // HOST:PORT
  absl::Duration deadline = absl::Seconds(60);        // each request
  absl::Duration connect_timeout = absl::Seconds(10);  // connect() waiting for the channel
  uint32_t chunk_bytes = kDefaultChunkBytes;  // upload / download; clamped to [1, kMaxChunkBytes]
  // Sent as "authorization: Bearer <token>" on every request when set: the tenant's token
  // of a uopd started with --tokens-file (`uop --token`, $UOPD_TOKEN). Over TLS it travels
  // as gRPC call credentials; on a plaintext channel (loopback) as plain metadata, since
  // gRPC sends call credentials over secure channels only.
  std::string bearer_token;
  // TLS to a uopd started with --tls-cert: on when `tls` is set or any file is given.
  // tls_ca (PEM) checks the server's certificate (empty: the system's roots); tls_cert and
  // tls_key are this client's certificate, for a server that requires one
  // (--tls-client-ca). tls_server_name: the name to expect in the server's certificate
  // instead of the host of `address`.
  bool tls = false;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  bool uses_tls() const { return tls || !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty(); }
  // The first connect() of the process raises glibc's mmap and trim thresholds (mallopt)
  // so that the 1-4 MiB blocks of uploads and downloads are reused instead of page-faulted
  // in again for every chunk (a 256 MiB download otherwise spends most of its time in
  // page faults). These settings are process-wide: an application with its own allocator
  // policy sets this to false (setting GLIBC_TUNABLES has the same effect).
  bool tune_malloc = true;
};

// What to compile for. Empty backend: the server's default ("cpu").
struct Target {
  std::string backend;  // "cpu" or "cuda"
  std::string arch;     // cuda: "sm_80", "sm_90"; cpu: "" (the workers' CPU)
};
// "cpu", "cuda", "cuda:sm_90"; INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<Target> parse_target(std::string_view text);
std::string target_str(const Target& t);  // the inverse; "cpu" for the default

enum class CacheStatus { Unspecified, Hit, Miss, Coalesced };
std::string_view cache_status_name(CacheStatus s);  // "hit", "miss", "coalesced", "unspecified"

// One kernel of a compiled graph, as uopd.v1.Kernel describes it.
struct Kernel {
  std::string name;
  std::string digest;     // hex SHA-256 of the normalized kernel
  std::string cache_key;  // hex SHA-256 of (digest, target, compiler build id, options)
  CacheStatus status = CacheStatus::Unspecified;
  std::string tier;       // for Hit: "memory", "disk" or "redis"
  double compile_ms = 0;  // for Miss
  std::string abi;        // the kernel ABI, text form (Compile's answer; empty in a Run's)
  std::string binary;     // when asked for: the object (cpu) or cubin (cuda)
  std::string source;     // when asked for: LLVM IR or CUDA C
};
// How a person reads a kernel's cache status: "miss, compiled in 12 ms", "hit (memory)",
// "coalesced (waited for a concurrent compile)".
std::string describe_cache(const Kernel& k);

// The loop schedule one kernel is compiled with (uopd.v1.KernelSchedule): its digest
// ("" for a graph of one kernel) and the schedule's text (compiler/passes/loop_schedule.h).
struct KernelSchedule {
  std::string digest;
  std::string schedule;
};

struct CompileResult {
  std::vector<Kernel> kernels;  // execution order; a repeated kernel appears once
  std::string graph_digest;
  bool plan_cached = false;
};

// What uopd's schedule search did for one kernel (uopd.v1.TuneResponse).
struct TuneResult {
  std::string name, digest;
  std::string heuristic_schedule, schedule;  // schedule "": the heuristic's stays
  double before_ms = 0, after_ms = 0;        // one launch, the heuristic's and the winner's
  bool from_record = false;                  // a record existed: nothing was searched
  std::string skipped;                       // why it was not searched
  uint64_t candidates_timed = 0;
  uint64_t dropped_compile = 0, dropped_mismatch = 0, dropped_crash = 0, dropped_timeout = 0;
  double seconds = 0;
};

struct ExplainStage {
  std::string name;    // a pipeline stage
  std::string kernel;  // for per-kernel stages
  std::string text;    // the IR after the stage
};

struct WorkerStatus {
  std::string id, device, address;
  std::string state;  // "up", "starting", "down"
  int64_t pid = 0;    // embedded workers
  uint64_t restarts = 0;
  std::string last_error;
};

// The server's counters (uopd.v1.StatsResponse).
struct Stats {
  uint64_t compiles = 0;
  uint64_t cache_hits_memory = 0, cache_hits_disk = 0, cache_hits_redis = 0;
  uint64_t cache_misses = 0, cache_coalesced = 0, cache_errors = 0;
  uint64_t plan_cache_hits = 0, plan_cache_misses = 0;
  uint64_t kernels_run = 0;
  // Execute calls uopd made to workers: through shared memory (embedded workers) / gRPC.
  uint64_t worker_executes_lane = 0, worker_executes_grpc = 0;
  uint64_t sessions = 0, buffers = 0, buffer_bytes = 0;
  // The compile pool (the caller's tenant's share with tokens): tasks waiting, tasks
  // running, requests holding a compile slot.
  uint64_t compile_queue_depth = 0, compile_tasks_running = 0, compiles_in_progress = 0;
  uint64_t launches_timed = 0;  // launches the workers timed (profiled Runs only)
  // Weights written by LoadModel (the whole server's): one upload per model loaded.
  uint64_t model_weight_buffers_written = 0, model_weight_bytes_written = 0;
  // Schedule search: searches, candidates timed and dropped by reason, tuning records
  // found by tier, missing, refused, written; the server's --search.
  uint64_t searches = 0, candidates_timed = 0;
  uint64_t candidates_dropped_compile = 0, candidates_dropped_mismatch = 0, candidates_dropped_crash = 0,
           candidates_dropped_timeout = 0;
  uint64_t tuning_records_memory = 0, tuning_records_disk = 0, tuning_records_redis = 0;
  uint64_t tuning_record_misses = 0, tuning_record_errors = 0, tuning_records_written = 0;
  // Searches whose cluster lease another server held (left to it), and searches another
  // server took over mid-search (stopped without a record).
  uint64_t leases_held_elsewhere = 0, leases_lost = 0;
  std::string search;
  // Data clients sent (uploads, inline bindings, models) and the graphs Runs carried (one
  // that names a held graph by digest carries none), since uopd started.
  uint64_t bytes_uploaded = 0, run_graph_bytes = 0;
  std::vector<WorkerStatus> workers;
  std::string compiler_build_id;
};

// Binds one input of a graph (a BUFFER at tensor level, a PARAM at kernel level):
//   {"x", HostTensor::random(Scalar::Float32, {12}, 1)}   by name, data inline
//   {node, buffer_id}                                      by node, data already uploaded
//   {3u, tensor}                                           by wire index (unsigned literal)
struct Input {
  // The node: by the graph's names, by wire index (in the graph as run() encodes it), or
  // as one of the nodes passed to run() (the client finds its wire index).
  std::variant<std::string, uint32_t, const UOp*> node;
  // A buffer of the session (its id), or data sent inline with this run only.
  std::variant<std::string, HostTensor> value;
};

struct RunOutput {
  std::string name;    // from the graph's names, else "out<i>"
  HostTensor tensor;   // dtype and shape always; data unless the output was kept
  std::string buffer_id;  // set when kept in the session (run(..., keep_outputs = true))
  bool kept() const { return !buffer_id.empty(); }
};

// How a graph is run (Session::run).
struct RunOptions {
  // Outputs stay in the session as buffers; only their ids, dtypes and shapes come back.
  bool keep_outputs = false;
  bool profile = false;  // the workers time every launch (RunResult::profile)
  // Output k (an index into RunResult::outputs) written into the session's buffer `id`
  // instead of a new one (uopd.proto's RunRequest.assign): the id stays and holds the
  // output, its old contents are freed. What a training step does with its parameters.
  std::vector<std::pair<size_t, std::string>> assign;
  // The session keeps the graph: a later run of the same graph (digest and names) sends
  // only its digest and bindings (RunRequest.hold_graph, graph_digest). A run that finds
  // it no longer held sends it again.
  bool hold_graph = false;
};

// One kernel's share of a profiled run (uopd.proto's KernelProfile).
struct KernelProfile {
  std::string name, digest, device;
  uint64_t launches = 0;
  double total_ms = 0, per_launch_ms = 0;
  double flops = 0, bytes = 0;          // the compiler's estimate, all launches
  double gflops = 0, gbytes_per_s = 0;  // 0 where there is no estimate or no time
  std::string schedule;                 // the axis types of its ranges
};

struct RunResult {
  std::vector<RunOutput> outputs;
  std::vector<Kernel> kernels;  // what ran, with cache status
  std::string device;
  double plan_ms = 0, compile_ms = 0, run_ms = 0;
  double collective_ms = 0;  // multi-device: the collectives between kernels
  std::vector<KernelProfile> profile;  // run(..., profile = true) only: slowest first
};

// The one conversion of a gRPC status (code as its number) into absl::Status: same code,
// same message. A code outside gRPC's range becomes UNKNOWN, keeping the message.
absl::Status status_from_grpc(int code, std::string_view message);

// How an upload of `size` bytes at `offset` is cut: consecutive ranges of at most
// effective_chunk_bytes(chunk_bytes) bytes. An empty upload is one empty range (the first
// chunk must still name the buffer).
struct ByteRange {
  uint64_t offset = 0, length = 0;
  bool operator==(const ByteRange&) const = default;
};
uint32_t effective_chunk_bytes(uint64_t requested);  // 0: the default; else [1, kMaxChunkBytes]
std::vector<ByteRange> chunk_ranges(uint64_t offset, uint64_t size, uint64_t chunk_bytes);

// A model held by the server (Session::load_model): its id in the session, and its
// inputs and outputs as imported.
struct ModelTensor {
  std::string name;
  Scalar dtype = Scalar::Float32;
  std::vector<int64_t> shape;
};
struct LoadedModel {
  std::string id;
  std::vector<ModelTensor> inputs, outputs;
  uint64_t weight_buffers = 0, weight_bytes = 0;
  double import_ms = 0;
};

namespace detail {
struct Connection;  // the channel, the stub and the options; defined in client.cc
}

// A session on the server: its devices and buffers. Closing it (close(), or destruction,
// best effort) frees its buffers on the server. Movable, not copyable; it keeps the
// connection alive, so it may outlive the Client that made it.
class Session {
 public:
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session();

  const std::string& id() const { return id_; }
  const std::vector<std::string>& devices() const { return devices_; }

  // A buffer of `elements` values of `dtype` on `device` (empty: the session's first).
  absl::StatusOr<std::string> create_buffer(Scalar dtype, uint64_t elements, const std::string& device = "");
  // Streams `bytes` into the buffer at byte `offset`, in chunks.
  absl::Status upload(const std::string& buffer_id, std::string_view bytes, uint64_t offset = 0);
  // `length` bytes from `offset` (0: to the end), reassembled from the streamed chunks;
  // DATA_LOSS if the chunks do not follow each other or overrun the length.
  absl::StatusOr<std::string> download(const std::string& buffer_id, uint64_t offset = 0, uint64_t length = 0);
  absl::Status free_buffer(const std::string& buffer_id);
  // Frees them all at once (the calls side by side, not one round trip each); the first
  // failure, or OK.
  absl::Status free_buffers(const std::vector<std::string>& buffer_ids);

  // create_buffer + upload of a whole tensor (a buffer is flat: the shape stays here).
  absl::StatusOr<std::string> upload_tensor(const HostTensor& t, const std::string& device = "");
  // The data of a kept output, checked against its dtype and shape.
  absl::StatusOr<HostTensor> download_tensor(const RunOutput& out);

  // Runs the graph on the session's device. `names` travel with the graph (inputs may be
  // bound by them; outputs are named by them). With keep_outputs, outputs stay in the
  // session as buffers and only their ids, dtypes and shapes come back. Without it, an
  // output larger than the server returns inline (uopd --max-inline-output-bytes) is
  // downloaded from the session, streamed, and freed there: the result has its data
  // either way. With profile, the workers time every launch (RunResult::profile).
  absl::StatusOr<RunResult> run(const UOp* root, const Names& names, const std::vector<Input>& inputs,
                                bool keep_outputs = false, bool profile = false);
  absl::StatusOr<RunResult> run(const UOp* root, const Names& names, const std::vector<Input>& inputs,
                                const RunOptions& options);

  // Streams an ONNX model to the server, which imports it and keeps its weights as
  // buffers of this session (freed with it). `input_shapes` fixes inputs whose declared
  // shapes are symbolic.
  absl::StatusOr<LoadedModel> load_model(std::string_view onnx_bytes,
                                         const std::map<std::string, std::vector<int64_t>>& input_shapes = {});
  // Runs a loaded model: `inputs` bind the model's inputs by name (inline or a buffer
  // id); outputs and profile as run()'s.
  absl::StatusOr<RunResult> run_model(const std::string& model_id, const std::vector<Input>& inputs,
                                      bool keep_outputs = false, bool profile = false);

  // Closes the session on the server. After it (whatever it returns) the destructor does
  // nothing more; the other calls still go to the server, which answers NOT_FOUND.
  absl::Status close();

 private:
  friend class Client;
  Session(std::shared_ptr<detail::Connection> conn, std::string id, std::vector<std::string> devices);

  std::shared_ptr<detail::Connection> conn_;
  std::string id_;
  std::vector<std::string> devices_;
  bool open_ = false;
  // Graphs the server holds for this session (RunOptions::hold_graph), as digest and
  // names, the most recent last; as many as it keeps.
  std::vector<std::string> held_graphs_;
};

class Client {
 public:
  // Opens a channel to options.address and waits (at most connect_timeout, and never past
  // deadline) for it to be ready: UNAVAILABLE naming the address otherwise.
  static absl::StatusOr<std::unique_ptr<Client>> connect(const ClientOptions& options);
  ~Client();

  const std::string& address() const;

  // Devices like "CPU:0"; empty: the server's first CPU. idle_timeout 0: the server's.
  absl::StatusOr<Session> create_session(std::vector<std::string> devices = {},
                                         absl::Duration idle_timeout = absl::ZeroDuration());
  // The graph's kernels, compiled for `target` or found in the cache.
  // `schedules` gives some kernels a loop schedule instead of the target's heuristic's.
  absl::StatusOr<CompileResult> compile(const UOp* root, const Names& names, const Target& target = {},
                                        bool include_binary = false, bool include_source = false,
                                        const std::vector<KernelSchedule>& schedules = {});
  // The IR after each stage (only `stage` when set), as the server lowers it for `target`.
  absl::StatusOr<std::vector<ExplainStage>> explain(const UOp* root, const Names& names,
                                                    const std::string& stage = "", const Target& target = {});
  absl::StatusOr<Stats> stats();
  // The schedule search of the graph's kernel `digest` (a digest or a prefix of 8+ digits;
  // "" for a graph of one kernel) for the server's CPU; width and budget 0: the server's.
  absl::StatusOr<TuneResult> tune(const UOp* root, const Names& names, const std::string& digest, uint32_t width = 0,
                                  uint32_t budget_s = 0);

 private:
  explicit Client(std::shared_ptr<detail::Connection> conn);
  std::shared_ptr<detail::Connection> conn_;
};

}  // namespace uop::client
