// The pipeline: the named list of stages, in order (docs/ARCHITECTURE.md, The pipeline; compiler/PIPELINE.md).
// plan_graph takes a verified graph from the wire to normalized kernels in execution
// order (what the scheduler plans and caches by digest); lower_for_cpu takes one
// normalized kernel to LINEAR for the CPU backend. Every stage's output can be traced by
// name, which is what `uopc explain` prints.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

struct StageInfo {
  std::string_view name;
  std::string_view what;
};
// Every stage, in order.
const std::vector<StageInfo>& pipeline_stages();

// Bounds for graphs from the network; 0 is none. A refusal is RESOURCE_EXHAUSTED naming
// the kernel and the limit, as the names here spell it (the scheduler's flags).
struct PipelineLimits {
  // One kernel's size (kernel_ops below), as planned, after each lowering stage and as
  // LINEAR: a kernel too big for the code generator is refused before it gets there.
  size_t kernel_ops = 0;
  std::string kernel_ops_name = "kernel_ops";
  // Nodes the Graph may hold while planning or lowering on it (Graph::set_node_limit,
  // checked inside every rewrite), so what a stage makes of a small graph costs bounded
  // memory and time.
  size_t graph_nodes = 0;
  std::string graph_nodes_name = "graph_nodes";
};

struct PipelineOptions {
  std::string device = "CPU:0";
  bool allow_custom = false;   // CUSTOM / CUSTOMI / CUSTOM_FUNCTION
  const NodeIndex* index = nullptr;  // wire indices, for the verifier's messages
  int vector_bits = 256;             // the CPU target's vector registers (optimize's upcasts)
  // Each stage's output. `kernel` names the kernel for per-kernel stages, empty for
  // stages over the whole graph.
  std::function<void(std::string_view stage, std::string_view kernel, const UOp* ir)> trace;
  PipelineLimits limits;
  // Asked after every stage (after its trace; for each kernel, after each per-kernel
  // stage): a non-OK status stops the pipeline with it. The scheduler's says DEADLINE_EXCEEDED once the
  // request's deadline has passed and CANCELLED once no request waits for the result.
  std::function<absl::Status()> keep_going;
};

// A kernel's size as the code generators see it: its ops, a vector op counted once per 16
// lanes (what a 512-bit register holds of 32-bit values), so that a wide vector counts for
// the machine code it becomes. LLVM's time grows faster than linearly in it.
size_t kernel_ops(const UOp* kernel);
// RESOURCE_EXHAUSTED naming the kernel, the stage and the limit when `kernel` is over
// limits.kernel_ops; OK otherwise (and without a limit).
absl::Status check_kernel_ops(const UOp* kernel, const PipelineLimits& limits, std::string_view name,
                              std::string_view stage);

struct KernelPlan {
  std::string name;
  std::string device;               // where it runs: the device of its buffers ("CPU:0")
  const UOp* kernel = nullptr;      // normalized SINK[kernel]: its digest is the kernel's identity
  std::vector<const UOp*> buffers;  // what each PARAM slot is bound to: a BUFFER, or the
                                    // PARAM itself when the graph came in at kernel level
};

// A collective between kernels: every buffer (one per device) ends holding the
// reduction of all of them (split_kernels.h). A copy moves a buffer to another device.
struct CollectivePlan {
  ReduceOp op = ReduceOp::Add;
  Scalar dtype = Scalar::Float32;
  std::vector<const UOp*> buffers;
};
struct CopyPlan {
  const UOp* src = nullptr;
  const UOp* dst = nullptr;
};
struct PlanStep {
  enum class Kind { Kernel, Collective, Copy };
  Kind kind = Kind::Kernel;
  size_t index = 0;  // into kernels, collectives or copies
};

struct Plan {
  std::vector<KernelPlan> kernels;            // in execution order
  std::vector<CollectivePlan> collectives;
  std::vector<CopyPlan> copies;
  std::vector<PlanStep> steps;                // kernels, collectives and copies, in order
  // The BUFFER of each output part (tensor level): one part per output, or one per shard
  // of a multi-device output (output_parts says which).
  std::vector<const UOp*> outputs;
  // The shape of each output part at the bound variable values (tensor level); at kernel
  // level, every PARAM by slot is an output of its size.
  std::vector<std::vector<int64_t>> output_shapes;
  struct OutputParts {
    std::vector<size_t> parts;  // indices into outputs
    int64_t axis = -1;          // concatenated along it; -1: replicated (part 0 is the value)
  };
  std::vector<OutputParts> output_parts;      // one per source of the graph's SINK
  std::vector<const UOp*> intermediates;      // buffers only kernels use
  std::vector<std::pair<const UOp*, int64_t>> var_values;  // DEFINE_VAR -> bound value
  const UOp* schedule = nullptr;              // SINK(CALL...): the plan as IR
  bool kernel_level = false;                  // the graph was one kernel already
};

// Stages verify .. normalize.
absl::StatusOr<Plan> plan_graph(Graph& g, const UOp* root, const PipelineOptions& opts = {});
// Stages optimize .. linearize, for one normalized kernel: a LINEAR for the CPU backend.
absl::StatusOr<const UOp*> lower_for_cpu(Graph& g, const UOp* kernel, const PipelineOptions& opts = {},
                                         std::string_view name = {});

// Stages optimize .. linearize for a GPU: optimize_gpu (tensor cores, group reduce,
// upcast, grid), group_reduce (shared memory), expand, lower_reduce, gpu_dims (parallel
// ranges -> SPECIAL blockIdx / threadIdx), bounds (on the IR gpu_dims made, which is
// what is rendered), linearize: a LINEAR for the CUDA backend (codegen/cuda.h). `sm` is the compute capability (80 for sm_80): tensor cores
// from 80 on.
struct GpuLowerOptions {
  int sm = 80;
  bool tensor_cores = true;
  int max_threads = 256;
};
absl::StatusOr<const UOp*> lower_for_cuda(Graph& g, const UOp* kernel, const PipelineOptions& opts = {},
                                          std::string_view name = {}, const GpuLowerOptions& gpu = {});

}  // namespace uop
