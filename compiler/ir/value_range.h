// ValueRange: sound integer bounds of index / int / bool expressions, for the rules that
// need to know a sign or a magnitude (symbolic's div/mod folding, bounds checking, the
// bounds of symbolic dims in dim.h).
//
// For a node of an integer, index or bool dtype, (*this)(u) = (vmin, vmax) such that every
// value u can take lies in [vmin, vmax], under eval.h's semantics: fixed-width integers
// wrap, so an operation that may overflow its dtype gives the dtype's full range; IDIV
// truncates, x / 0 = 0 and x % 0 = x. Bools are 0 / 1. Ranges are computed with 128-bit
// intermediates, so they never overflow themselves.
//
//   CONST              its value
//   RANGE, SPECIAL     [0, vmax(end) - 1]
//   DEFINE_VAR         [min, max] of its arg; BIND: its var's bounds
//   ALU, CAST          interval arithmetic on the sources' ranges
//   anything else      the dtype's full range
//
// A uint64 value that may reach 2^63 does not fit the int64 pair: its range is reported as
// (INT64_MIN, INT64_MAX), "unknown". Floats and pointers are always "unknown". Vector ops
// are bounded lane-wise (VECTORIZE, GEP, VCONST give the union of their lanes).
//
// Results are memoized per ValueRange object, which is valid for as long as the nodes live
// (nodes are immutable). The walk is iterative, so any depth is fine.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "compiler/ir/uop.h"

namespace uop {

class ValueRange {
 public:
  using Bounds = std::pair<int64_t, int64_t>;

  ValueRange() = default;
  // Bounds the caller vouches for (e.g. what a gate `x < 10` guarantees inside the code it
  // guards), intersected with what is computed for those nodes. Everything computed from
  // them is sound only where the assumptions hold. Assumptions that contradict what is
  // computed give an empty range (first > second): no value, the code never runs.
  explicit ValueRange(absl::flat_hash_map<const UOp*, Bounds> assumed) : assumed_(std::move(assumed)) {}

  Bounds operator()(const UOp* u);
  int64_t vmin(const UOp* u) { return (*this)(u).first; }
  int64_t vmax(const UOp* u) { return (*this)(u).second; }

  // Whether u's own op may wrap around its dtype for the ranges of its sources: an integer
  // ADD, SUB, MUL, MULACC, NEG, SHL, IDIV (MIN / -1), a narrowing CAST or a RANGE of a
  // narrow dtype whose exact result may leave the dtype. Ops of other kinds never wrap;
  // integer ops on uint64 may always.
  bool may_wrap(const UOp* u);
  // Whether some range computed so far was empty: assumptions that cannot all hold.
  bool contradiction() const { return contradiction_; }

  // Every value of the dtype (0..1 for bool; "unknown" for what int64 cannot hold).
  static Bounds full(DType d);
  // Whether ranges of this dtype are exact integer bounds: bool, signed ints, index and
  // unsigned ints narrower than 64 bits.
  static bool bounded(DType d);

 private:
  // The sources it needs are memoized already. Sets *wraps when the exact result may leave
  // the dtype (may_wrap).
  Bounds compute(const UOp* u, bool* wraps) const;
  absl::flat_hash_map<const UOp*, Bounds> memo_;
  absl::flat_hash_map<const UOp*, Bounds> assumed_;
  absl::flat_hash_set<const UOp*> wraps_;
  bool contradiction_ = false;
};

}  // namespace uop
