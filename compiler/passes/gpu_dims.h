// gpu_dims (GPU, before bounds and linearize): the parallel ranges become the
// hardware's indices, SPECIAL(end) named "blockIdx.x" .. "threadIdx.z" (the Bestiary's
// SPECIAL: a value, not a loop). Local and GroupReduce ranges become threadIdx.x, y, z in
// decreasing axis id; Global ranges blockIdx.x, y, z the same way (optimize_gpu.h numbers
// them). blockIdx.x is also split into threads when the block has room, a Global range
// r of extent N becoming
//
//   r = b * L + t                       when a power of two L in [32, room] divides N
//   r = min(b * L + t, N - 1)           otherwise (N may be an expression over DEFINE_VARs)
//       with b < ceil(N / L) and every STORE to a buffer that r reaches gated on b*L+t < N
//
// so every index keeps the values it had (a clamped index repeats the last one), and
// nothing is written twice; the bounds proof checks what this makes. The ENDs that closed these ranges go; a launch
// runs each value once instead (abi/kernel_abi.h: the grid is ceil(N / L) blocks, a launch with a
// grid dim <= 0 is skipped). Also folds `acc + WMMA(a, b, 0)` into WMMA(a, b, acc), the
// accumulation the tensor cores do in place (tensor_cores.h), and `acc + CAT(WMMA(a_i, b_i,
// 0)...)` into CAT(WMMA(a_i, b_i, acc's lanes of tile i)...): a warp's several mma tiles
// in one accumulator (gemm_tiles.h).
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

// `max_threads`: the most threads per block blockIdx.x is split into.
absl::StatusOr<const UOp*> map_gpu_dims(Graph& g, const UOp* kernel, int max_threads = 256);

}  // namespace uop
