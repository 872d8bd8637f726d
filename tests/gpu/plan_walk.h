// How the GPU tests run a tensor-level graph, whatever runs its kernels: plan_graph, then
// each kernel in order on buffers made on first use (inputs written into them), and the
// outputs read back, the way the service splits the work. The CUDA runner (cuda_runner.h,
// a real GPU) and the emulator's (emu_runner.h, compiler/gpu_emu) share it, so that the
// two run the same kernels on the same bindings. Single-device graphs only.
//
// `Device` provides
//   using Buffer = ...;  (kept, at a stable address, until the walk ends)
//   absl::StatusOr<Buffer> allocate(DType elem, int64_t size);
//   absl::Status write(Buffer&, const HostTensor&);
//   absl::Status read(Buffer&, HostTensor& out);  // out.data is sized
//   absl::Status launch(Graph&, const KernelPlan&, BufferOf& buffer_of, const Vars&);
// where buffer_of(BUFFER or PARAM node) gives that node's Buffer*.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "compiler/interp/host_tensor.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"

namespace uop::gputest {

using Vars = absl::flat_hash_map<std::string, int64_t>;
template <typename Buffer>
using BufferOf = std::function<absl::StatusOr<Buffer*>(const UOp*)>;

template <typename Device>
absl::StatusOr<std::vector<HostTensor>> run_plan(Device& dev, Graph& g, const UOp* sink,
                                                 const absl::flat_hash_map<const UOp*, HostTensor>& inputs) {
  using Buffer = typename Device::Buffer;
  auto plan = plan_graph(g, sink);
  if (!plan.ok()) return plan.status();
  absl::node_hash_map<const UOp*, Buffer> mem;
  BufferOf<Buffer> buffer_of = [&](const UOp* b) -> absl::StatusOr<Buffer*> {
    if (auto it = mem.find(b); it != mem.end()) return &it->second;
    const UOp* node = b;
    DType dt = node->op() == Op::PARAM ? node->dtype().pointee() : node->dtype();
    int64_t size = node->op() == Op::PARAM ? node->arg_as<ParamArg>().size : node->arg_as<BufferArg>().size;
    auto m = dev.allocate(dt, size);
    if (!m.ok()) return m.status();
    Buffer& out = mem.emplace(b, *std::move(m)).first->second;
    if (auto in = inputs.find(b); in != inputs.end())
      if (absl::Status s = dev.write(out, in->second); !s.ok()) return s;
    return &out;
  };
  Vars vars;
  for (const std::pair<const UOp*, int64_t>& v : plan->var_values)
    vars[v.first->arg_as<DefineVarArg>().name] = v.second;
  for (const ScheduleStep& st : plan->steps) {
    if (st.kind != ScheduleStep::Kind::Kernel) return absl::UnimplementedError("run_plan: single-device graphs only");
    const KernelPlan& k = plan->kernels[st.index];
    if (absl::Status s = dev.launch(g, k, buffer_of, vars); !s.ok())
      return absl::Status(s.code(), cat(k.name, ": ", s.message()));
  }
  std::vector<HostTensor> out;
  for (size_t i = 0; i < plan->outputs.size(); ++i) {
    auto m = buffer_of(plan->outputs[i]);
    if (!m.ok()) return m.status();
    HostTensor t = HostTensor::zeros(plan->outputs[i]->dtype().scalar, plan->output_shapes[i]);
    if (absl::Status s = dev.read(**m, t); !s.ok()) return s;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace uop::gputest
