// The pass tests' oracle: the reference interpreter on a kernel, on host tensors one per
// PARAM slot. A pass's result is checked against the interpreter on the kernel the pass
// started from, never against the pass itself: here for results the interpreter can run
// too (it runs every axis type as a plain loop), in run_on_cpu.h for the others.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/interp/host_tensor.h"
#include "compiler/interp/interp.h"

namespace uop::testing {

// One (dtype, size) per PARAM slot.
using Slots = std::vector<std::pair<Scalar, int64_t>>;

// Slot 0 zeros (the output), the others random, seeded by `seed` plus the slot.
inline std::vector<HostTensor> params_for(const Slots& slots, uint64_t seed = 7) {
  std::vector<HostTensor> out;
  for (size_t i = 0; i < slots.size(); ++i)
    out.push_back(i == 0 ? HostTensor::zeros(slots[i].first, {slots[i].second})
                         : HostTensor::random(slots[i].first, {slots[i].second}, seed + i));
  return out;
}

inline std::vector<HostTensor*> pointers(std::vector<HostTensor>& params) {
  std::vector<HostTensor*> out;
  for (HostTensor& t : params) out.push_back(&t);
  return out;
}

// Every slot within its dtype's tolerance (ints and bools exactly).
inline void expect_same_params(const std::vector<HostTensor>& want, const std::vector<HostTensor>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CompareResult c = compare(want[i], got[i], Tolerance::for_dtype(want[i].dtype));
    EXPECT_TRUE(c.ok) << "slot " << i << ": " << c.message;
  }
}

// The interpreter on `before` and on `after`, from the same params, agrees on every slot.
inline void expect_interpreter_agrees(const UOp* before, const UOp* after, const Slots& slots) {
  std::vector<HostTensor> want = params_for(slots), got = want;
  absl::Status a = interpret_kernel(before, pointers(want), {});
  ASSERT_TRUE(a.ok()) << a;
  absl::Status b = interpret_kernel(after, pointers(got), {});
  ASSERT_TRUE(b.ok()) << b;
  expect_same_params(want, got);
}

}  // namespace uop::testing
