// normalize (docs/ARCHITECTURE.md, The pipeline): erase what a kernel body says about where it runs, so
// that its digest is the identity of the computation. BUFFERs become PARAM(slot) in the
// order of their first use (slot 0 is the one the first STORE writes), RANGE axis ids are
// renumbered 0, 1, ... in toposort order. The same computation on different buffers, from
// different graphs or clients, is then one node digest: one kernel, compiled once.
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::StatusOr<const UOp*> normalize(Graph& g, const UOp* kernel);

}  // namespace uop
