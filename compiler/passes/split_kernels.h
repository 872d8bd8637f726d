// split_kernels (DESIGN §3, stage 4): each BUFFERIZE of a rangeified graph becomes one
// kernel, `SINK[kernel](STORE(INDEX(buf, flat), value, ranges...))`, called with its
// buffers: `CALL(body, buffers...)`. Reads of other realized values become loads of their
// buffers. The schedule lists the calls in an order where every buffer is written before
// it is read. Kernel bodies still name BUFFERs here; normalize.h turns them into PARAMs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/uop.h"
#include "compiler/passes/rangeify.h"

namespace uop {

struct KernelCall {
  const UOp* call = nullptr;          // CALL(body, buffers...)
  const UOp* body = nullptr;          // SINK[kernel](STORE...)
  std::vector<const UOp*> buffers;    // the BUFFER bound to each slot (slot 0 is written)
};

struct Schedule {
  const UOp* root = nullptr;                 // SINK(CALL...) in execution order
  std::vector<KernelCall> calls;             // the same, in execution order
  std::vector<const UOp*> outputs;           // the BUFFER holding each output of the graph
  std::vector<const UOp*> intermediates;     // BUFFERs (LUNIQUE) only kernels read and write
  std::vector<std::pair<const UOp*, int64_t>> var_values;  // DEFINE_VAR -> bound value
};

// `device` names where the new buffers live ("CPU:0").
absl::StatusOr<Schedule> split_kernels(Graph& g, const Rangeified& r, const std::string& device);

}  // namespace uop
