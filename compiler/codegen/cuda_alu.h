// Private to the CUDA backend (cuda_render.cc): the CUDA C spelling of dtypes, constants,
// ALU ops, CAST and BITCAST, one scalar lane at a time, with ir/eval.h's exact semantics
// (the helpers they call are in cuda_prelude.cc).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"
#include "compiler/ir/uop.h"

namespace uop::cuda_c {

// The type of one lane in registers: bool, signed char .. long long, uop_f16, float, ...
// Empty for void.
std::string_view reg_type(Scalar s);
// The type in memory: as reg_type, but bool is a byte (eval.h reads its lowest bit).
std::string_view mem_type(Scalar s);
std::string from_memory(Scalar s, const std::string& x);
std::string to_memory(Scalar s, const std::string& x);

// A constant of type `s`, converted with CAST semantics, spelled exactly (bit patterns for
// floats that are not small integers).
std::string constant(Scalar s, ConstValue v);

// The verifier has checked `u` (an ALU op, CAST or BITCAST) against eval.h's domain;
// INVALID_ARGUMENT with the rule (the caller names the node) for what this backend still
// cannot spell: a BITCAST that changes the vector width.
absl::Status check_alu(const UOp* u);
// One lane of an ALU op whose operands (of type `t`; WHERE's condition is bool) are the
// expressions `a`.
std::string alu(Op op, Scalar t, std::span<const std::string> a);
std::string cast(Scalar from, Scalar to, const std::string& x);
std::string bitcast(Scalar from, Scalar to, const std::string& x);

}  // namespace uop::cuda_c
