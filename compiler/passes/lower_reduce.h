// lower_reduce (before linearize): loops become explicit. A STORE or END that closes
// several ranges becomes nested single-range ENDs (the first range outermost), and a
// REDUCE becomes an accumulator: a DEFINE_REG set to the identity inside the loops the
// reduction sits in, updated inside its own loops, and read after them:
//
//   acc  = DEFINE_REG(size=1, id)
//   init = STORE(INDEX(AFTER(acc, outer ranges...), 0), identity)
//   cur  = INDEX(AFTER(acc, init, reduce ranges...), 0)
//   loop = END(STORE(cur, LOAD(acc, cur) <op> value), reduce ranges...)
//   out  = LOAD(acc, INDEX(AFTER(acc, loop), 0))
//
// AFTER pins each access of the accumulator to its place (and keeps the three INDEX
// nodes apart under hash consing); linearize.h schedules nodes by the ranges they
// depend on. Compiled code may keep the accumulator in registers (it is an alloca).
#pragma once

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"

namespace uop {

absl::StatusOr<const UOp*> lower_reduce(Graph& g, const UOp* kernel);

// The RANGEs a node's value varies with: those reachable through its sources, less the
// ones an END or REDUCE on the way closes. Sorted by axis id.
class RangeSets {
 public:
  const std::vector<const UOp*>& of(const UOp* u);

 private:
  absl::flat_hash_map<const UOp*, std::vector<const UOp*>> memo_;
};

}  // namespace uop
