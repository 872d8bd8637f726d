// group_reduce (GPU, after optimize_gpu, before expand): a REDUCE over a GroupReduce range
// T (the threads of a block, L of them) becomes a reduction in shared memory. Each thread
// reduces its own ranges into a partial value, and the block folds the L partials in a
// tree, every step separated by a barrier:
//
//   partial = REDUCE(v, the other ranges)            (each thread; none left: v)
//   smem    = DEFINE_LOCAL : ptr<T, local, L * rows>
//   STORE(smem[T], partial); BARRIER
//   for s = P/2, P/4, .., 1  (P: L rounded up to a power of two)
//     STORE(smem[T] if T < s and T + s < L,  smem[T] <op> smem[T + s]); BARRIER
//   result  = BARRIER(smem[0])                       (every thread reads it, then waits)
//
// Where the block has other thread ranges (Local: rows of threads, each folding its own
// reduction), each row has its own L elements: smem[row * L + T].
// A step reads smem[T] and smem[T + s] and writes smem[T] for T < s only, so no thread
// writes what another reads in the same step. The last barrier keeps a thread that goes
// on to the next iteration of an enclosing loop from overwriting smem[0] before everyone
// has read it. A STORE of the result into a buffer whose address does not move with T is
// gated to T == 0: one thread writes it. Barriers are never under a condition: every
// thread of the block reaches each one (gpu_dims.h masks tails with gates, not branches).
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::StatusOr<const UOp*> group_reduce(Graph& g, const UOp* kernel);

}  // namespace uop
