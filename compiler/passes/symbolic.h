// symbolic: the algebraic simplifier, the first rule set every later stage leans on
// (docs/ARCHITECTURE.md, The pipeline: index arithmetic after expand and devectorize).
//
//   constant folding    every ALU op, CAST and BITCAST on CONST operands, through eval.h
//   identities          x*1, x+0 (ints) / x+(-0.0) (floats), x//1, x%1, x&x, where(c,a,a),
//                       neg(neg x), casts to the same dtype, x<x on ints, ...
//   index arithmetic    constants move right and combine, constant factors distribute
//                       over sums, like terms combine, and div / mod / comparisons fold
//                       using value bounds (ValueRange): (a*c + b)//c -> a + b//c when b
//                       and the sum have one sign, x%c -> x when |x| < |c|, ...
//
// Every rule is exact under eval.h's semantics for every dtype: the simplified expression
// evaluates to the same value (bit for bit; any NaN for a NaN) at every point inside the
// variables' bounds. In particular nothing here assumes that `index` arithmetic does not
// overflow: index evaluates as int64 and wraps, and the bound-based rules check that the
// arithmetic they reason about cannot wrap. Float rules are identities only (no
// reassociation, no x*0).
//
// The rules apply to scalar nodes only: vectors are devectorized before this stage.
// Integer SUB and NEG are canonicalized to ADD and MUL by -1 for signed types, so that
// like terms meet; renderers print `a + b*-1` as they like.
//
// The rules take a ValueRange* as graph_rewrite's ctx for the bounds they consult
// (simplify() passes one). With a null ctx each bound query starts a fresh ValueRange,
// which is correct but slow.
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/rewrite/pattern.h"

namespace uop {

// The rule set, built once (thread-safe static) and shared.
const rw::RuleSet& symbolic_rules();

// graph_rewrite of `root` with symbolic_rules() and a fresh ValueRange.
absl::StatusOr<const UOp*> simplify(Graph& g, const UOp* root);

// `u` folded to a CONST when it is a scalar ALU op, CAST or BITCAST whose sources are all
// scalar CONSTs and eval.h defines the result; nullptr otherwise.
const UOp* fold_constants(Graph& g, const UOp* u);

}  // namespace uop
