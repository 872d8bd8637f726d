// bounds (DESIGN §3, stage 8): nothing a client sends may make a kernel touch memory
// outside its buffers. Every INDEX into a buffer (PARAM, BUFFER, DEFINE_REG, DEFINE_LOCAL)
// must be proven inside it, by one of:
//   * the value ranges of its index (value_range.h);
//   * the same under its gate: the gate's comparisons with constants (what rangeify
//     makes for PAD) narrow the ranges of what they compare, and of the linear terms
//     those are made of;
//   * for an index affine in its loops: each loop variable set to the end of its range
//     that minimizes (maximizes) the index, which keeps what interval arithmetic loses
//     when a loop's trip count is a variable (flipping a batch of b rows reads row
//     b - 1 - r, which is >= 0 because r < b).
// A kernel with an index that cannot be proven is refused with INVALID_ARGUMENT; it is
// never compiled, let alone run.
#pragma once

#include "absl/status/status.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::Status check_bounds(Graph& g, const UOp* kernel);

}  // namespace uop
