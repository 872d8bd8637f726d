#include "server/planner.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "compiler/codegen/cuda.h"
#include "compiler/ir/digest.h"
#include "compiler/pipeline.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"
#include "proto/artifact.pb.h"

namespace uop::server {
namespace {

// A compile that stopped because nobody waits for it any more.
bool is_stop(const absl::Status& s) {
  return s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

PipelineOptions Planner::pipeline_options() const {
  PipelineOptions po;
  po.allow_custom = opts_.allow_custom;
  po.vector_bits = vector_bits_;
  po.limits.kernel_ops = opts_.max_kernel_ops;
  po.limits.kernel_ops_name = "--max-kernel-ops";
  po.limits.graph_nodes = opts_.max_plan_nodes;
  po.limits.graph_nodes_name = "--max-plan-nodes";
  return po;
}

Planner::Planner(PlannerOptions opts, CompileCache* cache, CpuTarget target)
    : opts_(std::move(opts)),
      cache_(cache),
      target_(std::move(target)),
      vector_bits_(target_.vector_bits()),
      compiles_(opts_.compile_threads) {}

std::string Planner::cache_key(const Digest& kernel, std::string_view cache_namespace) const {
  // Everything that decides the bytes of the artifact: the computation, the machine, the
  // compiler that made it and its options.
  std::string material = cat("uopd-kernel-key/1\n", kernel.hex(), "\n", target_.id(), "\n", compiler_build_id(),
                             "\nvector_bits=", vector_bits_, " keep_source=", opts_.keep_source);
  // A private namespace only moves the key; the shared cache's keys stay what they were.
  if (!cache_namespace.empty()) material = cat(material, "\nnamespace=", cache_namespace);
  return sha256(material).hex();
}

absl::StatusOr<std::shared_ptr<const Plan>> Planner::plan(std::shared_ptr<const DecodedGraph> g, bool* cached,
                                                         std::string_view cache_namespace, const Requester& who) {
  Digest digest = g->root->digest();  // computes every digest below the root, once, here
  std::pair<std::string, Digest> key(std::string(cache_namespace), digest);
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->first != key) continue;
      auto plan = it->second;
      lru_.erase(it);
      lru_.emplace_back(std::move(key), plan);
      ++hits_;
      *cached = true;
      return plan;
    }
    ++misses_;
  }
  *cached = false;
  auto planned = to_pool<std::shared_ptr<const Plan>>(
      who, "planning", [this, g, digest, key](const std::function<absl::Status()>& keep_going)
                           -> absl::StatusOr<std::shared_ptr<const Plan>> {
        auto plan = plan_now(*g, digest, keep_going);
        if (!plan.ok()) return plan.status();
        std::lock_guard<std::mutex> l(mu_);
        lru_.emplace_back(key, *plan);
        while (lru_.size() > opts_.plan_cache_entries) lru_.erase(lru_.begin());
        return plan;
      });
  return planned.wait(who.gone);
}

absl::StatusOr<std::shared_ptr<const Plan>> Planner::plan_now(const DecodedGraph& g, const Digest& digest,
                                                              const std::function<absl::Status()>& keep_going) {
  auto t0 = std::chrono::steady_clock::now();
  PipelineOptions po = pipeline_options();
  po.index = &g.index;
  po.keep_going = keep_going;
  auto p = plan_graph(*g.graph, g.root, po);
  if (!p.ok()) return p.status();

  auto plan = std::make_shared<Plan>();
  plan->graph = digest;
  plan->kernel_level = p->kernel_level;
  for (auto& [var, value] : p->var_values) plan->vars[var->arg_as<DefineVarArg>().name] = value;

  absl::flat_hash_map<const UOp*, int> index_of;
  auto buffer = [&](const UOp* b, PlannedBuffer::Role role) {
    auto [it, added] = index_of.emplace(b, static_cast<int>(plan->buffers.size()));
    if (added) {
      PlannedBuffer pb;
      pb.role = role;
      pb.dtype = b->dtype().scalar;
      pb.elements = b->op() == Op::PARAM ? b->arg_as<ParamArg>().size : b->arg_as<BufferArg>().size;
      pb.node = b->digest();
      if (b->op() == Op::BUFFER) pb.device = b->src(1)->arg_as<DeviceArg>().devices.at(0);
      if (!pb.device.empty() && std::find(plan->devices.begin(), plan->devices.end(), pb.device) == plan->devices.end())
        plan->devices.push_back(pb.device);
      plan->buffers.push_back(pb);
    }
    return it->second;
  };
  absl::flat_hash_set<const UOp*> outputs(p->outputs.begin(), p->outputs.end());
  absl::flat_hash_set<const UOp*> intermediates(p->intermediates.begin(), p->intermediates.end());
  auto role_of = [&](const UOp* b) {
    return outputs.contains(b) ? PlannedBuffer::Role::Output
           : intermediates.contains(b) ? PlannedBuffer::Role::Intermediate
                                       : PlannedBuffer::Role::Input;
  };
  for (const KernelPlan& k : p->kernels) {
    PlannedKernel pk;
    pk.name = k.name;
    pk.digest = k.kernel->digest();
    pk.encoded = encode_binary(k.kernel);
    pk.device = k.device;
    for (const UOp* b : k.buffers) pk.buffers.push_back(buffer(b, role_of(b)));
    plan->kernels.push_back(std::move(pk));
  }
  // Multi-device steps: collectives and copies between the kernels.
  for (const CollectivePlan& c : p->collectives) {
    PlannedCollective pc;
    pc.op = c.op;
    pc.dtype = c.dtype;
    for (const UOp* b : c.buffers) pc.buffers.push_back(buffer(b, role_of(b)));
    plan->collectives.push_back(std::move(pc));
  }
  for (const CopyPlan& c : p->copies) plan->copies.push_back({buffer(c.src, role_of(c.src)), buffer(c.dst, role_of(c.dst))});
  for (const PlanStep& st : p->steps) {
    auto kind = st.kind == PlanStep::Kind::Kernel       ? PlannedStep::Kind::Kernel
                : st.kind == PlanStep::Kind::Collective ? PlannedStep::Kind::Collective
                                                        : PlannedStep::Kind::Copy;
    plan->steps.push_back({kind, st.index});
  }
  for (const auto& o : p->output_parts) plan->output_parts.push_back({o.parts, o.axis});
  if (p->kernel_level) {
    for (size_t i = 0; i < plan->buffers.size(); ++i)
      plan->outputs.push_back({plan->buffers[i].dtype, p->output_shapes[i], static_cast<int>(i)});
  } else {
    for (size_t i = 0; i < p->outputs.size(); ++i)
      plan->outputs.push_back({p->outputs[i]->dtype().scalar, p->output_shapes[i], buffer(p->outputs[i], PlannedBuffer::Role::Output)});
  }
  plan->plan_ms = ms_since(t0);
  return std::shared_ptr<const Plan>(plan);
}

PipelineOptions Planner::compile_options(const PlannedKernel& k, const std::function<bool()>& wanted) const {
  PipelineOptions po = pipeline_options();
  po.keep_going = [&k, &wanted]() -> absl::Status {
    if (wanted()) return absl::OkStatus();
    return absl::CancelledError(cat("the compile of kernel ", k.name, " was abandoned: no request waits for it any more"));
  };
  return po;
}

absl::StatusOr<std::string> Planner::build_cpu(const PlannedKernel& k, const std::string& key,
                                               const std::function<bool()>& wanted) {
  auto t0 = std::chrono::steady_clock::now();
  auto g = decode_binary(k.encoded);  // a private Graph: compiles run on several threads
  if (!g.ok()) return absl::InternalError(cat("planner: cannot decode kernel ", k.name, ": ", g.status().message()));
  PipelineOptions po = compile_options(k, wanted);
  auto linear = lower_for_cpu(*g->graph, g->root, po, k.name);
  if (!linear.ok()) return linear.status();
  // The last look before LLVM, which cannot be stopped once started: its time is bounded
  // by the size of the LINEAR, which lower_for_cpu has just checked.
  if (absl::Status s = po.keep_going(); !s.ok()) return s;
  auto art = compile_cpu(*linear, target_, CpuCompileOptions{2, opts_.keep_source});
  if (!art.ok()) return art.status();
  uopd::v1::Artifact a;
  a.set_key(key);
  a.set_kernel_digest(k.digest.hex());
  a.set_name(k.name);
  a.set_target(target_.id());
  a.set_build_id(compiler_build_id());
  a.set_abi(art->abi.serialize());
  a.set_object(art->object);
  a.set_source(art->ir_text);
  a.set_compile_ms(ms_since(t0));
  return a.SerializeAsString();
}

namespace {
// An entry that does not parse or names another kernel or target is never used, whatever
// the tier said about its authenticity.
absl::Status parse_artifact(const PlannedKernel& k, const std::string& key, const std::string& target_id,
                            std::string_view value, uopd::v1::Artifact* a) {
  if (!a->ParseFromArray(value.data(), static_cast<int>(value.size())) || a->key() != key || a->kernel_digest() != k.digest.hex() || a->target() != target_id)
    return absl::DataLossError(cat("compile cache: the entry for kernel ", k.name, " (key ", key.substr(0, 12),
                                   ") is not a ", target_id, " artifact of that kernel"));
  return absl::OkStatus();
}
}  // namespace

CompileCache::Verifier Planner::entry_check(const PlannedKernel& k, const std::string& key, const std::string& target_id) {
  return [k, key, target_id](std::string_view value) {
    uopd::v1::Artifact a;
    return parse_artifact(k, key, target_id, value, &a);
  };
}

absl::StatusOr<CompiledKernel> Planner::kernel_from_entry(const PlannedKernel& k, const std::string& key,
                                                          const std::string& target_id, const CacheResult& entry,
                                                          std::optional<double> compile_ms) {
  uopd::v1::Artifact a;
  if (absl::Status s = parse_artifact(k, key, target_id, entry.value, &a); !s.ok()) return s;
  auto abi = parse_abi(a.abi());
  if (!abi.ok()) return abi.status();
  CompiledKernel ck;
  ck.key = key;
  ck.name = k.name;
  ck.digest = k.digest;
  ck.object = a.object();
  ck.source = a.source();
  ck.abi = std::move(*abi);
  ck.outcome = entry.outcome;
  ck.tier = entry.tier;
  ck.compile_ms = compile_ms.value_or(a.compile_ms());
  return ck;
}

absl::StatusOr<std::vector<CompiledKernel>> Planner::compile(const Plan& plan, std::string_view cache_namespace,
                                                             const Requester& who) {
  return compile_per_kernel(plan, std::vector<std::string>(plan.kernels.size()), cache_namespace, who);
}

absl::StatusOr<std::vector<CompiledKernel>> Planner::compile_per_kernel(const Plan& plan,
                                                                        const std::vector<std::string>& arch_per_kernel,
                                                                        std::string_view cache_namespace,
                                                                        const Requester& who) {
  if (arch_per_kernel.size() != plan.kernels.size())
    return absl::InternalError(cat("planner: ", arch_per_kernel.size(), " targets for ", plan.kernels.size(), " kernels"));
  // One lookup per (kernel, target), all started before any is waited for: the misses
  // are compiled on the pool at once (in this requester's turns), hits are answered here.
  // A compile is the cache's compute for its key, so it is shared by every request that
  // wants the key while it runs; it owns what it needs (it may outlive this request).
  CompileCache::Runner on_pool = [this, owner = who.owner](std::function<void()> work) {
    compiles_.submit(owner, std::move(work));
  };
  absl::flat_hash_map<std::pair<Digest, std::string>, size_t> first;
  std::vector<size_t> which(plan.kernels.size());
  std::vector<CompileCache::Lookup> lookups;
  std::vector<size_t> kernel_of;  // the first kernel of each lookup
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const PlannedKernel& k = plan.kernels[i];
    const std::string& arch = arch_per_kernel[i];
    auto [it, fresh] = first.emplace(std::make_pair(k.digest, arch), lookups.size());
    which[i] = it->second;
    if (!fresh) continue;
    if (!arch.empty())
      if (auto t = CudaTarget::parse(arch); !t.ok()) return t.status();
    std::string key = arch.empty() ? cache_key(k.digest, cache_namespace) : cuda_cache_key(k.digest, arch, cache_namespace);
    std::string target_id = arch.empty() ? target_.id() : CudaTarget::parse(arch)->id();
    CompileCache::Compute compute = [this, k, arch, key](const std::function<bool()>& wanted) {
      return arch.empty() ? build_cpu(k, key, wanted) : build_cuda(k, arch, key, wanted);
    };
    lookups.push_back(cache_->start(key, std::move(compute), on_pool, who.deadline, entry_check(k, key, target_id)));
    kernel_of.push_back(i);
  }
  std::vector<CompiledKernel> done;
  for (size_t j = 0; j < lookups.size(); ++j) {
    const PlannedKernel& k = plan.kernels[kernel_of[j]];
    const std::string& arch = arch_per_kernel[kernel_of[j]];
    auto entry = cache_->finish(lookups[j], who.gone);
    // Returning drops the other lookups: compiles that only this request wanted are
    // abandoned at their next stage.
    if (!entry.ok()) {
      if (is_stop(entry.status())) return absl::Status(entry.status().code(), cat("kernel ", k.name, ": ", entry.status().message()));
      return entry.status();
    }
    std::string key = arch.empty() ? cache_key(k.digest, cache_namespace) : cuda_cache_key(k.digest, arch, cache_namespace);
    std::string target_id = arch.empty() ? target_.id() : CudaTarget::parse(arch)->id();
    auto ck = kernel_from_entry(k, key, target_id, *entry, std::nullopt);
    if (!ck.ok()) return ck.status();
    done.push_back(*std::move(ck));
  }
  std::vector<CompiledKernel> out;
  for (size_t i = 0; i < plan.kernels.size(); ++i) out.push_back(done[which[i]]);
  return out;
}

uint64_t Planner::plan_hits() const {
  std::lock_guard<std::mutex> l(mu_);
  return hits_;
}
uint64_t Planner::plan_misses() const {
  std::lock_guard<std::mutex> l(mu_);
  return misses_;
}

}  // namespace uop::server
