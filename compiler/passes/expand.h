// expand (docs/ARCHITECTURE.md, The pipeline): Upcast ranges become vector lanes. A value that depends on
// upcast ranges u1..um (in axis-id order) becomes a vector of prod(extents) lanes, lane
// l holding the value at the row-major decomposition of l. Two rule tables, in order:
//
//   memory     on the scalar graph, every LOAD and STORE whose address moves with an
//              upcast range is rewritten for vectors: an address that is affine in the
//              ranges and contiguous in the innermost ones becomes one vector access
//              per contiguous chunk (CAT-ed / GEP-ed together), anything else one scalar
//              access per lane (a gather / scatter, with each lane's gate). A loaded
//              vector is tagged UNROLL(value, axes); a store takes CONTRACT(value, axes).
//   vectorize  bottom-up: an upcast RANGE is UNROLL(VCONST 0..n-1), an ALU op of UNROLL
//              operands works on whole vectors (operands over fewer axes are broadcast
//              or swizzled with GEP), CONTRACT lines a value up with a store's lanes, and
//              a REDUCE keeps a vector accumulator whose lanes over the upcast ranges it
//              closes are folded after its loop.
//
// After expand no UNROLL, CONTRACT or upcast RANGE is left.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::StatusOr<const UOp*> expand_upcasts(Graph& g, const UOp* kernel);

// c such that e = base + c * r exactly, where base does not depend on r (0 when e does
// not depend on r); nullopt when e is not affine in r (r under IDIV, MOD, a product of two
// terms with r, ...).
std::optional<int64_t> affine_coeff(const UOp* e, const UOp* r);

}  // namespace uop
