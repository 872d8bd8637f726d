// The worker's buffers, programs and launches (WorkerRuntime) and the Worker gRPC
// adapter. Every size the network hands us is checked for overflow before it is used, and
// every buffer a kernel sees is checked against the kernel's ABI before it runs, whatever
// the device.
#include "worker/worker_service.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <thread>

#include "compiler/abi/kernel_abi.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "compiler/support/timing.h"
#include "transport/grpc_absl.h"
#include "transport/lane_messages.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/cuda/cuda_device.h"

namespace uop {

namespace wv1 = uopd::worker::v1;
using transport::to_grpc;

namespace {

absl::Time deadline_of(const grpc::ServerContext& ctx) {
  const auto when = ctx.deadline();
  return when == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture() : absl::FromChrono(when);
}

absl::Status out_of_range(uint64_t id, uint64_t offset, uint64_t size, uint64_t have) {
  return absl::OutOfRangeError(
      cat("buffer ", id, ": [", offset, ", +", size, ") is outside its ", have, " bytes"));
}

// Chunks of 1-4 MiB come and go with every WriteBuffer / ReadBuffer message. With glibc's
// defaults each is mmap'ed or trimmed back to the kernel when freed, and the next one
// page-faults its memory in again (microseconds a page on a VM). Blocks up to 64 MiB stay
// on the heap and up to 256 MiB of freed heap stays mapped. Large device buffers are
// still mmap'ed (and so returned when freed).
[[maybe_unused]] const bool kMallocTuned = [] {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return true;
}();

// [offset, offset + size) inside [0, have), without overflowing.
bool inside(uint64_t offset, uint64_t size, uint64_t have) { return offset <= have && size <= have - offset; }

}  // namespace

WorkerRuntime::WorkerRuntime(WorkerRuntimeOptions options)
    : WorkerRuntime(options, std::make_unique<CpuBackend>(options.target, options.threads)) {}

WorkerRuntime::WorkerRuntime(WorkerRuntimeOptions options, std::unique_ptr<DeviceBackend> backend)
    : options_(std::move(options)), backend_(std::move(backend)), watchdog_(options_.watchdog) {}

absl::Status WorkerRuntime::alloc_buffer(uint64_t id, uint64_t bytes) {
  if (id == 0) return absl::InvalidArgumentError("buffer id 0 is reserved (it means no buffer in a launch)");
  uint64_t serial = 0;
  {
    std::lock_guard lock(mu_);
    if (buffers_.contains(id)) return absl::AlreadyExistsError(cat("buffer ", id, " already exists"));
    uint64_t limit = options_.max_buffer_bytes;
    if (limit && (bytes > limit || buffer_bytes_ > limit - bytes))
      return absl::ResourceExhaustedError(cat("buffer ", id, ": ", bytes, " bytes would exceed the worker's budget of ",
                                              limit, " bytes (", buffer_bytes_, " in use)"));
    // Reserve the id and the bytes, then allocate and zero outside the lock.
    serial = ++next_serial_;
    buffers_.emplace(id, BufferEntry{nullptr, bytes, serial});
    buffer_bytes_ += bytes;
  }
  auto mem = backend_->allocate(bytes);
  std::lock_guard lock(mu_);
  // FreeBuffers may have dropped the reservation meanwhile (and given its bytes back), and
  // another alloc_buffer may even have reserved the id again: the serial tells.
  auto it = buffers_.find(id);
  bool still_reserved = it != buffers_.end() && it->second.serial == serial;
  if (!mem.ok()) {
    if (still_reserved) {
      buffer_bytes_ -= bytes;
      buffers_.erase(it);
    }
    return absl::Status(mem.status().code(), cat("buffer ", id, ": ", mem.status().message()));
  }
  if (still_reserved) it->second.memory = *std::move(mem);
  return absl::OkStatus();
}

uint64_t WorkerRuntime::free_buffers(std::span<const uint64_t> ids) {
  std::lock_guard lock(mu_);
  uint64_t freed = 0;
  for (uint64_t id : ids) {
    auto it = buffers_.find(id);
    if (it == buffers_.end()) continue;
    // In-flight launches and reads hold their own references, so the memory lives on
    // until they finish; the budget gets the bytes back now.
    buffer_bytes_ -= it->second.bytes;
    buffers_.erase(it);
    ++freed;
  }
  return freed;
}

absl::StatusOr<std::shared_ptr<DeviceMemory>> WorkerRuntime::find_buffer(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = buffers_.find(id);
  if (it == buffers_.end() || !it->second.memory) return absl::NotFoundError(cat("buffer ", id, " not found"));
  return it->second.memory;
}

absl::Status WorkerRuntime::write_buffer(uint64_t id, uint64_t offset, std::string_view data) {
  auto mem = find_buffer(id);
  if (!mem.ok()) return mem.status();
  if (!inside(offset, data.size(), (*mem)->size())) return out_of_range(id, offset, data.size(), (*mem)->size());
  if (data.empty()) return absl::OkStatus();
  if (absl::Status st = backend_->write(**mem, offset, data); !st.ok())
    return absl::Status(st.code(), cat("buffer ", id, ": ", st.message()));
  return absl::OkStatus();
}

absl::StatusOr<BufferSlice> WorkerRuntime::read_buffer(uint64_t id, uint64_t offset, uint64_t length) const {
  auto mem = find_buffer(id);
  if (!mem.ok()) return mem.status();
  uint64_t have = (*mem)->size();
  if (length == 0 && offset <= have) length = have - offset;
  if (!inside(offset, length, have)) return out_of_range(id, offset, length, have);
  auto slice = backend_->read(*mem, offset, length);
  if (!slice.ok()) return absl::Status(slice.status().code(), cat("buffer ", id, ": ", slice.status().message()));
  return slice;
}

absl::Status WorkerRuntime::load_program(const std::string& key, std::string_view object, std::string_view abi_text,
                                         std::vector<std::string>* unloaded) {
  if (key.empty()) return absl::InvalidArgumentError("a program needs a key");
  if (has_program(key)) return absl::OkStatus();
  auto abi = parse_abi(abi_text);
  if (!abi.ok()) return absl::InvalidArgumentError(cat("program ", key, ": bad ABI: ", abi.status().message()));
  // Linking takes a while; two loads of one key may race, and the first to finish wins.
  auto prog = backend_->load_program(key, object, *abi);
  if (!prog.ok()) return absl::Status(prog.status().code(), cat("program ", key, ": ", prog.status().message()));
  std::vector<Program> gone;  // released after the lock: unloading frees code
  {
    std::lock_guard lock(mu_);
    auto [it, added] = programs_.try_emplace(key);
    if (!added) return absl::OkStatus();
    recent_.push_front(key);
    it->second = {Program(*std::move(prog)), program_charge(object.size()), recent_.begin()};
    program_bytes_ += it->second.charge;
    // The least recently used go first; never the one just loaded, which its caller is
    // about to launch. A launch running one holds its own reference to it.
    while (options_.max_program_bytes > 0 && program_bytes_ > options_.max_program_bytes && recent_.size() > 1) {
      auto victim = programs_.find(recent_.back());
      program_bytes_ -= victim->second.charge;
      gone.push_back(std::move(victim->second.program));
      if (unloaded) unloaded->push_back(recent_.back());
      recent_.pop_back();
      programs_.erase(victim);
      ++programs_unloaded_;
    }
  }
  return absl::OkStatus();
}

bool WorkerRuntime::has_program(const std::string& key) const {
  std::lock_guard lock(mu_);
  return programs_.contains(key);
}

std::vector<WorkerRuntime::Program> WorkerRuntime::resolve(std::span<const LaunchSpec> launches) const {
  std::vector<Program> progs(launches.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < launches.size(); ++i) {
    if (launches[i].collective) continue;
    auto it = programs_.find(launches[i].key);
    if (it == programs_.end()) continue;
    progs[i] = it->second.program;
    recent_.splice(recent_.begin(), recent_, it->second.recent);
  }
  return progs;
}

absl::Status WorkerRuntime::run_launch(size_t index, const LaunchSpec& launch, const DeviceProgram& prog,
                                       const std::function<bool()>& cancelled, absl::Time deadline,
                                       double* launch_ms) const {
  auto where = [&] { return cat("launch ", index, " (program ", launch.key, "): "); };
  const KernelAbi& abi = prog.abi();
  if (static_cast<int64_t>(launch.buffer_ids.size()) != abi.num_buffers())
    return absl::InvalidArgumentError(
        cat(where(), "the kernel takes ", abi.num_buffers(), " buffers, the launch names ", launch.buffer_ids.size()));

  // The references keep every buffer alive until the kernel returns, even if freed meanwhile.
  std::vector<std::shared_ptr<DeviceMemory>> held(launch.buffer_ids.size());
  std::vector<DeviceMemory*> ptrs(launch.buffer_ids.size(), nullptr);
  for (size_t slot = 0; slot < launch.buffer_ids.size(); ++slot) {
    uint64_t id = launch.buffer_ids[slot];
    if (id == 0) continue;
    auto mem = find_buffer(id);
    if (!mem.ok()) return absl::NotFoundError(cat(where(), "slot ", slot, ": ", mem.status().message()));
    held[slot] = *std::move(mem);
    ptrs[slot] = held[slot].get();
  }
  // The kernel indexes each param within [0, size) elements (the bounds stage proved it);
  // what makes that safe here is that each buffer really is that large.
  for (const KernelParam& p : abi.params) {
    uint64_t need = 0;
    if (p.size < 0 || __builtin_mul_overflow(static_cast<uint64_t>(p.size), static_cast<uint64_t>(p.dtype.bytes()), &need))
      return absl::InvalidArgumentError(cat(where(), "slot ", p.slot, " has an impossible size in the ABI"));
    if (need == 0) continue;
    if (!held[p.slot])
      return absl::InvalidArgumentError(cat(where(), "slot ", p.slot, " needs a buffer of ", need, " bytes (",
                                            p.size, " x ", p.dtype.str(), "), the launch passes none"));
    if (held[p.slot]->size() < need)
      return absl::InvalidArgumentError(cat(where(), "buffer ", launch.buffer_ids[p.slot], " in slot ", p.slot, " holds ",
                                            held[p.slot]->size(), " bytes, the kernel needs ", need, " (", p.size,
                                            " x ", p.dtype.str(), ")"));
  }
  LaunchWatchdog::Watch watch(watchdog_, cat("launch ", index, " (program ", launch.key, ")"), deadline, &cancelled);
  // Timed only when asked: the clock around the backend's run, which a backend with its
  // own timer (CUDA events) replaces with the device's time.
  std::optional<std::chrono::steady_clock::time_point> start;
  double device_ms = -1;
  if (launch_ms) start = std::chrono::steady_clock::now();
  absl::Status st = backend_->run(prog, ptrs, launch.vars, watch.word(), launch_ms ? &device_ms : nullptr);
  if (launch_ms) *launch_ms = device_ms >= 0 ? device_ms : ms_since(*start);
  // Stopped: whatever the kernel wrote is incomplete, whether or not it noticed in time.
  if (absl::Status stopped = watch.status(); !stopped.ok()) st = stopped;
  if (!st.ok()) return absl::Status(st.code(), cat(where(), st.message()));
  return absl::OkStatus();
}

absl::StatusOr<double> WorkerRuntime::execute(std::span<const LaunchSpec> launches,
                                              const std::function<bool()>& cancelled, absl::Time deadline,
                                              std::vector<double>* launch_ms) const {
  std::vector<Program> progs = resolve(launches);
  for (size_t i = 0; i < launches.size(); ++i)
    if (!progs[i] && !launches[i].collective)
      return absl::FailedPreconditionError(
          cat("launch ", i, " (program ", launches[i].key, "): program ", launches[i].key, " not loaded"));
  return run_launches(launches, progs, cancelled, deadline, launch_ms);
}

absl::StatusOr<double> WorkerRuntime::run_launches(std::span<const LaunchSpec> launches, std::span<const Program> programs,
                                                   const std::function<bool()>& cancelled, absl::Time deadline,
                                                   std::vector<double>* launch_ms, double* collective_ms) const {
  auto start = std::chrono::steady_clock::now();
  double in_collectives = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    if (cancelled && cancelled())
      return absl::CancelledError(cat("cancelled by the caller before launch ", i, " of ", launches.size()));
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError(cat("the deadline passed before launch ", i, " of ", launches.size()));
    if (const std::optional<CollectiveSpec>& c = launches[i].collective) {
      auto ms = collective(*c, launches[i].buffer_ids, cancelled);
      if (!ms.ok()) return absl::Status(ms.status().code(), cat("launch ", i, " (collective in group '", c->group, "'): ", ms.status().message()));
      in_collectives += *ms;
      continue;
    }
    double ms = 0;
    if (absl::Status st = run_launch(i, launches[i], *programs[i], cancelled, deadline, launch_ms ? &ms : nullptr); !st.ok())
      return st;
    if (launch_ms) launch_ms->push_back(ms);
  }
  if (collective_ms) *collective_ms += in_collectives;
  return std::max(ms_since(start) - in_collectives, 0.0);
}

absl::StatusOr<ExecuteResult> WorkerRuntime::execute(const ExecuteBatch& batch, const std::function<bool()>& cancelled,
                                                     absl::Time deadline) {
  ExecuteResult result;
  // The programs first, held for the whole batch (a load meanwhile may unload them from
  // the table, not from under these launches). One missing: nothing happens.
  std::vector<Program> progs = resolve(batch.launches);
  for (size_t i = 0; i < progs.size(); ++i)
    if (!progs[i] && !batch.launches[i].collective && std::find(result.missing_programs.begin(), result.missing_programs.end(), batch.launches[i].key) ==
                         result.missing_programs.end())
      result.missing_programs.push_back(batch.launches[i].key);
  if (!result.missing_programs.empty()) return result;
  absl::Status st = [&]() -> absl::Status {
    for (const BufferInit& a : batch.allocs) {
      if (a.data.size() > a.bytes)
        return absl::InvalidArgumentError(
            cat("allocating buffer ", a.id, ": ", a.data.size(), " bytes of data for a buffer of ", a.bytes));
      absl::Status s = alloc_buffer(a.id, a.bytes);
      if (s.ok()) s = write_buffer(a.id, 0, a.data);
      if (!s.ok()) return absl::Status(s.code(), cat("allocating buffer ", a.id, ": ", s.message()));
    }
    auto ms = run_launches(batch.launches, progs, cancelled, deadline, batch.profile ? &result.launch_ms : nullptr,
                           &result.collective_ms);
    if (!ms.ok()) return ms.status();
    result.run_ms = *ms;
    for (uint64_t id : batch.read_back) {
      auto slice = read_buffer(id, 0, 0);
      if (!slice.ok()) return absl::Status(slice.status().code(), cat("reading back: ", slice.status().message()));
      result.outputs.push_back(*std::move(slice));
    }
    return absl::OkStatus();
  }();
  free_buffers(batch.free_after);
  if (!st.ok()) return st;
  return result;
}

absl::StatusOr<double> WorkerRuntime::collective(const CollectiveSpec& spec, uint64_t id,
                                                 const std::function<bool()>& cancelled) const {
  return collective(spec, std::span<const uint64_t>(&id, 1), cancelled);
}

absl::StatusOr<double> WorkerRuntime::collective(const CollectiveSpec& spec, std::span<const uint64_t> ids,
                                                 const std::function<bool()>& cancelled) const {
  auto start = std::chrono::steady_clock::now();
  // The references keep the memory alive if a buffer is freed meanwhile.
  std::vector<std::shared_ptr<DeviceMemory>> mems;
  for (uint64_t id : ids) {
    auto mem = find_buffer(id);
    if (!mem.ok()) return mem.status();
    mems.push_back(*std::move(mem));
  }
  auto with_buffer = [&](const absl::Status& st) {
    return absl::Status(st.code(), cat(ids.size() == 1 ? cat("buffer ", ids[0]) : cat("buffers ", join(ids, ", ")), ": ",
                                       st.message()));
  };
  absl::Status st;
  auto* cuda = mems.size() == 1 ? dynamic_cast<const CudaMemory*>(mems[0].get()) : nullptr;
  if (backend_->info().backend == "cpu") {
    // CPU memory is host memory: the transports reduce in it directly.
    std::vector<HostBuffer> host;
    for (const auto& m : mems) host.push_back({reinterpret_cast<void*>(m->address()), m->size()});
    st = run_collective(spec, host, cancelled);
  } else if (cuda && spec.transport == "nccl") {
    // NCCL reduces GPU memory in place: the device pointer and its context, no host copy.
    st = run_collective(spec, DeviceBufferRef{cuda->context(), cuda->ptr(), cuda->size()}, cancelled);
  } else {
    // Other devices go through a host copy (shm and gloo work on host memory).
    std::vector<std::string> copies;
    for (const auto& m : mems) {
      auto slice = backend_->read(m, 0, m->size());
      if (!slice.ok()) return with_buffer(slice.status());
      copies.emplace_back(slice->bytes());
    }
    std::vector<HostBuffer> host;
    for (std::string& c : copies) host.push_back({c.data(), c.size()});
    st = run_collective(spec, host, cancelled);
    for (size_t i = 0; st.ok() && i < mems.size(); ++i) st = backend_->write(*mems[i], 0, copies[i]);
  }
  if (!st.ok()) return with_buffer(st);
  return ms_since(start);
}

WorkerInfo WorkerRuntime::info() const {
  BackendInfo b = backend_->info();
  WorkerInfo i;
  i.device = options_.device;
  i.backend = b.backend;
  i.target = b.target;
  i.pid = getpid();
  i.threads = b.threads;
  std::lock_guard lock(mu_);
  i.buffers = buffers_.size();
  i.buffer_bytes = buffer_bytes_;
  i.programs = programs_.size();
  i.program_bytes = program_bytes_;
  i.programs_unloaded = programs_unloaded_;
  return i;
}

// ---- gRPC adapter: decode, call the runtime, encode. ----

grpc::Status WorkerService::Info(grpc::ServerContext*, const wv1::InfoRequest*, wv1::InfoResponse* resp) {
  InFlight guard(in_flight_);
  WorkerInfo i = rt_->info();
  resp->set_device(i.device);
  resp->set_backend(i.backend);
  resp->set_target(i.target);
  resp->set_pid(i.pid);
  resp->set_buffers(i.buffers);
  resp->set_buffer_bytes(i.buffer_bytes);
  resp->set_programs(i.programs);
  resp->set_program_bytes(i.program_bytes);
  resp->set_programs_unloaded(i.programs_unloaded);
  resp->set_threads(i.threads);
  return grpc::Status::OK;
}

grpc::Status WorkerService::AllocBuffer(grpc::ServerContext*, const wv1::AllocBufferRequest* req,
                                        wv1::AllocBufferResponse*) {
  InFlight guard(in_flight_);
  return to_grpc(rt_->alloc_buffer(req->buffer_id(), req->bytes()));
}

grpc::Status WorkerService::FreeBuffers(grpc::ServerContext*, const wv1::FreeBuffersRequest* req,
                                        wv1::FreeBuffersResponse* resp) {
  InFlight guard(in_flight_);
  resp->set_freed(rt_->free_buffers({req->buffer_ids().data(), static_cast<size_t>(req->buffer_ids_size())}));
  return grpc::Status::OK;
}

grpc::Status WorkerService::WriteBuffer(grpc::ServerContext*, grpc::ServerReader<wv1::WriteChunk>* reader,
                                        wv1::WriteBufferResponse* resp) {
  InFlight guard(in_flight_);
  wv1::WriteChunk chunk;
  uint64_t id = 0, total = 0;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      id = chunk.buffer_id();
      first = false;
    } else if (chunk.buffer_id() != 0 && chunk.buffer_id() != id) {
      return to_grpc(absl::InvalidArgumentError(
          cat("a write to buffer ", id, " has a chunk for buffer ", chunk.buffer_id(), "; one stream writes one buffer")));
    }
    if (absl::Status st = rt_->write_buffer(id, chunk.offset(), chunk.data()); !st.ok()) return to_grpc(st);
    total += chunk.data().size();
  }
  if (first) return to_grpc(absl::InvalidArgumentError("an empty write names no buffer"));
  resp->set_bytes(total);
  return grpc::Status::OK;
}

grpc::Status WorkerService::ReadBuffer(grpc::ServerContext* ctx, const wv1::ReadBufferRequest* req,
                                       grpc::ServerWriter<wv1::ReadChunk>* writer) {
  InFlight guard(in_flight_);
  auto slice = rt_->read_buffer(req->buffer_id(), req->offset(), req->length());
  if (!slice.ok()) return to_grpc(slice.status());
  uint64_t step = req->chunk_bytes() == 0 ? kDefaultReadChunkBytes : std::min(req->chunk_bytes(), kMaxReadChunkBytes);
  std::string_view bytes = slice->bytes();
  wv1::ReadChunk chunk;
  for (uint64_t done = 0; done < bytes.size(); done += step) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    size_t n = static_cast<size_t>(std::min<uint64_t>(step, bytes.size() - done));
    chunk.set_offset(slice->offset + done);
    chunk.set_data(bytes.data() + done, n);
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::LoadProgram(grpc::ServerContext*, const wv1::LoadProgramRequest* req,
                                        wv1::LoadProgramResponse* resp) {
  InFlight guard(in_flight_);
  std::vector<std::string> unloaded;
  absl::Status s = rt_->load_program(req->key(), req->object(), req->abi(), &unloaded);
  for (std::string& k : unloaded) resp->add_unloaded(std::move(k));
  return to_grpc(s);
}

// A CollectiveRequest as the runtime takes it: the spec and its buffers (one, or a
// bucket's). The caller's deadline bounds the wait for peers too: a member never waits
// longer than the scheduler is willing to.
absl::StatusOr<std::pair<CollectiveSpec, std::vector<uint64_t>>> collective_of(const WorkerRuntime& rt,
                                                                                 const wv1::CollectiveRequest& req,
                                                                                 absl::Time deadline) {
  CollectiveSpec spec;
  spec.group = req.group();
  spec.rank = req.rank();
  spec.size = req.size();
  spec.op = req.op();
  spec.dtype = req.dtype();
  spec.elements = req.elements();
  spec.keep_group = req.keep_group();
  if (req.bucket_size() > static_cast<int>(kMaxBucketBuffers))
    return absl::InvalidArgumentError(
        cat("collective in group '", req.group(), "': a bucket of ", req.bucket_size(), " buffers (at most ", kMaxBucketBuffers, ")"));
  std::vector<uint64_t> ids;
  for (const auto& b : req.bucket()) {
    ids.push_back(b.buffer_id());
    spec.bucket.push_back(b.elements());
  }
  if (ids.empty()) ids.push_back(req.buffer_id());
  spec.transport = req.transport();
  spec.rendezvous = req.rendezvous();
  spec.rendezvous_dial = rt.options().rendezvous_dial;
  uint32_t timeout = req.timeout_ms() ? req.timeout_ms() : kDefaultCollectiveTimeoutMs;
  if (deadline != absl::InfiniteFuture()) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left < static_cast<int64_t>(timeout)) timeout = static_cast<uint32_t>(std::max<int64_t>(left, 1));
  }
  spec.timeout_ms = timeout;
  return std::make_pair(std::move(spec), std::move(ids));
}

absl::Status run_collective_request(WorkerRuntime& rt, const wv1::CollectiveRequest& req, wv1::CollectiveResponse* resp,
                                    const std::function<bool()>& cancelled, absl::Time deadline) {
  ASSIGN_OR_RETURN(auto c, collective_of(rt, req, deadline));
  ASSIGN_OR_RETURN(double ms, rt.collective(c.first, c.second, cancelled));
  resp->set_ms(ms);
  return absl::OkStatus();
}

absl::Status run_execute(WorkerRuntime& rt, const wv1::ExecuteRequest& req, wv1::ExecuteResponse* resp,
                         const std::function<bool()>& cancelled, absl::Time deadline) {
  ExecuteBatch batch;
  batch.allocs.reserve(req.allocs_size());
  for (const wv1::BufferInit& a : req.allocs()) batch.allocs.push_back({a.buffer_id(), a.bytes(), a.data()});
  batch.launches.reserve(req.launches_size());
  for (const wv1::Launch& l : req.launches()) {
    if (l.has_collective()) {
      ASSIGN_OR_RETURN(auto c, collective_of(rt, l.collective(), deadline));
      batch.launches.push_back({"", std::move(c.second), {}, std::move(c.first)});
      continue;
    }
    batch.launches.push_back({l.key(), {l.buffer_ids().begin(), l.buffer_ids().end()}, {l.vars().begin(), l.vars().end()}});
  }
  batch.read_back.assign(req.read_back().begin(), req.read_back().end());
  batch.free_after.assign(req.free_after().begin(), req.free_after().end());
  batch.profile = req.profile();
  auto result = rt.execute(batch, cancelled, deadline);
  if (!result.ok()) return result.status();
  for (std::string& k : result->missing_programs) resp->add_missing_programs(std::move(k));
  resp->set_run_ms(result->run_ms);
  resp->set_collective_ms(result->collective_ms);
  for (double ms : result->launch_ms) resp->add_launch_ms(ms);
  for (const BufferSlice& out : result->outputs) resp->add_outputs(out.data, out.length);
  return absl::OkStatus();
}

ExecLane::Handler lane_handler(WorkerRuntime* rt) {
  return [rt](std::string_view request, std::span<char> reply, const std::function<bool()>& abandoned,
              absl::Time deadline) -> absl::StatusOr<size_t> {
    const std::optional<lane::Kind> kind = lane::kind_of(request);
    if (kind == lane::Kind::Write) {
      auto w = lane::decode_write(request);
      if (!w) return absl::InvalidArgumentError(cat("a lane write of ", request.size(), " bytes has no header"));
      if (absl::Status s = rt->write_buffer(w->first.buffer_id, w->first.offset, w->second); !s.ok()) return s;
      return 0;
    }
    if (kind == lane::Kind::Read) {
      auto r = lane::decode_read(request);
      if (!r) return absl::InvalidArgumentError(cat("a lane read of ", request.size(), " bytes is malformed"));
      if (r->length == 0 || r->length > reply.size())
        return absl::InvalidArgumentError(cat("a lane read of ", r->length, " bytes: the slot holds 1 to ", reply.size()));
      auto slice = rt->read_buffer(r->buffer_id, r->offset, r->length);
      if (!slice.ok()) return slice.status();
      std::memcpy(reply.data(), slice->data, slice->length);
      return slice->length;
    }
    if (!kind) return absl::InvalidArgumentError(cat("a lane request of ", request.size(), " bytes of no known kind"));
    request.remove_prefix(1);
    // The rest are protobuf requests whose answers are protobuf replies.
    auto answer = [&](const google::protobuf::MessageLite& resp) -> absl::StatusOr<size_t> {
      const size_t n = resp.ByteSizeLong();
      if (n > reply.size())
        return absl::ResourceExhaustedError(cat("the reply of ", n, " bytes does not fit the lane's slot of ", reply.size()));
      resp.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(reply.data()));
      return n;
    };
    auto parse = [&](google::protobuf::MessageLite& req) {
      return req.ParseFromArray(request.data(), static_cast<int>(request.size()))
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError(cat("the lane's ", request.size(), " bytes are not a ", req.GetTypeName()));
    };
    // Parses the request, runs it, and answers with what it filled in.
    auto handle = [&](auto req, auto resp, const auto& run) -> absl::StatusOr<size_t> {
      RETURN_IF_ERROR(parse(req));
      RETURN_IF_ERROR(run(req, &resp));
      return answer(resp);
    };
    switch (*kind) {
      case lane::Kind::Execute:
        return handle(wv1::ExecuteRequest(), wv1::ExecuteResponse(),
                      [&](const wv1::ExecuteRequest& req, wv1::ExecuteResponse* resp) {
                        return run_execute(*rt, req, resp, abandoned, deadline);
                      });
      case lane::Kind::Collective:
        return handle(wv1::CollectiveRequest(), wv1::CollectiveResponse(),
                      [&](const wv1::CollectiveRequest& req, wv1::CollectiveResponse* resp) {
                        return run_collective_request(*rt, req, resp, abandoned, deadline);
                      });
      case lane::Kind::Free:
        return handle(wv1::FreeBuffersRequest(), wv1::FreeBuffersResponse(),
                      [&](const wv1::FreeBuffersRequest& req, wv1::FreeBuffersResponse* resp) {
                        resp->set_freed(rt->free_buffers({req.buffer_ids().data(), static_cast<size_t>(req.buffer_ids_size())}));
                        return absl::OkStatus();
                      });
      default:
        return absl::InvalidArgumentError(cat("a lane request of ", request.size() + 1, " bytes of no known kind"));
    }
  };
}

grpc::Status WorkerService::Execute(grpc::ServerContext* ctx, const wv1::ExecuteRequest* req,
                                    wv1::ExecuteResponse* resp) {
  InFlight guard(in_flight_);
  return to_grpc(run_execute(*rt_, *req, resp, [ctx] { return ctx->IsCancelled(); }, deadline_of(*ctx)));
}

grpc::Status WorkerService::Collective(grpc::ServerContext* ctx, const wv1::CollectiveRequest* req,
                                       wv1::CollectiveResponse* resp) {
  InFlight guard(in_flight_);
  return to_grpc(run_collective_request(*rt_, *req, resp, [ctx] { return ctx->IsCancelled(); }, deadline_of(*ctx)));
}

}  // namespace uop
