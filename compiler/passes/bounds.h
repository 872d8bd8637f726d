// bounds (DESIGN §3, stage 8): nothing a client sends may make a kernel touch memory
// outside its buffers. Every INDEX into a buffer (PARAM, BUFFER, DEFINE_REG, DEFINE_LOCAL)
// must be proven inside it from the value ranges of its index (value_range.h), or lie
// under a gate that implies it: the gate's comparisons with constants (what rangeify
// makes for PAD) narrow the ranges of what they compare. A kernel with an index that
// cannot be proven is refused with INVALID_ARGUMENT; it is never compiled, let alone run.
#pragma once

#include "absl/status/status.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::Status check_bounds(const UOp* kernel);

}  // namespace uop
