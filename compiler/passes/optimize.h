// optimize (docs/ARCHITECTURE.md, The pipeline): how a normalized kernel's loops run on the
// target, as a loop schedule (loop_schedule.h): a list of split / reorder / thread steps
// over the kernel's canonical axes, applied by apply_schedule. The schedule is given (a
// client's CompileRequest.schedules, a search) or chosen here by heuristic_schedule, one
// function per kernel shape, for the CPU:
//   * elementwise (no REDUCE): the innermost output loop that stores contiguously is split
//     into an outer loop and an Upcast range the width of a vector register. A loop the
//     width divides is preferred; else the innermost contiguous loop is upcast by a
//     divisor of its trip count above half the width, or by the width with the tail
//     masked (split_range), or whole when it is shorter than the width.
//   * tiled reduction (outputs and a REDUCE): the lane loop as above, twice the width when
//     that divides it (more independent accumulators), and a second output loop upcast by
//     4 when 4 divides it, so a matmul keeps a 4 x 2W tile of accumulators in registers,
//     with the lane loop's outer part moved outermost (reorder).
//   * full reduction (no output loop): the reduce loop is upcast by 4W, 2W or W, the
//     largest that divides it, else as an elementwise lane loop: vector accumulators,
//     folded at the end.
//   * then, for every shape, Thread: the outermost output loop is split across the thread
//     pool when the kernel does enough work to pay for waking threads.
// A new shape is a new function called from heuristic_schedule. expand.h turns Upcast
// ranges into vector ops. The schedule is part of the compiled kernel and its cache key,
// not of its identity: the digest of the normalized kernel (before this stage) names the
// computation.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/passes/loop_schedule.h"

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

// What the CPU lets a schedule do (ScheduleLimits for `opts`).
ScheduleLimits cpu_schedule_limits(const OptimizeOptions& opts = {});

// The CPU heuristic's schedule for `kernel` (empty for a kernel that is not one STORE).
LoopSchedule heuristic_schedule(const UOp* kernel, const OptimizeOptions& opts = {});

// apply_schedule(heuristic_schedule(kernel)), or of `schedule` when it is not empty (its
// text, parsed strictly). `applied`, when not null, gets the text of the schedule applied.
absl::StatusOr<const UOp*> optimize_cpu(Graph& g, const UOp* kernel, const OptimizeOptions& opts = {},
                                        std::string_view schedule = {}, std::string* applied = nullptr);

// Splits `r` (a RANGE with a constant trip count n >= 2) by `factor` (2 .. n) into
// r0 * factor + r1: r0 keeps r's axis type and id with trip count ceil(n / factor), r1 is
// a new range of `type` with trip count `factor`. Where r was closed, r0 and r1 are
// closed in its place (r0 outer). A factor that does not divide n masks the iterations
// past n: r's uses become min(r0 * factor + r1, n - 1), a STORE that closed r stores only
// where r0 * factor + r1 < n, and a REDUCE that closed r folds in its identity there (a
// range an END closes is refused, and so is one that the gate of an access reads: see
// can_mask). INVALID_ARGUMENT otherwise.
absl::StatusOr<const UOp*> split_range(Graph& g, const UOp* kernel, const UOp* r, int64_t factor, AxisType type);

// Whether split_range may split `r` by a factor that does not divide its trip count: not
// where the gate of an access reads r (a padded read, r < 52). Such an access is proven
// in bounds by narrowing r with its gate, and r clamped, min(r0 * f + r1, n - 1), is an
// expression the gate no longer narrows the same way once symbolic has rewritten it.
bool can_mask(const UOp* kernel, const UOp* r);

}  // namespace uop
