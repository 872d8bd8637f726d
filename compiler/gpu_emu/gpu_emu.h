// The GPU emulator: a LINEAR lowered by the CUDA backend (SPECIAL blockIdx / threadIdx,
// DEFINE_LOCAL shared memory, BARRIER, WMMA, vector loads and stores) executed on the CPU
// the way a GPU runs it, with the checks a GPU does not make. Like the reference
// interpreter it is slow and obviously right; it is the CUDA backend's oracle where there
// is no GPU (CI) and a search can run kernels on it. No CUDA, no LLVM.
//
// Execution (docs/ARCHITECTURE.md, "The GPU emulator"):
//   * the grid and block dims are the kernel ABI's (abi_of: GpuLaunch), evaluated with the
//     variables as the worker does (each checked against its [min, max]); a grid dim <= 0
//     launches nothing;
//   * blocks run one after another; within a block every thread runs until it reaches a
//     BARRIER, a WMMA or the end, then the next thread. A WMMA runs once all 32 threads of
//     its warp (threads 32w .. 32w+31 in threadIdx.x-fastest order) wait at it; a BARRIER
//     is released once every thread of the block waits at it;
//   * PARAM buffers are shared by the whole grid, DEFINE_LOCAL arrays by a block, DEFINE_REG
//     arrays are per thread; every ALU op, CAST and BITCAST goes through the interpreter's
//     scalar semantics (interp/node_eval.h, ir/eval.h) lane by lane, so emulator and
//     interpreter agree by construction;
//   * WMMA is mma.sync m16n8k16 with the fragment layout cuda_prelude.cc and tensor_cores.cc
//     use: lane l = 4g + t holds A[g + 8i][2t + j + 8k] in element j + 2i + 4k of its
//     8-vector, B[2t + j + 8k][g] in element j + 2k of its 4-vector, C and D[g + 8i][2t + j]
//     in element j + 2i; D = C + A B summed over k in order with fused multiply-adds.
//
// Errors (absl status, INVALID_ARGUMENT unless said otherwise), each naming the node as
// "node N (OP)", N its position in the LINEAR, and the threads as "thread (x, y, z) of
// block (x, y, z)", with a rule in brackets:
//   [emu.bounds]   a load or store (gate on) outside its global, shared or register array;
//   [emu.race]     in shared memory, two threads writing one element, or one writing an
//                  element another read, between the same two barriers, or a thread reading
//                  an element another thread wrote that no barrier has published since;
//                  in global memory, the same between threads of different blocks (no
//                  barrier orders them) or of one block between two barriers;
//   [emu.uninit]   a read of shared memory or of a register no thread has written;
//   [emu.barrier]  a BARRIER some threads of the block skip (they end, or wait at another
//                  barrier) — one inside control flow that differs between threads;
//   [emu.wmma]     a WMMA not reached by all 32 threads of a full warp;
//   [emu.launch]   a launch the GPU refuses: over 1024 threads per block, a grid over
//                  CUDA's limits, over 48 KiB of shared memory, a variable missing or out
//                  of its bounds, a buffer missing or too small for its PARAM;
//   [emu.op], [emu.gather]  what the CUDA renderer does not emit either: an op outside
//                  the LINEAR subset above, a vector of indices, operands whose lane
//                  counts do not fit;
//   RESOURCE_EXHAUSTED past options.max_steps executed ops or options.max_values lanes.
// A LINEAR the verifier refuses gets the verifier's status, as the renderers give it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/abi/kernel_abi.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/uop.h"

namespace uop {

struct GpuEmuOptions {
  // Ops executed over all threads of the launch (a thread's start counts as one) before
  // giving up.
  int64_t max_steps = int64_t{1} << 32;
  // Value lanes and register elements of a block's threads together (16 bytes or less
  // each), so that a block of 1024 threads of a LINEAR with many wide values or large
  // register arrays is refused rather than allocated.
  int64_t max_values = int64_t{1} << 26;
};

// What one launch did.
struct GpuEmuStats {
  GpuDims dims;          // the launch dims the ABI gave
  int64_t blocks = 0;    // blocks run
  int64_t steps = 0;     // ops executed, all threads together
  int64_t barriers = 0;  // barrier releases, all blocks together
  int64_t wmmas = 0;     // WMMAs executed, one per warp
};

// Runs `linear` (a LINEAR of the CUDA backend's lowering) once on the CPU. params[slot] is
// the buffer of PARAM(slot): its dtype the PARAM's element dtype, at least as many
// elements as the PARAM's size (times its vector width); written in place. `vars` binds
// each DEFINE_VAR by name.
absl::StatusOr<GpuEmuStats> emulate_gpu(const UOp* linear, std::span<HostTensor* const> params,
                                        const absl::flat_hash_map<std::string, int64_t>& vars,
                                        const GpuEmuOptions& options = {});

}  // namespace uop
