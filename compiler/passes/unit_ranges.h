// unit_ranges: loops of one iteration or none, which rangeify makes for size-1 and
// size-0 dims. A RANGE of one iteration is the constant 0, and the STORE, REDUCE or END
// that closed it closes it no more; a REDUCE over a loop that never runs is its identity;
// a STORE or END around such a loop does nothing and leaves the kernel's SINK. Dropping
// them keeps loops and kernel digests minimal, and keeps never-executed accesses out of
// the bounds proof.
#pragma once

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::StatusOr<const UOp*> drop_unit_ranges(Graph& g, const UOp* root);

}  // namespace uop
