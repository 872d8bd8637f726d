// rangeify (docs/ARCHITECTURE.md, The pipeline): a tensor-level graph becomes index arithmetic over
// explicit loops. Each realized value (realize.h) becomes BUFFERIZE(value at ranges,
// ranges...): a fresh RANGE per dim. "The value of tensor x at indices i..." is written
// INDEX(x, i... [, gate]), and the rules push that INDEX down through the graph:
// movement ops rewrite the indices (RESHAPE, PERMUTE, EXPAND, SHRINK, FLIP) or add
// validity (PAD: a gate on the loads below and a WHERE selecting 0 outside), REDUCE_AXIS
// becomes REDUCE over fresh Reduce ranges, ALU ops apply to their operands' values at the
// same indices. What is left reads memory: LOAD(BUFFER, INDEX(BUFFER, flat [, gate])) for
// inputs, INDEX(BUFFERIZE, i...) for realized values (split_kernels turns those into
// loads of the kernel's output buffer). BIND becomes its DEFINE_VAR, whose bound value is
// recorded.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/shape.h"
#include "compiler/ir/uop.h"

namespace uop {

struct Rangeified {
  // SINK(BUFFERIZE per output of the tensor SINK, in order).
  const UOp* sink = nullptr;
  // Every DEFINE_VAR of the graph with the value its BIND gave it.
  std::vector<std::pair<const UOp*, int64_t>> var_values;
};

absl::StatusOr<Rangeified> rangeify(Graph& g, const UOp* tensor_sink, ShapeInference& shapes);

}  // namespace uop
