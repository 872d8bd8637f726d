// gemm_tiles (the schedule step tile(BM,BN,BK,TM,TN), loop_schedule.h): a float matmul
// (tensor_cores.h MatmulMatch: C = f(sum over k of a(m, k) * b(k, n)), batch loops
// allowed) becomes a GEMM of block tiles staged through shared memory:
//
//   blockIdx.x = gn (N / BN), blockIdx.y = gm (M / BM), blockIdx.z = one batch loop
//   threadIdx.x = tx (BN / TN), threadIdx.y = ty (BM / TM); T = threads per block
//   As = DEFINE_LOCAL[2 * BK * BM], Bs = DEFINE_LOCAL[2 * BK * BN]   (two buffers each)
//   for kt < K / BK:                             (the Reduce loop of the accumulator)
//     buf = kt % 2
//     every thread stores BM * BK / T elements of a's tile, e = tid + T u:
//       As[buf][k][m] = a(gm BM + m, kt BK + k), (m, k) = e split with k fastest when a
//       walks memory along k, m fastest when it walks along m (coalesced global reads);
//     likewise BK * BN / T elements of b's tile into Bs[buf][k][n]; BARRIER
//     for kk < BK: acc[i][j] += As[buf][kk][ty + i TY] * Bs[buf][kk][tx + j TX]
//                  (TM x TN float lanes of one vector accumulator per thread, each a
//                  fused multiply-add: lower_reduce makes a MULACC of the product)
//   C[gm BM + ty + i TY, gn BN + tx + j TX] = f(acc[i][j])
//
// tc_tile(BM,BN,BK,WM,WN) is the same staging for a float16 / bfloat16 matmul (the narrow
// values staged, BK a multiple of 16) computed on the tensor cores: threadIdx.x is the
// lane, threadIdx.y the warp; warp w computes the WM x WN tile at rows (w / (BN / WN)) WM,
// columns (w % (BN / WN)) WN of the block's, as (WM / 16) x (WN / 8) mma.sync m16n8k16
// tiles per 16-deep k step, their fragments read from shared memory in PTX's layout
// (tensor_cores.h), float32 accumulators (4 lanes per mma tile per lane).
//
// Rows and columns of a thread are interleaved (ty + i TY, tx + j TX) so that neighbouring
// threads read neighbouring shared-memory words (no bank conflicts) and store neighbouring
// elements of C. One barrier per k step is enough with two buffers: a thread writes buffer
// b at step kt + 2 only after the barrier of step kt + 1, which every thread reaches after
// its reads of b at step kt. The operands are computed (a cast, a scale) before they are
// staged, so shared memory holds the accumulator's dtype. The accumulation reassociates
// the REDUCE as the contract allows (a per-thread sum in k order, no split of k).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

struct GemmTile {
  int64_t bm = 0, bn = 0, bk = 0;  // the block's tile of C and the k step staged per barrier
  int64_t tm = 0, tn = 0;          // each thread's block of C (register blocking); a warp's
                                   // with tensor_cores
  bool tensor_cores = false;       // tc_tile: warps of mma.sync m16n8k16 (sm_80+)
  int64_t threads() const {
    if (tm < 1 || tn < 1) return 0;
    return (bm / tm) * (bn / tn) * (tensor_cores ? 32 : 1);
  }
  std::string str() const;  // the schedule step: tile(...) / tc_tile(...)
};

// Why `tile` does not fit `kernel` ("" when it does): the kernel is no float matmul (in
// either orientation) whose M, N, K the tile divides, the threads are not 32 .. 1024, a
// tile is not a whole number of loads per thread, or shared memory would exceed 48 KiB.
std::string gemm_tile_misfit(const UOp* kernel, const GemmTile& tile);

// The tiled kernel; INVALID_ARGUMENT with gemm_tile_misfit's reason when it does not fit.
absl::StatusOr<const UOp*> tile_gemm(Graph& g, const UOp* kernel, const GemmTile& tile);

}  // namespace uop
