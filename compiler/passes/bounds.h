// bounds (docs/ARCHITECTURE.md, The pipeline): nothing a client sends may make a kernel touch memory
// outside its buffers. Every INDEX into a buffer (PARAM, BUFFER, DEFINE_REG, DEFINE_LOCAL)
// must be proven inside it wherever it executes, under the arithmetic the backends emit:
// integers wrap in their width (compiler/ir/eval.h), so no step below assumes they do not.
//
// What holds where an access executes (its facts):
//   * every loop or launch index its index or gate reads is inside its range:
//     0 <= r < end(r), hence end(r) >= 1 (an access inside a loop that never runs never
//     executes);
//   * its gate is true.
// Facts narrow value ranges (value_range.h) forwards and backwards: `i - 1 < 3` bounds i
// too. A step back through an op is taken only where it is exact under wrapping: through
// x + y, x - y and -x modulo 2^w (so `x + INT32_MIN < 4` says x is near INT32_MIN, not
// that it is small), through x * c and x << c only where that product cannot wrap for
// x's range, through x // c, x >> c, min, max, comparisons and casts that keep the value.
// Facts that contradict each other mean the access never executes.
//
// The index is then proven by one of:
//   * its value range under the facts;
//   * for an index affine in its loop and launch indices (and the clamps min(x, y) of a
//     GPU grid split): each of them set to the end of its range that minimizes
//     (maximizes) the index, which keeps what interval arithmetic loses when a trip count
//     is a variable (flipping a batch of b rows reads row b - 1 - r, which is >= 0 because
//     r < b). Sound only where that arithmetic cannot wrap, so it is checked not to, for
//     the index and for the expressions with the ends put in;
//   * a gated expression g with idx = a*g + rest, for a constant a: idx lies in
//     a*[bounds of g] + bounds(rest) (the relation a RESHAPE makes between a padded axis
//     and the flat index), exact because it holds modulo 2^w and the result lies inside
//     the dtype.
// A kernel with an index that cannot be proven is refused with INVALID_ARGUMENT
// [bounds.unproven]; it is never compiled, let alone run.
#pragma once

#include "absl/status/status.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::Status check_bounds(Graph& g, const UOp* kernel);

// The proof of one INDEX, as check_bounds makes it: an earlier stage asks whether a form it
// could emit (expand: a masked vector load, a load without its gate) would be proven.
absl::Status check_index(Graph& g, const UOp* index);

// The elements behind a buffer (PARAM, BUFFER, DEFINE_REG, DEFINE_LOCAL, through AFTER), or
// -1 when it is not memory.
int64_t buffer_elements(const UOp* buf);

}  // namespace uop
