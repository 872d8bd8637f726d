#include "local/local_runner.h"

#include <chrono>
#include <thread>
#include <unordered_map>

#include "absl/container/node_hash_map.h"
#include "compiler/ir/eval.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"

namespace uop {
namespace {

int default_threads(int n) { return n > 0 ? n : std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace

HostTensor concat(const std::vector<const HostTensor*>& shards, int64_t axis) {
  HostTensor out;
  out.dtype = shards[0]->dtype;
  out.shape = shards[0]->shape;
  out.shape[axis] = 0;
  for (const HostTensor* s : shards) out.shape[axis] += s->shape[axis];
  // Row-major: each shard contributes, for every index of the dims before the axis, one
  // contiguous run of its dims from the axis on.
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out.shape[d];
  for (int64_t o = 0; o < outer; ++o)
    for (const HostTensor* s : shards) {
      size_t run = s->data.size() / std::max<int64_t>(outer, 1);
      out.data.append(s->data, static_cast<size_t>(o) * run, run);
    }
  return out;
}

LocalRunner::LocalRunner(int threads, CpuTarget target)
    : backend_(std::move(target)), pool_(default_threads(threads)) {}

absl::StatusOr<const CpuProgram*> LocalRunner::program(Graph& g, const KernelPlan& k, KernelReport* report) {
  report->name = k.name;
  report->digest = k.kernel->digest();
  std::pair<Digest, std::string> key(report->digest, choose_schedule_ ? choose_schedule_(k.kernel) : std::string());
  if (auto it = programs_.find(key); it != programs_.end()) {
    report->abi = it->second->abi();
    return it->second.get();
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string applied;
  PipelineOptions po;
  po.schedule = key.second;
  po.applied_schedule = &applied;
  ASSIGN_OR_RETURN(const UOp* linear, backend_.lower(g, k.kernel, po, k.name));
  report->lower_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(CodeArtifact art, backend_.compile(linear));
  art.abi.schedule = applied;
  ASSIGN_OR_RETURN(std::unique_ptr<CpuProgram> prog, CpuProgram::load(art.object, art.abi));
  report->compile_ms = ms_since(t0);
  report->compiled = true;
  report->abi = art.abi;
  const CpuProgram* p = prog.get();
  programs_.emplace(std::move(key), std::move(prog));
  return p;
}

absl::StatusOr<std::vector<HostTensor>> LocalRunner::run(Graph& g, const UOp* root,
                                                         const absl::flat_hash_map<const UOp*, HostTensor>& inputs,
                                                         std::vector<KernelReport>* report,
                                                         const PipelineOptions& opts) {
  ASSIGN_OR_RETURN(GraphPlan plan, plan_graph(g, root, opts));

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
  for (auto& [v, value] : plan.var_values) {
    var_by_name[v->arg_as<DefineVarArg>().name] = value;
  }

  auto run_kernel = [&](const KernelPlan& k) -> absl::Status {
    KernelReport rep;
    ASSIGN_OR_RETURN(const CpuProgram* prog, program(g, k, &rep));
    std::vector<void*> ptrs(prog->abi().num_buffers(), nullptr);
    for (const KernelParam& p : prog->abi().params) {
      ASSIGN_OR_RETURN(HostTensor* buf, buffer_for(k.buffers.at(p.slot)));
      ptrs[p.slot] = buf->data.data();
    }
    std::vector<int64_t> vars;
    for (const KernelVar& v : prog->abi().vars) {
      auto it = var_by_name.find(v.name);
      if (it == var_by_name.end()) return absl::InvalidArgumentError(cat("variable ", v.name, " is not bound"));
      vars.push_back(it->second);
    }
    RETURN_IF_ERROR(prog->run(ptrs, vars, &pool_));
    if (report) report->push_back(std::move(rep));
    return absl::OkStatus();
  };
  // In one process every device is this memory: a collective folds the members' buffers
  // in member order (as eval.h defines each op) into all of them; a copy copies.
  auto run_collective = [&](const CollectiveStep& c) -> absl::Status {
    std::vector<HostTensor*> bufs;
    for (const UOp* b : c.buffers) {
      ASSIGN_OR_RETURN(HostTensor* t, buffer_for(b));
      bufs.push_back(t);
    }
    Op combine = reduce_combine_op(c.op);
    for (int64_t i = 0; i < bufs[0]->numel(); ++i) {
      ConstValue acc = bufs[0]->get(i);
      for (size_t k = 1; k < bufs.size(); ++k) {
        ConstValue args[2] = {acc, bufs[k]->get(i)};
        acc = *eval_alu(combine, c.dtype, args);
      }
      for (HostTensor* t : bufs) t->set(i, acc);
    }
    return absl::OkStatus();
  };
  for (const ScheduleStep& st : plan.steps) {
    if (st.kind == ScheduleStep::Kind::Kernel) {
      RETURN_IF_ERROR(run_kernel(plan.kernels[st.index]));
    } else if (st.kind == ScheduleStep::Kind::Collective) {
      RETURN_IF_ERROR(run_collective(plan.collectives[st.index]));
    } else {
      ASSIGN_OR_RETURN(HostTensor* src, buffer_for(plan.copies[st.index].src));
      ASSIGN_OR_RETURN(HostTensor* dst, buffer_for(plan.copies[st.index].dst));
      dst->data = src->data;
    }
  }

  std::vector<HostTensor> out;
  if (plan.kernel_level) {
    for (const UOp* p : plan.kernels[0].buffers) {
      ASSIGN_OR_RETURN(HostTensor* buf, buffer_for(p));
      out.push_back(*buf);
    }
    return out;
  }
  std::vector<HostTensor> parts;
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    ASSIGN_OR_RETURN(HostTensor* buf, buffer_for(plan.outputs[i]));
    HostTensor t = *buf;
    t.shape = plan.output_shapes[i];
    t.data.resize(static_cast<size_t>(t.numel()) * t.itemsize());
    parts.push_back(std::move(t));
  }
  // A multi-device output is its shards put together (a replicated one, any shard).
  for (const GraphPlan::OutputParts& o : plan.output_parts) {
    if (o.parts.size() == 1 || o.axis < 0) {
      out.push_back(parts[o.parts[0]]);
      continue;
    }
    std::vector<const HostTensor*> shards;
    for (size_t p : o.parts) shards.push_back(&parts[p]);
    out.push_back(concat(shards, o.axis));
  }
  return out;
}

}  // namespace uop
