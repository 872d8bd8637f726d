// tensor_cores (optimize_gpu's first rule): a matmul on float16 / bfloat16 inputs runs on
// the tensor cores with WMMA, the PTX instruction mma.sync.aligned.m16n8k16 (sm_80+).
//
// It applies to a kernel STORE(C[...], f(REDUCE(Add, a * b, k)), ..., m, ..., n) where a
// and b are float16 (or both bfloat16) values, or such values widened exactly to
// float32, a depends on m and not n, b on n and not m, and M % 16, N % 8, K % 16 are 0
// (constant extents); f is anything of the reduction and the loops. The kernel becomes
//
//   blockIdx.y = gm (M / 16), blockIdx.x = gn (N / (8 W)), threadIdx.y = w (W warps),
//   threadIdx.x = lane (32), other output loops: blockIdx.z (one) or serial loops;
//   acc = REDUCE(Add, WMMA(A, B, 0), kk over K / 16)     (<4 x float32> per lane)
//   A = VECTORIZE(a at m = 16 gm + g + 8 i, k = 16 kk + 2 t + j + 8 h)   8 lanes
//   B = VECTORIZE(b at k = 16 kk + 2 t + j + 8 h, n = 8 (W gn + w) + g)  4 lanes
//   C[m = 16 gm + g + 8 i, n = 8 (W gn + w) + 2 t + j] = f(acc lane 2 i + j)
//
// with g = lane / 4, t = lane % 4 (PTX's fragment layout for m16n8k16: lane l holds A
// rows g, g+8 at columns 2t, 2t+1, 2t+8, 2t+9, B's transpose likewise, and C rows g, g+8
// at columns 2t, 2t+1). The accumulation is float32 (a reassociated REDUCE, which the
// contract allows); a float16 / bfloat16 result is rounded once at the end.
// gpu_dims.h folds `acc + WMMA(A, B, 0)` into WMMA(A, B, acc) once the accumulator exists.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

// A matmul-shaped kernel: STORE(C[...], f(REDUCE(Add, a * b, k)), outputs...) of a float
// scalar REDUCE over one constant loop k, a depending on output loop m and not n, b on n
// and not m; the other output loops (constant, batch) in `batch`. The tensor cores and
// the shared-memory GEMM tiles (gemm_tiles.h) both start from it.
struct MatmulMatch {
  const UOp* store = nullptr;
  const UOp* reduce = nullptr;
  const UOp* k = nullptr;     // the reduce loop
  const UOp* a = nullptr;     // the operand that moves with m
  const UOp* b = nullptr;     // the operand that moves with n
  const UOp* m = nullptr;
  const UOp* n = nullptr;
  std::vector<const UOp*> batch;  // the other output loops, outermost first
};

// The kernel as a matmul whose orientation `fits` accepts (either operand may be a, the
// first orientation tried is the product's own order); nullopt when it is none.
std::optional<MatmulMatch> match_matmul(const UOp* kernel, const std::function<bool(const MatmulMatch&)>& fits);

// The float16 / bfloat16 value a matmul operand is: itself, or what an exact widening CAST
// to `acc` (float32) reads; nullptr when it is neither.
const UOp* tensor_core_operand(const UOp* x, DType acc);
// The WMMA of m16n8k16 on `in` (Float16 or BFloat16) inputs with float32 accumulators.
WmmaArg tensor_core_wmma(Scalar in);

// The loops that close a rebuilt matmul's stores, outermost first, before its own: the
// first batch loop that fits becomes blockIdx.z (a Global range of axis id `z_id`, put in
// `batch_dims` for the caller to substitute), any others stay serial loops.
std::vector<const UOp*> matmul_batch_loops(Graph& g, const MatmulMatch& mt, int64_t z_id,
                                           absl::flat_hash_map<const UOp*, const UOp*>* batch_dims);

// Whether the rule applies to `kernel`, and the warps per block it picks (0: none).
bool fits_tensor_cores(const UOp* kernel);
int64_t tensor_core_warps(const UOp* kernel);

// The kernel for the tensor cores with `warps` warps per block (0: the rule's pick), or
// `kernel` itself when the rule does not apply; INVALID_ARGUMENT for warps that are not
// 1, 2 or 4 dividing N / 8.
absl::StatusOr<const UOp*> use_tensor_cores(Graph& g, const UOp* kernel, int64_t warps = 0);

// The WMMA instruction names this backend knows (WmmaArg::name).
inline constexpr const char* kWmmaF16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
inline constexpr const char* kWmmaBF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";

}  // namespace uop
