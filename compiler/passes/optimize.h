// optimize (docs/ARCHITECTURE.md, The pipeline): how a normalized kernel's loops run on the
// target, as a loop schedule (loop_schedule.h): a list of split / reorder / thread steps
// over the kernel's canonical axes, applied by apply_schedule. The schedule is given (a
// client's CompileRequest.schedules, a search) or chosen here by heuristic_schedule, one
// function per kernel shape, for the CPU:
//   * elementwise (no REDUCE): the innermost output loop that stores contiguously is split
//     into an outer loop and an Upcast range the width of a vector register. A loop the
//     width divides is preferred; else the innermost contiguous loop is upcast by a
//     divisor of its trip count above half the width, or by the width with the tail
//     masked (split_range; gated where a pad's gate reads the loop), or whole when it is
//     shorter than the width.
//   * outputs and a REDUCE: a tile of accumulators, chosen by what the reduction's
//     operands (its LOADs) share along the output loop the STORE writes contiguously:
//       - register tile (a matmul, a convolution, attention's P V): an output loop that
//         no operand read along the lane loop reads (a matmul's rows, a convolution's
//         output channels) gives rows, so that each vector loaded serves every row and
//         each broadcast value every lane; the lane loop takes twice the width where
//         that divides it (a convolution: at most 8 lanes, the channels the rest), else
//         the largest power of two up to the width that does (odd
//         vectors become pieces and shuffles, a masked tail scalar loads); a second
//         output loop those operands read (the map's height) fills half a vector where
//         the width alone does not; rows take the rest of half the register file's
//         lanes (256 for a window reduction read through gated loads), up to 32; a
//         single reduce loop gets the lane loop's outer part outermost (reorder),
//         a window reduction its output loop of most iterations (the map's rows);
//       - window tile (a depthwise convolution, a pool, a reduction over a non-innermost
//         axis): every operand reads every output loop, so no lane shares a load: the
//         lane loop's vector, filled from a second loop, and up to 4 rows of another for
//         the adds in flight; the small window loops stay constant inner loops;
//       - dot tile (Q K^T, a matmul with a transposed operand, a sum over the innermost
//         axis, a recurrent cell's sibling gate products): no operand is contiguous along
//         the output but all are along each reduction's innermost reduce loop: its
//         lanes, folded after it, under up to 4 x 4 outputs (not for a reduction nested
//         in another's body, whose lanes would multiply).
//   * full reduction (no output loop): the reduce loop is upcast by 4W, 2W or W, the
//     largest that divides it, else as an elementwise lane loop: vector accumulators,
//     folded at the end.
//   * then, for every shape, Thread: the outermost output loop is split across the thread
//     pool when the kernel does enough work to pay for waking threads, its iterations
//     (an elementwise kernel's elements) counted with sibling reductions added, not
//     multiplied (an output loop of more
//     iterations moved outermost first where that one has under 8);
//   * last, a reduce loop that a load's index divides or takes a remainder of by a small
//     factor (a channel shuffle read by a convolution) is split by it into lanes, which
//     makes the index affine.
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
  // Most lanes one value may have after upcasting: 16 AVX-512 registers of fp32 (a
  // matmul's tile of accumulators), a bound on what expand makes of one value.
  int max_lanes = 256;
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
// where r0 * factor + r1 < n, and a REDUCE that closed r folds in its identity there. A
// range an END closes is refused. A range that the gate of an access reads (see can_mask)
// splits so only into Upcast lanes, unclamped, every access that reads it gated by
// r0 * factor + r1 < n. INVALID_ARGUMENT otherwise.
absl::StatusOr<const UOp*> split_range(Graph& g, const UOp* kernel, const UOp* r, int64_t factor, AxisType type);

// Whether split_range may clamp `r` where a factor does not divide its trip count: not
// where the gate of an access reads r (a padded read, r < 52). Such an access is proven
// in bounds by narrowing r with its gate, and r clamped, min(r0 * f + r1, n - 1), is an
// expression the gate no longer narrows the same way once symbolic has rewritten it;
// there only Upcast lanes may have a tail, gated rather than clamped.
bool can_mask(const UOp* kernel, const UOp* r);

}  // namespace uop
