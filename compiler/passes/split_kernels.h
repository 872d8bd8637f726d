// split_kernels (docs/ARCHITECTURE.md, The pipeline): each BUFFERIZE of a rangeified graph becomes one
// kernel, `SINK[kernel](STORE(INDEX(buf, flat), value, ranges...))`, called with its
// buffers: `CALL(body, buffers...)`. Reads of other realized values become loads of their
// buffers. Each kernel runs on the device of the buffers it reads (one device per kernel).
// Between kernels the schedule has the steps that are not kernels: an ALLREDUCE of
// buffers on several devices (in place), a COPY of a buffer to another device. Steps are
// in an order where every buffer is written before it is read. Kernel bodies still name
// BUFFERs here; normalize.h turns them into PARAMs.
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

// A collective: every buffer (one per device, in device order) ends holding the reduction
// of all of them.
struct CollectiveStep {
  ReduceOp op = ReduceOp::Add;
  Scalar dtype = Scalar::Float32;
  std::vector<const UOp*> buffers;
};
struct CopyStep {
  const UOp* src = nullptr;  // BUFFERs, on their DEVICEs
  const UOp* dst = nullptr;
};
struct ScheduleStep {
  enum class Kind { Kernel, Collective, Copy };
  Kind kind = Kind::Kernel;
  size_t index = 0;  // into calls, collectives or copies
};

struct Schedule {
  const UOp* root = nullptr;                 // SINK(CALL...) in execution order
  std::vector<KernelCall> calls;             // kernels, in execution order
  std::vector<CollectiveStep> collectives;
  std::vector<CopyStep> copies;
  std::vector<ScheduleStep> steps;           // everything, in execution order
  std::vector<const UOp*> outputs;           // the BUFFER holding each output of the graph
  std::vector<const UOp*> intermediates;     // BUFFERs (LUNIQUE) only kernels read and write
  std::vector<std::pair<const UOp*, int64_t>> var_values;  // DEFINE_VAR -> bound value
};

// `device` names where buffers of values that read no buffer live ("CPU:0").
absl::StatusOr<Schedule> split_kernels(Graph& g, const Rangeified& r, const std::string& device);

}  // namespace uop
