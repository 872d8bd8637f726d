// The planner: a decoded graph -> an immutable Plan (kernels in execution order, the
// buffers they bind, the outputs' shapes), cached by the graph's digest so a repeated
// graph skips lowering; and the compile step: each kernel of a plan, compiled once per
// cache key through the tiered compile cache. Planning, compiling and explaining all run
// on the compile pool (task_queue.h), apart from the RPC threads, shared fairly between
// tenants and clients; the RPC thread waits, and stops waiting when its request's
// deadline passes or its client goes away.
//
// Bounded work: every stage is checked (compiler/pipeline.h keep_going) against the
// request's deadline and against whether anyone still waits (a compile shared by several
// requests goes on while one of them waits); a kernel over --max-kernel-ops is refused
// before LLVM or NVRTC sees it, and planning or lowering that grows a graph past
// --max-plan-nodes stops. LLVM itself cannot be interrupted: its time is bounded by the
// size of what it is given, which is why the kernel bound comes before it.
//
// A Plan holds no UOp pointers: kernels travel as encoded graphs and inputs are named by
// their node's digest, so a cached plan is shared by concurrent requests whose graphs have
// the same digest but maybe other wire orders and names.
#pragma once

#include <cstdint>
#include <memory>
#include <atomic>
#include <mutex>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/abi/kernel_abi.h"
#include "compiler/backend.h"
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/explain.h"
#include "compiler/ir/codec.h"
#include "compiler/pipeline.h"
#include "server/cache/compile_cache.h"
#include "server/task_queue.h"

namespace uop::server {

struct PlannedBuffer {
  enum class Role { Input, Output, Intermediate };
  Role role = Role::Intermediate;
  Scalar dtype = Scalar::Float32;
  int64_t elements = 0;
  Digest node;  // inputs: the digest of the BUFFER / PARAM node a binding names
  std::string device;  // the DEVICE of its BUFFER ("CPU:1"); "" for a kernel-level PARAM
};

struct PlannedKernel {
  std::string name;
  Digest digest;               // the normalized kernel's identity
  std::string encoded;         // the normalized kernel, encode_binary()
  std::vector<int> buffers;    // per slot: index into Plan::buffers
  std::string device;          // where it runs (the device of its buffers)
  std::vector<int> writes;     // the buffers it stores to (into Plan::buffers); it may read any
};

// Multi-device plans (compiler/pipeline.h): a collective leaves every one of its buffers
// (one per device, in device order) holding the reduction of all of them; a copy moves a
// buffer to another device. Steps list kernels, collectives and copies in order.
struct PlannedCollective {
  ReduceOp op = ReduceOp::Add;
  Scalar dtype = Scalar::Float32;
  // segments[k][i]: member i's buffer (into Plan::buffers) of the k-th allreduce this one
  // step does. One segment, or a bucket (bucket_collectives): allreduces of the same op,
  // dtype and devices reduced by one collective, each element as if its buffer were alone.
  std::vector<std::vector<int>> segments;
  const std::vector<int>& members() const { return segments.front(); }
};
struct PlannedCopy {
  int src = 0, dst = 0;  // into Plan::buffers
};
// Which outputs make up one output of the graph: one, or one per shard of a
// multi-device output (concatenated along `axis`; -1 replicated).
struct PlannedOutputParts {
  std::vector<size_t> parts;  // into Plan::outputs
  int64_t axis = -1;
};

struct PlannedOutput {
  Scalar dtype = Scalar::Float32;
  std::vector<int64_t> shape;
  int buffer = 0;
};

struct Plan {
  Digest graph;
  std::vector<PlannedBuffer> buffers;
  std::vector<PlannedKernel> kernels;  // execution order
  std::vector<PlannedOutput> outputs;  // one per output of the graph (per shard when multi-device)
  std::vector<PlannedCollective> collectives;
  std::vector<PlannedCopy> copies;
  std::vector<ScheduleStep> steps;     // kernels, collectives and copies in execution order
  // Per step: the earlier steps it waits for (order_steps), sorted. The order of `steps`
  // is one the graph allows; an executor may run a step as soon as these are done.
  std::vector<std::vector<int>> waits_for;
  std::vector<PlannedOutputParts> output_parts;  // one per source of the graph's SINK
  std::vector<std::string> devices;    // every device the buffers name, in first-use order
  // More than one device: each runs on its own worker. A plan on one device runs on the
  // session's (first) device, whatever its DEVICE nodes say.
  bool multi_device() const { return devices.size() > 1; }
  absl::flat_hash_map<std::string, int64_t> vars;  // DEFINE_VAR name -> bound value
  bool kernel_level = false;
  double plan_ms = 0;
};

// One compiled kernel as a worker loads it. Its object and source are shared, never
// copied: every warm Run resolves each of its kernels to one of these (Planner::compile),
// and an object is tens of kilobytes.
struct CompiledKernel {
  std::string key;     // hex cache key
  std::string name;
  Digest digest;
  std::shared_ptr<const std::string> object = empty_bytes();
  std::shared_ptr<const std::string> source = empty_bytes();
  KernelAbi abi;
  std::string abi_text;  // abi as the artifact carries it (KernelAbi::serialize)
  CacheOutcome outcome = CacheOutcome::Miss;
  std::string tier;    // for hits
  double compile_ms = 0;

  static std::shared_ptr<const std::string> bytes(std::string s) { return std::make_shared<const std::string>(std::move(s)); }
  static const std::shared_ptr<const std::string>& empty_bytes() {
    static const auto* none = new std::shared_ptr<const std::string>(std::make_shared<const std::string>());
    return *none;
  }
};

// Loop schedules given for a compile (CompileRequest.schedules): kernel digest (hex) ->
// schedule text. A kernel not named gets its target's heuristic.
using KernelSchedules = absl::flat_hash_map<std::string, std::string>;

// Who planning or compiling is for, and until when: the compile pool's queue its tasks
// wait in, the request's deadline, and `gone` (ServerContext::IsCancelled), which says its
// client went away; it is asked only on the requesting thread, while that thread waits.
struct Requester {
  TaskOwner owner;
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> gone;
};

struct ExplainOptions {
  std::string only;                        // one stage's outputs only; empty: every stage
  std::shared_ptr<const Backend> backend;  // lower, render and compile for it; null: the CPU
};

struct PlannerOptions {
  size_t plan_cache_entries = 1024;
  // Kernels resolved from cache entries (parsed and checked), kept so that a warm Run's
  // kernels cost a key and a map lookup each instead of a tier read and a parse; bounded
  // by the bytes of their objects and sources (forgotten all at once past it).
  uint64_t resolved_kernel_bytes = uint64_t{128} << 20;
  int compile_threads = 2;
  // Bounds on the work one request can cause (compiler/pipeline.h PipelineLimits); 0 is
  // none. The largest kernels of the conformance models (bidirectional LSTM and GRU as
  // torch exports them) have ~12,400 ops and take LLVM seconds; a 120,000-op kernel takes
  // it many minutes. Every model's planning stays far below the node bound.
  size_t max_kernel_ops = 16384;      // one kernel, before LLVM / NVRTC
  size_t max_plan_nodes = 2'000'000;  // the graph while planning it, or one kernel while lowering it
  // Allreduces that can wait for each other (bucket_collectives) go as one collective of up
  // to this many bytes per member; 0: each on its own.
  uint64_t bucket_cap_bytes = uint64_t{25} << 20;
  bool allow_custom = false;
  bool keep_source = false;  // store LLVM IR with each artifact (for `include_source`)
  // The arch a backend compiles for when a request names none (a Compile or Explain with
  // a target and no arch) and for a worker that does not report its own, by backend name
  // ("cuda" -> "sm_90"); a backend not named here gets its registry default.
  absl::flat_hash_map<std::string, std::string> default_arch;
};

// Bucketing, as DDP does with gradients: collectives of the same op, dtype and member
// devices join one bucket while it stays within `cap_bytes` per member (one larger than
// that stays alone). Steps that share a buffer keep their order; the steps that need a
// bucket's results (the updates that read the gradients) wait until it is closed, so the
// collectives after them can still join it. The kernels between collectives then also
// gather into fewer Executes. 0: nothing changes.
void bucket_collectives(Plan& plan, uint64_t cap_bytes);

// What a step reads and writes (indices into Plan::buffers): a kernel writes its slot 0
// and reads the rest, a copy reads its source and writes its destination, a collective
// reads and writes all of its buffers.
struct StepAccess {
  std::vector<int> reads, writes;
};
StepAccess step_access(const Plan& plan, const ScheduleStep& st);
// Plan::waits_for from the steps' accesses: a step waits for the last earlier writer of
// each buffer it reads or writes, and for the readers since that write of each buffer it
// writes, so any run of the steps that honours these gives the bits the order gives.
void order_steps(Plan& plan);

class Planner {
 public:
  Planner(PlannerOptions opts, CompileCache* cache, CpuTarget target);

  // The plan of a decoded (not yet verified) graph; INVALID_ARGUMENT naming the node and
  // rule for a graph the pipeline refuses, RESOURCE_EXHAUSTED naming the limit for one
  // over a bound, DEADLINE_EXCEEDED / CANCELLED when `who` stopped waiting first. `cached`
  // says whether it came from the cache; a miss is planned on the compile pool (which may
  // go on using `g` after this returns, hence the shared pointer).
  // The plan cache is keyed by (`cache_namespace`, graph digest): a tenant with a private
  // namespace (server/auth.h) neither finds plans others made nor warms theirs, so
  // `cached` (CompileResponse.plan_cached, Run's plan time) tells it nothing about other
  // tenants' graphs. Empty is the namespace everyone shares.
  absl::StatusOr<std::shared_ptr<const Plan>> plan(std::shared_ptr<const DecodedGraph> g, bool* cached,
                                                   std::string_view cache_namespace = {}, const Requester& who = {});

  // The backend a request's target names (compiler/backend.h): name "" is the CPU of
  // this machine (the workers'), arch "" the default (PlannerOptions::default_arch).
  // UNIMPLEMENTED for a backend this server does not know, INVALID_ARGUMENT for an arch
  // its backend does not.
  absl::StatusOr<std::shared_ptr<const Backend>> backend(std::string_view name, std::string_view arch = {}) const;
  // The CPU of this machine.
  const std::shared_ptr<const CpuBackend>& host() const { return host_; }

  // Every kernel of the plan, compiled for `backend` or found in the cache. Concurrent
  // requests for a kernel being compiled wait for that compile (singleflight in the
  // cache), each until its own deadline; a compile nobody waits for any more is abandoned
  // at its next stage. `cache_namespace` (a tenant's private cache, server/auth.h) salts
  // every cache key: empty is the cache everyone shares.
  // `schedules` names the loop schedule of some kernels (by digest): a part of their keys.
  absl::StatusOr<std::vector<CompiledKernel>> compile(const Plan& plan, std::shared_ptr<const Backend> backend,
                                                      std::string_view cache_namespace = {}, const Requester& who = {},
                                                      const KernelSchedules& schedules = {});
  // Each kernel compiled for its own backend (a Run whose devices mix targets):
  // `per_kernel[i]` for plan.kernels[i]. One compile per distinct (kernel, target).
  absl::StatusOr<std::vector<CompiledKernel>> compile(const Plan& plan,
                                                      const std::vector<std::shared_ptr<const Backend>>& per_kernel,
                                                      std::string_view cache_namespace = {}, const Requester& who = {},
                                                      const KernelSchedules& schedules = {});

  // compile(per_kernel), shared: a plan whose kernels were all resolved from the first
  // tier before, with the same targets, names and schedules, is answered by the one
  // vector kept for it (per graph and namespace), with no cache key computed and no
  // kernel copied (a warm Run of a 131-kernel model spent a fifth of its time on those).
  // The kept vectors go with the resolved kernels (resolved_kernel_bytes).
  absl::StatusOr<std::shared_ptr<const std::vector<CompiledKernel>>> compile_shared(
      const Plan& plan, const std::vector<std::shared_ptr<const Backend>>& per_kernel, std::string_view cache_namespace = {},
      const Requester& who = {}, const KernelSchedules& schedules = {});

  // A schedule search's candidates (server/tuner.h): kernel k compiled for `backend` with
  // each of `schedules` exactly ("" the target's heuristic; no tuning record consulted), as
  // many at once as the compile pool runs, in `who`'s turns and under its deadline, none
  // stored in the compile cache (a search compiles many that are never used again). One
  // result per schedule, in order; each carries the key its schedule is cached under.
  std::vector<absl::StatusOr<CompiledKernel>> compile_candidates(const PlannedKernel& k, std::shared_ptr<const Backend> backend,
                                                                 const std::vector<std::string>& schedules,
                                                                 std::string_view cache_namespace, const Requester& who);

  // Where compile() takes the schedule of a kernel no request names one for: a tuning
  // record (server/tuner.h), or "" for the target's heuristic. Set before serving.
  using ScheduleSource =
      std::function<std::string(const PlannedKernel& k, const Backend& backend, std::string_view cache_namespace)>;
  void set_schedule_source(ScheduleSource source) { schedule_source_ = std::move(source); }

  // The cache key of a kernel for `backend` (and namespace, and loop schedule: "" the
  // heuristic's): Backend::cache_key with this planner's keep_source.
  std::string cache_key(const Digest& kernel, const Backend& backend, std::string_view cache_namespace = {},
                        std::string_view schedule = {}) const;

  // The IR after each stage (`uop explain`), every kernel lowered, rendered and compiled
  // as a Compile would (the same bounds), on the compile pool: planning is one task and
  // each kernel another, so a graph of many kernels takes turns with other clients.
  absl::StatusOr<std::vector<ExplainedStage>> explain(std::shared_ptr<const DecodedGraph> g, const ExplainOptions& opts,
                                                      const Requester& who = {});

  uint64_t plan_hits() const;
  uint64_t plan_misses() const;
  // Compile pool tasks waiting / running: all, or one group's (TaskOwner::group).
  uint64_t compile_queue_depth() const { return compiles_.depth(); }
  uint64_t compile_queue_depth(std::string_view group) const { return compiles_.depth(group); }
  uint64_t compile_tasks_running() const { return compiles_.running(); }
  uint64_t compile_tasks_running(std::string_view group) const { return compiles_.running(group); }
  // Planning, explaining and compile tasks given up because no request waited any more.
  uint64_t tasks_abandoned() const { return compiles_.abandoned() + cache_->abandoned(); }

 private:
  // The pipeline's options for this planner's target and bounds.
  PipelineOptions pipeline_options() const;
  // The same for compiling kernel k: its stages stop once `wanted` says nobody waits.
  PipelineOptions compile_options(const PlannedKernel& k, const std::function<bool()>& wanted) const;
  absl::StatusOr<std::shared_ptr<const Plan>> plan_now(const DecodedGraph& g, const Digest& digest,
                                                       const std::function<absl::Status()>& keep_going);
  // The cached plan for `key`, moved to most recent; null on a miss. Under mu_.
  std::shared_ptr<const Plan> cached_plan_locked(const std::pair<std::string, Digest>& key);
  // Planning adds nodes to the Graph it plans (plan_graph), so one graph is planned by one
  // task at a time: a graph the server holds across requests (a model's, RunModel) can be
  // asked for by several requests at once, and a task whose request went away may still
  // be planning it when the next request comes. The lock for `g`, while any task holds it.
  std::shared_ptr<std::mutex> planning_lock(const DecodedGraph* g);
  // Lowers and compiles one kernel for `backend` with `schedule` ("" the heuristic's; the
  // compile cache's compute for its key); `wanted` says whether a request still waits for it.
  absl::StatusOr<std::string> build(const PlannedKernel& k, const Backend& backend, const std::string& key,
                                    const std::string& schedule, const std::function<bool()>& wanted);
  // `fn` queued on the compile pool for `who` alone (task_queue.h Pending).
  template <typename T>
  Pending<T> to_pool(const Requester& who, std::string what,
                     std::function<absl::StatusOr<T>(const std::function<absl::Status()>& keep_going)> fn) {
    return compiles_.submit_for<T>(who.owner, who.deadline, std::move(what), std::move(fn));
  }
  // What the cache checks in every entry a tier answers for kernel k: an entry that
  // authenticates but is not an artifact of k for `target_id` under `key` (a bug in another
  // server, a key holder's mistake) is removed from that tier and k compiled again. It
  // keeps what it needs: a compile may check entries after its request has gone.
  static CompileCache::Verifier entry_check(const PlannedKernel& k, const std::string& key,
                                            const std::string& target_id);
  // A cache entry (what get_or_compute answered for `key`) checked to be an artifact of
  // kernel k for `target_id`, as a CompiledKernel; DATA_LOSS otherwise. `compile_ms` is
  // this call's compile time when it compiled the entry itself.
  static absl::StatusOr<CompiledKernel> kernel_from_entry(const PlannedKernel& k, const std::string& key,
                                                          const std::string& target_id, const CacheResult& entry,
                                                          std::optional<double> compile_ms);

  // The kernel an earlier compile() resolved the cache key to (null: none kept), and
  // keeping one (resolved_kernel_bytes bounds them).
  std::shared_ptr<const CompiledKernel> resolved(const std::string& key) const;
  void remember(const CompiledKernel& ck);

  PlannerOptions opts_;
  CompileCache* cache_;
  std::shared_ptr<const CpuBackend> host_;
  mutable std::mutex mu_;
  // Backends made for requests' targets, by (name, arch), kept for the planner's life.
  mutable absl::flat_hash_map<std::pair<std::string, std::string>, std::shared_ptr<const Backend>> backends_;
  // (namespace, graph digest) -> plan, most recent last.
  std::vector<std::pair<std::pair<std::string, Digest>, std::shared_ptr<const Plan>>> lru_;
  uint64_t hits_ = 0, misses_ = 0;
  absl::flat_hash_map<const DecodedGraph*, std::weak_ptr<std::mutex>> planning_locks_;  // planning_lock's
  ScheduleSource schedule_source_;  // set before serving, read by every compile
  // Cache key -> the kernel its entry holds, as kernel_from_entry made it (resolved_kernel_bytes).
  // A key names a kernel, its target, namespace and schedule, so its entry never changes:
  // one that was checked once is good for every later request of that key. Under mu_.
  absl::flat_hash_map<std::string, std::shared_ptr<const CompiledKernel>> resolved_;
  uint64_t resolved_bytes_ = 0;
  // (namespace, graph digest) -> what compile_shared answered for it, when every kernel
  // was a first-tier hit; cleared with resolved_, whose generation counts the clears. Under mu_.
  struct ResolvedPlan {
    std::vector<const Backend*> backends;
    std::vector<std::string> schedules;
    std::shared_ptr<const std::vector<CompiledKernel>> kernels;
  };
  absl::flat_hash_map<std::string, ResolvedPlan> resolved_plans_;
  uint64_t resolved_generation_ = 0;
  TaskQueue compiles_;  // last: its threads stop (finishing what they run) before the rest goes
};

}  // namespace uop::server
