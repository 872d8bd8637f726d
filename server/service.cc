#include "server/service.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "compiler/backend.h"
#include "compiler/explain.h"
#include "compiler/passes/loop_schedule.h"
#include "compiler/pipeline.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"
#include "proto/worker.grpc.pb.h"
#include "transport/grpc_absl.h"

namespace uop::server {
namespace {

namespace pb = ::uopd::v1;

// Bulk transfers move 1-4 MiB messages: gRPC allocates a slice per message sent and
// protobuf a string per chunk parsed. With glibc's defaults each such block is mmap'ed or
// trimmed back to the kernel when freed, so every chunk page-faults its memory in again
// (on a VM a fault costs microseconds: a 256 MiB upload spent seconds in the kernel).
// Keeping blocks up to 64 MiB on the heap, and up to 256 MiB of freed heap untrimmed,
// makes the next chunk reuse the last one's pages. Set once, when the service is linked.
[[maybe_unused]] const bool kMallocTuned = [] {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return true;
}();

using transport::to_grpc;

pb::CacheStatus status_of(CacheOutcome o) {
  switch (o) {
    case CacheOutcome::Hit: return pb::HIT;
    case CacheOutcome::Miss: return pb::MISS;
    case CacheOutcome::Coalesced: return pb::COALESCED;
  }
  return pb::CACHE_STATUS_UNSPECIFIED;
}

// A Run's answer lists its kernels without their ABI (Compile's has it): a model of 100
// kernels carried 130 KB of ABI text in every warm Run, a tenth of its time in uopd.
void fill_kernel(const CompiledKernel& k, bool binary, bool source, pb::Kernel* out, bool abi = true) {
  out->set_name(k.name);
  out->set_digest(k.digest.hex());
  out->set_cache_key(k.key);
  out->set_status(status_of(k.outcome));
  out->set_tier(k.tier);
  out->set_compile_ms(k.compile_ms);
  if (abi) out->set_abi(k.abi_text);
  if (binary) out->set_binary(*k.object);
  if (source) out->set_source(*k.source);
}

// CompileRequest.schedules as the planner takes them: each entry names a kernel of the
// plan (by digest, or "" in a plan of one kernel) at most once, with a schedule that
// parses (whether it fits its kernel is the compile's to say, naming the step). The
// text the planner keys on is the canonical one.
// The kernel of `plan` that `digest` names (a whole digest, a prefix of 8+ hex digits
// naming one kernel, or "" for a plan of one kernel), in hex; INVALID_ARGUMENT naming
// `what` otherwise.
absl::StatusOr<std::string> kernel_named(std::string digest, const Plan& plan, std::string_view what) {
  absl::flat_hash_set<std::string> digests;
  for (const PlannedKernel& k : plan.kernels) digests.insert(k.digest.hex());
  if (digest.empty()) {
    if (digests.size() != 1)
      return absl::InvalidArgumentError(cat(what, " names no kernel, and the graph has ", digests.size(),
                                            " kernels: name one by its digest"));
    return *digests.begin();
  }
  if (digests.contains(digest)) return digest;
  // A prefix of at least 8 hex digits (what `uop compile` prints) names the one kernel
  // whose digest starts with it.
  std::vector<std::string> match;
  if (digest.size() >= 8)
    for (const std::string& d : digests)
      if (d.starts_with(digest)) match.push_back(d);
  if (match.size() != 1)
    return absl::InvalidArgumentError(cat(what, ": the graph has ", match.empty() ? "no kernel" : "several kernels",
                                          " of digest '", digest.substr(0, 64), digest.size() > 64 ? "...'" : "'"));
  return match[0];
}

absl::StatusOr<KernelSchedules> schedules_of(const pb::CompileRequest& req, const Plan& plan) {
  KernelSchedules out;
  if (req.schedules_size() == 0) return out;
  for (int i = 0; i < req.schedules_size(); ++i) {
    const pb::KernelSchedule& s = req.schedules(i);
    ASSIGN_OR_RETURN(std::string digest, kernel_named(s.digest(), plan, cat("schedules[", i, "]")));
    auto parsed = parse_loop_schedule(s.schedule());
    if (!parsed.ok()) return absl::InvalidArgumentError(cat("schedules[", i, "]: ", parsed.status().message()));
    if (!out.emplace(digest, parsed->str()).second)
      return absl::InvalidArgumentError(cat("schedules[", i, "]: kernel ", digest, " is given a schedule twice"));
  }
  return out;
}

// A profiled Run's answer (RunRequest.profile): the launches of each kernel on each
// device summed, with the rates its ABI's work estimate gives, slowest first; each launch
// also goes into uopd_kernel_seconds, by the kind of its device.
void fill_profile(const Plan& plan, const std::vector<CompiledKernel>& kernels,
                  const std::vector<RunOutcome::LaunchTime>& times, Metrics& metrics, pb::RunResponse* resp) {
  struct Sum {
    size_t kernel = 0;
    std::string device;
    uint64_t launches = 0;
    double ms = 0, flops = 0, bytes = 0;
  };
  std::vector<Sum> sums;
  absl::flat_hash_map<std::pair<std::string, std::string>, size_t> index;  // (cache key, device)
  for (const RunOutcome::LaunchTime& t : times) {
    const CompiledKernel& k = kernels.at(t.kernel);
    auto [it, fresh] = index.try_emplace(std::make_pair(k.key, t.device), sums.size());
    if (fresh) sums.push_back({t.kernel, t.device});
    Sum& s = sums[it->second];
    ++s.launches;
    s.ms += t.ms;
    if (k.abi.work) {
      std::vector<int64_t> vars;
      for (const KernelVar& v : k.abi.vars) {
        auto var = plan.vars.find(v.name);
        vars.push_back(var == plan.vars.end() ? 0 : var->second);
      }
      s.flops += static_cast<double>(k.abi.work->flops.eval(vars));
      s.bytes += static_cast<double>(k.abi.work->bytes.eval(vars));
    }
    metrics.kernel_seconds(backend_for_device(t.device).name, t.ms / 1000);
  }
  std::stable_sort(sums.begin(), sums.end(), [](const Sum& a, const Sum& b) { return a.ms > b.ms; });
  for (const Sum& s : sums) {
    const CompiledKernel& k = kernels[s.kernel];
    pb::KernelProfile* out = resp->add_profile();
    out->set_name(k.name);
    out->set_digest(k.digest.hex());
    out->set_device(s.device);
    out->set_launches(s.launches);
    out->set_total_ms(s.ms);
    out->set_per_launch_ms(s.ms / static_cast<double>(s.launches));
    out->set_flops(s.flops);
    out->set_bytes(s.bytes);
    // A launch too short for the clock has no rate, not an infinite one.
    if (s.ms > 0) {
      out->set_gflops(s.flops / (s.ms * 1e6));
      out->set_gbytes_per_s(s.bytes / (s.ms * 1e6));
    }
    out->set_schedule(k.abi.schedule_str());
  }
}

// The arch of the programs a device runs, as its worker reports it (Info's backend and
// target: "cuda", "sm_90"); "" (the target's default) when it reports another backend.
// UNAVAILABLE naming the device when no worker for it is up (a machine without a GPU),
// before anything is compiled for it.
absl::StatusOr<std::string> worker_arch(WorkerPool& pool, const std::string& device, const BackendKind& kind,
                                        absl::Time deadline) {
  auto w = pool.worker_for(device, absl::Seconds(5));
  if (!w.ok()) return absl::Status(w.status().code(), cat("device ", device, ": ", w.status().message()));
  auto stub = (*w)->stub();
  if (!stub) return absl::UnavailableError(cat("device ", device, ": ", (*w)->describe(), " is not up"));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(5))));
  ::uopd::worker::v1::InfoResponse info;
  grpc::Status st = stub->Info(&ctx, ::uopd::worker::v1::InfoRequest(), &info);
  if (st.ok() && info.backend() == kind.name && kind.make(info.target()).ok()) return info.target();
  return std::string();
}

// The name a graph gives node `u`, or "".
std::string name_of(const DecodedGraph& g, const UOp* u) {
  for (auto& [n, node] : g.names)
    if (node == u) return n;
  return "";
}

// elements x the dtype's width, saturating (a size past 2^64 is over every limit anyway).
uint64_t bytes_of(int64_t elements, Scalar dtype) {
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(elements, 0)), w = scalar_bytes(dtype);
  return w != 0 && n > UINT64_MAX / w ? UINT64_MAX : n * w;
}

// The compile pool's group for a request (task_queue.h): its tenant when tokens are on;
// else the host it comes from, so that one machine's many connections share one turn.
std::string compile_group(grpc::ServerContextBase* ctx, const Tenant& tenant, bool tenants) {
  if (tenants) return cat("tenant:", tenant.name());
  std::string peer = ctx->peer();  // "ipv4:127.0.0.1:41234", "ipv6:[::1]:41234", "unix:..."
  auto colon = peer.rfind(':');
  if (colon != std::string::npos && colon + 1 < peer.size() &&
      peer.find_first_not_of("0123456789", colon + 1) == std::string::npos)
    peer.resize(colon);
  return cat("host:", peer);
}

// Whom planning and compiling are for and until when: the group, then the connection
// (one flow per client), the request's deadline, and its client going away.
Requester requester(grpc::ServerContextBase* ctx, const Tenant& tenant, bool tenants, absl::Time deadline) {
  Requester who;
  who.owner = {compile_group(ctx, tenant, tenants), ctx->peer()};
  who.deadline = deadline;
  who.gone = [ctx] { return ctx->IsCancelled(); };
  return who;
}

// Counts a handler as in flight for its whole run.
class InFlight {
 public:
  explicit InFlight(std::atomic<uint64_t>& n) : n_(n) { ++n_; }
  ~InFlight() { --n_; }

 private:
  std::atomic<uint64_t>& n_;
};

// A Run's bindings: each names a BUFFER (or PARAM) node of the request's graph, which the
// plan knows by digest, and binds it to a session buffer on the right device or to an
// inline tensor of the right size (whose bytes move out of the request). Every input of a
// tensor-level graph must be bound.
struct RunInputs {
  absl::flat_hash_map<int, BoundInput> inputs;  // by plan buffer; points into the two below
  std::vector<BufferInfo> session_buffers;
  std::vector<HostTensor> tensors;
  uint64_t inline_bytes = 0;
};

absl::Status bind_run_inputs(SessionManager& sessions, uint64_t max_inline_bytes, const Plan& p, const DecodedGraph& g,
                             const std::string& device, const std::string& who, pb::RunRequest* req, RunInputs& in) {
  // No more bindings than the graph has buffers (what is kept per binding below is then
  // bounded by the graph, not by the request's count).
  if (static_cast<size_t>(req->inputs_size()) > p.buffers.size())
    return absl::InvalidArgumentError(cat(req->inputs_size(), " bindings for a graph with ", p.buffers.size(),
                                          " buffers; each binds one input"));
  in.session_buffers.resize(req->inputs_size());
  in.tensors.resize(req->inputs_size());
  for (int i = 0; i < req->inputs_size(); ++i) {
    const pb::Binding& bind = req->inputs(i);
    const UOp* node = nullptr;
    std::string label;
    if (bind.node_case() == pb::Binding::kName) {
      label = cat("'", bind.name(), "'");
      for (auto& [n, u] : g.names)
        if (n == bind.name()) node = u;
    } else if (bind.node_case() == pb::Binding::kIndex && bind.index() < g.nodes.size()) {
      label = cat("node ", bind.index());
      node = g.nodes[bind.index()];
    }
    if (!node) return absl::InvalidArgumentError(cat("binding ", i, ": the graph has no node ", label.empty() ? "named by it" : label));
    int buf = -1;
    for (size_t j = 0; j < p.buffers.size(); ++j)
      if (p.buffers[j].role != PlannedBuffer::Role::Intermediate && p.buffers[j].node == node->digest()) buf = static_cast<int>(j);
    if (buf < 0 || (!p.kernel_level && p.buffers[buf].role != PlannedBuffer::Role::Input))
      return absl::InvalidArgumentError(cat("binding ", i, ": ", label, " is not an input of the graph (a BUFFER it reads)"));
    const PlannedBuffer& pb_ = p.buffers[buf];
    if (bind.value_case() == pb::Binding::kBufferId) {
      auto b = sessions.buffer(req->session_id(), bind.buffer_id(), who);
      if (!b.ok()) return b.status();
      // A multi-device graph names each buffer's device; one device means the session's.
      const std::string& want = p.multi_device() && !pb_.device.empty() ? pb_.device : device;
      if (b->dtype != pb_.dtype || b->elements != static_cast<uint64_t>(pb_.elements) || b->device != want)
        return absl::InvalidArgumentError(cat("binding ", label, ": buffer ", b->id, " holds ", b->elements, " x ", scalar_name(b->dtype), " on ", b->device, "; the graph wants ", pb_.elements, " x ", scalar_name(pb_.dtype), " on ", want));
      in.session_buffers[i] = *b;
      in.inputs[buf].session_buffer = &in.session_buffers[i];
    } else if (bind.value_case() == pb::Binding::kTensor) {
      const pb::Tensor& t = bind.tensor();
      HostTensor& h = in.tensors[i];
      h.dtype = static_cast<Scalar>(t.dtype());
      h.shape = {static_cast<int64_t>(pb_.elements)};
      uint64_t want = static_cast<uint64_t>(pb_.elements) * scalar_bytes(pb_.dtype);
      if (h.dtype != pb_.dtype || t.data().size() != want)
        return absl::InvalidArgumentError(cat("binding ", label, ": an inline tensor of ", t.data().size(), " bytes of ", scalar_name(h.dtype), "; the graph wants ", pb_.elements, " x ", scalar_name(pb_.dtype), " (", want, " bytes)"));
      in.inline_bytes += want;
      if (in.inline_bytes > max_inline_bytes)
        return absl::ResourceExhaustedError(cat("inline tensors of one run: over the limit of ", max_inline_bytes, " bytes; upload buffers instead"));
      // The request's bytes move over: an inline input is held once.
      h.data.swap(*req->mutable_inputs(i)->mutable_tensor()->mutable_data());
      in.inputs[buf].tensor = &h;
    } else {
      return absl::InvalidArgumentError(cat("binding ", label, ": neither a buffer id nor a tensor"));
    }
  }
  if (!p.kernel_level)
    for (size_t j = 0; j < p.buffers.size(); ++j)
      if (p.buffers[j].role == PlannedBuffer::Role::Input && !in.inputs.contains(static_cast<int>(j)))
        return absl::InvalidArgumentError(cat("input ", j, " of the graph (", p.buffers[j].elements, " x ", scalar_name(p.buffers[j].dtype), ") is not bound"));
  return absl::OkStatus();
}

// The name of plan output `i` in a Run's answer: the graph's name of the output (SINK
// sources; PARAMs at kernel level), "out<i>" for an unnamed one, and "<name>@<device>"
// for each shard of a multi-device output.
std::string run_output_name(const Plan& p, const DecodedGraph& g, const std::vector<const UOp*>& out_nodes, size_t i) {
  size_t owner = i;
  std::string shard;
  for (size_t j = 0; j < p.output_parts.size(); ++j)
    for (size_t part : p.output_parts[j].parts)
      if (part == i) {
        owner = j;
        if (p.output_parts[j].parts.size() > 1) shard = cat("@", p.buffers[p.outputs[i].buffer].device);
      }
  std::string n = owner < out_nodes.size() ? name_of(g, out_nodes[owner]) : "";
  if (!shard.empty()) n = cat(n.empty() ? cat("out", owner) : n, shard);
  return n.empty() ? cat("out", i) : n;
}

// A held model's input or output on the wire.
void fill_tensor(const ModelTensorInfo& t, pb::ModelTensor* out) {
  out->set_name(t.name);
  out->set_dtype(static_cast<::uop::v1::DType::Scalar>(t.dtype));
  for (int64_t d : t.shape) out->add_shape(d);
}

}  // namespace

UopdService::UopdService(ServiceDeps deps)
    : d_(deps), inflight_(deps.limits.max_inflight_bytes), threads_(std::make_unique<HandlerThreads>(deps.limits.handler_threads)) {
  if (!d_.tenants) {
    own_tenants_ = Tenants::anonymous();
    d_.tenants = own_tenants_.get();
  }
  watchdog_ = std::thread([this] { watchdog(); });
}

UopdService::~UopdService() {
  {
    std::lock_guard<std::mutex> l(watch_mu_);
    stop_watchdog_ = true;
  }
  watch_cv_.notify_all();
  watchdog_.join();
}

absl::Time UopdService::deadline(grpc::ServerContextBase* ctx) const {
  absl::Time mine = absl::Now() + d_.limits.request_deadline;
  absl::Time theirs = absl::FromChrono(ctx->deadline());
  return std::min(mine, theirs);
}

absl::StatusOr<Tenant*> UopdService::admit(grpc::ServerContextBase* ctx) {
  if (draining_) return absl::UnavailableError("uopd is shutting down: retry on another scheduler, or once it is back");
  std::vector<std::string_view> auth;
  auto range = ctx->client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) auth.emplace_back(it->second.data(), it->second.size());
  return d_.tenants->admit(auth, absl::Now());
}

grpc::Status UopdService::finish(std::string_view method, const absl::Status& s) {
  InFlight in_flight(in_flight_);
  d_.metrics->request(method, s.code());
  return to_grpc(s);
}

void UopdService::bytes_in(uint64_t n) {
  d_.metrics->bytes_in(n);
  bytes_uploaded_.fetch_add(n, std::memory_order_relaxed);
}

void UopdService::free_buffers(const std::vector<BufferInfo>& buffers) {
  // By the worker that allocated them: with tenant isolation, a device has a process per
  // tenant, and a buffer's is the one named in it.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> by_worker;
  for (const BufferInfo& b : buffers) by_worker[b.worker_id].push_back(b.worker_buffer);
  for (auto& [id, ids] : by_worker) {
    auto w = d_.workers->worker_by_id(id);
    if (w && w->stub()) (void)d_.executor->free(w, ids);  // a restarted worker has nothing to free
  }
}

grpc::Status UopdService::CreateSession(grpc::ServerContext* ctx, const pb::CreateSessionRequest* req,
                                        pb::CreateSessionResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("CreateSession", tenant.status());
  const std::string& who = (*tenant)->name();
  std::vector<std::string> devices(req->devices().begin(), req->devices().end());
  if (devices.empty()) devices.push_back("CPU:0");
  for (const std::string& dev : devices) {
    auto w = d_.workers->worker_for(dev, absl::Seconds(5), who);
    if (!w.ok()) return finish("CreateSession", absl::Status(w.status().code(), cat("device ", dev, ": ", w.status().message())));
  }
  const TenantQuota& q = (*tenant)->quota();
  auto id = d_.sessions->open(devices, absl::Milliseconds(req->idle_timeout_ms()), SessionOwner{who, q.max_sessions, q.max_bytes});
  if (!id.ok()) {
    (*tenant)->count_rejection("sessions");
    return finish("CreateSession", id.status());
  }
  resp->set_session_id(*id);
  for (const std::string& dev : devices) resp->add_devices(dev);
  return finish("CreateSession", absl::OkStatus());
}

grpc::Status UopdService::CloseSession(grpc::ServerContext* ctx, const pb::CloseSessionRequest* req,
                                       pb::CloseSessionResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("CloseSession", tenant.status());
  const std::string& who = (*tenant)->name();
  auto buffers = d_.sessions->close(req->session_id(), who);
  if (!buffers.ok()) return finish("CloseSession", buffers.status());
  free_buffers(*buffers);
  resp->set_buffers_freed(buffers->size());
  return finish("CloseSession", absl::OkStatus());
}

absl::StatusOr<std::vector<std::string>> UopdService::devices_for(const std::string& session, const std::string& who,
                                                                  const std::string& device) {
  if (!device.empty()) {
    auto known = d_.sessions->devices(session, who);
    if (!known.ok()) return known.status();
    if (std::find(known->begin(), known->end(), device) == known->end()) {
      auto w = d_.workers->worker_for(device, absl::Seconds(5), who);
      if (!w.ok()) return absl::Status(w.status().code(), cat("device ", device.substr(0, 64), ": ", w.status().message()));
    }
  }
  return d_.sessions->use_device(session, device, who);
}

grpc::Status UopdService::CreateBuffer(grpc::ServerContext* ctx, const pb::CreateBufferRequest* req,
                                       pb::CreateBufferResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("CreateBuffer", tenant.status());
  const std::string& who = (*tenant)->name();
  auto devices = devices_for(req->session_id(), who, req->device());
  if (!devices.ok()) return finish("CreateBuffer", devices.status());
  const std::string device = devices->front();
  auto scalar = static_cast<Scalar>(req->dtype());
  if (req->dtype() <= 0 || req->dtype() >= kNumScalars || scalar_bytes(scalar) == 0)
    return finish("CreateBuffer", absl::InvalidArgumentError(cat("dtype ", static_cast<int>(req->dtype()), " is not a value type")));
  if (req->elements() > (uint64_t{1} << 40))
    return finish("CreateBuffer", absl::InvalidArgumentError(cat("a buffer of ", req->elements(), " elements is too large")));
  auto w = d_.workers->worker_for(device, absl::Seconds(10), who);
  if (!w.ok()) return finish("CreateBuffer", w.status());
  BufferInfo b;
  b.device = device;
  b.dtype = scalar;
  b.elements = req->elements();
  b.bytes = req->elements() * scalar_bytes(scalar);
  b.worker_buffer = Executor::new_buffer_id(*w);
  b.worker_id = (*w)->id();
  b.worker_generation = (*w)->generation();
  auto id = d_.sessions->add_buffer(req->session_id(), b, who);  // the quota check comes first
  if (!id.ok()) {
    if (id.status().code() == absl::StatusCode::kResourceExhausted) (*tenant)->count_rejection("bytes");
    return finish("CreateBuffer", id.status());
  }
  if (absl::Status s = d_.executor->alloc(*w, b.worker_buffer, b.bytes, deadline(ctx)); !s.ok()) {
    (void)d_.sessions->remove_buffer(req->session_id(), *id, who);
    return finish("CreateBuffer", s);
  }
  resp->set_buffer_id(*id);
  resp->set_bytes(b.bytes);
  return finish("CreateBuffer", absl::OkStatus());
}

// A sync stream as the watchdog sees it: a Download whose client stops reading leaves
// the handler's Write blocked in flow control, a LoadModel whose client stops sending
// leaves its Read blocked, and only cancelling the call (TryCancel, from the watchdog's
// thread) releases it; so does one past its deadline. `what` and `idle` name the call
// and what its client stopped doing in the messages.
class UopdService::DownloadWatch final : public WatchedStream {
 public:
  DownloadWatch(UopdService* svc, grpc::ServerContext* ctx, absl::Time deadline, std::string what = "download",
                std::string idle = "read nothing")
      : svc_(svc), ctx_(ctx), deadline_(deadline), what_(std::move(what)), idle_(std::move(idle)),
        last_write_(absl::ToUnixNanos(absl::Now())) {
    svc_->watch(this);
  }
  ~DownloadWatch() override { svc_->unwatch(this); }
  void progress() { last_write_ = absl::ToUnixNanos(absl::Now()); }
  void check(absl::Time now) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!why_.ok()) return;
    if (now > deadline_)
      why_ = absl::DeadlineExceededError(cat(what_, ": the request deadline passed (the client's, or --request-deadline-s)"));
    else if (now - absl::FromUnixNanos(last_write_.load()) > svc_->d_.limits.stream_idle_timeout)
      why_ = absl::DeadlineExceededError(cat(what_, ": the client ", idle_, " for ",
                                             absl::FormatDuration(svc_->d_.limits.stream_idle_timeout),
                                             " (--stream-idle-timeout-s); the ", what_, " is ended"));
    else
      return;
    ctx_->TryCancel();
  }
  // Why the watchdog ended the call; OK if it did not.
  absl::Status why() {
    std::lock_guard<std::mutex> l(mu_);
    return why_;
  }

 private:
  UopdService* svc_;
  grpc::ServerContext* ctx_;
  const absl::Time deadline_;
  const std::string what_, idle_;
  std::atomic<int64_t> last_write_;
  std::mutex mu_;
  absl::Status why_;
};

grpc::Status UopdService::Download(grpc::ServerContext* ctx, const pb::DownloadRequest* req,
                                   grpc::ServerWriter<pb::DownloadChunk>* writer) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("Download", tenant.status());
  const std::string& who = (*tenant)->name();
  auto b = d_.sessions->buffer(req->session_id(), req->buffer_id(), who);
  if (!b.ok()) return finish("Download", b.status());
  if (req->offset() > b->bytes) return finish("Download", absl::OutOfRangeError(cat("download: offset ", req->offset(), " is past the end of buffer ", b->id, " (", b->bytes, " bytes)")));
  uint64_t length = req->length() == 0 ? b->bytes - req->offset() : req->length();
  if (length > b->bytes - req->offset()) return finish("Download", absl::OutOfRangeError(cat("download: ", length, " bytes from ", req->offset(), " pass the end of buffer ", b->id, " (", b->bytes, " bytes)")));
  auto w = d_.workers->worker_for(b->device, absl::Seconds(10), who);
  if (!w.ok()) return finish("Download", w.status());
  if ((*w)->id() != b->worker_id || (*w)->generation() != b->worker_generation)
    return finish("Download", absl::UnavailableError(cat("buffer ", b->id, " was held by worker ", b->worker_id, ", which restarted since; its contents are lost")));
  uint64_t sent = 0;
  pb::DownloadChunk c;  // reused: its buffer and the worker chunk's go back and forth
  DownloadWatch watch(this, ctx, deadline(ctx));
  absl::Status s = d_.executor->read_into(*w, b->worker_buffer, req->offset(), length, deadline(ctx),
                                          [&](uint64_t offset, std::string& data) {
                                            c.set_offset(offset);
                                            // The worker's chunk becomes the client's: the
                                            // two strings trade buffers, nothing is copied.
                                            c.mutable_data()->swap(data);
                                            sent += c.data().size();
                                            if (!writer->Write(c)) return false;
                                            watch.progress();
                                            return true;
                                          });
  d_.metrics->bytes_out(sent);
  if (absl::Status ended = watch.why(); !ended.ok()) return finish("Download", ended);
  if (ctx->IsCancelled()) return finish("Download", absl::CancelledError("download: the client went away"));
  return finish("Download", s);
}

grpc::Status UopdService::FreeBuffer(grpc::ServerContext* ctx, const pb::FreeBufferRequest* req, pb::FreeBufferResponse*) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("FreeBuffer", tenant.status());
  const std::string& who = (*tenant)->name();
  auto b = d_.sessions->remove_buffer(req->session_id(), req->buffer_id(), who);
  if (!b.ok()) return finish("FreeBuffer", b.status());
  free_buffers({*b});
  return finish("FreeBuffer", absl::OkStatus());
}

grpc::Status UopdService::Compile(grpc::ServerContextBase* ctx, const pb::CompileRequest* req, pb::CompileResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("Compile", tenant.status());
  // Every target compiles here (a CUDA one with NVRTC, GPU or not).
  auto backend = d_.planner->backend(req->target().backend(), req->target().arch());
  if (!backend.ok()) return finish("Compile", backend.status());
  auto decoded = decode_proto(req->graph(), d_.limits.decode);
  if (!decoded.ok()) return finish("Compile", decoded.status());
  auto g = std::make_shared<const DecodedGraph>(std::move(*decoded));
  auto slot = (*tenant)->begin_compile();
  if (!slot.ok()) return finish("Compile", slot.status());
  const Requester whom = requester(ctx, **tenant, d_.tenants->enabled(), deadline(ctx));
  bool cached = false;
  auto plan = d_.planner->plan(g, &cached, (*tenant)->cache_namespace(), whom);
  if (!plan.ok()) return finish("Compile", plan.status());
  auto schedules = schedules_of(*req, **plan);
  if (!schedules.ok()) return finish("Compile", schedules.status());
  auto kernels = d_.planner->compile(**plan, *backend, (*tenant)->cache_namespace(), whom, *schedules);
  if (!kernels.ok()) return finish("Compile", kernels.status());
  absl::flat_hash_set<std::string> seen;
  for (const CompiledKernel& k : *kernels) {
    if (!seen.insert(k.key).second) continue;
    if (k.outcome == CacheOutcome::Miss) d_.metrics->compile_seconds(k.compile_ms / 1000);
    fill_kernel(k, req->include_binary(), req->include_source(), resp->add_kernels());
  }
  resp->set_graph_digest((*plan)->graph.hex());
  resp->set_plan_cached(cached);
  return finish("Compile", absl::OkStatus());
}

grpc::Status UopdService::Tune(grpc::ServerContextBase* ctx, const pb::TuneRequest* req, pb::TuneResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("Tune", tenant.status());
  if (!d_.tuner) return finish("Tune", absl::FailedPreconditionError("this uopd has no schedule search"));
  if (req->width() > 64) return finish("Tune", absl::InvalidArgumentError(cat("width ", req->width(), ": at most 64")));
  auto decoded = decode_proto(req->graph(), d_.limits.decode);
  if (!decoded.ok()) return finish("Tune", decoded.status());
  auto g = std::make_shared<const DecodedGraph>(std::move(*decoded));
  // A search holds one of the tenant's compile slots while it runs: it compiles.
  auto slot = (*tenant)->begin_compile();
  if (!slot.ok()) return finish("Tune", slot.status());
  const Requester whom = requester(ctx, **tenant, d_.tenants->enabled(), deadline(ctx));
  bool cached = false;
  auto plan = d_.planner->plan(g, &cached, (*tenant)->cache_namespace(), whom);
  if (!plan.ok()) return finish("Tune", plan.status());
  auto digest = kernel_named(req->digest(), **plan, "digest");
  if (!digest.ok()) return finish("Tune", digest.status());
  size_t index = 0;
  while ((*plan)->kernels[index].digest.hex() != *digest) ++index;
  auto r = d_.tuner->tune(**plan, index, "CPU:0", (*tenant)->name(), (*tenant)->cache_namespace(), whom,
                          static_cast<int>(req->width()), absl::Seconds(req->budget_s()));
  if (!r.ok()) return finish("Tune", r.status());
  resp->set_name(r->name);
  resp->set_digest(r->digest.hex());
  resp->set_heuristic_schedule(r->heuristic);
  resp->set_schedule(r->schedule);
  resp->set_before_ms(r->before_ms);
  resp->set_after_ms(r->after_ms);
  resp->set_from_record(r->from_record);
  resp->set_skipped(r->skipped);
  resp->set_candidates_timed(r->candidates_timed);
  resp->set_dropped_compile(r->dropped_compile);
  resp->set_dropped_mismatch(r->dropped_mismatch);
  resp->set_dropped_crash(r->dropped_crash);
  resp->set_dropped_timeout(r->dropped_timeout);
  resp->set_seconds(r->seconds);
  return finish("Tune", absl::OkStatus());
}

grpc::Status UopdService::Run(grpc::ServerContextBase* ctx, pb::RunRequest* req, pb::RunResponse* resp, ByteBudget::Hold& held) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("Run", tenant.status());
  auto devices = devices_for(req->session_id(), (*tenant)->name(), req->device());
  if (!devices.ok()) return finish("Run", devices.status());
  auto g = run_request_graph(**tenant, req);
  if (!g.ok()) return finish("Run", g.status());
  return finish("Run", run_graph(ctx, **tenant, *devices, *std::move(g), req, resp, held));
}

absl::StatusOr<std::shared_ptr<const DecodedGraph>> UopdService::run_request_graph(Tenant& tenant, pb::RunRequest* req) {
  if (!req->graph_digest().empty()) {
    if (req->has_graph() || req->hold_graph())
      return absl::InvalidArgumentError("a Run sends its graph or names a held one by graph_digest, not both");
    return d_.sessions->held_graph(req->session_id(), req->graph_digest(), tenant.name());
  }
  const uint64_t bytes = req->graph().ByteSizeLong();
  run_graph_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  ASSIGN_OR_RETURN(DecodedGraph decoded, decode_proto(req->graph(), d_.limits.decode));
  auto g = std::make_shared<const DecodedGraph>(std::move(decoded));
  if (req->hold_graph()) {
    // Digests memoize on first use, without a lock: computed here, before the Runs that
    // name the graph share it (as a held model's).
    compute_digests(g->root);
    RETURN_IF_ERROR(d_.sessions->hold_graph(req->session_id(), g->root->digest().hex(), g, bytes, tenant.name()));
  }
  return g;
}

absl::StatusOr<std::vector<std::string>> UopdService::check_assign(const Plan& p, const std::string& device,
                                                                   const std::string& who, const pb::RunRequest& req,
                                                                   std::vector<bool>& keep) {
  std::vector<std::string> to(p.outputs.size());
  // A kernel-level graph writes its outputs in the session buffers bound to them: assigning
  // one would swap a buffer's memory for itself and free it.
  if (p.kernel_level && req.assign_size() > 0)
    return absl::InvalidArgumentError("assign: a kernel-level graph writes its outputs in the buffers bound to them; assign is for tensor-level graphs");
  absl::flat_hash_set<std::string> buffers;
  for (int k = 0; k < req.assign_size(); ++k) {
    const pb::OutputAssign& a = req.assign(k);
    if (a.output() >= p.outputs.size())
      return absl::InvalidArgumentError(cat("assign ", k, ": output ", a.output(), " of a graph with ", p.outputs.size(), " outputs"));
    if (!to[a.output()].empty()) return absl::InvalidArgumentError(cat("assign ", k, ": output ", a.output(), " is assigned twice"));
    if (!buffers.insert(a.buffer_id()).second)
      return absl::InvalidArgumentError(cat("assign ", k, ": buffer '", a.buffer_id().substr(0, 64), "' is assigned twice"));
    ASSIGN_OR_RETURN(BufferInfo b, d_.sessions->buffer(req.session_id(), a.buffer_id(), who), cat("assign ", k, ": "));
    const PlannedOutput& o = p.outputs[a.output()];
    const PlannedBuffer& pb_ = p.buffers[o.buffer];
    const std::string& want = p.multi_device() && !pb_.device.empty() ? pb_.device : device;
    if (b.dtype != o.dtype || b.elements != static_cast<uint64_t>(pb_.elements) || b.device != want)
      return absl::InvalidArgumentError(cat("assign ", k, ": buffer ", b.id, " holds ", b.elements, " x ", scalar_name(b.dtype),
                                            " on ", b.device, "; output ", a.output(), " is ", pb_.elements, " x ",
                                            scalar_name(o.dtype), " on ", want));
    to[a.output()] = a.buffer_id();
    keep[a.output()] = true;
  }
  return to;
}

absl::Status UopdService::run_graph(grpc::ServerContextBase* ctx, Tenant& tenant, const std::vector<std::string>& devices,
                                    std::shared_ptr<const DecodedGraph> g, pb::RunRequest* req, pb::RunResponse* resp,
                                    ByteBudget::Hold& held) {
  const std::string& who = tenant.name();
  // Held while planning and compiling, not while running.
  std::optional<Tenant::CompileSlot> compiling;
  {
    auto slot = tenant.begin_compile();
    if (!slot.ok()) return slot.status();
    compiling.emplace(std::move(*slot));
  }
  const Requester whom = requester(ctx, tenant, d_.tenants->enabled(), deadline(ctx));
  auto t0 = std::chrono::steady_clock::now();
  bool cached = false;
  auto plan = d_.planner->plan(g, &cached, tenant.cache_namespace(), whom);
  if (!plan.ok()) return plan.status();
  const Plan& p = **plan;
  resp->set_plan_ms(ms_since(t0));

  RunInputs in;
  RETURN_IF_ERROR(bind_run_inputs(*d_.sessions, d_.limits.max_inline_bytes, p, *g, devices.front(), who, req, in));

  // Outputs come back inline up to --max-inline-output-bytes, in order; the others stay
  // in the session as buffers (the client downloads and frees them), so the answer, held
  // here until it is sent, stays bounded whatever the graph computes.
  // A kernel-level output bound to a session buffer is that buffer, written in place:
  // kept, it is answered by the buffer's own id, never by a second id for the same memory
  // (freeing which would free the first); not kept, it comes back inline or the Run is
  // refused, since the client's download-and-free of an output kept past the limit would
  // free the caller's buffer.
  auto bound = [&](size_t i) -> const BufferInfo* {
    if (!p.kernel_level) return nullptr;
    auto it = in.inputs.find(p.outputs[i].buffer);
    return it != in.inputs.end() ? it->second.session_buffer : nullptr;
  };
  std::vector<bool> keep(p.outputs.size(), req->keep_outputs());
  uint64_t inline_out = 0;
  for (size_t i = 0; i < p.outputs.size() && !req->keep_outputs(); ++i) {
    const uint64_t bytes = bytes_of(p.buffers[p.outputs[i].buffer].elements, p.outputs[i].dtype);
    if (bytes <= d_.limits.max_inline_output_bytes - inline_out) inline_out += bytes;
    else if (const BufferInfo* b = bound(i))
      return absl::ResourceExhaustedError(cat("Run: output ", i, " is bound buffer ", b->id, " and past the ", d_.limits.max_inline_output_bytes,
                                              " bytes of inline outputs (--max-inline-output-bytes); ask for keep_outputs"));
    else keep[i] = true;
  }
  RETURN_IF_ERROR(held.grow(inline_out, "Run: its inline outputs"));
  ASSIGN_OR_RETURN(std::vector<std::string> assign_to, check_assign(p, devices.front(), who, *req, keep));
  // A copy between devices passes through the scheduler, one at a time.
  uint64_t copy_bytes = 0;
  for (const PlannedCopy& c : p.copies)
    copy_bytes = std::max(copy_bytes, bytes_of(std::min(p.buffers[c.src].elements, p.buffers[c.dst].elements), p.buffers[c.src].dtype));
  RETURN_IF_ERROR(held.grow(copy_bytes, "Run: a copy between devices"));
  // What the run allocates on the workers counts against the session's and the tenant's
  // byte quotas while it runs; kept outputs stay counted as the session's buffers.
  auto reserving = d_.sessions->reserve(req->session_id(), Executor::run_bytes(p, in.inputs),
                                        "for the run's intermediates, inline inputs and outputs", who);
  if (!reserving.ok()) {
    if (reserving.status().code() == absl::StatusCode::kResourceExhausted) tenant.count_rejection("bytes");
    return reserving.status();
  }
  SessionManager::Reservation& reserved = *reserving;

  // Where each kernel runs (as the executor places it) and so what it is compiled for:
  // the target whose code its device runs, for the arch that device's worker reports (the
  // CPU's is this machine's).
  std::vector<std::shared_ptr<const Backend>> per_kernel(p.kernels.size());
  {
    absl::flat_hash_map<std::string, std::shared_ptr<const Backend>> of_device;
    for (size_t i = 0; i < p.kernels.size(); ++i) {
      const PlannedKernel& pk = p.kernels[i];
      std::string dev = devices.front();
      if (p.multi_device()) {
        const std::string& named = pk.buffers.empty() ? pk.device : p.buffers[pk.buffers[0]].device;
        if (!named.empty()) dev = named;
      }
      auto it = of_device.find(dev);
      if (it == of_device.end()) {
        const BackendKind& kind = backend_for_device(dev);
        std::string arch;
        if (kind.name != d_.planner->host()->name()) {
          auto reported = worker_arch(*d_.workers, dev, kind, deadline(ctx));
          if (!reported.ok()) return reported.status();
          arch = *reported;
        }
        auto backend = d_.planner->backend(kind.name, arch);
        if (!backend.ok()) return backend.status();
        it = of_device.emplace(dev, *backend).first;
      }
      per_kernel[i] = it->second;
    }
  }
  t0 = std::chrono::steady_clock::now();
  auto shared = d_.planner->compile_shared(p, per_kernel, tenant.cache_namespace(), whom);
  compiling.reset();
  if (!shared.ok()) return shared.status();
  const std::vector<CompiledKernel>* kernels = shared->get();
  resp->set_compile_ms(ms_since(t0));
  for (const CompiledKernel& k : *kernels) {
    if (k.outcome == CacheOutcome::Miss) d_.metrics->compile_seconds(k.compile_ms / 1000);
    fill_kernel(k, false, false, resp->add_kernels(), /*abi=*/false);
  }

  auto outcome = d_.executor->run(devices.front(), who, p, *kernels, in.inputs, keep, deadline(ctx), req->profile());
  if (!outcome.ok()) return outcome.status();
  // --search=beam: kernels without a tuning record are searched in the background.
  if (d_.tuner) d_.tuner->after_run(*plan, devices.front(), who, tenant.cache_namespace());
  if (req->profile()) fill_profile(p, *kernels, outcome->launch_times, *d_.metrics, resp);
  d_.metrics->kernels_run(outcome->kernels_run);
  kernels_run_ += outcome->kernels_run;
  bytes_in(in.inline_bytes);
  resp->set_run_ms(outcome->run_ms);
  resp->set_collective_ms(outcome->collective_ms);
  resp->set_device(devices.front());
  resp->set_graph_digest(g->root->digest().hex());

  // Output names: the graph's names of the outputs (SINK sources; PARAMs at kernel level).
  std::vector<const UOp*> out_nodes;
  if (p.kernel_level) {
    out_nodes = kernel_graph_params(g->root);
  } else {
    out_nodes.assign(g->root->src().begin(), g->root->src().end());
  }
  // Assigned outputs take the place of their buffers' old contents, which go without a
  // wait (the next Run does not need them); one whose buffer was freed meanwhile is freed
  // too, and so is every kept output after it.
  absl::Status assigned = absl::OkStatus();
  std::vector<bool> placed(p.outputs.size(), false);
  std::map<std::pair<std::string, uint64_t>, std::vector<uint64_t>> retired;  // by worker process
  for (size_t i = 0; i < p.outputs.size() && assigned.ok(); ++i) {
    if (assign_to[i].empty()) continue;
    auto old = d_.sessions->replace_buffer(req->session_id(), assign_to[i], outcome->kept[i], who);
    if (!old.ok()) {
      assigned = absl::Status(old.status().code(), cat("assigning output ", i, ": ", old.status().message()));
      break;
    }
    placed[i] = true;
    retired[{old->worker_id, old->worker_generation}].push_back(old->worker_buffer);
  }
  for (const auto& [process, ids] : retired)
    if (auto w = d_.workers->worker_by_id(process.first)) d_.executor->free_later(w, process.second, ids);
  if (!assigned.ok()) {
    std::vector<BufferInfo> rest;
    for (size_t j = 0; j < p.outputs.size(); ++j)
      if (keep[j] && !placed[j]) rest.push_back(outcome->kept[j]);
    free_buffers(rest);
    return assigned;
  }
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    pb::Output* o = resp->add_outputs();
    o->set_name(run_output_name(p, *g, out_nodes, i));
    const std::string& on = p.multi_device() ? p.buffers[p.outputs[i].buffer].device : "";
    o->set_device(on.empty() ? devices.front() : on);
    o->set_dtype(static_cast<::uop::v1::DType::Scalar>(p.outputs[i].dtype));
    for (int64_t d : p.outputs[i].shape) o->add_shape(d);
    if (keep[i] && bound(i)) {
      o->set_buffer_id(bound(i)->id);
    } else if (!assign_to[i].empty()) {
      o->set_buffer_id(assign_to[i]);
    } else if (keep[i]) {
      auto id = d_.sessions->add_buffer(req->session_id(), outcome->kept[i], who, &reserved);
      if (!id.ok()) {
        std::vector<BufferInfo> rest;
        for (size_t j = i; j < p.outputs.size(); ++j)
          if (keep[j] && !bound(j) && assign_to[j].empty()) rest.push_back(outcome->kept[j]);
        free_buffers(rest);
        return id.status();
      }
      o->set_buffer_id(*id);
    } else {
      d_.metrics->bytes_out(outcome->outputs[i].data.size());
      o->set_data(std::move(outcome->outputs[i].data));
    }
  }
  return absl::OkStatus();
}

grpc::Status UopdService::Explain(grpc::ServerContextBase* ctx, const pb::ExplainRequest* req, pb::ExplainResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("Explain", tenant.status());
  // The target's lowering, render and compile (where its compiler loads here).
  ExplainOptions opts;
  auto backend = d_.planner->backend(req->target().backend(), req->target().arch());
  if (!backend.ok()) return finish("Explain", backend.status());
  opts.backend = *backend;
  opts.only = req->stage();
  if (absl::Status s = check_stage_name(opts.only); !s.ok()) return finish("Explain", s);
  auto decoded = decode_proto(req->graph(), d_.limits.decode);
  if (!decoded.ok()) return finish("Explain", decoded.status());
  auto g = std::make_shared<const DecodedGraph>(std::move(*decoded));
  // Explain compiles what Compile would: the same compile slot, pool and bounds.
  auto slot = (*tenant)->begin_compile();
  if (!slot.ok()) return finish("Explain", slot.status());
  auto stages = d_.planner->explain(g, opts, requester(ctx, **tenant, d_.tenants->enabled(), deadline(ctx)));
  if (!stages.ok()) return finish("Explain", stages.status());
  for (ExplainedStage& st : *stages) {
    auto* s = resp->add_stages();
    s->set_name(std::move(st.name));
    s->set_kernel(std::move(st.kernel));
    s->set_text(std::move(st.text));
  }
  return finish("Explain", absl::OkStatus());
}

grpc::Status UopdService::Stats(grpc::ServerContext* ctx, const pb::StatsRequest*, pb::StatsResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("Stats", tenant.status());
  const std::string& who = (*tenant)->name();
  for (auto& [tier, st] : d_.cache->stats()) {
    if (tier == "memory") resp->set_cache_hits_memory(st.hits);
    if (tier == "disk") resp->set_cache_hits_disk(st.hits);
    if (tier == "redis") resp->set_cache_hits_redis(st.hits);
    resp->set_cache_errors(resp->cache_errors() + st.errors + st.put_errors);
  }
  resp->set_compiles(d_.cache->computes());
  resp->set_cache_misses(d_.cache->computes());
  resp->set_cache_coalesced(d_.cache->coalesced());
  resp->set_plan_cache_hits(d_.planner->plan_hits());
  resp->set_kernels_run(kernels_run_.load());
  const Executor::ExecuteCounts executes = d_.executor->execute_counts();
  resp->set_worker_executes_lane(executes.lane);
  resp->set_worker_executes_grpc(executes.grpc);
  resp->set_launches_timed(d_.executor->launches_timed());
  resp->set_plan_cache_misses(d_.planner->plan_misses());
  if (d_.tenants->enabled()) {  // a tenant counts its own sessions and compile tasks only
    TenantUsage u = d_.sessions->usage(who);
    resp->set_sessions(u.sessions);
    resp->set_buffers(u.buffers);
    resp->set_buffer_bytes(u.bytes);
    const std::string group = compile_group(ctx, **tenant, true);
    resp->set_compile_queue_depth(d_.planner->compile_queue_depth(group));
    resp->set_compile_tasks_running(d_.planner->compile_tasks_running(group));
  } else {
    resp->set_compile_queue_depth(d_.planner->compile_queue_depth());
    resp->set_compile_tasks_running(d_.planner->compile_tasks_running());
    resp->set_sessions(d_.sessions->sessions());
    resp->set_buffers(d_.sessions->buffers());
    resp->set_buffer_bytes(d_.sessions->bytes());
  }
  resp->set_compiles_in_progress((*tenant)->compiles_running());
  resp->set_model_weight_buffers_written(weight_buffers_written_.load());
  resp->set_model_weight_bytes_written(weight_bytes_written_.load());
  resp->set_bytes_uploaded(bytes_uploaded_.load());
  resp->set_run_graph_bytes(run_graph_bytes_.load());
  resp->set_compiler_build_id(compiler_build_id());
  if (d_.tuner) {
    const TunerStats t = d_.tuner->stats();
    resp->set_searches(t.searches);
    resp->set_candidates_timed(t.candidates_timed);
    resp->set_candidates_dropped_compile(t.dropped_compile);
    resp->set_candidates_dropped_mismatch(t.dropped_mismatch);
    resp->set_candidates_dropped_crash(t.dropped_crash);
    resp->set_candidates_dropped_timeout(t.dropped_timeout);
    resp->set_leases_held_elsewhere(t.leases_held_elsewhere);
    resp->set_leases_lost(t.leases_lost);
    for (const auto& [tier, n] : t.record_hits) {
      if (tier == "memory") resp->set_tuning_records_memory(n);
      if (tier == "disk") resp->set_tuning_records_disk(n);
      if (tier == "redis") resp->set_tuning_records_redis(n);
    }
    resp->set_tuning_record_misses(t.record_misses);
    resp->set_tuning_record_errors(t.record_errors);
    resp->set_tuning_records_written(t.records_written);
    resp->set_search(search_mode_name(d_.tuner->options()));
  } else {
    resp->set_search("off");
  }
  // Tenants see what a device is doing, not where its worker is: addresses, pids and the
  // last error (which names both) are the operator's. Without a tokens file there is one
  // tenant, the operator's own, and reaching a worker takes its secret anyway.
  const bool operator_view = !d_.tenants->enabled();
  for (const auto& w : d_.workers->snapshot()) {
    if (!w.tenant.empty() && w.tenant != who) continue;  // another tenant's own process
    pb::WorkerStatus* ws = resp->add_workers();
    ws->set_id(w.id);
    ws->set_device(w.device);
    ws->set_state(w.state);
    ws->set_restarts(w.restarts);
    if (!operator_view) continue;
    ws->set_address(w.address);
    ws->set_pid(w.pid);
    ws->set_last_error(w.last_error);
  }
  return finish("Stats", absl::OkStatus());
}

// --- Models held by the server (server/models.h)

absl::StatusOr<std::string> UopdService::buffer_with(Tenant& tenant, const std::string& session, const std::string& device,
                                                     const HostTensor& data, absl::Time deadline) {
  const std::string& who = tenant.name();
  ASSIGN_OR_RETURN(auto w, d_.workers->worker_for(device, absl::Seconds(10), who));
  BufferInfo b;
  b.device = device;
  b.dtype = data.dtype;
  b.elements = static_cast<uint64_t>(data.numel());
  b.bytes = data.data.size();
  b.worker_buffer = Executor::new_buffer_id(w);
  b.worker_id = w->id();
  b.worker_generation = w->generation();
  auto id = d_.sessions->add_buffer(session, b, who);  // the quota check comes first
  if (!id.ok()) {
    if (id.status().code() == absl::StatusCode::kResourceExhausted) tenant.count_rejection("bytes");
    return id.status();
  }
  absl::Status s = d_.executor->alloc(w, b.worker_buffer, b.bytes, deadline);
  if (s.ok()) {
    s = d_.executor->write(w, b.worker_buffer, 0, data.data, deadline);
    if (!s.ok()) free_buffers({b});
  }
  if (!s.ok()) {
    (void)d_.sessions->remove_buffer(session, *id, who);
    return s;
  }
  return *id;
}

grpc::Status UopdService::LoadModel(grpc::ServerContext* ctx, grpc::ServerReader<pb::LoadModelChunk>* reader,
                                    pb::LoadModelResponse* resp) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("LoadModel", tenant.status());
  const std::string& who = (*tenant)->name();
  auto t0 = std::chrono::steady_clock::now();
  // The model's bytes as they arrive, held against the request's and the server's budget
  // before they are kept; past the encoded-graph limit the stream is refused unread.
  ByteBudget::Hold held = inflight_.hold(d_.limits.max_request_memory);
  const uint64_t max_model = d_.limits.decode.max_bytes;
  std::string bytes, session;
  std::map<std::string, std::vector<int64_t>> shapes;
  pb::LoadModelChunk c;
  bool first = true;
  DownloadWatch watch(this, ctx, deadline(ctx), "LoadModel", "sent nothing");
  while (reader->Read(&c)) {
    watch.progress();
    if (first) {
      session = c.session_id();
      auto devices = d_.sessions->devices(session, who);
      if (!devices.ok()) return finish("LoadModel", devices.status());
      if (static_cast<uint64_t>(c.input_shapes_size()) > d_.limits.decode.max_vector_width)
        return finish("LoadModel", absl::InvalidArgumentError(cat("LoadModel: ", c.input_shapes_size(), " input shapes; the limit is ", d_.limits.decode.max_vector_width)));
      for (const auto& s : c.input_shapes()) shapes[s.name()] = {s.shape().begin(), s.shape().end()};
      first = false;
    } else if (!c.session_id().empty() || c.input_shapes_size() > 0) {
      return finish("LoadModel", absl::InvalidArgumentError("LoadModel: only the first chunk names the session and input shapes"));
    }
    if (c.data().size() > max_model - bytes.size())
      return finish("LoadModel", absl::ResourceExhaustedError(cat("LoadModel: the model is larger than ", max_model,
                                                                  " bytes, the limit of an encoded graph (--max-request-bytes)")));
    if (absl::Status s = held.grow(c.data().size(), "LoadModel: receiving the model"); !s.ok()) return finish("LoadModel", s);
    bytes.append(c.data());
    c.Clear();
  }
  if (absl::Status ended = watch.why(); !ended.ok()) return finish("LoadModel", ended);
  if (ctx->IsCancelled()) return finish("LoadModel", absl::CancelledError("LoadModel: the client went away"));
  if (first) return finish("LoadModel", absl::InvalidArgumentError("LoadModel: no chunks; the first names the session"));
  if (bytes.empty()) return finish("LoadModel", absl::InvalidArgumentError("LoadModel: the model has no bytes"));
  auto devices = d_.sessions->devices(session, who);
  if (!devices.ok()) return finish("LoadModel", devices.status());

  // The import holds the weights once more (as tensors) and then the graph it made.
  if (absl::Status s = held.grow(bytes.size(), "LoadModel: importing the model"); !s.ok()) return finish("LoadModel", s);
  auto imported = import_model_graph(bytes, shapes, d_.limits.decode);
  if (!imported.ok()) {
    const absl::Status& s = imported.status();
    return finish("LoadModel", absl::Status(s.code(), cat("LoadModel: ", s.message())));
  }
  if (absl::Status s = held.grow(imported->graph_bytes, "LoadModel: the model's graph"); !s.ok()) return finish("LoadModel", s);
  auto model = std::make_shared<HeldModel>();
  model->graph = imported->graph;
  // Digests memoize on first use, without a lock: computed here, before every RunModel of
  // the model shares the graph.
  compute_digests(model->graph->root);
  model->inputs = imported->inputs;
  model->outputs = imported->outputs;
  // The weights become buffers of the session, written once; a failure takes back the
  // ones already made.
  uint64_t weight_bytes = 0;
  auto undo = [&] {
    std::vector<BufferInfo> made;
    for (auto& [name, id] : model->weights)
      if (auto b = d_.sessions->remove_buffer(session, id, who); b.ok()) made.push_back(*b);
    free_buffers(made);
  };
  for (auto& [name, data] : imported->weights) {
    auto id = buffer_with(**tenant, session, devices->front(), data, deadline(ctx));
    if (!id.ok()) {
      undo();
      return finish("LoadModel", absl::Status(id.status().code(), cat("LoadModel: weight ", name, ": ", id.status().message())));
    }
    model->weights.emplace_back(name, *id);
    weight_bytes += data.data.size();
  }
  auto id = d_.sessions->add_model(session, model, imported->graph_bytes, who);
  if (!id.ok()) {
    if (id.status().code() == absl::StatusCode::kResourceExhausted) (*tenant)->count_rejection("bytes");
    undo();
    return finish("LoadModel", id.status());
  }
  weight_buffers_written_ += model->weights.size();
  weight_bytes_written_ += weight_bytes;
  bytes_in(bytes.size());
  resp->set_model_id(*id);
  for (const auto& t : model->inputs) fill_tensor(t, resp->add_inputs());
  for (const auto& t : model->outputs) fill_tensor(t, resp->add_outputs());
  resp->set_weight_buffers(model->weights.size());
  resp->set_weight_bytes(weight_bytes);
  resp->set_import_ms(ms_since(t0));
  return finish("LoadModel", absl::OkStatus());
}

grpc::Status UopdService::RunModel(grpc::ServerContextBase* ctx, pb::RunModelRequest* req, pb::RunResponse* resp,
                                   ByteBudget::Hold& held) {
  InFlight in_flight(in_flight_);
  auto tenant = admit(ctx);
  if (!tenant.ok()) return finish("RunModel", tenant.status());
  const std::string& who = (*tenant)->name();
  auto devices = d_.sessions->devices(req->session_id(), who);
  if (!devices.ok()) return finish("RunModel", devices.status());
  auto model = d_.sessions->model(req->session_id(), req->model_id(), who);
  if (!model.ok()) return finish("RunModel", model.status());
  // The model's inputs as the client binds them, by name only (the graph's wire indices
  // are the server's business); the weights bound to the session's buffers.
  pb::RunRequest run;
  run.set_session_id(req->session_id());
  run.set_keep_outputs(req->keep_outputs());
  run.set_profile(req->profile());
  for (int i = 0; i < req->inputs_size(); ++i) {
    pb::Binding* b = req->mutable_inputs(i);
    if (b->node_case() != pb::Binding::kName)
      return finish("RunModel", absl::InvalidArgumentError(cat("binding ", i, ": a model's input is bound by its name")));
    bool known = false;
    for (const auto& in : (*model)->inputs) known |= in.name == b->name();
    if (!known) return finish("RunModel", absl::InvalidArgumentError(cat("binding ", i, ": the model has no input named '", b->name().substr(0, 64), "'")));
    run.add_inputs()->Swap(b);  // inline bytes move, never copied
  }
  for (const auto& [name, id] : (*model)->weights) {
    pb::Binding* b = run.add_inputs();
    b->set_name(name);
    b->set_buffer_id(id);
  }
  return finish("RunModel", run_graph(ctx, **tenant, *devices, (*model)->graph, &run, resp, held));
}

}  // namespace uop::server
