#include "compiler/explain.h"

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/printer.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

// The trace that keeps what `only` selects.
std::function<void(std::string_view, std::string_view, const UOp*)> keep_into(std::vector<ExplainedStage>& out,
                                                                           std::string_view only) {
  return [&out, only = std::string(only)](std::string_view stage, std::string_view kernel, const UOp* ir) {
    if (!only.empty() && stage != only) return;
    out.push_back({std::string(stage), std::string(kernel), explain_text(ir)});
  };
}

// A LINEAR reads best as a numbered list of ops with their sources, indented by loop.
std::string print_linear(const UOp* linear) {
  absl::flat_hash_map<const UOp*, size_t> pos;
  std::string out;
  int depth = 0;
  for (const UOp* u : linear->src()) {
    pos[u] = pos.size();
    if (u->op() == Op::END) --depth;
    std::string line = cat(std::string(2 * std::max(depth, 0), ' '), "%", pos[u], " = ", op_name(u->op()));
    std::string arg = arg_str(u->arg());
    if (!arg.empty()) line += cat("(", arg, ")");
    line += cat(" : ", u->dtype().str());
    std::vector<std::string> srcs;
    for (const UOp* s : u->src()) srcs.push_back(pos.contains(s) ? cat("%", pos[s]) : std::string("?"));
    if (!srcs.empty()) line += cat("  <- ", join(srcs, ", "));
    out += line + "\n";
    if (u->op() == Op::RANGE) ++depth;
  }
  return out;
}

}  // namespace

absl::Status check_stage_name(std::string_view only) {
  if (only.empty()) return absl::OkStatus();
  std::vector<std::string> names;
  for (const StageInfo& s : pipeline_stages()) {
    if (s.name == only) return absl::OkStatus();
    names.emplace_back(s.name);
  }
  return absl::InvalidArgumentError(cat("unknown stage '", only, "'; the stages are ", join(names, ", ")));
}

std::string explain_text(const UOp* ir) { return ir->op() == Op::LINEAR ? print_linear(ir) : print_tree(ir); }

std::string abi_text(const KernelAbi& abi) {
  std::string s;
  for (const KernelParam& p : abi.params)
    s += cat("  slot ", p.slot, ": ", p.dtype.str(), "[", p.size, "]", p.read ? " read" : "", p.written ? " written" : "", "\n");
  for (const KernelVar& v : abi.vars) s += cat("  var ", v.name, " in [", v.min, ", ", v.max, "]\n");
  s += cat("  tasks = ", abi.tasks_extent.str(abi.vars), "\n");
  s += cat("  schedule = ", abi.schedule_str(), "\n");
  return s;
}

absl::StatusOr<GraphPlan> explain_plan(Graph& g, const UOp* root, PipelineOptions opts, std::string_view only,
                                       std::vector<ExplainedStage>& out) {
  opts.trace = keep_into(out, only);
  return plan_graph(g, root, opts);
}

absl::Status explain_kernel(Graph& g, const KernelPlan& kernel, const Backend& backend, PipelineOptions opts,
                            std::string_view only, std::vector<ExplainedStage>& out) {
  opts.trace = keep_into(out, only);
  std::string applied;
  opts.applied_schedule = &applied;
  const size_t first = out.size();
  ASSIGN_OR_RETURN(const UOp* linear, backend.lower(g, kernel.kernel, opts, kernel.name));
  // The optimize stage's IR after the schedule it applied, which is what made it.
  for (size_t i = first; i < out.size(); ++i)
    if (out[i].name == "optimize") out[i].text = cat("schedule: ", applied.empty() ? "(none)" : applied, "\n", out[i].text);
  auto stage = [&](std::string_view name, std::string text) {
    if (only.empty() || only == name) out.push_back({std::string(name), kernel.name, std::move(text)});
  };
  if (!only.empty() && only != "render" && only != "compile") return absl::OkStatus();
  // Only the source asked for, or no compiler here: the render alone.
  if (absl::Status why = backend.available(); only == "render" || !why.ok()) {
    ASSIGN_OR_RETURN(CodeArtifact src, backend.render(linear));
    src.abi.schedule = applied;
    stage("render", std::move(src.source));
    if (!why.ok()) stage("compile", cat("no ", backend.object_kind(), ": ", why.message(), "\n", abi_text(src.abi)));
    return absl::OkStatus();
  }
  if (opts.keep_going) RETURN_IF_ERROR(opts.keep_going());
  ASSIGN_OR_RETURN(CodeArtifact art, backend.compile(linear, BackendCompileOptions{.keep_source = true}));
  art.abi.schedule = applied;
  stage("render", art.source);
  stage("compile", cat(backend.inspect(art), "\n", abi_text(art.abi)));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ExplainedStage>> explain(Graph& g, const UOp* root, const Backend& backend,
                                                    const PipelineOptions& opts, std::string_view only) {
  RETURN_IF_ERROR(check_stage_name(only));
  std::vector<ExplainedStage> out;
  ASSIGN_OR_RETURN(GraphPlan plan, explain_plan(g, root, opts, only, out));
  for (const KernelPlan& k : plan.kernels) RETURN_IF_ERROR(explain_kernel(g, k, backend, opts, only, out));
  return out;
}

}  // namespace uop
