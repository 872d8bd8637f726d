// optimize for CUDA (docs/ARCHITECTURE.md, The pipeline): how a normalized kernel's loops run on a GPU.
// A table of rules, tried in order; the first that applies shapes the kernel:
//
//   tensor_cores   a float16 / bfloat16 matmul tile (REDUCE(Add, a*b) with M % 16, N % 8,
//                  K % 16 == 0) on sm_80+: one warp per 16x8 output tile, WMMA
//                  (mma.sync m16n8k16) over K, see tensor_cores.h.
//   group_reduce   a reduction whose outputs are few (<= max_group_outputs) or whose
//                  reduce loop reads memory contiguously: the reduce loop is split into
//                  a per-thread part (Reduce) and a GroupReduce range of L threads
//                  (L = 256 .. 32, the largest that divides it; a loop no L divides is
//                  split into ceil(K / L) x L with the tail masked to the identity);
//                  group_reduce.h then folds the L partial results in shared memory.
//   upcast         the innermost output loop that stores contiguously is split by the
//                  lanes of a 16-byte vector (when it divides and leaves >= 64 threads):
//                  each thread then loads and stores vectors (expand.h).
//   grid           (always, last) the output loops become Global: the innermost
//                  (contiguous) one blockIdx.x, two more blockIdx.y / z when their
//                  extents fit (<= 65535); any others stay serial loops.
//
// Global ranges are numbered so that blockIdx.x has the largest axis id, y the next, z
// the next, and likewise Local / GroupReduce ranges for threadIdx: gpu_dims.h maps them
// in that order after bounds checking, and splits blockIdx.x into blocks of threads.
// Everything here keeps index values inside the ranges they replace, so the bounds proof
// (stage 8) sees what runs.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

struct GpuOptimizeOptions {
  int sm = 80;                       // compute capability: tensor cores need 80 or more
  bool tensor_cores = true;
  int max_threads = 256;             // threads per block the heuristics aim for
  int64_t max_group_outputs = 2048;  // group_reduce when a reduction has at most this many outputs
  int64_t min_group_reduce = 64;     // ... and reduces at least this many values per output
  int vector_bytes = 16;             // widest load / store one thread issues
};

absl::StatusOr<const UOp*> optimize_gpu(Graph& g, const UOp* kernel, const GpuOptimizeOptions& opts = {});

}  // namespace uop
