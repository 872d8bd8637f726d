// optimize for CUDA (docs/ARCHITECTURE.md, The pipeline): how a normalized kernel's loops run
// on a GPU, as a loop schedule (loop_schedule.h) that apply_schedule applies, so that a
// client or a search can give another one (CompileRequest.schedules). The heuristic,
// gpu_heuristic_schedule, tries these in order; the first that applies shapes the kernel:
//
//   tc(W)          a float16 / bfloat16 matmul tile (REDUCE(Add, a*b) with M % 16, N % 8,
//                  K % 16 == 0) on sm_80+: one warp per 16x8 output tile, WMMA
//                  (mma.sync m16n8k16) over K, W warps per block, see tensor_cores.h.
//   tile(BM,BN,BK,TM,TN)
//                  any other float matmul (batched too) whose extents a tile divides: block
//                  tiles of A and B staged through shared memory, double-buffered, each
//                  thread a TM x TN block of C in registers (gemm_tiles.h); the tile is
//                  the largest of 128x128x8 / 8x8, 64x64x8 / 4x4, 32x32x8 / 4x4 that fits
//                  and leaves 256 blocks (else the fitting one with the most blocks).
//   split(R,L,group_reduce)
//                  a reduction whose outputs are few (<= max_group_outputs) or whose
//                  reduce loop R reads memory contiguously: R is split into a per-thread
//                  part (Reduce) and a GroupReduce range of L threads (L = 256 .. 32, the
//                  largest that divides it; a loop no L divides is split into
//                  ceil(K / L) x L with the tail masked to the identity); group_reduce.h
//                  then folds the L partial results in shared memory.
//   split(A,W,upcast)
//                  the innermost output loop that stores contiguously is split by the
//                  lanes of a 16-byte vector (when it divides and leaves >= 64 threads):
//                  each thread then loads and stores vectors (expand.h).
//   grid(X,Y,Z)    (after either split, or alone) the output loops become Global: the
//                  innermost contiguous one blockIdx.x, two more blockIdx.y / z when their
//                  extents fit (<= 65535); any others stay serial loops.
//
// Global ranges are numbered so that blockIdx.x has the largest axis id, y the next, z
// the next, and likewise Local / GroupReduce ranges for threadIdx: gpu_dims.h maps them
// in that order after bounds checking, and splits blockIdx.x into blocks of threads.
// Everything here keeps index values inside the ranges they replace, so the bounds proof
// sees what runs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/passes/loop_schedule.h"

namespace uop {

struct GpuOptimizeOptions {
  int sm = 80;                       // compute capability: tensor cores need 80 or more
  bool tensor_cores = true;
  bool smem_tiles = true;            // matmuls as shared-memory GEMM tiles (tile steps)
  int max_threads = 256;             // threads per block the heuristics aim for
  int64_t max_group_outputs = 2048;  // group_reduce when a reduction has at most this many outputs
  int64_t min_group_reduce = 64;     // ... and reduces at least this many values per output
  int vector_bytes = 16;             // widest load / store one thread issues
};

// What a GPU lets a schedule do: splits into local / group_reduce / upcast, the grid, tc
// (sm_80+, tensor cores on) and tile; no thread pool.
ScheduleLimits gpu_schedule_limits(const GpuOptimizeOptions& opts = {});

// The heuristic's schedule for `kernel` (empty for a kernel that is not one STORE).
LoopSchedule gpu_heuristic_schedule(const UOp* kernel, const GpuOptimizeOptions& opts = {});

// apply_schedule(gpu_heuristic_schedule(kernel)), or of `schedule` when it is not empty
// (its text, parsed strictly). `applied`, when not null, gets the text applied.
absl::StatusOr<const UOp*> optimize_gpu(Graph& g, const UOp* kernel, const GpuOptimizeOptions& opts = {},
                                        std::string_view schedule = {}, std::string* applied = nullptr);

}  // namespace uop
