// Explain (planner.h): the IR after each stage, for `uop explain`, as compiler/explain.h
// prints it. It does what a Compile does, so it goes where a Compile goes: the compile
// pool, in its requester's turns, with the same bounds and checks. Planning is one task;
// then each kernel, cloned into a Graph of its own (a Graph is one thread's), is lowered,
// rendered and compiled as a task of its own, so a graph of many kernels takes turns with
// other clients instead of holding a thread for all of them. Each task writes only its
// own stages; the requesting thread puts them in order.
#include "compiler/explain.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "server/planner.h"

namespace uop::server {
namespace {

// A kernel of the plan, alone in its Graph.
struct KernelToExplain {
  KernelPlan plan;
  std::shared_ptr<Graph> graph;
};
struct PlanExplained {
  std::vector<ExplainedStage> stages;
  std::vector<KernelToExplain> kernels;
};

}  // namespace

absl::StatusOr<std::vector<ExplainedStage>> Planner::explain(std::shared_ptr<const DecodedGraph> g,
                                                             const ExplainOptions& opts, const Requester& who) {
  RETURN_IF_ERROR(check_stage_name(opts.only));
  std::shared_ptr<const Backend> backend = opts.backend ? opts.backend : host_;
  const std::string only = opts.only;
  auto planned = to_pool<PlanExplained>(who, "explain: planning", [this, g, only](const std::function<absl::Status()>& keep_going)
                                                                       -> absl::StatusOr<PlanExplained> {
    PlanExplained out;
    PipelineOptions po = pipeline_options();
    po.index = &g->index;
    po.keep_going = keep_going;
    ASSIGN_OR_RETURN(GraphPlan plan, explain_plan(*g->graph, g->root, po, only, out.stages));
    for (const KernelPlan& k : plan.kernels) {
      auto own = std::make_shared<Graph>();
      KernelPlan alone{.name = k.name, .device = k.device, .kernel = clone_into(*own, k.kernel)};
      out.kernels.push_back({std::move(alone), std::move(own)});
    }
    return out;
  }).wait(who.gone);
  if (!planned.ok()) return planned.status();

  // Every kernel queued at once; the answers are put in kernel order.
  std::vector<Pending<std::vector<ExplainedStage>>> kernels;
  for (KernelToExplain& k : planned->kernels) {
    kernels.push_back(to_pool<std::vector<ExplainedStage>>(
        who, cat("explain: kernel ", k.plan.name),
        [this, k, only, backend](const std::function<absl::Status()>& keep_going)
            -> absl::StatusOr<std::vector<ExplainedStage>> {
          std::vector<ExplainedStage> out;
          PipelineOptions po = pipeline_options();
          po.keep_going = keep_going;
          RETURN_IF_ERROR(explain_kernel(*k.graph, k.plan, *backend, po, only, out));
          return out;
        }));
  }
  // Returning early drops the rest, which then stop at their next stage.
  std::vector<ExplainedStage> out = std::move(planned->stages);
  for (auto& k : kernels) {
    ASSIGN_OR_RETURN(std::vector<ExplainedStage> stages, k.wait(who.gone));
    for (ExplainedStage& s : stages) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace uop::server
