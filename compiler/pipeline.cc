#include "compiler/pipeline.h"

#include <algorithm>

#include "compiler/ir/dim.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/verifier.h"
#include "compiler/passes/bounds.h"
#include "compiler/passes/expand.h"
#include "compiler/passes/linearize.h"
#include "compiler/passes/lower_reduce.h"
#include "compiler/passes/multi.h"
#include "compiler/passes/normalize.h"
#include "compiler/passes/rangeify.h"
#include "compiler/passes/split_kernels.h"
#include "compiler/passes/symbolic.h"
#include "compiler/passes/unit_ranges.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

// What happens after every stage: its output traced, then the checks a caller asked for
// (its deadline, whether anyone still waits), the graph's size and, for a kernel's stages
// (`kernel` named), the kernel's.
absl::Status after(Graph& g, const PipelineOptions& o, std::string_view stage, std::string_view kernel, const UOp* ir) {
  if (o.trace) o.trace(stage, kernel, ir);
  if (o.keep_going) RETURN_IF_ERROR(o.keep_going());
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

// What the planning stages hand on, one to the next.
struct Planning {
  Planning(Graph& g, const UOp* root, const PipelineOptions& opts) : g(g), root(root), opts(opts), shapes(g) {}
  Graph& g;
  const UOp* root;
  const PipelineOptions& opts;
  ShapeInference shapes;
  MultiLowered lowered;  // multi
  Rangeified ranged;     // rangeify
  Schedule schedule;     // split_kernels
  GraphPlan plan;        // split_kernels on (kernel bodies: symbolic, normalize)
};
// A planning stage gives each output (the graph's, or one per kernel, named) to `emit`,
// which traces and checks it under the stage's name from the table.
using Emit = std::function<absl::Status(std::string_view kernel, const UOp* ir)>;
struct PlanningStage {
  StageInfo info;
  absl::Status (*run)(Planning& p, const Emit& emit);
};

absl::Status verify_stage(Planning& p, const Emit& emit) {
  VerifyOptions vo;
  vo.allow_custom = p.opts.allow_custom;
  vo.index = p.opts.index;
  vo.stage = detect_stage(p.root);
  RETURN_IF_ERROR(verify(p.g, p.root, vo));
  if (vo.stage != Stage::Tensor && vo.stage != Stage::Kernel)
    return absl::InvalidArgumentError("plan: a graph must be tensor level (a SINK of outputs) or one kernel");
  p.plan.kernel_level = vo.stage == Stage::Kernel;
  return emit("", p.root);
}

// The stages up to symbolic are over tensor-level graphs; a graph that is one kernel
// already starts at normalize.
absl::Status multi_stage(Planning& p, const Emit& emit) {
  if (p.plan.kernel_level) return absl::OkStatus();
  ASSIGN_OR_RETURN(p.lowered, lower_multi(p.g, p.root, p.shapes));
  return emit("", p.lowered.sink);
}

absl::Status rangeify_stage(Planning& p, const Emit& emit) {
  if (p.plan.kernel_level) return absl::OkStatus();
  ASSIGN_OR_RETURN(p.ranged, rangeify(p.g, p.lowered.sink, p.shapes));
  return emit("", p.ranged.sink);
}

absl::Status split_kernels_stage(Planning& p, const Emit& emit) {
  if (p.plan.kernel_level) return absl::OkStatus();
  ASSIGN_OR_RETURN(p.schedule, split_kernels(p.g, p.ranged, p.opts.device));
  RETURN_IF_ERROR(emit("", p.schedule.root));
  GraphPlan& plan = p.plan;
  for (const UOp* out : p.lowered.sink->src()) {
    ASSIGN_OR_RETURN(const Shape* shape, p.shapes.shape(out));
    std::vector<int64_t> dims;
    for (const UOp* d : *shape) {
      ASSIGN_OR_RETURN(int64_t v, eval_dim(d, p.schedule.var_values));
      dims.push_back(v);
    }
    plan.output_shapes.push_back(std::move(dims));
  }
  for (const MultiLowered::Output& o : p.lowered.outputs) plan.output_parts.push_back({o.parts, o.axis});
  plan.outputs = p.schedule.outputs;
  plan.intermediates = p.schedule.intermediates;
  plan.var_values = p.schedule.var_values;
  plan.schedule = p.schedule.root;
  plan.collectives = p.schedule.collectives;
  plan.copies = p.schedule.copies;
  return absl::OkStatus();
}

// Each kernel's body simplified; a kernel every loop of which is empty is dropped (nothing
// to run), which is why the plan's steps are made here.
absl::Status planned_symbolic_stage(Planning& p, const Emit& emit) {
  if (p.plan.kernel_level) return absl::OkStatus();
  GraphPlan& plan = p.plan;
  for (const ScheduleStep& st : p.schedule.steps) {
    if (st.kind != ScheduleStep::Kind::Kernel) {
      plan.steps.push_back(st);
      continue;
    }
    const KernelCall& kc = p.schedule.calls[st.index];
    KernelPlan kp;
    kp.name = kc.body->arg_as<KernelInfoArg>().name;
    kp.device = kc.buffers.empty() ? p.opts.device : kc.buffers[0]->src(1)->arg_as<DeviceArg>().devices.at(0);
    ASSIGN_OR_RETURN(const UOp* body, drop_unit_ranges(p.g, kc.body));
    ASSIGN_OR_RETURN(body, simplify(p.g, body));
    RETURN_IF_ERROR(emit(kp.name, body));
    if (body->num_src() == 0) continue;
    // normalize numbers buffers by first use in this body (simplification may have
    // dropped one the split kernel named): bind the slots the same way.
    for (const UOp* u : toposort(body))
      if (u->op() == Op::BUFFER) kp.buffers.push_back(u);
    kp.kernel = body;
    kp.writes = {0};
    plan.steps.push_back({ScheduleStep::Kind::Kernel, plan.kernels.size()});
    plan.kernels.push_back(std::move(kp));
  }
  return absl::OkStatus();
}

// The PARAM slots a kernel stores to (through AFTERs).
std::vector<size_t> written_slots(const UOp* kernel) {
  std::vector<size_t> slots;
  for (const UOp* u : toposort(kernel)) {
    if (!u->is(Op::STORE) || !u->src(0)->is(Op::INDEX)) continue;
    const UOp* b = u->src(0)->src(0);
    while (b->is(Op::AFTER)) b = b->src(0);
    if (!b->is(Op::PARAM)) continue;
    size_t slot = static_cast<size_t>(b->arg_as<ParamArg>().slot);
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
  }
  std::sort(slots.begin(), slots.end());
  return slots;
}

bool by_slot(const UOp* a, const UOp* b) { return a->arg_as<ParamArg>().slot < b->arg_as<ParamArg>().slot; }

// PARAMs sorted by slot must be slots 0..n-1, none repeated.
absl::Status check_slots(const std::vector<const UOp*>& params, std::string_view what) {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i]->arg_as<ParamArg>().slot != static_cast<int64_t>(i))
      return absl::InvalidArgumentError(cat(what, ": PARAM slots must be 0..", params.size() - 1,
                                            " with none repeated; slot ", i, " is missing or taken twice [plan.slots]"));
  return absl::OkStatus();
}

// A normalized kernel's PARAMs by slot, checked.
absl::StatusOr<std::vector<const UOp*>> params_by_slot(const UOp* kernel, std::string_view what) {
  std::vector<const UOp*> params;
  for (const UOp* u : toposort(kernel))
    if (u->op() == Op::PARAM) params.push_back(u);
  std::sort(params.begin(), params.end(), by_slot);
  RETURN_IF_ERROR(check_slots(params, what));
  return params;
}

bool is_sink_of_calls(const UOp* root) {
  return root->num_src() > 0 &&
         std::all_of(root->src().begin(), root->src().end(), [](const UOp* s) { return s->is(Op::CALL); });
}

std::string kernel_name_of(const UOp* sink) {
  const auto* info = sink->arg_if<KernelInfoArg>();
  return info && !info->name.empty() ? info->name : "kernel";
}

// A graph that is kernels already: one kernel, whose PARAMs are the graph's buffers by
// slot, or a SINK of CALLs, each running its kernel on the graph's PARAMs it names, in
// the order of the SINK's sources.
absl::Status normalize_kernel_graph(Planning& p, const Emit& emit) {
  GraphPlan& plan = p.plan;
  if (!is_sink_of_calls(p.root)) {
    if (std::any_of(p.root->src().begin(), p.root->src().end(), [](const UOp* s) { return s->is(Op::CALL); }))
      return absl::InvalidArgumentError(
          "a kernel-level SINK holds one kernel's STOREs or CALLs of kernels, not both [plan.call]");
    ASSIGN_OR_RETURN(const UOp* body, normalize(p.g, p.root));
    KernelPlan kp;
    kp.name = kernel_name_of(p.root);
    RETURN_IF_ERROR(emit(kp.name, body));
    kp.kernel = body;
    ASSIGN_OR_RETURN(kp.buffers, params_by_slot(body, "kernel"));
    kp.writes = written_slots(body);
    plan.params = kp.buffers;
    plan.steps.push_back({ScheduleStep::Kind::Kernel, 0});
    plan.kernels.push_back(std::move(kp));
    plan.schedule = body;
  } else {
    for (size_t c = 0; c < p.root->num_src(); ++c) {
      const UOp* call = p.root->src(c);
      const std::string what = cat("call ", c);
      const UOp* sink = call->src(0);
      if (!sink->is(Op::SINK) || sink->num_src() == 0 ||
          std::any_of(sink->src().begin(), sink->src().end(), [](const UOp* s) { return s->is(Op::CALL); }))
        return absl::InvalidArgumentError(cat(what, ": calls a ", op_name(sink->op()),
                                              "; a kernel-level CALL calls a kernel, SINK[kernel](STORE...) [plan.call]"));
      KernelPlan kp;
      kp.name = kernel_name_of(sink);
      ASSIGN_OR_RETURN(kp.kernel, normalize(p.g, sink));
      RETURN_IF_ERROR(emit(kp.name, kp.kernel));
      ASSIGN_OR_RETURN(std::vector<const UOp*> slots, params_by_slot(kp.kernel, cat(what, " (kernel ", kp.name, ")")));
      if (slots.size() != call->num_src() - 1)
        return absl::InvalidArgumentError(cat(what, " (kernel ", kp.name, "): the kernel has ", slots.size(),
                                              " buffer slots, the CALL binds ", call->num_src() - 1, " [plan.call]"));
      for (size_t i = 0; i < slots.size(); ++i) {
        const UOp* arg = call->src(i + 1);
        if (!arg->is(Op::PARAM))
          return absl::InvalidArgumentError(cat(what, " (kernel ", kp.name, "): slot ", i, " is bound to a ",
                                                op_name(arg->op()), ", not a PARAM of the graph [plan.call]"));
        // The kernel was proven inside buffers of its own PARAMs' sizes: what it is bound to
        // must be exactly that.
        if (arg->dtype() != slots[i]->dtype())
          return absl::InvalidArgumentError(cat(what, " (kernel ", kp.name, "): slot ", i, " is ",
                                                slots[i]->dtype().str(), ", the PARAM bound to it ", arg->dtype().str(),
                                                " [plan.call]"));
        if (std::find(kp.buffers.begin(), kp.buffers.end(), arg) != kp.buffers.end())
          return absl::InvalidArgumentError(cat(what, " (kernel ", kp.name, "): PARAM slot ",
                                                arg->arg_as<ParamArg>().slot,
                                                " is bound to two of the kernel's slots [plan.call]"));
        kp.buffers.push_back(arg);
      }
      kp.writes = written_slots(kp.kernel);
      plan.steps.push_back({ScheduleStep::Kind::Kernel, plan.kernels.size()});
      plan.kernels.push_back(std::move(kp));
    }
    plan.params = kernel_graph_params(p.root);
    RETURN_IF_ERROR(check_slots(plan.params, "the graph (what its CALLs bind)"));
    plan.schedule = p.root;
  }
  for (const UOp* param : plan.params) {
    plan.output_parts.push_back({{plan.output_shapes.size()}, -1});
    plan.output_shapes.push_back({param->arg_as<ParamArg>().size});
  }
  return absl::OkStatus();
}

absl::Status normalize_stage(Planning& p, const Emit& emit) {
  if (p.plan.kernel_level) return normalize_kernel_graph(p, emit);
  for (KernelPlan& kp : p.plan.kernels) {
    ASSIGN_OR_RETURN(kp.kernel, normalize(p.g, kp.kernel));
    RETURN_IF_ERROR(emit(kp.name, kp.kernel));
  }
  return absl::OkStatus();
}

const PlanningStage kPlanning[] = {
    {{"verify", "the graph as decoded and checked against its stage's rules"}, verify_stage},
    {{"multi", "multi-device tensors -> per-device tensors; reductions across shards -> ALLREDUCE"}, multi_stage},
    {{"rangeify", "movement ops -> index arithmetic over RANGEs; REDUCE_AXIS -> REDUCE; BUFFERIZE where values are materialized"},
     rangeify_stage},
    {{"split_kernels", "one kernel per BUFFERIZE: SINK(CALL(kernel, buffers...)...) in execution order"}, split_kernels_stage},
    {{"symbolic", "per kernel: unit ranges dropped, constant folding, identities, index arithmetic"}, planned_symbolic_stage},
    {{"normalize", "per kernel: BUFFER -> PARAM in slot order, ranges renumbered; the digest is the kernel's identity"},
     normalize_stage},
};

absl::StatusOr<const UOp*> run_bounds(Graph& g, const UOp* kernel) {
  RETURN_IF_ERROR(check_bounds(g, kernel));
  return kernel;
}

}  // namespace

std::span<const StageInfo> planning_stages() {
  static const std::vector<StageInfo> kInfo = [] {
    std::vector<StageInfo> v;
    for (const PlanningStage& st : kPlanning) v.push_back(st.info);
    return v;
  }();
  return kInfo;
}

std::vector<const UOp*> kernel_graph_params(const UOp* root) {
  std::vector<const UOp*> params;
  auto add = [&](const UOp* u) {
    if (u->is(Op::PARAM) && std::find(params.begin(), params.end(), u) == params.end()) params.push_back(u);
  };
  if (is_sink_of_calls(root)) {
    for (const UOp* call : root->src())
      for (size_t i = 1; i < call->num_src(); ++i) add(call->src(i));
  } else {
    for (const UOp* u : toposort(root)) add(u);
  }
  std::sort(params.begin(), params.end(), by_slot);
  return params;
}

const KernelStage& symbolic_stage() {
  static const KernelStage k{"symbolic", "per kernel: constant folding, identities, index arithmetic",
                             [](Graph& g, const UOp* k) { return simplify(g, k); }};
  return k;
}
const KernelStage& expand_stage() {
  static const KernelStage k{"expand", "per kernel: Upcast ranges -> vector lanes (vector loads / stores, vector accumulators)",
                             expand_upcasts};
  return k;
}
const KernelStage& lower_reduce_stage() {
  static const KernelStage k{"lower_reduce", "per kernel: REDUCE -> accumulator (DEFINE_REG); closed ranges -> ENDs",
                             lower_reduce};
  return k;
}
const KernelStage& bounds_stage() {
  static const KernelStage k{"bounds", "per kernel: every INDEX of the IR that is rendered proven inside its buffer, or the kernel is refused",
                             run_bounds};
  return k;
}
const KernelStage& linearize_stage() {
  static const KernelStage k{"linearize", "per kernel: LINEAR, the flat op list in execution order", linearize};
  return k;
}

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

absl::StatusOr<GraphPlan> plan_graph(Graph& g, const UOp* root, const PipelineOptions& opts) {
  RETURN_IF_ERROR(bound_graph(g, opts));
  Planning p(g, root, opts);
  for (const PlanningStage& st : kPlanning) {
    Emit emit = [&](std::string_view kernel, const UOp* ir) { return after(g, opts, st.info.name, kernel, ir); };
    RETURN_IF_ERROR(st.run(p, emit));
  }
  return std::move(p.plan);
}

absl::StatusOr<const UOp*> run_kernel_stages(Graph& g, const UOp* kernel, std::span<const KernelStage> schedule,
                                             const PipelineOptions& opts, std::string_view name) {
  const size_t n = schedule.size();
  if (n < 2 || schedule[n - 2].name != bounds_stage().name || schedule[n - 1].name != linearize_stage().name)
    return absl::InternalError("pipeline: a schedule must end with bounds then linearize, so that what is rendered is what was proven");
  RETURN_IF_ERROR(bound_graph(g, opts));
  RETURN_IF_ERROR(check_kernel_ops(kernel, opts.limits, name, "normalize"));
  if (!opts.schedule.empty() &&
      std::none_of(schedule.begin(), schedule.end(), [](const KernelStage& st) { return bool(st.scheduled); }))
    return absl::InvalidArgumentError(cat("kernel ", name, ": this target takes no loop schedule (\"", opts.schedule, "\" given)"));
  for (const KernelStage& st : schedule) {
    if (st.scheduled) {
      ASSIGN_OR_RETURN(kernel, st.scheduled(g, kernel, opts.schedule, opts.applied_schedule));
    } else {
      ASSIGN_OR_RETURN(kernel, st.run(g, kernel));
    }
    RETURN_IF_ERROR(after(g, opts, st.name, name, kernel));
  }
  return kernel;
}

}  // namespace uop
