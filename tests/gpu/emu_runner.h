// Runs a tensor-level graph on the GPU emulator (compiler/gpu_emu) the way cuda_runner.h
// runs it on a GPU (plan_walk.h): plan_graph, then per kernel the CUDA backend's lowering
// for `target` and emulate_gpu on host buffers. No GPU, no NVRTC. Header-only test helper
// for gpu_emu_test and cuda_gpu_test (the emulator against the GPU).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/backends/cuda/cuda_backend.h"
#include "compiler/gpu_emu/gpu_emu.h"
#include "compiler/interp/host_tensor.h"
#include "tests/gpu/plan_walk.h"

namespace uop::gputest {

class EmuRunner {
 public:
  explicit EmuRunner(CudaTarget target) : backend_(std::move(target)) {}

  // One tensor per SINK source (single-device graphs).
  absl::StatusOr<std::vector<HostTensor>> run(Graph& g, const UOp* sink,
                                              const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
    linears_.clear();  // they live in the graph of the run that made them
    return run_plan(*this, g, sink, inputs);
  }

  // The loop schedule each kernel is lowered with ("" or unset: the heuristic's), and the
  // error of a lowering, which names the kernel and its schedule.
  void set_schedules(std::function<std::string(const UOp* kernel)> f) { schedule_of_ = std::move(f); }

  // What the launches did, summed over every run.
  const GpuEmuStats& totals() const { return totals_; }
  int64_t launches() const { return launches_; }

  // plan_walk.h's Device.
  using Buffer = HostTensor;
  absl::StatusOr<Buffer> allocate(DType elem, int64_t size) {
    return HostTensor::zeros(elem.scalar, {size * elem.count});
  }
  absl::Status write(Buffer& b, const HostTensor& t) {
    if (t.data.size() > b.data.size())
      return absl::InvalidArgumentError(cat("an input of ", t.str(0), " into ", b.str(0)));
    b.data.replace(0, t.data.size(), t.data);
    return absl::OkStatus();
  }
  absl::Status read(Buffer& b, HostTensor& out) {
    if (out.data.size() > b.data.size())
      return absl::InvalidArgumentError(cat("an output of ", out.str(0), " from ", b.str(0)));
    out.data = b.data.substr(0, out.data.size());
    return absl::OkStatus();
  }
  absl::Status launch(Graph& g, const KernelPlan& k, BufferOf<Buffer>& buffer_of, const Vars& vars) {
    auto linear = linear_of(g, k);
    if (!linear.ok()) return linear.status();
    std::vector<HostTensor*> params;
    for (const UOp* b : k.buffers) {
      auto p = buffer_of(b);
      if (!p.ok()) return p.status();
      params.push_back(*p);
    }
    auto st = emulate_gpu(*linear, params, vars);
    if (!st.ok()) return st.status();
    ++launches_;
    totals_.blocks += st->blocks;
    totals_.steps += st->steps;
    totals_.barriers += st->barriers;
    totals_.wmmas += st->wmmas;
    return absl::OkStatus();
  }

  // The LINEAR of one normalized kernel, lowered once per digest and run.
  absl::StatusOr<const UOp*> linear_of(Graph& g, const KernelPlan& k) {
    if (auto it = linears_.find(k.kernel->digest()); it != linears_.end()) return it->second;
    PipelineOptions opts;
    if (schedule_of_) opts.schedule = schedule_of_(k.kernel);
    auto linear = backend_.lower(g, k.kernel, opts, k.name);
    if (!linear.ok())
      return absl::Status(linear.status().code(), cat(k.name, " with schedule \"", opts.schedule, "\": ", linear.status().message()));
    linears_.emplace(k.kernel->digest(), *linear);
    return *linear;
  }

 private:
  CudaBackend backend_;
  std::function<std::string(const UOp* kernel)> schedule_of_;
  absl::flat_hash_map<Digest, const UOp*> linears_;
  GpuEmuStats totals_;
  int64_t launches_ = 0;
};

}  // namespace uop::gputest
