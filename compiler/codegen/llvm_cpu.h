// The LLVM CPU backend: LINEAR -> LLVM IR (IRBuilder, no text round trip) -> the O2
// pipeline tuned for the target CPU -> a relocatable ELF object in memory. The object
// defines one function, PIPELINE.md's entry point:
//
//   void uop_kernel(void* const* buffers, const int64_t* vars, int64_t task, int64_t ntasks,
//                   const uint32_t* stop);
//
// `stop` is the launch's stop word (abi/kernel_abi.h): the kernel reads it at the loop headers
// stop_checks.h picks and returns as soon as it is nonzero. worker/cpu/cpu_program.h
// loads and runs it. This header is LLVM-free.
//
// CUSTOM (the Bestiary's inline extension, C only): a CUSTOM whose arg is
// `name({0}, {1}, ...)`, its sources in order, is a call of the C function `name` with
// the sources as arguments, returning the CUSTOM's dtype (a scalar integer, float32 or
// float64, or void). The object leaves `name` undefined; the worker's loader resolves it
// from the process (libc, libm), so a CUSTOM can do whatever the worker may do, which is
// why the verifier refuses it unless the server allows custom ops, and why workers run
// in a sandbox (worker/sandbox.h).
//
// Numerics: every ALU op, CAST and BITCAST computes exactly what ir/eval.h says, bit for
// bit (BITCAST and loads / stores keep every bit; arithmetic keeps NaN-ness, not NaN
// payloads or signs, which eval.h does not define either), except the transcendentals,
// which call the C library (libm, resolved when the object is loaded) and are bounded
// here in ULPs of the result type against eval.h:
//
//   op     float64  float32  float16  bfloat16
//   EXP2      1        1        1        1
//   LOG2      1        1        1        1
//   SIN       1        1        1        1
//   POW       1        1        1        1
//
// float64 calls the same libm functions eval.h does (so it is exact in practice);
// float32, float16 and bfloat16 call the float32 functions (glibc documents <= 1 ULP for
// them; eval.h rounds the double result once) and round the float32 result once, except
// EXP2, which is vector code computed in float64 to some 1e-13 and rounded once
// (llvm_cpu_alu.cc, exp2_narrow), so it rounds as eval.h does but in vanishingly rare
// ties. On the test inputs (llvm_cpu_test.cc) every case is exact except float32 SIN, at
// 1 ULP.
// float16 and bfloat16 arithmetic is computed in float32 and rounded once, which is exact
// for + - * / sqrt; MULACC on them rounds to odd before the final rounding, like eval.h.
// Conversions to bfloat16 are integer code, so no compiler-runtime helper is called.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "compiler/abi/cpu_target.h"
#include "compiler/abi/kernel_abi.h"
#include "compiler/ir/uop.h"

namespace uop {

// Names this backend, its kernel ABI and the LLVM it was built with, e.g.
// "uopd-llvm-cpu/3 abi-3 llvm-19.1.7". Part of every cache key: a change in code
// generation bumps the backend version, a change in the ABI its version.
std::string compiler_build_id();

struct CpuCompileOptions {
  int opt_level = 2;          // 0..3, LLVM's O levels
  bool emit_ir_text = false;  // keep the rendered (unoptimized) LLVM IR, the SOURCE stage
  // Read the stop word at the loops stop_checks.h picks. Off only to measure what the
  // checks cost (bench_cpu); such a kernel's ABI says it has no stop word.
  bool stop_checks = true;
};

struct CpuArtifact {
  std::string object;   // relocatable ELF, in memory
  std::string ir_text;  // if asked
  KernelAbi abi;
  double render_ms = 0;   // LINEAR -> verified LLVM module
  double compile_ms = 0;  // optimization + code generation
  std::string entry = "uop_kernel";
};

// The LINEAR is verified first (verify_linear): INVALID_ARGUMENT with the verifier's
// message (node, rule, path) for one that breaks the LINEAR rules; INVALID_ARGUMENT naming
// the node by its toposort index, its op and the rule for a valid one this backend cannot
// compile; INTERNAL if LLVM fails or the renderer's assertions do, which is a bug here.
// Thread-safe: each call has its own LLVMContext.
absl::StatusOr<CpuArtifact> compile_cpu(const UOp* linear, const CpuTarget& target,
                                        const CpuCompileOptions& options = {});

}  // namespace uop
