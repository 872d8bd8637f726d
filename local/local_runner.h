// Compiles and runs a graph inside this process: `uopc run`, the differential tests and
// the benchmarks. The service does the same work split across the scheduler (planning,
// compile cache) and worker processes (buffers, launches).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "compiler/backends/cpu/cpu_backend.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/ir/uop.h"
#include "compiler/pipeline.h"
#include "worker/cpu/cpu_program.h"
#include "worker/cpu/thread_pool.h"

namespace uop {

struct KernelReport {
  std::string name;
  Digest digest;          // the normalized kernel's identity
  bool compiled = false;  // false: this runner had compiled it already
  double lower_ms = 0;    // optimize .. linearize
  double compile_ms = 0;  // render + LLVM
  KernelAbi abi;
};

// Shards put together along `axis` (row-major), as a multi-device output reads.
HostTensor concat(const std::vector<const HostTensor*>& shards, int64_t axis);

class LocalRunner {
 public:
  explicit LocalRunner(int threads = 0 /* 0: the hardware's */, CpuTarget target = CpuTarget::host());

  // Tensor level: `inputs` binds BUFFER nodes; returns one tensor per SINK source with its
  // shape (a multi-device output put together from its shards). Devices are names only
  // here: every kernel runs in this process, collectives fold buffers in member order. Kernel level: `inputs` binds PARAM nodes (unbound ones start zeroed); returns
  // every PARAM's buffer after the run, by slot.
  absl::StatusOr<std::vector<HostTensor>> run(Graph& g, const UOp* root,
                                              const absl::flat_hash_map<const UOp*, HostTensor>& inputs,
                                              std::vector<KernelReport>* report = nullptr,
                                              const PipelineOptions& opts = {});

  // Compiles (or finds) the program of one normalized kernel.
  absl::StatusOr<const CpuProgram*> program(Graph& g, const KernelPlan& k, KernelReport* report);

  // The loop schedule each kernel is compiled with (compiler/passes/loop_schedule.h
  // text; "" or no chooser: the CPU heuristic's). Programs are kept per (kernel, schedule).
  void set_schedules(std::function<std::string(const UOp* kernel)> choose) { choose_schedule_ = std::move(choose); }

  ThreadPool& pool() { return pool_; }
  const CpuTarget& target() const { return backend_.target(); }
  const CpuBackend& backend() const { return backend_; }

 private:
  CpuBackend backend_;
  ThreadPool pool_;
  std::function<std::string(const UOp* kernel)> choose_schedule_;
  absl::flat_hash_map<std::pair<Digest, std::string>, std::unique_ptr<CpuProgram>> programs_;
};

}  // namespace uop
