// The pipeline: the named stages of docs/ARCHITECTURE.md's pipeline, in order
// (compiler/PIPELINE.md). The stages are data: plan_graph runs the planning table (verify
// .. normalize) over a verified graph from the wire and gives normalized kernels in
// execution order (what the scheduler plans and caches by digest); a backend's lowering is
// its schedule, a list of kernel stages (optimize .. linearize) that run_kernel_stages runs
// on one normalized kernel. One loop runs each table and traces each stage's output by the
// name in the table, so the list, `uopc explain --stage` and the code cannot disagree.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/passes/split_kernels.h"

namespace uop {

struct StageInfo {
  std::string_view name;
  std::string_view what;
};
// Every stage, in order: the planning stages, then every registered backend's schedule
// merged in order (a stage several backends share is listed once), then render and
// compile (compiler/backend.h, which defines it, since it needs the backends).
std::vector<StageInfo> pipeline_stages();

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
  // Each stage's output. `kernel` names the kernel for per-kernel stages, empty for
  // stages over the whole graph.
  std::function<void(std::string_view stage, std::string_view kernel, const UOp* ir)> trace;
  PipelineLimits limits;
  // Asked after every stage (after its trace; for each kernel, after each per-kernel
  // stage): a non-OK status stops the pipeline with it. The scheduler's says DEADLINE_EXCEEDED once the
  // request's deadline has passed and CANCELLED once no request waits for the result.
  std::function<absl::Status()> keep_going;
  // The loop schedule of the kernel being lowered (compiler/passes/loop_schedule.h, as
  // text): "" lets the target's heuristic choose. A target without a stage that applies
  // schedules refuses a non-empty one.
  std::string schedule;
  // Where the stage that applies the schedule puts the text of the one it applied (the
  // heuristic's, or `schedule`), when not null.
  std::string* applied_schedule = nullptr;
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
                                    // graph's PARAM when the graph came in at kernel level
  std::vector<size_t> writes;       // the slots the kernel stores to (slot 0 at tensor level)
};

// What planning made of a graph, as IR in its Graph: the kernels, collectives and copies
// (split_kernels.h's steps; a Kernel step indexes `kernels`) in execution order. The
// scheduler turns it into a server::Plan, which holds no UOp pointers and is cached.
struct GraphPlan {
  std::vector<KernelPlan> kernels;            // in execution order
  std::vector<CollectiveStep> collectives;
  std::vector<CopyStep> copies;
  std::vector<ScheduleStep> steps;            // kernels, collectives and copies, in order
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
  // The graph came in at kernel level: one kernel, SINK[kernel](STORE...), or several run
  // in order, SINK(CALL(SINK[kernel](...), PARAM...)...), each CALL binding its kernel's
  // slots to the graph's PARAMs. Those PARAMs (`params`, by slot 0..n-1) are the Run's
  // buffers and its outputs.
  bool kernel_level = false;
  std::vector<const UOp*> params;
};

// The PARAMs a kernel-level graph binds, by slot: the CALLs' arguments of a SINK of CALLs,
// else every PARAM of the kernel.
std::vector<const UOp*> kernel_graph_params(const UOp* root);

// The planning stages, in order (verify .. normalize).
std::span<const StageInfo> planning_stages();
// Runs them: a verified graph in, its plan out.
absl::StatusOr<GraphPlan> plan_graph(Graph& g, const UOp* root, const PipelineOptions& opts = {});

// A stage over one kernel: its IR in, its IR out. A backend's lowering is a list of them,
// its schedule (compiler/backend.h), from a normalized kernel to LINEAR; a stage may
// appear more than once in a schedule (symbolic runs after each stage that leaves
// arithmetic to fold).
struct KernelStage {
  std::string_view name;
  std::string_view what;
  std::function<absl::StatusOr<const UOp*>(Graph& g, const UOp* kernel)> run;
  // Set for the stage that applies a loop schedule (optimize), which run_kernel_stages
  // then calls instead of `run`, with PipelineOptions::schedule ("" for the heuristic's)
  // and applied_schedule.
  std::function<absl::StatusOr<const UOp*>(Graph& g, const UOp* kernel, std::string_view schedule, std::string* applied)>
      scheduled;
};

// The kernel stages every backend's schedule can use. bounds then linearize end every
// schedule (run_kernel_stages checks it): nothing runs between the proof and linearize,
// which only orders, so what is rendered is what was proven.
const KernelStage& symbolic_stage();
const KernelStage& expand_stage();
const KernelStage& lower_reduce_stage();
const KernelStage& bounds_stage();
const KernelStage& linearize_stage();

// Runs `schedule` on one normalized kernel, tracing and checking (keep_going, the limits)
// after every stage; INTERNAL for a schedule that does not end with bounds, linearize.
absl::StatusOr<const UOp*> run_kernel_stages(Graph& g, const UOp* kernel, std::span<const KernelStage> schedule,
                                             const PipelineOptions& opts = {}, std::string_view name = {});

}  // namespace uop
