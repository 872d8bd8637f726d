// The dim algebra (compiler/ir/README.md, "Symbolic dims"). A dim is an index expression:
// a CONST, a DEFINE_VAR (a BIND of one counts as the variable), or an ALU op over dims
// (bool inside, e.g. a WHERE condition). This file builds dims with light folding, bounds
// them, evaluates them once the variables are bound, and decides whether two dims are
// equal (or ordered) for every value of the variables.
//
// Equality is decided on a canonical form, never by sampling: each side is normalized to
// a sum of products (integer coefficients over monomials of variables and opaque terms,
// e.g. IDIV / MOD / MAX nodes, whose operands are normalized in turn) and the two forms
// are compared exactly. What cannot be decided that way is reported as kUnknown, never
// guessed. Every walk is iterative: dim expressions may be arbitrarily deep.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/ir/value_range.h"

namespace uop {

// The value of a constant dim (a CONST of an integer kind), nullopt otherwise.
std::optional<int64_t> const_dim(const UOp* d);

// Dim arithmetic with light folding, so constant shapes stay CONST nodes: two CONSTs fold
// (unless the result overflows int64), x+0, x-0, x*1 give x, x*0 gives 0, x-x gives 0.
const UOp* dim_add(Graph& g, const UOp* a, const UOp* b);
const UOp* dim_sub(Graph& g, const UOp* a, const UOp* b);
const UOp* dim_mul(Graph& g, const UOp* a, const UOp* b);

// Interval bounds of a dim over the DEFINE_VAR ranges (a BIND counts as its variable's
// whole range: a bound value may change between runs of the same compiled graph), from
// ValueRange: index arithmetic wraps like int64, so a dim that may overflow is "unknown",
// [INT64_MIN, INT64_MAX].
struct DimBounds {
  int64_t min;
  int64_t max;
};

// Whether d is a dim expression, and its bounds, memoized for a caller that asks about
// many dims of one graph (valid as long as the nodes live).
class DimFacts {
 public:
  // nullopt when d is not a dim expression.
  std::optional<DimBounds> bounds(const UOp* d);
  bool is_dim(const UOp* d);

 private:
  absl::flat_hash_map<const UOp*, bool> is_dim_;
  ValueRange range_;
};

// Bounds of one dim; "unknown" when d is not a dim expression.
DimBounds dim_bounds(const UOp* d);
inline int64_t dim_max(const UOp* d) { return dim_bounds(d).max; }

// The value of d with each DEFINE_VAR at its value in `vars` (a BIND is its variable; of
// a variable missing from `vars`, the value the BIND binds), under eval.h's index
// semantics (wraps like int64, x / 0 = 0). INVALID_ARGUMENT naming the variable when one
// that is read has no value [dim.var], or the op when d is not a dim expression [dim.op].
absl::StatusOr<int64_t> eval_dim(const UOp* d, std::span<const std::pair<const UOp*, int64_t>> vars);

// What the algebra can tell about a claim that must hold for every value of the variables.
enum class DimTruth { kTrue, kFalse, kUnknown };

// a == b for every value of the variables.
//   kTrue     the canonical forms are equal (as polynomials mod 2^64, which is how index
//             arithmetic computes), or the two are the same node or the same constant.
//   kFalse    a proof they differ somewhere: the forms differ by a nonzero constant, the
//             bounds are disjoint, the difference is a polynomial in the variables alone
//             whose degree in each variable is below that variable's number of values
//             (such a polynomial vanishes on the whole box only if it is zero) and neither
//             side can wrap, or a point found where the values differ.
//   kUnknown  otherwise: e.g. MAX(a, b) against a + b - MIN(a, b), a difference of high
//             degree, either side not a dim expression, or a form too large to normalize
//             (over kMaxDimTerms terms).
DimTruth dims_equal(const UOp* a, const UOp* b);
// a <= b for every value of the variables: by constants, by bounds (max(a) <= min(b)), or,
// when neither side can wrap, by the difference b - a of the canonical forms: zero, or
// multilinear (degree <= 1 in each variable and opaque term) and >= 0 at every corner of
// the box, which is where a multilinear form takes its extremes. kFalse on disjoint bounds
// or a point found where a > b; kUnknown otherwise.
DimTruth dims_le(const UOp* a, const UOp* b);

// The size past which a canonical form is not built (the claim is kUnknown).
inline constexpr size_t kMaxDimTerms = 512;

}  // namespace uop
