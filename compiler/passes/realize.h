// Where a tensor-level graph is materialized into buffers: the placement of BUFFERIZE
// (docs/ARCHITECTURE.md, The pipeline). Everything not chosen here is fused into the kernel that reads it.
#pragma once

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/uop.h"

namespace uop {

// The tensor nodes to materialize, for a tensor-level SINK whose sources are the outputs:
//   * every output, and every CONTIGUOUS;
//   * a REDUCE_AXIS that reaches its kernel through a broadcasting EXPAND: fused, it would
//     be recomputed for every broadcast element (softmax's max and sum);
//   * a REDUCE_AXIS that reaches its kernel through a PAD: fused, it would run under the
//     pad's gate, element by element (a convolution read by the next one's padded input);
//   * a PAD that a REDUCE_AXIS reads (a convolution's or a pool's padded input, a
//     concatenation a convolution reads): fused, every load of the reduction would be
//     gated, a scalar per vector lane, and the pad's source recomputed for each read;
//   * a reduction's operand that a broadcast repeats (a matmul's A along the output
//     columns) and whose elementwise chain is more than a few ops (a LayerNorm feeding a
//     projection): fused, it would be recomputed for every tile of the broadcast axis;
//   * a REDUCE_AXIS read by more than one kernel, so it is computed once;
//   * a REDUCE_AXIS that another REDUCE_AXIS of its kernel folds (a convolution pooled to
//     a vector): fused, its loops run inside the outer reduction's, untiled.
// Elementwise values are recomputed in each kernel that reads them (cheap, and it keeps
// an elementwise chain one kernel). A reduction with its elementwise prologue and
// epilogue stays one kernel.
absl::StatusOr<absl::flat_hash_set<const UOp*>> plan_realize(const UOp* tensor_sink, ShapeInference& shapes);

}  // namespace uop
