// The tests' way to run what the interpreter cannot (vectors, LINEAR, compiled kernels):
// a LINEAR compiled by the CPU backend for this host, or a kernel already loaded, run on
// host tensors, one per PARAM slot, in place. The caller compares the result with the interpreter's on the kernel the pass
// started from.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "compiler/codegen/llvm_cpu.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/interp/interp.h"
#include "tests/unit/compiler/passes/interp_check.h"
#include "worker/cpu/cpu_program.h"

namespace uop::testing {

// Runs a loaded kernel on host tensors, one per PARAM slot, in place.
inline absl::Status run_program(const CpuProgram& prog, std::vector<HostTensor>& params) {
  // Copies aligned for any element (a string's bytes need not be).
  std::vector<std::vector<std::max_align_t>> copies;
  std::vector<void*> bufs;
  for (HostTensor& t : params) {
    copies.emplace_back(t.data.size() / sizeof(std::max_align_t) + 2);
    auto* p = reinterpret_cast<char*>(copies.back().data());
    std::memcpy(p, t.data.data(), t.data.size());
    bufs.push_back(p);
  }
  absl::Status st = prog.run(bufs, {}, nullptr);
  for (size_t i = 0; i < params.size(); ++i) std::memcpy(params[i].data.data(), bufs[i], params[i].data.size());
  return st;
}

inline absl::Status run_on_cpu(const UOp* linear, std::vector<HostTensor>& params) {
  auto art = compile_cpu(linear, CpuTarget::host(), {});
  if (!art.ok()) return art.status();
  auto prog = CpuProgram::load(art->object, art->abi);
  if (!prog.ok()) return prog.status();
  return run_program(**prog, params);
}

// The interpreter on `kernel` (what a pass started from) and the CPU backend on `linear`
// (what became of it) agree on every param: one of each (dtype, size) in `slots`, slot 0
// zeros (the output), the others random.
inline void expect_cpu_matches_interpreter(const UOp* kernel, const UOp* linear, const Slots& slots) {
  std::vector<HostTensor> want = params_for(slots), got = want;
  absl::Status interpreted = interpret_kernel(kernel, pointers(want), {});
  ASSERT_TRUE(interpreted.ok()) << interpreted;
  absl::Status ran = run_on_cpu(linear, got);
  ASSERT_TRUE(ran.ok()) << ran;
  expect_same_params(want, got);
}

}  // namespace uop::testing
