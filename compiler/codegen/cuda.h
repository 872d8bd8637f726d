// The CUDA backend: LINEAR -> CUDA C source -> NVRTC -> cubin (and PTX) for one GPU
// architecture. One kernel is one artifact and one launch; its ABI (abi/kernel_abi.h: the
// kernel signature, the launch dims as LaunchExprs) travels with it, and
// compiler/codegen/README.md describes the contract worker/cuda implements.
//
// NVRTC is loaded with dlopen when first needed, so a build with the CUDA toolkit runs on
// machines without it (compile_cuda then says UNAVAILABLE) and a build without the
// toolkit (UOPD_CUDA off) still renders: only compile_cuda answers UNIMPLEMENTED. No GPU
// and no driver are needed to compile: the scheduler compiles for CUDA targets anywhere.
// This header is free of CUDA and LLVM headers.
//
// Numerics: the same contract as the CPU backend (ir/eval.h bit for bit; see
// cuda_prelude.cc): wrap-around integers, guarded division and modulo (x / 0 = 0,
// x % 0 = x, INT_MIN / -1 = INT_MIN), shift amounts modulo the width, float -> int casts
// that saturate with NaN -> 0, NaN-propagating MAX / MIN with -0 < +0, fused MULACC, and
// float16 / bfloat16 rounded once per op. Code is compiled with --fmad=false (no
// contraction), IEEE division and square root, and denormals kept. The transcendentals
// of float32, float16 and bfloat16 are computed with CUDA's float64 functions and rounded
// once, which keeps them within 1 ULP of eval.h, as on the CPU; float64 ones use the
// float64 functions, whose documented bounds (CUDA C Programming Guide, "Mathematical
// Functions") are EXP2 1, LOG2 1, SIN 2, POW 2 ULP. WMMA accumulates in float32 on the
// tensor cores (a reassociated sum, which REDUCE allows).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/abi/kernel_abi.h"
#include "compiler/ir/uop.h"

namespace uop {

struct CudaTarget {
  std::string arch = "sm_80";  // sm_XX (or sm_XXa): what NVRTC compiles the cubin for

  // "sm_80", "sm_90", "sm_90a", ... (sm_70 or newer); INVALID_ARGUMENT otherwise.
  static absl::StatusOr<CudaTarget> parse(std::string_view arch);
  // One string naming the target in cache keys: "cuda/sm_80".
  std::string id() const;
  // The compute capability as a number: 80 for sm_80, 90 for sm_90a.
  int sm() const;
  bool operator==(const CudaTarget&) const = default;
};

// NVRTC's version as "13.0", or "none" when it cannot be loaded (or the build has no CUDA).
std::string nvrtc_version();
// Names this backend and the NVRTC it compiles with, e.g. "uopd-cuda/2 abi-5 nvrtc-13.0". Part
// of every CUDA cache key, with CudaTarget::id(): a change in code generation bumps the
// backend version, a different NVRTC gives different code.
std::string cuda_build_id();
// OK when NVRTC can be used here; else why not (UNIMPLEMENTED: built without CUDA,
// UNAVAILABLE: libnvrtc could not be loaded).
absl::Status nvrtc_status();

struct CudaCompileOptions {
  std::string entry = "uop_kernel";  // the kernel's name in the cubin
  bool emit_ptx = true;              // keep the PTX NVRTC made on the way
  bool line_info = false;            // -lineinfo, for profilers
};

struct CudaArtifact {
  std::string source;  // CUDA C (the SOURCE stage)
  std::string ptx;     // if asked
  std::string cubin;   // ELF for EM_CUDA, for CudaTarget::arch
  KernelAbi abi;       // with abi.gpu: the launch dims
  std::string entry = "uop_kernel";
  double render_ms = 0;   // LINEAR -> CUDA C
  double compile_ms = 0;  // NVRTC
};

// INVALID_ARGUMENT with the verifier's message for a LINEAR that breaks the LINEAR rules
// (it is verified first), naming the node by its toposort index, its op and the rule for a
// valid one this backend cannot render, or for source NVRTC refuses (with NVRTC's log);
// INTERNAL for NVRTC failing otherwise; UNIMPLEMENTED / UNAVAILABLE as nvrtc_status().
// Thread-safe.
absl::StatusOr<CudaArtifact> compile_cuda(const UOp* linear, const CudaTarget& target,
                                          const CudaCompileOptions& options = {});

// --- the pieces, for tests, benchmarks and `uop explain` --------------------------------

struct CudaSource {
  std::string source;  // the kernel alone, or the prelude then the kernel
  KernelAbi abi;
  std::string entry;
  int64_t threads_per_block = 1;  // the constant product of the threadIdx extents
};
// LINEAR -> CUDA C, no NVRTC needed. Without the prelude the text is only the kernel,
// for concatenating many kernels (distinct entries) after one cuda_prelude().
absl::StatusOr<CudaSource> render_cuda(const UOp* linear, std::string_view entry = "uop_kernel",
                                       bool with_prelude = true);
// The helpers every rendered kernel calls (the exact semantics above).
std::string_view cuda_prelude();
// The one WMMA render_cuda emits (cuda_prelude's mma.sync m16n8k16): a 8 x f16 / bf16,
// b 4 x the same, c and d 4 x f32, 32 threads. The GPU emulator runs the same shape.
bool is_mma_m16n8k16(const UOp* wmma);

// One NVRTC compile of a whole translation unit (any number of kernels).
struct CudaModule {
  std::string ptx, cubin, log;
  double compile_ms = 0;
};
absl::StatusOr<CudaModule> nvrtc_compile(std::string_view source, const CudaTarget& target,
                                         const CudaCompileOptions& options = {},
                                         std::string_view file_name = "uop_kernel.cu");

// What a cubin's ELF header and symbol table say, for checking an artifact before it is
// cached or loaded: e_machine is EM_CUDA (190), the SM it is for (e_flags), and the
// kernels it defines (STT_FUNC symbols with a .text.<name> section).
struct CubinInfo {
  int sm = 0;
  int abi_version = 0;
  std::vector<std::string> kernels;
};
absl::StatusOr<CubinInfo> inspect_cubin(std::string_view cubin);

}  // namespace uop
