// The reference interpreter: the test oracle every compiled kernel is checked against.
// Slow, simple, obviously right. Every scalar op goes through ir/eval.h, so the
// interpreter and constant folding cannot disagree; nothing here reimplements an op.
//
// Two entry points, one per IR level (compiler/ir/README.md):
//   * interpret(): a tensor-level SINK. Each node's whole tensor is computed bottom-up,
//     dense and row-major, with shapes from ShapeInference and symbolic dims evaluated at
//     their bound values.
//   * interpret_kernel(): a kernel-level SINK[kernel] of STORE / END over RANGE / INDEX /
//     LOAD / REDUCE, exactly as compiler/PIPELINE.md "Kernel-level semantics" says.
//
// Errors are values: an op the interpreter does not evaluate, an unbound variable, an
// out-of-bounds index or a malformed node is INVALID_ARGUMENT "node N (OP): what", N being
// the node's position in toposort(root); a tensor or loop nest over the limits below is
// RESOURCE_EXHAUSTED. The interpreter never reads or writes outside a buffer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/eval.h"
#include "compiler/ir/uop.h"

namespace uop {

struct InterpOptions {
  // Tensor level: the most elements one tensor (input, intermediate or output) may have.
  int64_t max_elements = int64_t{1} << 28;
  // Kernel level: the most loop-body executions (over all loops) before giving up, so a
  // kernel with an absurd trip count fails instead of running for hours.
  int64_t max_steps = int64_t{1} << 32;
};

// Tensor level. `inputs` binds BUFFER nodes to data: the tensor's dtype must be the
// BUFFER's and its element count the BUFFER's size N (its shape is ignored: a BUFFER is
// shape (N)). Returns one tensor per source of `sink`, in order, with that source's shape
// (a root that is a single tensor rather than a SINK gives that one tensor).
// Semantics (README "Tensor level"):
//   movement ops are index maps: RESHAPE keeps row-major order, PERMUTE, EXPAND broadcasts
//     size-1 dims, PAD fills with zero bits (0, false, +0.0), SHRINK, FLIP;
//   REDUCE_AXIS keeps reduced dims as 1, folds in increasing index order from the
//     identity (Add 0, Mul 1, Max lowest / -inf, Min highest / +inf);
//   ALU ops elementwise on operands of one shape; CAST, BITCAST elementwise;
//   CONST is a scalar; BIND(DEFINE_VAR, CONST v) is v; a DEFINE_VAR is the value a BIND of
//     it in the graph gives, and an error when there is none; BUFFER_VIEW a slice;
//   CONTIGUOUS, CONTIGUOUS_BACKWARD, DETACH, COPY (one process), AFTER are identity.
// Multi-device graphs (README "Multi-device") evaluate to their logical values: a MULTI is
//   its shards concatenated along its axis (replicated, axis -1: shard 0), and every op
//   on it computes on that whole value, so an output that is a MULTI comes back unsharded;
//   MSELECT(m, i) is device i's part of m (a MULTI's shard i as given; for another
//   multi-device value, its slice along the shard axis, or the whole when replicated; for
//   an ALLREDUCE, its result); ALLREDUCE(m, DEVICE(d0..dn-1)) folds the n parts of m
//   element by element in device order with the reduce op's combine from eval.h
//   (p0 op p1 op ... op pn-1), the replicated result having a part's shape. MSTACK is not
//   evaluated (it has no shape in shape.h).
absl::StatusOr<std::vector<HostTensor>> interpret(Graph& g, const UOp* sink,
                                                  const absl::flat_hash_map<const UOp*, HostTensor>& inputs,
                                                  const InterpOptions& options = {});

// Kernel level. params[slot] is the buffer of PARAM(slot): its dtype must be the
// PARAM's element dtype and it must hold at least the PARAM's size elements; INDEX is
// checked against that size. vars binds each DEFINE_VAR by name; a missing value or one
// outside [min, max] is an error. The params' contents are updated in place.
//
// Sequential semantics: SINK runs its sources in order, each STORE / END / REDUCE runs
// its ranges as nested loops (first range outermost), a loop's end is evaluated when the
// loop starts. A STORE whose gate is false evaluates neither its value nor its address's
// bounds; a LOAD with a false gate gives its alt (0 without one). Values are memoized
// until a range they depend on moves or (for anything that loads) a STORE happens.
absl::Status interpret_kernel(const UOp* kernel_sink, std::span<HostTensor* const> params,
                              const absl::flat_hash_map<std::string, int64_t>& vars,
                              const InterpOptions& options = {});


}  // namespace uop
