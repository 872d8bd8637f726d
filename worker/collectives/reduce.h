// The element-wise combine of an allreduce: out[i] = a[i] op b[i] for (op, dtype), with
// exactly the scalar semantics of compiler/ir/eval.h (integers wrap; float16 and bfloat16
// are computed in float and rounded once, which for + and * is the same single rounding
// eval.h does in double; MAX/MIN propagate NaN and order -0 below +0). Both transports
// (the shared-memory ring and Gloo) reduce through this one function, so a collective
// gives the interpreter's answer whichever way its bytes travel.
//
// A NaN result is some NaN: its sign and payload are not specified (eval.h's are not
// either, once stored).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"

namespace uop {

// out[i] = a[i] op b[i] for i < n. out may be a or b (the same address), not a partial
// overlap. Pointers need only the element's natural alignment.
using CombineFn = void (*)(void* out, const void* a, const void* b, size_t n);

// The combine for (op, dtype); INVALID_ARGUMENT where eval.h does not define the op on
// the dtype (ADD / MUL on bool) or for void.
absl::StatusOr<CombineFn> combine_function(ReduceOp op, Scalar dtype);

// "add", "mul", "max", "min" (the wire names of CollectiveRequest.op); nullopt otherwise.
std::optional<ReduceOp> reduce_op_from_wire(std::string_view name);
std::string_view reduce_op_wire_name(ReduceOp op);

}  // namespace uop
