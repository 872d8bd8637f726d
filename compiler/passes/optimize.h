// optimize (DESIGN §3, stage 6): choose how a normalized kernel's loops run on the
// target. Heuristics today, search later. For the CPU:
//   * Thread: the outermost output loop is split across the thread pool when the kernel
//     does enough work to pay for waking threads.
// A range's axis type is part of the kernel that gets compiled, not of its identity: the
// digest of the normalized kernel (before this stage) names the computation.
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

struct OptimizeOptions {
  // Below this many innermost iterations a kernel runs on one thread.
  int64_t min_parallel_work = int64_t{1} << 16;
};

absl::StatusOr<const UOp*> optimize_cpu(Graph& g, const UOp* kernel, const OptimizeOptions& opts = {});

}  // namespace uop
