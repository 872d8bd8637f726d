// linearize (docs/ARCHITECTURE.md, The pipeline): a lowered kernel (lower_reduce.h: single-range ENDs, no
// REDUCE) becomes LINEAR, the flat op list of compiler/PIPELINE.md.
//
// The loop nest comes from the ENDs: loop r sits inside the innermost range its END
// still depends on. Every other op goes into the innermost loop among the ranges it
// depends on (RangeSets), so loop-invariant work is hoisted by construction. Inside each
// loop, ops and child loops are ordered topologically, ties broken by the kernel's
// toposort order, so the output is deterministic.
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::StatusOr<const UOp*> linearize(Graph& g, const UOp* lowered_kernel);

}  // namespace uop
