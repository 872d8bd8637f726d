#include "server/executor.h"

#include <chrono>

#include "compiler/support/strings.h"
#include "proto/worker.grpc.pb.h"

namespace uop::server {
namespace {

namespace wpb = ::uopd::worker::v1;

absl::Status from_grpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void set_deadline(grpc::ClientContext& ctx, absl::Time deadline) {
  ctx.set_deadline(absl::ToChronoTime(deadline));
}

// Codes that mean the worker, not the request, failed.
bool worker_gone(absl::StatusCode c) {
  return c == absl::StatusCode::kUnavailable || c == absl::StatusCode::kCancelled ||
         c == absl::StatusCode::kUnknown || c == absl::StatusCode::kAborted || c == absl::StatusCode::kInternal;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Executor::Stub>> Executor::stub(const Worker& w) {
  auto s = w->stub();
  if (!s) return absl::UnavailableError(cat(w->describe(), " is not up (", w->state(), "): ", w->last_error()));
  return s;
}

absl::Status Executor::failed(const Worker& w, const absl::Status& s, std::string_view what,
                              std::optional<uint64_t> generation) {
  if (worker_gone(s.code())) return pool_->on_failure(w, s, generation);
  return absl::Status(s.code(), cat(what, " on worker ", w->id(), ": ", s.message()));
}

absl::Status Executor::alloc(const Worker& w, uint64_t id, uint64_t bytes, absl::Time deadline) {
  grpc::ClientContext ctx;
  set_deadline(ctx, deadline);
  wpb::AllocBufferRequest req;
  req.set_buffer_id(id);
  req.set_bytes(bytes);
  wpb::AllocBufferResponse resp;
  auto st = stub(w);
  if (!st.ok()) return st.status();
  absl::Status s = from_grpc((*st)->AllocBuffer(&ctx, req, &resp));
  return s.ok() ? s : failed(w, s, "allocating a buffer");
}

absl::Status Executor::write(const Worker& w, uint64_t id, uint64_t offset, std::string_view data, absl::Time deadline) {
  grpc::ClientContext ctx;
  set_deadline(ctx, deadline);
  wpb::WriteBufferResponse resp;
  auto st = stub(w);
  if (!st.ok()) return st.status();
  auto stream = (*st)->WriteBuffer(&ctx, &resp);
  for (uint64_t at = 0; at < data.size() || (at == 0 && data.empty()); at += kChunk) {
    wpb::WriteChunk chunk;
    chunk.set_buffer_id(id);
    chunk.set_offset(offset + at);
    chunk.set_data(std::string(data.substr(at, kChunk)));
    if (!stream->Write(chunk)) break;  // the status below says why
    if (data.empty()) break;
  }
  stream->WritesDone();
  absl::Status s = from_grpc(stream->Finish());
  return s.ok() ? s : failed(w, s, "writing a buffer");
}

absl::Status Executor::read_into(const Worker& w, uint64_t id, uint64_t offset, uint64_t length, absl::Time deadline,
                                 const std::function<bool(uint64_t, std::string_view)>& sink) {
  grpc::ClientContext ctx;
  set_deadline(ctx, deadline);
  wpb::ReadBufferRequest req;
  req.set_buffer_id(id);
  req.set_offset(offset);
  req.set_length(length);
  req.set_chunk_bytes(kChunk);
  auto st = stub(w);
  if (!st.ok()) return st.status();
  auto stream = (*st)->ReadBuffer(&ctx, req);
  wpb::ReadChunk chunk;
  bool stopped = false;  // the sink had enough (its client went away)
  while (stream->Read(&chunk)) {
    if (!sink(chunk.offset(), chunk.data())) {
      stopped = true;
      ctx.TryCancel();
      break;
    }
  }
  absl::Status s = from_grpc(stream->Finish());
  if (stopped) return absl::OkStatus();
  return s.ok() ? s : failed(w, s, "reading a buffer");
}

absl::StatusOr<std::string> Executor::read(const Worker& w, uint64_t id, uint64_t offset, uint64_t length,
                                           absl::Time deadline) {
  std::string out;
  out.reserve(length);
  absl::Status s = read_into(w, id, offset, length, deadline, [&](uint64_t at, std::string_view data) {
    if (at != offset + out.size()) return false;  // chunks arrive in order; anything else is a bug
    out.append(data);
    return true;
  });
  if (!s.ok()) return s;
  if (out.size() != length)
    return absl::InternalError(cat("worker ", w->id(), " returned ", out.size(), " of ", length, " bytes"));
  return out;
}

absl::Status Executor::free(const Worker& w, const std::vector<uint64_t>& ids) {
  if (ids.empty()) return absl::OkStatus();
  grpc::ClientContext ctx;
  set_deadline(ctx, absl::Now() + absl::Seconds(10));
  wpb::FreeBuffersRequest req;
  for (uint64_t id : ids) req.add_buffer_ids(id);
  wpb::FreeBuffersResponse resp;
  auto st = stub(w);
  if (!st.ok()) return st.status();
  absl::Status s = from_grpc((*st)->FreeBuffers(&ctx, req, &resp));
  return s.ok() ? s : failed(w, s, "freeing buffers");
}

absl::StatusOr<RunOutcome> Executor::run(const std::string& device, const Plan& plan,
                                         const std::vector<CompiledKernel>& kernels,
                                         const absl::flat_hash_map<int, BoundInput>& inputs, bool keep_outputs,
                                         absl::Time deadline) {
  auto worker = pool_->worker_for(device);
  if (!worker.ok()) return worker.status();
  const Worker& w = *worker;
  // The process this run talks to; a failure or a program load is attributed to it, not
  // to a replacement that started meanwhile.
  const uint64_t generation = w->generation();
  RunOutcome out;

  // Every plan buffer as a worker buffer: a session buffer as it is (on this worker, of
  // this generation), everything else allocated for the run.
  std::vector<uint64_t> ids(plan.buffers.size(), 0);
  std::vector<uint64_t> temps;
  auto cleanup = [&] { (void)free(w, temps); };
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlannedBuffer& pb = plan.buffers[i];
    uint64_t bytes = static_cast<uint64_t>(pb.elements) * scalar_bytes(pb.dtype);
    auto in = inputs.find(static_cast<int>(i));
    if (in != inputs.end() && in->second.session_buffer) {
      const BufferInfo& b = *in->second.session_buffer;
      if (b.worker_id != w->id() || b.worker_generation != w->generation()) {
        cleanup();
        return absl::UnavailableError(cat("buffer ", b.id, " was held by worker ", b.worker_id,
                                          ", which restarted since; its contents are lost"));
      }
      ids[i] = b.worker_buffer;
      continue;
    }
    ids[i] = new_buffer_id();
    if (absl::Status s = alloc(w, ids[i], bytes, deadline); !s.ok()) {
      cleanup();
      return s;
    }
    temps.push_back(ids[i]);
    if (in != inputs.end() && in->second.tensor) {
      if (absl::Status s = write(w, ids[i], 0, in->second.tensor->data, deadline); !s.ok()) {
        cleanup();
        return s;
      }
      out.bytes_in += in->second.tensor->data.size();
    }  // else: outputs, intermediates, unbound kernel-level buffers start zeroed (workers zero new buffers)
  }

  // Programs the worker does not have yet.
  for (const CompiledKernel& k : kernels) {
    if (w->has_program(k.key)) continue;
    grpc::ClientContext ctx;
    set_deadline(ctx, deadline);
    wpb::LoadProgramRequest req;
    req.set_key(k.key);
    req.set_object(k.object);
    req.set_abi(k.abi.serialize());
    wpb::LoadProgramResponse resp;
    auto st = stub(w);
    absl::Status s = st.ok() ? from_grpc((*st)->LoadProgram(&ctx, req, &resp)) : st.status();
    if (!s.ok()) {
      cleanup();
      return failed(w, s, cat("loading kernel ", k.name), generation);
    }
    w->note_program(k.key, generation);
  }

  // The launches, in order, in one call.
  wpb::ExecuteRequest exec;
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    const PlannedKernel& pk = plan.kernels[i];
    const CompiledKernel& ck = kernels[i];
    wpb::Launch* l = exec.add_launches();
    l->set_key(ck.key);
    std::vector<uint64_t> slots(ck.abi.num_buffers(), 0);
    for (const KernelParam& p : ck.abi.params) slots[p.slot] = ids.at(pk.buffers.at(p.slot));
    for (uint64_t id : slots) l->add_buffer_ids(id);
    for (const KernelVar& v : ck.abi.vars) {
      auto it = plan.vars.find(v.name);
      if (it == plan.vars.end()) {
        cleanup();
        return absl::InvalidArgumentError(cat("kernel ", pk.name, " needs variable ", v.name, ", which the graph does not bind"));
      }
      l->add_vars(it->second);
    }
  }
  {
    auto t0 = std::chrono::steady_clock::now();
    grpc::ClientContext ctx;
    set_deadline(ctx, deadline);
    wpb::ExecuteResponse resp;
    auto st = stub(w);
    absl::Status s = st.ok() ? from_grpc((*st)->Execute(&ctx, exec, &resp)) : st.status();
    out.run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      cleanup();
      return failed(w, s, "running the kernels", generation);
    }
    out.kernels_run = plan.kernels.size();
  }

  // The outputs: read back, or handed over to the session (then not freed here).
  for (const PlannedOutput& o : plan.outputs) {
    const PlannedBuffer& pb = plan.buffers[o.buffer];
    HostTensor t;
    t.dtype = o.dtype;
    t.shape = o.shape;
    uint64_t bytes = static_cast<uint64_t>(t.numel()) * scalar_bytes(o.dtype);
    if (keep_outputs) {
      BufferInfo b;
      b.device = device;
      b.dtype = o.dtype;
      b.elements = static_cast<uint64_t>(pb.elements);
      b.bytes = static_cast<uint64_t>(pb.elements) * scalar_bytes(pb.dtype);
      b.worker_buffer = ids[o.buffer];
      b.worker_id = w->id();
      b.worker_generation = w->generation();
      temps.erase(std::remove(temps.begin(), temps.end(), ids[o.buffer]), temps.end());
      out.kept.push_back(b);
      continue;
    }
    auto data = read(w, ids[o.buffer], 0, bytes, deadline);
    if (!data.ok()) {
      cleanup();
      return data.status();
    }
    out.bytes_out += data->size();
    t.data = std::move(*data);
    out.outputs.push_back(std::move(t));
  }
  cleanup();
  return out;
}

}  // namespace uop::server
