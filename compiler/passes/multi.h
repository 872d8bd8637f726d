// multi (docs/ARCHITECTURE.md, The pipeline): a multi-device graph becomes per-device graphs joined by
// collectives. The rules push every op on a MULTI into its shards (compiler/ir/README.md,
// "Multi-device"): element-wise ops and the movement ops that leave the shard axis alone
// apply per shard; a reduction over the shard axis reduces per shard and combines the
// partials with an ALLREDUCE, which leaves the value replicated. What remains is
// single-device: shards, and MSELECT(ALLREDUCE(MULTI(partials), DEVICE), i) where a
// device reads the collective's result. The SINK's multi-device outputs are flattened
// into one output per shard.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/uop.h"

namespace uop {

struct MultiLowered {
  const UOp* sink = nullptr;  // SINK of single-device tensors
  struct Output {
    std::vector<size_t> parts;  // the sources of `sink` holding this output (one per shard)
    int64_t axis = -1;          // the shard axis; -1 replicated (or one part)
  };
  std::vector<Output> outputs;  // one per source of the original SINK
};

// A graph without MULTI comes back as it is, one part per output.
absl::StatusOr<MultiLowered> lower_multi(Graph& g, const UOp* tensor_sink, ShapeInference& shapes);

// The device a single-device tensor lives on: the DEVICE of the buffers it reads (the
// first found; nullptr for constants alone).
const UOp* device_of(const UOp* u);

}  // namespace uop
