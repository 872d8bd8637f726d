// The planner: a decoded graph -> an immutable Plan (kernels in execution order, the
// buffers they bind, the outputs' shapes), cached by the graph's digest so a repeated
// graph skips lowering; and the compile step: each kernel of a plan, compiled once per
// cache key through the tiered compile cache on a thread pool apart from the RPC threads.
//
// A Plan holds no UOp pointers: kernels travel as encoded graphs and inputs are named by
// their node's digest, so a cached plan is shared by concurrent requests whose graphs have
// the same digest but maybe other wire orders and names.
#pragma once

#include <cstdint>
#include <memory>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/codegen/abi.h"
#include "compiler/codegen/llvm_cpu.h"
#include "compiler/ir/codec.h"
#include "server/cache/compile_cache.h"
#include "server/task_queue.h"

namespace uop::server {

struct PlannedBuffer {
  enum class Role { Input, Output, Intermediate };
  Role role = Role::Intermediate;
  Scalar dtype = Scalar::Float32;
  int64_t elements = 0;
  Digest node;  // inputs: the digest of the BUFFER / PARAM node a binding names
};

struct PlannedKernel {
  std::string name;
  Digest digest;               // the normalized kernel's identity
  std::string encoded;         // the normalized kernel, encode_binary()
  std::vector<int> buffers;    // per slot: index into Plan::buffers
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
  std::vector<PlannedOutput> outputs;  // one per output of the graph
  absl::flat_hash_map<std::string, int64_t> vars;  // DEFINE_VAR name -> bound value
  bool kernel_level = false;
  double plan_ms = 0;
};

// One compiled kernel as a worker loads it.
struct CompiledKernel {
  std::string key;     // hex cache key
  std::string name;
  Digest digest;
  std::string object;
  std::string source;
  KernelAbi abi;
  CacheOutcome outcome = CacheOutcome::Miss;
  std::string tier;    // for hits
  double compile_ms = 0;
};

struct PlannerOptions {
  size_t plan_cache_entries = 1024;
  int compile_threads = 2;
  bool allow_custom = false;
  bool keep_source = false;  // store LLVM IR with each artifact (for `include_source`)
};

class Planner {
 public:
  Planner(PlannerOptions opts, CompileCache* cache, CpuTarget target);

  // The plan of a decoded (not yet verified) graph; INVALID_ARGUMENT naming the node and
  // rule for a graph the pipeline refuses. `cached` says whether it came from the cache.
  absl::StatusOr<std::shared_ptr<const Plan>> plan(const DecodedGraph& g, bool* cached);

  // Every kernel of the plan, compiled or found in the cache. Concurrent requests for a
  // kernel being compiled wait for that compile (singleflight in the cache).
  absl::StatusOr<std::vector<CompiledKernel>> compile(const Plan& plan);

  // The cache key of a kernel for this planner's target.
  std::string cache_key(const Digest& kernel) const;

  const CpuTarget& target() const { return target_; }
  uint64_t plan_hits() const;
  uint64_t plan_misses() const;
  uint64_t compile_queue_depth() const;

 private:
  absl::StatusOr<CompiledKernel> compile_one(const PlannedKernel& k);

  PlannerOptions opts_;
  CompileCache* cache_;
  CpuTarget target_;
  int vector_bits_;
  TaskQueue compiles_;
  mutable std::mutex mu_;
  std::vector<std::pair<Digest, std::shared_ptr<const Plan>>> lru_;  // most recent last
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace uop::server
