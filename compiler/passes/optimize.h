// optimize (docs/ARCHITECTURE.md, The pipeline): choose how a normalized kernel's loops run on the
// target. Heuristics today, search later. For the CPU:
//   * Upcast: the innermost output loop that stores contiguously is split into an outer
//     loop and an Upcast range the width of a vector register (twice that when the
//     kernel reduces, for more independent accumulators); a kernel that reduces also
//     upcasts a second output loop by 4, so a matmul keeps a 4 x 2W tile of accumulators
//     in registers. A kernel with no output loop to upcast (a full reduction) upcasts its
//     reduce loop by 4W instead: vector accumulators, folded at the end. Only loops whose
//     trip count the width divides are split, so no remainder code is needed.
//   * Thread: the outermost output loop is split across the thread pool when the kernel
//     does enough work to pay for waking threads.
// expand.h turns Upcast ranges into vector ops. The axis types are part of the compiled
// kernel, not of its identity: the digest of the normalized kernel (before this stage)
// names the computation.
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

struct OptimizeOptions {
  // Below this many innermost iterations a kernel runs on one thread.
  int64_t min_parallel_work = int64_t{1} << 16;
  // Width of the target's vector registers in bits (512 with AVX-512, 256 with AVX2);
  // 0 turns upcasting off.
  int vector_bits = 256;
  // Most lanes one value may have after upcasting.
  int max_lanes = 128;
};

absl::StatusOr<const UOp*> optimize_cpu(Graph& g, const UOp* kernel, const OptimizeOptions& opts = {});

// Splits `r` (a RANGE whose constant trip count `factor` divides) into r0 * factor + r1:
// r0 keeps r's axis type and id, r1 is a new range of `type` with trip count `factor`.
// Where r was closed, r0 and r1 are closed in its place (r0 outer).
absl::StatusOr<const UOp*> split_range(Graph& g, const UOp* kernel, const UOp* r, int64_t factor, AxisType type);

}  // namespace uop
