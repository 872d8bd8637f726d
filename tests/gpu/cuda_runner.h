// Runs a tensor-level graph on one GPU in this process, the way the service splits the
// work (plan_walk.h): plan_graph, then per kernel the CUDA backend's lowering + compile_cuda
// (NVRTC, for the device's arch), loaded and launched by the worker's CUDA runtime
// (worker/cuda) with the launch dims its ABI gives. Buffers live in device memory for the
// whole graph.
// Header-only test helper for cuda_gpu_test and bench_nvrtc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/codegen/cuda.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/backends/cuda/cuda_backend.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "tests/gpu/plan_walk.h"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/cuda_driver.h"

namespace uop::cudatest {

class CudaRunner {
 public:
  // UNAVAILABLE without a driver or a GPU.
  static absl::StatusOr<std::unique_ptr<CudaRunner>> open(int ordinal = 0) {
    auto d = CudaDriver::load();
    if (!d.ok()) return d.status();
    CudaDeviceOptions o;
    o.ordinal = ordinal;
    auto dev = CudaDevice::open(*d, std::move(o));
    if (!dev.ok()) return dev.status();
    auto r = std::unique_ptr<CudaRunner>(new CudaRunner);
    r->dev_ = *std::move(dev);
    auto t = CudaTarget::parse(r->dev_->arch());
    if (!t.ok()) return t.status();
    r->target_ = *t;
    return r;
  }

  CudaDevice& device() { return *dev_; }
  const CudaTarget& target() const { return target_; }

  // The program of one normalized kernel, compiled once per digest.
  absl::StatusOr<std::shared_ptr<const DeviceProgram>> program(Graph& g, const KernelPlan& k) {
    if (auto it = programs_.find(k.kernel->digest()); it != programs_.end()) return it->second;
    auto linear = CudaBackend(target_).lower(g, k.kernel, {}, k.name);
    if (!linear.ok()) return linear.status();
    auto art = compile_cuda(*linear, target_, CudaCompileOptions{.emit_ptx = false});
    if (!art.ok()) return art.status();
    // What the worker does with a LoadProgram: the launch shape from the ABI's GPU dims.
    auto p = dev_->load_program(k.kernel->digest().short_hex(), art->cubin, art->abi);
    if (!p.ok()) return p.status();
    programs_.emplace(k.kernel->digest(), *p);
    return *p;
  }

  // One tensor per SINK source (single-device graphs), through plan_walk.h.
  absl::StatusOr<std::vector<HostTensor>> run(Graph& g, const UOp* sink,
                                              const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
    return gputest::run_plan(*this, g, sink, inputs);
  }

  // plan_walk.h's Device.
  using Buffer = std::shared_ptr<DeviceMemory>;
  absl::StatusOr<Buffer> allocate(DType elem, int64_t size) {
    return dev_->allocate(std::max<uint64_t>(16, static_cast<uint64_t>(size) * elem.bytes()));
  }
  absl::Status write(Buffer& b, const HostTensor& t) { return dev_->write(*b, 0, t.data); }
  absl::Status read(Buffer& b, HostTensor& out) {
    auto slice = dev_->read(b, 0, out.data.size());
    if (!slice.ok()) return slice.status();
    out.data.assign(slice->bytes());
    return absl::OkStatus();
  }
  absl::Status launch(Graph& g, const KernelPlan& k, gputest::BufferOf<Buffer>& buffer_of, const gputest::Vars& vars) {
    auto prog = program(g, k);
    if (!prog.ok()) return prog.status();
    const KernelAbi& abi = (*prog)->abi();
    std::vector<DeviceMemory*> bufs(abi.num_buffers(), nullptr);
    for (const KernelParam& p : abi.params) {
      auto b = buffer_of(k.buffers.at(p.slot));
      if (!b.ok()) return b.status();
      bufs[p.slot] = (*b)->get();
    }
    std::vector<int64_t> values;
    for (const KernelVar& v : abi.vars) values.push_back(vars.at(v.name));
    return dev_->run(**prog, bufs, values);
  }

 private:
  CudaRunner() = default;
  std::unique_ptr<CudaDevice> dev_;
  CudaTarget target_;
  absl::flat_hash_map<Digest, std::shared_ptr<const DeviceProgram>> programs_;
};

}  // namespace uop::cudatest
