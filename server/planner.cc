#include "server/planner.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "compiler/ir/digest.h"
#include "compiler/pipeline.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"
#include "proto/artifact.pb.h"

namespace uop::server {
namespace {

// Plans compile_shared keeps answers for, at most (then it starts again).
constexpr size_t kResolvedPlans = 1024;

// A compile that stopped because nobody waits for it any more.
bool is_stop(const absl::Status& s) {
  return s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

PipelineOptions Planner::pipeline_options() const {
  PipelineOptions po;
  po.allow_custom = opts_.allow_custom;
  po.limits.kernel_ops = opts_.max_kernel_ops;
  po.limits.kernel_ops_name = "--max-kernel-ops";
  po.limits.graph_nodes = opts_.max_plan_nodes;
  po.limits.graph_nodes_name = "--max-plan-nodes";
  return po;
}

Planner::Planner(PlannerOptions opts, CompileCache* cache, CpuTarget target)
    : opts_(std::move(opts)),
      cache_(cache),
      host_(target == CpuTarget::host() ? host_cpu_backend() : std::make_shared<CpuBackend>(std::move(target))),
      compiles_(opts_.compile_threads) {}

absl::StatusOr<std::shared_ptr<const Backend>> Planner::backend(std::string_view name, std::string_view arch) const {
  ASSIGN_OR_RETURN(const BackendKind* kind, find_backend(name));
  std::string chosen(arch);
  if (chosen.empty()) {
    auto it = opts_.default_arch.find(std::string(kind->name));
    chosen = it != opts_.default_arch.end() ? it->second : std::string(kind->default_arch);
  }
  if (kind->name == host_->name()) {
    // The CPU is this machine's, which the workers share; the kind refuses any other arch.
    if (chosen == kind->default_arch) return host_;
    return kind->make(chosen);
  }
  std::lock_guard<std::mutex> l(mu_);
  auto key = std::make_pair(std::string(kind->name), chosen);
  if (auto it = backends_.find(key); it != backends_.end()) return it->second;
  ASSIGN_OR_RETURN(std::shared_ptr<const Backend> made, kind->make(chosen));
  backends_.emplace(std::move(key), made);
  return made;
}

std::string Planner::cache_key(const Digest& kernel, const Backend& backend, std::string_view cache_namespace,
                               std::string_view schedule) const {
  // Everything that decides the bytes of the artifact: the computation, the machine, the
  // compiler that made it, its options and the loop schedule.
  return backend.cache_key(kernel, opts_.keep_source, cache_namespace, schedule);
}

std::shared_ptr<const Plan> Planner::cached_plan_locked(const std::pair<std::string, Digest>& key) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->first != key) continue;
    auto plan = it->second;
    lru_.erase(it);
    lru_.emplace_back(key, plan);
    return plan;
  }
  return nullptr;
}

std::shared_ptr<std::mutex> Planner::planning_lock(const DecodedGraph* g) {
  std::lock_guard<std::mutex> l(mu_);
  std::shared_ptr<std::mutex> lock = planning_locks_[g].lock();
  if (!lock) {
    // The graphs whose tasks have all finished leave expired entries: drop them as the
    // map grows, so it holds about as many entries as graphs being planned.
    if (planning_locks_.size() > 64) absl::erase_if(planning_locks_, [](const auto& e) { return e.second.expired(); });
    lock = std::make_shared<std::mutex>();
    planning_locks_[g] = lock;
  }
  return lock;
}

absl::StatusOr<std::shared_ptr<const Plan>> Planner::plan(std::shared_ptr<const DecodedGraph> g, bool* cached,
                                                         std::string_view cache_namespace, const Requester& who) {
  Digest digest = g->root->digest();  // computes every digest below the root, once, here
  std::pair<std::string, Digest> key(std::string(cache_namespace), digest);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto plan = cached_plan_locked(key)) {
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
        std::shared_ptr<std::mutex> graph_lock = planning_lock(g.get());
        std::lock_guard<std::mutex> planning(*graph_lock);
        {
          std::lock_guard<std::mutex> l(mu_);
          if (auto plan = cached_plan_locked(key)) return plan;  // planned while this task waited
        }
        ASSIGN_OR_RETURN(std::shared_ptr<const Plan> plan, plan_now(*g, digest, keep_going));
        std::lock_guard<std::mutex> l(mu_);
        lru_.emplace_back(key, plan);
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
  ASSIGN_OR_RETURN(GraphPlan p, plan_graph(*g.graph, g.root, po));

  auto plan = std::make_shared<Plan>();
  plan->graph = digest;
  plan->kernel_level = p.kernel_level;
  for (auto& [var, value] : p.var_values) plan->vars[var->arg_as<DefineVarArg>().name] = value;

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
  absl::flat_hash_set<const UOp*> outputs(p.outputs.begin(), p.outputs.end());
  absl::flat_hash_set<const UOp*> intermediates(p.intermediates.begin(), p.intermediates.end());
  auto role_of = [&](const UOp* b) {
    return outputs.contains(b) ? PlannedBuffer::Role::Output
           : intermediates.contains(b) ? PlannedBuffer::Role::Intermediate
                                       : PlannedBuffer::Role::Input;
  };
  // At kernel level the graph's PARAMs are its buffers, in slot order: buffer i is slot i.
  for (const UOp* param : p.params) buffer(param, PlannedBuffer::Role::Input);
  for (const KernelPlan& k : p.kernels) {
    PlannedKernel pk;
    pk.name = k.name;
    pk.digest = k.kernel->digest();
    pk.encoded = encode_binary(k.kernel);
    pk.device = k.device;
    for (const UOp* b : k.buffers) pk.buffers.push_back(buffer(b, role_of(b)));
    for (size_t slot : k.writes)
      if (slot < pk.buffers.size()) pk.writes.push_back(pk.buffers[slot]);
    plan->kernels.push_back(std::move(pk));
  }
  // Multi-device steps: collectives and copies between the kernels.
  for (const CollectiveStep& c : p.collectives) {
    PlannedCollective pc;
    pc.op = c.op;
    pc.dtype = c.dtype;
    pc.segments.emplace_back();
    for (const UOp* b : c.buffers) pc.segments.back().push_back(buffer(b, role_of(b)));
    plan->collectives.push_back(std::move(pc));
  }
  for (const CopyStep& c : p.copies) plan->copies.push_back({buffer(c.src, role_of(c.src)), buffer(c.dst, role_of(c.dst))});
  plan->steps = p.steps;
  for (const auto& o : p.output_parts) plan->output_parts.push_back({o.parts, o.axis});
  if (p.kernel_level) {
    for (size_t i = 0; i < plan->buffers.size(); ++i)
      plan->outputs.push_back({plan->buffers[i].dtype, p.output_shapes[i], static_cast<int>(i)});
  } else {
    for (size_t i = 0; i < p.outputs.size(); ++i)
      plan->outputs.push_back({p.outputs[i]->dtype().scalar, p.output_shapes[i], buffer(p.outputs[i], PlannedBuffer::Role::Output)});
  }
  bucket_collectives(*plan, opts_.bucket_cap_bytes);
  order_steps(*plan);
  plan->plan_ms = ms_since(t0);
  return std::shared_ptr<const Plan>(plan);
}

StepAccess step_access(const Plan& plan, const ScheduleStep& st) {
  StepAccess a;
  switch (st.kind) {
    case ScheduleStep::Kind::Kernel: {
      const PlannedKernel& k = plan.kernels[st.index];
      a.writes = k.writes;
      for (int b : k.buffers)
        if (std::find(k.writes.begin(), k.writes.end(), b) == k.writes.end()) a.reads.push_back(b);
      break;
    }
    case ScheduleStep::Kind::Copy:
      a.reads.push_back(plan.copies[st.index].src);
      a.writes.push_back(plan.copies[st.index].dst);
      break;
    case ScheduleStep::Kind::Collective:
      for (const auto& seg : plan.collectives[st.index].segments) a.writes.insert(a.writes.end(), seg.begin(), seg.end());
      a.reads = a.writes;
      break;
  }
  return a;
}

void order_steps(Plan& plan) {
  plan.waits_for.assign(plan.steps.size(), {});
  absl::flat_hash_map<int, int> last_writer;              // buffer -> step
  absl::flat_hash_map<int, std::vector<int>> readers;     // buffer -> steps since its last write
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const StepAccess a = step_access(plan, plan.steps[s]);
    absl::flat_hash_set<int> waits;
    for (int b : a.reads)
      if (auto w = last_writer.find(b); w != last_writer.end()) waits.insert(w->second);
    for (int b : a.writes) {
      if (auto w = last_writer.find(b); w != last_writer.end()) waits.insert(w->second);
      if (auto r = readers.find(b); r != readers.end()) waits.insert(r->second.begin(), r->second.end());
    }
    waits.erase(static_cast<int>(s));
    std::vector<int>& out = plan.waits_for[s];
    out.assign(waits.begin(), waits.end());
    std::sort(out.begin(), out.end());
    for (int b : a.reads) readers[b].push_back(static_cast<int>(s));
    for (int b : a.writes) {
      last_writer[b] = static_cast<int>(s);
      readers[b].clear();
    }
  }
}

void bucket_collectives(Plan& plan, uint64_t cap_bytes) {
  if (cap_bytes == 0 || plan.collectives.size() < 2) return;
  auto member_bytes = [&](const PlannedCollective& c) {
    uint64_t total = 0;
    for (const auto& seg : c.segments)
      total += static_cast<uint64_t>(std::max<int64_t>(plan.buffers[seg[0]].elements, 0)) * scalar_bytes(c.dtype);
    return total;
  };
  auto devices_of = [&](const PlannedCollective& c) {
    std::vector<std::string> d;
    for (int b : c.members()) d.push_back(plan.buffers[b].device);
    return d;
  };
  auto access_of = [&](const ScheduleStep& st) { return step_access(plan, st); };
  // Two steps keep their order where one writes a buffer the other reads or writes; any
  // others may swap. The open bucket is not in `steps` yet; a step that depends so on it,
  // or on a step deferred already, is deferred until the bucket is closed, so that later
  // collectives can still join it.
  std::vector<PlannedCollective> collectives;
  std::vector<ScheduleStep> steps, deferred;
  std::optional<PlannedCollective> open;
  absl::flat_hash_set<int> in_bucket, deferred_reads, deferred_writes;
  uint64_t open_bytes = 0;
  auto any_in = [](const absl::flat_hash_set<int>& set, const std::vector<int>& buffers) {
    return std::any_of(buffers.begin(), buffers.end(), [&](int b) { return set.contains(b); });
  };
  auto waits = [&](const StepAccess& a) {
    return any_in(in_bucket, a.reads) || any_in(in_bucket, a.writes) || any_in(deferred_writes, a.reads) ||
           any_in(deferred_writes, a.writes) || any_in(deferred_reads, a.writes);
  };
  auto close = [&] {
    if (!open) return;
    steps.push_back({ScheduleStep::Kind::Collective, collectives.size()});
    collectives.push_back(*std::move(open));
    open.reset();
    in_bucket.clear();
    open_bytes = 0;
    steps.insert(steps.end(), deferred.begin(), deferred.end());
    deferred.clear();
    deferred_reads.clear();
    deferred_writes.clear();
  };
  for (const ScheduleStep& st : plan.steps) {
    const StepAccess a = access_of(st);
    if (st.kind != ScheduleStep::Kind::Collective) {
      if (open && waits(a)) {
        deferred.push_back(st);
        deferred_reads.insert(a.reads.begin(), a.reads.end());
        deferred_writes.insert(a.writes.begin(), a.writes.end());
      } else {
        steps.push_back(st);
      }
      continue;
    }
    PlannedCollective& c = plan.collectives[st.index];
    const uint64_t bytes = member_bytes(c);
    const bool joins = open && open->op == c.op && open->dtype == c.dtype && devices_of(*open) == devices_of(c) &&
                       open_bytes + bytes <= cap_bytes && !waits(a);
    if (!joins) close();
    if (!open) open = PlannedCollective{c.op, c.dtype, {}};
    for (auto& seg : c.segments) open->segments.push_back(std::move(seg));
    in_bucket.insert(a.writes.begin(), a.writes.end());
    open_bytes += bytes;
  }
  close();
  plan.collectives = std::move(collectives);
  plan.steps = std::move(steps);
}

PipelineOptions Planner::compile_options(const PlannedKernel& k, const std::function<bool()>& wanted) const {
  PipelineOptions po = pipeline_options();
  po.keep_going = [&k, &wanted]() -> absl::Status {
    if (wanted()) return absl::OkStatus();
    return absl::CancelledError(cat("the compile of kernel ", k.name, " was abandoned: no request waits for it any more"));
  };
  return po;
}

absl::StatusOr<std::string> Planner::build(const PlannedKernel& k, const Backend& backend, const std::string& key,
                                           const std::string& schedule, const std::function<bool()>& wanted) {
  auto t0 = std::chrono::steady_clock::now();
  // A private Graph: compiles run on several threads.
  ASSIGN_OR_RETURN(DecodedGraph g, decode_binary(k.encoded), cat("planner: cannot decode kernel ", k.name, ": "));
  PipelineOptions po = compile_options(k, wanted);
  std::string applied;
  po.schedule = schedule;
  po.applied_schedule = &applied;
  ASSIGN_OR_RETURN(const UOp* linear, backend.lower(*g.graph, g.root, po, k.name));
  // The last look before the code generator, which cannot be stopped once started
  // (LLVM, NVRTC): its time is bounded by the size of the LINEAR, which lowering has
  // just checked.
  RETURN_IF_ERROR(po.keep_going());
  ASSIGN_OR_RETURN(CodeArtifact art, backend.compile(linear, BackendCompileOptions{.keep_source = opts_.keep_source}));
  art.abi.schedule = applied;
  uopd::v1::Artifact a;
  a.set_key(key);
  a.set_kernel_digest(k.digest.hex());
  a.set_name(k.name);
  a.set_target(backend.target_id());
  a.set_build_id(backend.build_id());
  a.set_abi(art.abi.serialize());
  a.set_object(art.object);
  a.set_source(art.source);
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
  RETURN_IF_ERROR(parse_artifact(k, key, target_id, entry.value, &a));
  ASSIGN_OR_RETURN(KernelAbi abi, parse_abi(a.abi()));
  CompiledKernel ck;
  ck.key = key;
  ck.name = k.name;
  ck.digest = k.digest;
  ck.object = CompiledKernel::bytes(std::move(*a.mutable_object()));
  ck.source = CompiledKernel::bytes(std::move(*a.mutable_source()));
  ck.abi = std::move(abi);
  ck.abi_text = a.abi();
  ck.outcome = entry.outcome;
  ck.tier = entry.tier;
  ck.compile_ms = compile_ms.value_or(a.compile_ms());
  return ck;
}

absl::StatusOr<std::vector<CompiledKernel>> Planner::compile(const Plan& plan, std::shared_ptr<const Backend> backend,
                                                             std::string_view cache_namespace, const Requester& who,
                                                             const KernelSchedules& schedules) {
  return compile(plan, std::vector<std::shared_ptr<const Backend>>(plan.kernels.size(), std::move(backend)),
                 cache_namespace, who, schedules);
}

absl::StatusOr<std::vector<CompiledKernel>> Planner::compile(const Plan& plan,
                                                             const std::vector<std::shared_ptr<const Backend>>& per_kernel,
                                                             std::string_view cache_namespace, const Requester& who,
                                                             const KernelSchedules& schedules) {
  if (per_kernel.size() != plan.kernels.size())
    return absl::InternalError(cat("planner: ", per_kernel.size(), " targets for ", plan.kernels.size(), " kernels"));
  // One lookup per (kernel, target), all started before any is waited for: the misses
  // are compiled on the pool at once (in this requester's turns), hits are answered here.
  // A compile is the cache's compute for its key, so it is shared by every request that
  // wants the key while it runs; it owns what it needs (it may outlive this request).
  CompileCache::Runner on_pool = [this, owner = who.owner](std::function<void()> work) {
    compiles_.submit(owner, std::move(work));
  };
  struct Wanted {
    size_t kernel;    // the first kernel of the lookup
    std::string key;  // its cache key
    std::shared_ptr<const CompiledKernel> resolved;  // resolved by an earlier request: no lookup
    std::optional<CompileCache::Lookup> lookup;
  };
  absl::flat_hash_map<std::string, size_t> first;  // cache key -> wanted
  // Kernels resolved earlier answer as the first tier would, so only where it is memory.
  const bool keep = cache_->first_tier_in_process();
  std::vector<size_t> which(plan.kernels.size());
  std::vector<Wanted> wanted;
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const PlannedKernel& k = plan.kernels[i];
    std::shared_ptr<const Backend> backend = per_kernel[i];
    if (!backend) return absl::InternalError(cat("planner: no target for kernel ", k.name));
    // The key names the kernel, its schedule and everything about its target: equal
    // keys, one compile.
    auto given = schedules.find(k.digest.hex());
    std::string schedule = given != schedules.end() ? given->second : std::string();
    if (given == schedules.end() && schedule_source_) schedule = schedule_source_(k, *backend, cache_namespace);
    std::string key = cache_key(k.digest, *backend, cache_namespace, schedule);
    auto [it, fresh] = first.emplace(key, wanted.size());
    which[i] = it->second;
    if (!fresh) continue;
    Wanted w{i, key, keep ? resolved(key) : nullptr, std::nullopt};
    if (!w.resolved) {
      CompileCache::Compute compute = [this, k, backend, key, schedule](const std::function<bool()>& still_wanted) {
        return build(k, *backend, key, schedule, still_wanted);
      };
      w.lookup = cache_->start(key, std::move(compute), on_pool, who.deadline, entry_check(k, key, backend->target_id()));
    }
    wanted.push_back(std::move(w));
  }
  std::vector<CompiledKernel> done;
  for (Wanted& w : wanted) {
    const PlannedKernel& k = plan.kernels[w.kernel];
    if (w.resolved) {
      CompiledKernel ck = *w.resolved;
      ck.name = k.name;  // one digest may carry other names (a client's)
      ck.outcome = CacheOutcome::Hit;
      ck.tier = cache_->count_first_tier_hit();
      done.push_back(std::move(ck));
      continue;
    }
    auto entry = cache_->finish(*w.lookup, who.gone);
    // Returning drops the other lookups: compiles that only this request wanted are
    // abandoned at their next stage.
    if (!entry.ok()) {
      if (is_stop(entry.status())) return absl::Status(entry.status().code(), cat("kernel ", k.name, ": ", entry.status().message()));
      return entry.status();
    }
    ASSIGN_OR_RETURN(CompiledKernel ck, kernel_from_entry(k, w.key, per_kernel[w.kernel]->target_id(), *entry, std::nullopt));
    if (keep) remember(ck);
    done.push_back(std::move(ck));
  }
  std::vector<CompiledKernel> out;
  out.reserve(plan.kernels.size());
  for (size_t i = 0; i < plan.kernels.size(); ++i) out.push_back(done[which[i]]);
  return out;
}

absl::StatusOr<std::shared_ptr<const std::vector<CompiledKernel>>> Planner::compile_shared(
    const Plan& plan, const std::vector<std::shared_ptr<const Backend>>& per_kernel, std::string_view cache_namespace,
    const Requester& who, const KernelSchedules& schedules) {
  const size_t n = plan.kernels.size();
  const bool memo = schedules.empty() && per_kernel.size() == n && n > 0 && cache_->first_tier_in_process();
  if (!memo) {
    ASSIGN_OR_RETURN(std::vector<CompiledKernel> out, compile(plan, per_kernel, cache_namespace, who, schedules));
    return std::make_shared<const std::vector<CompiledKernel>>(std::move(out));
  }
  // What decides each kernel's key besides its digest: its target and its schedule (a
  // tuning record may have come since).
  ResolvedPlan now;
  now.backends.reserve(n);
  now.schedules.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!per_kernel[i]) return absl::InternalError(cat("planner: no target for kernel ", plan.kernels[i].name));
    now.backends.push_back(per_kernel[i].get());
    now.schedules.push_back(schedule_source_ ? schedule_source_(plan.kernels[i], *per_kernel[i], cache_namespace) : std::string());
  }
  const std::string key = cat(cache_namespace, "\n", plan.graph.hex());
  uint64_t generation;
  {
    std::lock_guard<std::mutex> l(mu_);
    generation = resolved_generation_;
    auto it = resolved_plans_.find(key);
    if (it != resolved_plans_.end() && it->second.backends == now.backends && it->second.schedules == now.schedules) {
      const std::vector<CompiledKernel>& kept = *it->second.kernels;
      bool same = kept.size() == n;
      for (size_t i = 0; same && i < n; ++i) same = kept[i].name == plan.kernels[i].name && kept[i].digest == plan.kernels[i].digest;
      if (same) {
        std::shared_ptr<const std::vector<CompiledKernel>> out = it->second.kernels;
        cache_->count_first_tier_hits(n);
        return out;
      }
    }
  }
  ASSIGN_OR_RETURN(std::vector<CompiledKernel> compiled, compile(plan, per_kernel, cache_namespace, who, schedules));
  auto out = std::make_shared<const std::vector<CompiledKernel>>(std::move(compiled));
  // Kept only when each kernel is what a later compile() would answer: a first-tier hit.
  const std::string first = cache_->first_tier_name();
  for (const CompiledKernel& k : *out)
    if (k.outcome != CacheOutcome::Hit || k.tier != first) return out;
  std::lock_guard<std::mutex> l(mu_);
  if (resolved_generation_ != generation) return out;  // the kernels were let go meanwhile
  if (resolved_plans_.size() >= kResolvedPlans) resolved_plans_.clear();
  now.kernels = out;
  resolved_plans_[key] = std::move(now);
  return out;
}

std::shared_ptr<const CompiledKernel> Planner::resolved(const std::string& key) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = resolved_.find(key);
  return it == resolved_.end() ? nullptr : it->second;
}

void Planner::remember(const CompiledKernel& ck) {
  const uint64_t bytes = ck.object->size() + ck.source->size() + ck.abi_text.size();
  if (bytes > opts_.resolved_kernel_bytes) return;
  std::lock_guard<std::mutex> l(mu_);
  if (resolved_.contains(ck.key)) return;
  if (resolved_bytes_ + bytes > opts_.resolved_kernel_bytes) {
    resolved_.clear();  // rare: the kernels still in use come back at their next Run
    resolved_bytes_ = 0;
    resolved_plans_.clear();
    ++resolved_generation_;
  }
  resolved_.emplace(ck.key, std::make_shared<const CompiledKernel>(ck));
  resolved_bytes_ += bytes;
}

std::vector<absl::StatusOr<CompiledKernel>> Planner::compile_candidates(const PlannedKernel& k,
                                                                        std::shared_ptr<const Backend> backend,
                                                                        const std::vector<std::string>& schedules,
                                                                        std::string_view cache_namespace,
                                                                        const Requester& who) {
  std::vector<Pending<std::string>> pending;
  std::vector<std::string> keys;
  for (const std::string& schedule : schedules) {
    keys.push_back(cache_key(k.digest, *backend, cache_namespace, schedule));
    pending.push_back(to_pool<std::string>(
        who, cat("a schedule candidate of kernel ", k.name),
        [this, k, backend, key = keys.back(), schedule](const std::function<absl::Status()>& keep_going) {
          return build(k, *backend, key, schedule, [&keep_going] { return keep_going().ok(); });
        }));
  }
  std::vector<absl::StatusOr<CompiledKernel>> out;
  for (size_t i = 0; i < pending.size(); ++i) {
    absl::StatusOr<std::string> art = pending[i].wait(who.gone);
    if (!art.ok()) {
      out.push_back(art.status());
      continue;
    }
    CacheResult entry{*std::move(art), CacheOutcome::Miss, ""};
    out.push_back(kernel_from_entry(k, keys[i], backend->target_id(), entry, std::nullopt));
  }
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
