// Explain: the IR after each stage of the pipeline, as `uopc explain` and uopd's Explain
// RPC (`uop explain`) print it. Both go through these functions, so they say the same:
// a LINEAR as its flat numbered op list, any other IR as a tree, then the backend's
// render (its source) and compile (inspect()'s line and the kernel's ABI).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/backend.h"
#include "compiler/pipeline.h"

namespace uop {

// One stage's output: the stage, the kernel (per-kernel stages; empty for the graph's)
// and its text.
struct ExplainedStage {
  std::string name, kernel, text;
};

// OK when `only` is empty or names a stage; INVALID_ARGUMENT listing the stages otherwise.
absl::Status check_stage_name(std::string_view only);

// The text of a stage's IR.
std::string explain_text(const UOp* ir);
// A kernel's ABI, one line per parameter and variable, then its task extent.
std::string abi_text(const KernelAbi& abi);

// The planning stages (`opts.trace` is replaced): their outputs that `only` selects
// (all when empty) appended to `out`; the plan for explain_kernel.
absl::StatusOr<GraphPlan> explain_plan(Graph& g, const UOp* root, PipelineOptions opts, std::string_view only,
                                       std::vector<ExplainedStage>& out);
// One kernel of the plan lowered by `backend`, rendered and compiled (where the backend
// can compile here; otherwise compile's text says why not), its stages appended to `out`.
// Render and compile are skipped when `only` names another stage. opts.keep_going is
// asked once more before the compile, which cannot be stopped once started.
absl::Status explain_kernel(Graph& g, const KernelPlan& kernel, const Backend& backend, PipelineOptions opts,
                            std::string_view only, std::vector<ExplainedStage>& out);
// Both, for every kernel in order.
absl::StatusOr<std::vector<ExplainedStage>> explain(Graph& g, const UOp* root, const Backend& backend,
                                                    const PipelineOptions& opts = {}, std::string_view only = {});

}  // namespace uop
