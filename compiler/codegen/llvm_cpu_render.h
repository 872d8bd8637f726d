// Private to the LLVM CPU backend: LINEAR -> LLVM module, the half of compile_cpu
// (llvm_cpu.h) before optimization; llvm_cpu_driver.cc sets up the target machine and
// turns the module into an object. LLVM types are only forward-declared here, so this
// header stays LLVM-free.
#pragma once

#include "absl/status/status.h"
#include "compiler/abi/cpu_target.h"
#include "compiler/abi/kernel_abi.h"
#include "compiler/ir/uop.h"

namespace llvm {
class Module;
}  // namespace llvm

namespace uop::llvm_cpu {

// Renders `linear` (whose ABI is `abi`) into `m`, an empty module with the target's triple
// and data layout: the internal `uop_body` and the exported `uop_kernel` entry point.
// INVALID_ARGUMENT (naming the node) for a LINEAR this backend cannot compile; the
// module is then incomplete and must not be used.
absl::Status render_module(llvm::Module& m, const UOp* linear, const KernelAbi& abi, const CpuTarget& target,
                           bool stop_checks);

}  // namespace uop::llvm_cpu
