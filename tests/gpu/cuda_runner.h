// Runs a tensor-level graph on one GPU in this process, the way the service splits the
// work: plan_graph, then per kernel the CUDA backend's lowering + compile_cuda (NVRTC, for the
// device's arch), loaded and launched by the worker's CUDA runtime (worker/cuda) with
// the launch dims its ABI gives. Buffers live in device memory for the whole graph.
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

  // One tensor per SINK source (single-device graphs).
  absl::StatusOr<std::vector<HostTensor>> run(Graph& g, const UOp* sink,
                                              const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
    auto plan = plan_graph(g, sink);
    if (!plan.ok()) return plan.status();
    absl::flat_hash_map<const UOp*, std::shared_ptr<DeviceMemory>> mem;
    auto buffer_for = [&](const UOp* b) -> absl::StatusOr<DeviceMemory*> {
      if (auto it = mem.find(b); it != mem.end()) return it->second.get();
      DType dt = b->op() == Op::PARAM ? b->dtype().pointee() : b->dtype();
      int64_t size = b->op() == Op::PARAM ? b->arg_as<ParamArg>().size : b->arg_as<BufferArg>().size;
      auto m = dev_->allocate(std::max<uint64_t>(16, static_cast<uint64_t>(size) * dt.bytes()));
      if (!m.ok()) return m.status();
      if (auto in = inputs.find(b); in != inputs.end())
        if (absl::Status s = dev_->write(**m, 0, in->second.data); !s.ok()) return s;
      return mem.emplace(b, *m).first->second.get();
    };
    absl::flat_hash_map<std::string, int64_t> var_by_name;
    for (auto& [v, value] : plan->var_values) var_by_name[v->arg_as<DefineVarArg>().name] = value;
    for (const ScheduleStep& st : plan->steps) {
      if (st.kind != ScheduleStep::Kind::Kernel) return absl::UnimplementedError("CudaRunner: single-device graphs only");
      const KernelPlan& k = plan->kernels[st.index];
      auto prog = program(g, k);
      if (!prog.ok()) return absl::Status(prog.status().code(), cat(k.name, ": ", prog.status().message()));
      const KernelAbi& abi = (*prog)->abi();
      std::vector<DeviceMemory*> bufs(abi.num_buffers(), nullptr);
      for (const KernelParam& p : abi.params) {
        auto b = buffer_for(k.buffers.at(p.slot));
        if (!b.ok()) return b.status();
        bufs[p.slot] = *b;
      }
      std::vector<int64_t> vars;
      for (const KernelVar& v : abi.vars) vars.push_back(var_by_name.at(v.name));
      if (absl::Status s = dev_->run(**prog, bufs, vars); !s.ok())
        return absl::Status(s.code(), cat(k.name, ": ", s.message()));
    }
    std::vector<HostTensor> out;
    for (size_t i = 0; i < plan->outputs.size(); ++i) {
      const UOp* b = plan->outputs[i];
      auto m = buffer_for(b);
      if (!m.ok()) return m.status();
      HostTensor t = HostTensor::zeros(b->dtype().scalar, plan->output_shapes[i]);
      auto slice = dev_->read(mem.at(b), 0, t.data.size());
      if (!slice.ok()) return slice.status();
      t.data.assign(slice->bytes());
      out.push_back(std::move(t));
    }
    return out;
  }

 private:
  CudaRunner() = default;
  std::unique_ptr<CudaDevice> dev_;
  CudaTarget target_;
  absl::flat_hash_map<Digest, std::shared_ptr<const DeviceProgram>> programs_;
};

}  // namespace uop::cudatest
