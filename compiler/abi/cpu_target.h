// The CPU a kernel is compiled for: LLVM's triple, CPU name and feature string, which is
// what the LLVM CPU backend (codegen/llvm_cpu.h) compiles for and what names CPU
// artifacts in cache keys. Part of the compiler <-> runtime contract: the scheduler
// compiles for it and a CPU worker reports its own, so both must name a machine the same
// way. LLVM-free: host() reads CPUID itself, so that uop-worker needs no LLVM backend to
// say what it runs on; cpu_target_test checks that it names the host exactly as LLVM's
// own detection (sys::getHostCPUName / getHostCPUFeatures) does.
#pragma once

#include <string>

namespace uop {

struct CpuTarget {
  std::string triple;    // x86_64-pc-linux-gnu
  std::string cpu;       // skylake-avx512
  std::string features;  // +avx2,+avx512f,-amx-tile,... (sorted, so equal targets compare equal)

  // The machine this process runs on. On x86-64: LLVM's CPU name and its full feature
  // list, each feature present only where the OS saves the registers it uses. Elsewhere:
  // the "generic" CPU without features (code for the architecture's baseline).
  static CpuTarget host();
  // One string naming the target in cache keys.
  std::string id() const;
  // Width of the vector registers in bits: 512 with AVX-512, 256 with AVX / AVX2, else 128.
  int vector_bits() const;
  bool operator==(const CpuTarget&) const = default;
};

}  // namespace uop
