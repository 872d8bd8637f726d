// Where a kernel checks its stop word (abi/kernel_abi.h), so that a launch past its deadline ends
// soon after the word is set, whatever its loop bounds, at a cost bench_cpu cannot see.
// The rule, over the LINEAR's loops from the innermost out, with `work` a rough count of
// the ops one iteration runs (nested loops' work included):
//
//   * a loop whose trip count is a constant and whose whole run is small
//     (trips x work <= work_between_checks) gets no check: its parent accounts for it.
//     This is every small inner loop (a k-loop of a tile, an unrolled reduction);
//   * any other loop (a trip count that is not a constant, or a large one: a RANGE to
//     2^63 - 1 is in bounds and endless) gets a check every `every` iterations, with
//     every = work_between_checks / work: once per iteration when an iteration is
//     heavy (an outer loop around big inner loops), once per chunk of iterations when
//     it is light (a long elementwise loop, strip-mined by the renderer so that the
//     hot inner loop stays exactly as it was).
//
// Between two checks a kernel then runs at most about 2 x work_between_checks ops (a
// checked loop's unchecked tail, then its siblings). A check is a relaxed 32-bit load
// and a branch to the kernel's exit. LLVM-free; the renderers use it.
#pragma once

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "compiler/ir/uop.h"

namespace uop {

struct StopCheckOptions {
  int64_t work_between_checks = int64_t{1} << 16;
};

// RANGE -> how many iterations between two checks (>= 1). A RANGE that is not in the
// map gets no check. A malformed LINEAR (an END that closes no open RANGE) gives a plan
// for what could be read of it; the renderer reports the error.
using StopCheckPlan = absl::flat_hash_map<const UOp*, int64_t>;
StopCheckPlan plan_stop_checks(const UOp* linear, const StopCheckOptions& options = {});

}  // namespace uop
