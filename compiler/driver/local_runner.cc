#include "compiler/driver/local_runner.h"

#include <chrono>
#include <thread>
#include <unordered_map>

#include "absl/container/node_hash_map.h"
#include "compiler/ir/eval.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int default_threads(int n) { return n > 0 ? n : std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace

LocalRunner::LocalRunner(int threads, CpuTarget target)
    : target_(std::move(target)), pool_(default_threads(threads)), vector_bits_(target_.vector_bits()) {}

absl::StatusOr<const CpuProgram*> LocalRunner::program(Graph& g, const KernelPlan& k, KernelReport* report) {
  report->name = k.name;
  report->digest = k.kernel->digest();
  if (auto it = programs_.find(report->digest); it != programs_.end()) {
    report->abi = it->second->abi();
    return it->second.get();
  }
  auto t0 = std::chrono::steady_clock::now();
  PipelineOptions po;
  po.vector_bits = vector_bits_;
  auto linear = lower_for_cpu(g, k.kernel, po, k.name);
  if (!linear.ok()) return linear.status();
  report->lower_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  auto art = compile_cpu(*linear, target_);
  if (!art.ok()) return art.status();
  auto prog = CpuProgram::load(art->object, art->abi);
  if (!prog.ok()) return prog.status();
  report->compile_ms = ms_since(t0);
  report->compiled = true;
  report->abi = art->abi;
  const CpuProgram* p = prog->get();
  programs_.emplace(report->digest, std::move(*prog));
  return p;
}

absl::StatusOr<std::vector<HostTensor>> LocalRunner::run(Graph& g, const UOp* root,
                                                         const absl::flat_hash_map<const UOp*, HostTensor>& inputs,
                                                         std::vector<KernelReport>* report,
                                                         const PipelineOptions& opts) {
  auto plan = plan_graph(g, root, opts);
  if (!plan.ok()) return plan.status();

  // Every buffer a kernel binds, with its contents.
  // node_hash_map: kernels get pointers into these tensors while more are added, and a
  // flat map's rehash would move them (a short tensor's bytes live inside its std::string).
  absl::node_hash_map<const UOp*, HostTensor> mem;
  auto buffer_for = [&](const UOp* b) -> absl::StatusOr<HostTensor*> {
    if (auto it = mem.find(b); it != mem.end()) return &it->second;
    DType dt = b->op() == Op::PARAM ? b->dtype().pointee() : b->dtype();
    int64_t size = b->op() == Op::PARAM ? b->arg_as<ParamArg>().size : b->arg_as<BufferArg>().size;
    if (auto in = inputs.find(b); in != inputs.end()) {
      if (in->second.dtype != dt.scalar || in->second.numel() != size)
        return absl::InvalidArgumentError(cat("input for ", op_name(b->op()), " of ", size, " x ", dt.str(),
                                              " is ", in->second.str(0)));
      return &mem.emplace(b, in->second).first->second;
    }
    return &mem.emplace(b, HostTensor::zeros(dt.scalar, {size})).first->second;
  };
  absl::flat_hash_map<std::string, int64_t> var_by_name;
  for (auto& [v, value] : plan->var_values) {
    var_by_name[v->arg_as<DefineVarArg>().name] = value;
  }

  for (const KernelPlan& k : plan->kernels) {
    KernelReport rep;
    auto prog = program(g, k, &rep);
    if (!prog.ok()) return prog.status();
    std::vector<void*> ptrs((*prog)->abi().num_buffers(), nullptr);
    for (const KernelParam& p : (*prog)->abi().params) {
      auto buf = buffer_for(k.buffers.at(p.slot));
      if (!buf.ok()) return buf.status();
      ptrs[p.slot] = (*buf)->data.data();
    }
    std::vector<int64_t> vars;
    for (const KernelVar& v : (*prog)->abi().vars) {
      auto it = var_by_name.find(v.name);
      if (it == var_by_name.end()) return absl::InvalidArgumentError(cat("variable ", v.name, " is not bound"));
      vars.push_back(it->second);
    }
    if (absl::Status s = (*prog)->run(ptrs, vars, &pool_); !s.ok()) return s;
    if (report) report->push_back(std::move(rep));
  }

  std::vector<HostTensor> out;
  if (plan->kernel_level) {
    for (const UOp* p : plan->kernels[0].buffers) {
      auto buf = buffer_for(p);
      if (!buf.ok()) return buf.status();
      out.push_back(**buf);
    }
    return out;
  }
  for (size_t i = 0; i < plan->outputs.size(); ++i) {
    auto buf = buffer_for(plan->outputs[i]);
    if (!buf.ok()) return buf.status();
    HostTensor t = **buf;
    t.shape = plan->output_shapes[i];
    t.data.resize(static_cast<size_t>(t.numel()) * t.itemsize());
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace uop
