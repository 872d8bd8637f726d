#include "compiler/pipeline.h"

#include <algorithm>

#include "compiler/ir/dim.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/verifier.h"
#include "compiler/passes/bounds.h"
#include "compiler/passes/expand.h"
#include "compiler/passes/gpu_dims.h"
#include "compiler/passes/group_reduce.h"
#include "compiler/passes/linearize.h"
#include "compiler/passes/lower_reduce.h"
#include "compiler/passes/multi.h"
#include "compiler/passes/normalize.h"
#include "compiler/passes/optimize.h"
#include "compiler/passes/optimize_gpu.h"
#include "compiler/passes/rangeify.h"
#include "compiler/passes/split_kernels.h"
#include "compiler/passes/symbolic.h"
#include "compiler/passes/unit_ranges.h"
#include "compiler/support/strings.h"

namespace uop {

const std::vector<StageInfo>& pipeline_stages() {
  static const std::vector<StageInfo> kStages = {
      {"verify", "the graph as decoded and checked against its stage's rules"},
      {"multi", "multi-device tensors -> per-device tensors; reductions across shards -> ALLREDUCE"},
      {"rangeify", "movement ops -> index arithmetic over RANGEs; REDUCE_AXIS -> REDUCE; BUFFERIZE where values are materialized"},
      {"split_kernels", "one kernel per BUFFERIZE: SINK(CALL(kernel, buffers...)...) in execution order"},
      {"symbolic", "per kernel: constant folding, identities, index arithmetic"},
      {"normalize", "per kernel: BUFFER -> PARAM in slot order, ranges renumbered; the digest is the kernel's identity"},
      {"optimize", "per kernel: axis types for the target (Thread, Upcast)"},
      {"expand", "per kernel: Upcast ranges -> vector lanes (vector loads / stores, vector accumulators)"},
      {"lower_reduce", "per kernel: REDUCE -> accumulator (DEFINE_REG); closed ranges -> ENDs"},
      {"gpu_dims", "per kernel, GPU: Global / Local ranges -> SPECIAL blockIdx / threadIdx (launch dims)"},
      {"bounds", "per kernel: every INDEX of the IR that is rendered proven inside its buffer, or the kernel is refused"},
      {"linearize", "per kernel: LINEAR, the flat op list in execution order"},
      {"render", "per kernel: LLVM IR (CPU) or CUDA C (GPU)"},
      {"compile", "per kernel: relocatable ELF object (CPU) or cubin (GPU)"},
  };
  return kStages;
}

namespace {

// What happens after every stage: its output traced, then the checks a caller asked for
// (its deadline, whether anyone still waits), the graph's size and, for a kernel's stages
// (`kernel` named), the kernel's.
absl::Status after(Graph& g, const PipelineOptions& o, std::string_view stage, std::string_view kernel, const UOp* ir) {
  if (o.trace) o.trace(stage, kernel, ir);
  if (o.keep_going)
    if (absl::Status s = o.keep_going(); !s.ok()) return s;
  if (o.limits.graph_nodes != 0 && g.size() > o.limits.graph_nodes)
    return absl::ResourceExhaustedError(cat("stage ", stage, " grew the graph to ", g.size(), " nodes, over the limit of ",
                                            o.limits.graph_nodes, " (", o.limits.graph_nodes_name, ")"));
  if (!kernel.empty()) return check_kernel_ops(ir, o.limits, kernel, stage);
  return absl::OkStatus();
}

// Every rewrite on `g` from here on stops once the graph passes the limit.
absl::Status bound_graph(Graph& g, const PipelineOptions& o) {
  if (o.limits.graph_nodes == 0) return absl::OkStatus();
  g.set_node_limit(o.limits.graph_nodes, o.limits.graph_nodes_name);
  if (g.size() > o.limits.graph_nodes)
    return absl::ResourceExhaustedError(cat("the graph holds ", g.size(), " nodes already, over the limit of ",
                                            o.limits.graph_nodes, " (", o.limits.graph_nodes_name, ")"));
  return absl::OkStatus();
}

// The stages every backend runs after its own optimizer: upcasts expanded, reductions
// lowered to accumulators.
absl::StatusOr<const UOp*> expand_and_reduce(Graph& g, const UOp* kernel, const PipelineOptions& opts,
                                             std::string_view name) {
  auto k = expand_upcasts(g, kernel);
  if (!k.ok()) return k.status();
  if (absl::Status s = after(g, opts, "expand", name, *k); !s.ok()) return s;
  k = lower_reduce(g, *k);
  if (k.ok()) k = simplify(g, *k);
  if (!k.ok()) return k.status();
  if (absl::Status s = after(g, opts, "lower_reduce", name, *k); !s.ok()) return s;
  return k;
}

// The last stages of every backend: every memory access of the kernel proven inside its
// buffer, then the same IR linearized. Nothing runs between the proof and linearize
// (which only orders; the checks after the bounds stage only look), so what is rendered
// is what was proven.
absl::StatusOr<const UOp*> check_and_linearize(Graph& g, const UOp* kernel, const PipelineOptions& opts,
                                               std::string_view name) {
  if (absl::Status s = check_bounds(g, kernel); !s.ok()) return s;
  if (absl::Status s = after(g, opts, "bounds", name, kernel); !s.ok()) return s;
  auto k = linearize(g, kernel);
  if (!k.ok()) return k.status();
  if (absl::Status s = after(g, opts, "linearize", name, *k); !s.ok()) return s;
  return k;
}

// A graph that is one kernel already: its PARAMs are its buffers, by slot.
absl::StatusOr<Plan> plan_kernel(Graph& g, const UOp* root, const PipelineOptions& opts) {
  Plan plan;
  plan.kernel_level = true;
  auto body = normalize(g, root);
  if (!body.ok()) return body.status();
  KernelPlan kp;
  const auto* info = root->arg_if<KernelInfoArg>();
  kp.name = info && !info->name.empty() ? info->name : "kernel";
  if (absl::Status s = after(g, opts, "normalize", kp.name, *body); !s.ok()) return s;
  kp.kernel = *body;
  for (const UOp* u : toposort(*body))
    if (u->op() == Op::PARAM) kp.buffers.push_back(u);
  std::sort(kp.buffers.begin(), kp.buffers.end(),
            [](const UOp* a, const UOp* b) { return a->arg_as<ParamArg>().slot < b->arg_as<ParamArg>().slot; });
  for (size_t i = 0; i < kp.buffers.size(); ++i)
    if (kp.buffers[i]->arg_as<ParamArg>().slot != static_cast<int64_t>(i))
      return absl::InvalidArgumentError(cat("kernel: PARAM slots must be 0..", kp.buffers.size() - 1,
                                            " with none repeated; slot ", i, " is missing or taken twice [plan.slots]"));
  for (const UOp* p : kp.buffers) {
    plan.output_parts.push_back({{plan.output_shapes.size()}, -1});
    plan.output_shapes.push_back({p->arg_as<ParamArg>().size});
  }
  plan.steps.push_back({PlanStep::Kind::Kernel, 0});
  plan.kernels.push_back(std::move(kp));
  plan.schedule = *body;
  return plan;
}

}  // namespace

size_t kernel_ops(const UOp* kernel) {
  size_t ops = 0;
  for (const UOp* u : toposort(kernel)) ops += (std::max<size_t>(u->dtype().count, 1) + 15) / 16;
  return ops;
}

absl::Status check_kernel_ops(const UOp* kernel, const PipelineLimits& limits, std::string_view name,
                              std::string_view stage) {
  if (limits.kernel_ops == 0) return absl::OkStatus();
  size_t ops = kernel_ops(kernel);
  if (ops <= limits.kernel_ops) return absl::OkStatus();
  return absl::ResourceExhaustedError(cat("kernel ", name, " has ", ops, " ops after stage ", stage, ", over the limit of ",
                                          limits.kernel_ops, " (", limits.kernel_ops_name, "): split the graph (CONTIGUOUS) into smaller kernels"));
}

absl::StatusOr<Plan> plan_graph(Graph& g, const UOp* root, const PipelineOptions& opts) {
  VerifyOptions vo;
  vo.allow_custom = opts.allow_custom;
  vo.index = opts.index;
  Stage stage = detect_stage(root);
  vo.stage = stage;
  if (absl::Status s = bound_graph(g, opts); !s.ok()) return s;
  if (absl::Status s = verify(g, root, vo); !s.ok()) return s;
  if (absl::Status s = after(g, opts, "verify", "", root); !s.ok()) return s;
  if (stage == Stage::Kernel) return plan_kernel(g, root, opts);
  if (stage != Stage::Tensor)
    return absl::InvalidArgumentError("plan: a graph must be tensor level (a SINK of outputs) or one kernel");

  ShapeInference shapes(g);
  auto lowered = lower_multi(g, root, shapes);
  if (!lowered.ok()) return lowered.status();
  if (lowered->sink != root)
    if (absl::Status s = after(g, opts, "multi", "", lowered->sink); !s.ok()) return s;
  const UOp* sink = lowered->sink;
  auto r = rangeify(g, sink, shapes);
  if (!r.ok()) return r.status();
  if (absl::Status s = after(g, opts, "rangeify", "", r->sink); !s.ok()) return s;
  auto sched = split_kernels(g, *r, opts.device);
  if (!sched.ok()) return sched.status();
  if (absl::Status s = after(g, opts, "split_kernels", "", sched->root); !s.ok()) return s;

  Plan plan;
  for (const UOp* out : sink->src()) {
    auto shape = shapes.shape(out);
    if (!shape.ok()) return shape.status();
    std::vector<int64_t> dims;
    for (const UOp* d : **shape) {
      auto v = eval_dim(d, sched->var_values);
      if (!v.ok()) return v.status();
      dims.push_back(*v);
    }
    plan.output_shapes.push_back(std::move(dims));
  }
  for (const MultiLowered::Output& o : lowered->outputs) plan.output_parts.push_back({o.parts, o.axis});
  plan.outputs = sched->outputs;
  plan.intermediates = sched->intermediates;
  plan.var_values = sched->var_values;
  plan.schedule = sched->root;
  for (const CollectiveStep& c : sched->collectives) plan.collectives.push_back({c.op, c.dtype, c.buffers});
  for (const CopyStep& c : sched->copies) plan.copies.push_back({c.src, c.dst});
  for (const ScheduleStep& st : sched->steps) {
    if (st.kind == ScheduleStep::Kind::Collective) {
      plan.steps.push_back({PlanStep::Kind::Collective, st.index});
      continue;
    }
    if (st.kind == ScheduleStep::Kind::Copy) {
      plan.steps.push_back({PlanStep::Kind::Copy, st.index});
      continue;
    }
    const KernelCall& kc = sched->calls[st.index];
    KernelPlan kp;
    kp.name = kc.body->arg_as<KernelInfoArg>().name;
    kp.device = kc.buffers.empty() ? opts.device : kc.buffers[0]->src(1)->arg_as<DeviceArg>().devices.at(0);
    auto body = drop_unit_ranges(g, kc.body);
    if (body.ok()) body = simplify(g, *body);
    if (!body.ok()) return body.status();
    if (absl::Status s = after(g, opts, "symbolic", kp.name, *body); !s.ok()) return s;
    if ((*body)->num_src() == 0) continue;  // every loop of it is empty: nothing to run
    // normalize numbers buffers by first use in this body (simplification may have
    // dropped one the split kernel named): bind the slots the same way.
    for (const UOp* u : toposort(*body))
      if (u->op() == Op::BUFFER) kp.buffers.push_back(u);
    body = normalize(g, *body);
    if (!body.ok()) return body.status();
    if (absl::Status s = after(g, opts, "normalize", kp.name, *body); !s.ok()) return s;
    kp.kernel = *body;
    plan.steps.push_back({PlanStep::Kind::Kernel, plan.kernels.size()});
    plan.kernels.push_back(std::move(kp));
  }
  return plan;
}

absl::StatusOr<const UOp*> lower_for_cpu(Graph& g, const UOp* kernel, const PipelineOptions& opts,
                                         std::string_view name) {
  if (absl::Status s = bound_graph(g, opts); !s.ok()) return s;
  if (absl::Status s = check_kernel_ops(kernel, opts.limits, name, "normalize"); !s.ok()) return s;
  OptimizeOptions oo;
  oo.vector_bits = opts.vector_bits;
  auto k = optimize_cpu(g, kernel, oo);
  if (!k.ok()) return k.status();
  if (absl::Status s = after(g, opts, "optimize", name, *k); !s.ok()) return s;
  k = expand_and_reduce(g, *k, opts, name);
  if (!k.ok()) return k.status();
  return check_and_linearize(g, *k, opts, name);
}

absl::StatusOr<const UOp*> lower_for_cuda(Graph& g, const UOp* kernel, const PipelineOptions& opts,
                                          std::string_view name, const GpuLowerOptions& gpu) {
  if (absl::Status s = bound_graph(g, opts); !s.ok()) return s;
  if (absl::Status s = check_kernel_ops(kernel, opts.limits, name, "normalize"); !s.ok()) return s;
  GpuOptimizeOptions oo;
  oo.sm = gpu.sm;
  oo.tensor_cores = gpu.tensor_cores;
  oo.max_threads = gpu.max_threads;
  auto k = optimize_gpu(g, kernel, oo);
  if (!k.ok()) return k.status();
  if (absl::Status s = after(g, opts, "optimize", name, *k); !s.ok()) return s;
  k = group_reduce(g, *k);
  if (k.ok()) k = expand_and_reduce(g, *k, opts, name);
  if (!k.ok()) return k.status();
  k = map_gpu_dims(g, *k, gpu.max_threads);
  if (k.ok()) k = simplify(g, *k);
  if (!k.ok()) return k.status();
  if (absl::Status s = after(g, opts, "gpu_dims", name, *k); !s.ok()) return s;
  return check_and_linearize(g, *k, opts, name);
}

}  // namespace uop
