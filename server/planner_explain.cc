// Explain (planner.h): the IR after each stage, for `uop explain`. It does what a Compile
// does, so it goes where a Compile goes: the compile pool, in its requester's turns, with
// the same bounds and checks. Planning is one task; then each kernel, cloned into a Graph
// of its own (a Graph is one thread's), is lowered, rendered and compiled as a task of its
// own, so a graph of many kernels takes turns with other clients instead of holding a
// thread for all of them. Each task writes only its own stages; the requesting thread
// puts them in order.
#include "compiler/codegen/cuda.h"
#include "compiler/codegen/llvm_cpu.h"
#include "compiler/ir/printer.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "server/planner.h"

namespace uop::server {
namespace {

// A kernel of the plan, alone in its Graph.
struct KernelToExplain {
  std::string name;
  std::shared_ptr<Graph> graph;
  const UOp* kernel = nullptr;
};
struct PlanExplained {
  std::vector<ExplainedStage> stages;
  std::vector<KernelToExplain> kernels;
};

// The trace that keeps what `only` asks for (everything when empty).
std::function<void(std::string_view, std::string_view, const UOp*)> keep_into(std::vector<ExplainedStage>& out,
                                                                           const std::string& only) {
  return [&out, only](std::string_view stage, std::string_view kernel, const UOp* ir) {
    if (!only.empty() && stage != only) return;
    out.push_back({std::string(stage), std::string(kernel), print_tree(ir)});
  };
}

}  // namespace

absl::StatusOr<std::vector<ExplainedStage>> Planner::explain(std::shared_ptr<const DecodedGraph> g,
                                                             const ExplainOptions& opts, const Requester& who) {
  std::optional<CudaTarget> cuda;
  if (!opts.cuda_arch.empty()) {
    auto t = CudaTarget::parse(opts.cuda_arch);
    if (!t.ok()) return t.status();
    cuda = *t;
  }
  const std::string only = opts.only;
  auto planned = to_pool<PlanExplained>(who, "explain: planning", [this, g, only](const std::function<absl::Status()>& keep_going)
                                                                       -> absl::StatusOr<PlanExplained> {
    PlanExplained out;
    PipelineOptions po = pipeline_options();
    po.index = &g->index;
    po.keep_going = keep_going;
    po.trace = keep_into(out.stages, only);
    auto plan = plan_graph(*g->graph, g->root, po);
    if (!plan.ok()) return plan.status();
    for (const KernelPlan& k : plan->kernels) {
      auto own = std::make_shared<Graph>();
      const UOp* kernel = clone_into(*own, k.kernel);
      out.kernels.push_back({k.name, std::move(own), kernel});
    }
    return out;
  }).wait(who.gone);
  if (!planned.ok()) return planned.status();

  // Every kernel queued at once; the answers are put in kernel order.
  const bool codegen = only.empty() || only == "render" || only == "compile";
  std::vector<Pending<std::vector<ExplainedStage>>> kernels;
  for (KernelToExplain& k : planned->kernels) {
    kernels.push_back(to_pool<std::vector<ExplainedStage>>(
          who, cat("explain: kernel ", k.name),
          [this, k, only, cuda, codegen](const std::function<absl::Status()>& keep_going)
              -> absl::StatusOr<std::vector<ExplainedStage>> {
            std::vector<ExplainedStage> out;
            PipelineOptions po = pipeline_options();
            po.keep_going = keep_going;
            po.trace = keep_into(out, only);
            auto stage = [&](std::string_view name, std::string text) {
              if (only.empty() || only == name) out.push_back({std::string(name), k.name, std::move(text)});
            };
            if (cuda) {
              GpuLowerOptions go;
              go.sm = cuda->sm();
              auto linear = lower_for_cuda(*k.graph, k.kernel, po, k.name, go);
              if (!linear.ok()) return linear.status();
              if (!codegen) return out;
              auto src = render_cuda(*linear);
              if (!src.ok()) return src.status();
              stage("render", src->source);
              if (absl::Status nv = nvrtc_status(); !nv.ok()) {
                stage("compile", cat("no cubin: ", nv.message(), "\n", src->abi.serialize()));
                return out;
              }
              if (absl::Status s = keep_going(); !s.ok()) return s;  // NVRTC cannot be stopped
              auto art = uop::compile_cuda(*linear, *cuda, CudaCompileOptions{.emit_ptx = false});
              if (!art.ok()) return art.status();
              stage("compile", cat(art->cubin.size(), " bytes of cubin for ", cuda->arch, " (", cuda_build_id(), ")\n",
                                   art->abi.serialize()));
              return out;
            }
            auto linear = lower_for_cpu(*k.graph, k.kernel, po, k.name);
            if (!linear.ok()) return linear.status();
            if (!codegen) return out;
            if (absl::Status s = keep_going(); !s.ok()) return s;  // LLVM cannot be stopped
            auto art = compile_cpu(*linear, target_, CpuCompileOptions{2, true});
            if (!art.ok()) return art.status();
            stage("render", art->ir_text);
            stage("compile", cat(art->object.size(), " bytes of ELF for ", target_.cpu, "\n", art->abi.serialize()));
            return out;
          }));
  }
  // Returning early drops the rest, which then stop at their next stage.
  std::vector<ExplainedStage> out = std::move(planned->stages);
  for (auto& k : kernels) {
    auto stages = k.wait(who.gone);
    if (!stages.ok()) return stages.status();
    for (ExplainedStage& s : *stages) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace uop::server
