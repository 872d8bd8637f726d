// How the calls that carry bulk bytes reach the service (server/service.h): the raw
// unary calls (Compile, Run, Explain) checked as bytes before they are parsed, the Run
// response written as slices that own its outputs, and the Upload reactor with its idle
// and deadline bounds. Everything that may block runs on the service's handler threads.
#include <algorithm>

#include "compiler/support/strings.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/uop.pb.h"
#include "server/service.h"
#include "server/wire_scan.h"
#include "transport/grpc_absl.h"

namespace uop::server {
namespace {

namespace pb = ::uopd::v1;
namespace gpb = google::protobuf;

// An Upload chunk: the data (at most 4 MiB, proto/uopd.proto) and its ids and offset.
constexpr uint64_t kMaxUploadMessage = (uint64_t{4} << 20) + (uint64_t{64} << 10);

uint64_t saturating_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// A protobuf varint and a length-delimited field's tag, as the wire writes them.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
size_t varint_size(uint64_t v) { return gpb::io::CodedOutputStream::VarintSize64(v); }
void put_bytes_tag(std::string& out, int field) { put_varint(out, (static_cast<uint64_t>(field) << 3) | 2); }

// A slice that owns a string's bytes: the string is moved in, not copied.
grpc::Slice owning_slice(std::string data) {
  auto* held = new std::string(std::move(data));
  return grpc::Slice(held->data(), held->size(), [](void* p) { delete static_cast<std::string*>(p); }, held);
}

// The RunResponse as the wire has it, each output's data in a slice of its own that takes
// the string over. Protobuf reads fields in any order and a message's fields across
// pieces, so each output is its metadata, then its data field, then the rest follows.
void encode_run_response(pb::RunResponse& resp, grpc::ByteBuffer* out) {
  constexpr int kOutputs = pb::RunResponse::kOutputsFieldNumber, kData = pb::Output::kDataFieldNumber;
  std::vector<grpc::Slice> slices;
  std::string head;
  for (pb::Output& o : *resp.mutable_outputs()) {
    if (o.value_case() != pb::Output::kData) {
      put_bytes_tag(head, kOutputs);
      put_varint(head, o.ByteSizeLong());
      o.AppendToString(&head);
      continue;
    }
    std::string data = std::move(*o.mutable_data());
    o.clear_value();
    const size_t meta = o.ByteSizeLong();
    const uint64_t data_field = varint_size((kData << 3) | 2) + varint_size(data.size()) + data.size();
    put_bytes_tag(head, kOutputs);
    put_varint(head, meta + data_field);
    o.AppendToString(&head);
    put_bytes_tag(head, kData);
    put_varint(head, data.size());
    slices.emplace_back(head);
    head.clear();
    if (!data.empty()) slices.push_back(owning_slice(std::move(data)));
  }
  resp.clear_outputs();
  resp.AppendToString(&head);
  slices.emplace_back(head);
  *out = grpc::ByteBuffer(slices.data(), slices.size());
}

template <class Resp>
absl::Status encode_response(Resp& resp, grpc::ByteBuffer* out, ByteBudget::Hold& held) {
  if (absl::Status s = held.grow(resp.ByteSizeLong(), "the response"); !s.ok()) return s;
  bool own = false;
  grpc::Status st = grpc::SerializationTraits<Resp>::Serialize(resp, out, &own);
  if (!st.ok()) return absl::InternalError(cat("cannot serialize the response: ", st.error_message()));
  return absl::OkStatus();
}

// The Run's outputs were reserved by the Run itself; the rest is a few hundred bytes.
template <>
absl::Status encode_response<pb::RunResponse>(pb::RunResponse& resp, grpc::ByteBuffer* out, ByteBudget::Hold& held) {
  uint64_t meta = resp.ByteSizeLong();
  for (const pb::Output& o : resp.outputs()) meta -= std::min<uint64_t>(meta, o.data().size());
  if (absl::Status s = held.grow(meta, "the response"); !s.ok()) return s;
  encode_run_response(resp, out);
  return absl::OkStatus();
}

}  // namespace

// One raw unary call, from its bytes to its answer. It counts as in flight (the drain on
// SIGTERM waits for it) until its answer has left, and holds its share of the budget for
// bytes in flight until then.
class UopdService::RawUnaryCall final : public grpc::ServerUnaryReactor {
 public:
  RawUnaryCall(UopdService* svc, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : svc_(svc), ctx_(ctx), response_(response), held_(svc->inflight_.hold(svc->d_.limits.max_request_memory)) {
    ++svc_->in_flight_;
    // The bytes become this call's (gRPC's copy is left empty), so that they can be
    // dropped as soon as they are parsed.
    const_cast<grpc::ByteBuffer*>(request)->Swap(&request_);
  }
  void OnDone() override {
    --svc_->in_flight_;
    delete this;
  }

  UopdService* svc_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer* response_;
  ByteBudget::Hold held_;
};

template <class Req, class Resp>
grpc::ServerUnaryReactor* UopdService::serve_raw(std::string_view method, grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                                 RawBody<Req, Resp> body) {
  auto* call = new RawUnaryCall(this, ctx, request, response);
  if (draining_) {
    call->Finish(finish(method, absl::UnavailableError("uopd is shutting down: retry on another scheduler, or once it is back")));
    return call;
  }
  // The bytes as received are the request's first holding.
  if (absl::Status s = call->held_.grow(call->request_.Length(), cat(method, ": receiving the request")); !s.ok()) {
    call->Finish(finish(method, s));
    return call;
  }
  threads_->submit([this, call, method, body = std::move(body)] {
    grpc::CallbackServerContext* ctx = call->ctx_;
    auto answer = [&]() -> grpc::Status {
      if (ctx->IsCancelled()) return finish(method, absl::CancelledError(cat(method, ": the client went away")));
      if (absl::Now() > deadline(ctx))
        return finish(method, absl::DeadlineExceededError(cat(method, ": the request deadline passed before it could start")));
      const uint64_t received = call->request_.Length();
      const uint64_t cap = d_.limits.max_request_memory;
      const uint32_t max_nodes = d_.limits.decode.max_nodes;
      WireScanLimits limits;
      limits.count = ::uop::v1::Node::descriptor();
      limits.max_counted = max_nodes;
      limits.max_bytes = cap;
      absl::StatusOr<WireCost> cost;
      {
        grpc::ProtoBufferReader reader(&call->request_);
        cost = scan_wire(reader, *Req::descriptor(), limits);
      }
      if (!cost.ok()) return finish(method, cost.status());
      if (cost->counted > max_nodes)
        return finish(method, absl::InvalidArgumentError(cat(method, ": the graph has more than max_nodes (", max_nodes,
                                                             ", --max-nodes) nodes [codec.limits]")));
      // Parsed, and decoded: what the request will hold until its handler is done.
      // Decoding copies strings (args, names) at most once: never more than the bytes.
      const uint64_t parsed = saturating_add(saturating_add(cost->bytes, cost->counted * kDecodedNodeBytes), received);
      if (cost->stopped || parsed > cap)
        return finish(method, absl::ResourceExhaustedError(cat(
                                  method, ": its ", received, " bytes would take more than ", cap,
                                  " bytes once parsed, more than one request may hold at once (--max-request-memory)")));
      if (absl::Status s = call->held_.grow(parsed, cat(method, ": parsing the request")); !s.ok()) return finish(method, s);
      gpb::Arena arena;  // the request's messages, freed at once
      Req* req = gpb::Arena::CreateMessage<Req>(&arena);
      bool parsed_ok = false;
      {
        grpc::ProtoBufferReader reader(&call->request_);
        parsed_ok = req->ParseFromZeroCopyStream(&reader);
      }
      call->request_.Clear();
      call->held_.shrink(received);
      if (!parsed_ok)
        return finish(method, absl::InvalidArgumentError(cat(method, ": the request is not a valid ", Req::descriptor()->full_name())));
      Resp resp;
      grpc::Status st = body(ctx, req, &resp, call->held_);
      if (!st.ok()) return st;
      // The request is done with: its memory goes back before the answer takes its own.
      arena.Reset();
      call->held_.shrink(parsed);
      if (absl::Status s = encode_response(resp, call->response_, call->held_); !s.ok()) return transport::to_grpc(s);
      return st;
    };
    grpc::Status st = answer();
    call->Finish(st);  // the last use of `call`: OnDone may delete it from now on
  });
  return call;
}

grpc::ServerUnaryReactor* UopdService::Compile(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  return serve_raw<pb::CompileRequest, pb::CompileResponse>(
      "Compile", ctx, request, response,
      [this](grpc::ServerContextBase* c, pb::CompileRequest* req, pb::CompileResponse* resp, ByteBudget::Hold&) {
        return Compile(c, req, resp);
      });
}

grpc::ServerUnaryReactor* UopdService::Tune(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) {
  return serve_raw<pb::TuneRequest, pb::TuneResponse>(
      "Tune", ctx, request, response,
      [this](grpc::ServerContextBase* c, pb::TuneRequest* req, pb::TuneResponse* resp, ByteBudget::Hold&) {
        return Tune(c, req, resp);
      });
}

grpc::ServerUnaryReactor* UopdService::Run(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
  return serve_raw<pb::RunRequest, pb::RunResponse>(
      "Run", ctx, request, response,
      [this](grpc::ServerContextBase* c, pb::RunRequest* req, pb::RunResponse* resp, ByteBudget::Hold& held) {
        return Run(c, req, resp, held);
      });
}

grpc::ServerUnaryReactor* UopdService::RunModel(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) {
  return serve_raw<pb::RunModelRequest, pb::RunResponse>(
      "RunModel", ctx, request, response,
      [this](grpc::ServerContextBase* c, pb::RunModelRequest* req, pb::RunResponse* resp, ByteBudget::Hold& held) {
        return RunModel(c, req, resp, held);
      });
}

grpc::ServerUnaryReactor* UopdService::Explain(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  return serve_raw<pb::ExplainRequest, pb::ExplainResponse>(
      "Explain", ctx, request, response,
      [this](grpc::ServerContextBase* c, pb::ExplainRequest* req, pb::ExplainResponse* resp, ByteBudget::Hold&) {
        return Explain(c, req, resp);
      });
}

// ---------------------------------------------------------------------------------------
// Upload: chunks forwarded to the buffer's worker as they arrive, one at a time, on a
// handler thread; the next read starts once a chunk is written. The watchdog ends an
// upload whose client sends nothing for --stream-idle-timeout-s, or that passes its
// deadline, with DEADLINE_EXCEEDED saying which.

class UopdService::UploadCall final : public grpc::ServerReadReactor<grpc::ByteBuffer>, public WatchedStream {
 public:
  UploadCall(UopdService* svc, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response)
      : svc_(svc), ctx_(ctx), response_(response), deadline_(svc->deadline(ctx)), last_activity_(absl::Now()) {
    ++svc_->in_flight_;
  }

  void start() {
    if (svc_->draining_)
      return end_now(absl::UnavailableError("uopd is shutting down: retry on another scheduler, or once it is back"));
    auto tenant = svc_->admit(ctx_);
    if (!tenant.ok()) return end_now(tenant.status());
    tenant_ = (*tenant)->name();
    svc_->watch(this);
    // Reads start under the lock: the watchdog, which ends calls under it too, then either
    // sees a read pending (its completion after Finish is ignored) or ended the call first.
    std::lock_guard<std::mutex> l(mu_);
    if (!ended_) StartRead(&chunk_bytes_);
  }

  void OnReadDone(bool ok) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (ended_) return;  // a read that completes after the watchdog ended the call
      busy_ = true;
    }
    svc_->threads_->submit([this, ok] { ok ? on_chunk() : on_end(); });
  }

  void OnDone() override {
    svc_->unwatch(this);
    --svc_->in_flight_;
    delete this;
  }

  // The watchdog: whether the call is idle past its limit or past its deadline; if so it
  // is ended here (on a handler thread, since finishing the writer may block).
  void check(absl::Time now) override {
    absl::Status why;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (ended_ || busy_) return;  // a chunk being written is progress; its write has the deadline
      if (now > deadline_)
        why = absl::DeadlineExceededError("upload: the request deadline passed (the client's, or --request-deadline-s)");
      else if (now - last_activity_ > svc_->d_.limits.stream_idle_timeout)
        why = absl::DeadlineExceededError(cat("upload: no chunk for ", absl::FormatDuration(svc_->d_.limits.stream_idle_timeout),
                                              " (--stream-idle-timeout-s); the upload is ended"));
      else
        return;
      ended_ = true;
    }
    svc_->threads_->submit([this, why] { finish_writer_and_end(why); });
  }

 private:
  // One chunk arrived (handler thread).
  void on_chunk() {
    absl::Status s = write_chunk();
    if (!s.ok()) return end(s);
    std::lock_guard<std::mutex> l(mu_);
    busy_ = false;
    last_activity_ = absl::Now();
    StartRead(&chunk_bytes_);
  }

  absl::Status write_chunk() {
    const uint64_t n = chunk_bytes_.Length();
    if (n > kMaxUploadMessage)
      return absl::InvalidArgumentError(cat("upload: a chunk message of ", n, " bytes; chunks carry at most 4 MiB of data"));
    // The bytes as received and as parsed, until they are on their way to the worker.
    ByteBudget::Hold chunk_held = svc_->inflight_.hold(2 * kMaxUploadMessage);
    if (absl::Status s = chunk_held.grow(2 * n, "upload: a chunk"); !s.ok()) return s;
    pb::UploadChunk chunk;
    {
      grpc::ProtoBufferReader reader(&chunk_bytes_);
      if (!chunk.ParseFromZeroCopyStream(&reader)) return absl::InvalidArgumentError("upload: a chunk is not a valid uopd.v1.UploadChunk");
    }
    chunk_bytes_.Clear();
    if (!writer_) {
      if (absl::Status s = open(chunk); !s.ok()) return s;
    }
    if (chunk.offset() > b_.bytes || chunk.data().size() > b_.bytes - chunk.offset())
      return absl::OutOfRangeError(cat("upload: chunk at byte ", chunk.offset(), " of ", chunk.data().size(),
                                       " bytes does not fit buffer ", b_.id, " of ", b_.bytes, " bytes"));
    total_ += chunk.data().size();
    // The writer may take the chunk's bytes; its failure is what finish() says.
    if (!writer_->write(chunk.offset(), *chunk.mutable_data()).ok()) return writer_->finish();
    return absl::OkStatus();
  }

  // The first chunk names the buffer.
  absl::Status open(const pb::UploadChunk& chunk) {
    auto b = svc_->d_.sessions->buffer(chunk.session_id(), chunk.buffer_id(), tenant_);
    if (!b.ok()) return b.status();
    auto w = svc_->d_.workers->worker_for(b->device, absl::Seconds(10), tenant_);
    if (!w.ok()) return w.status();
    if ((*w)->id() != b->worker_id || (*w)->generation() != b->worker_generation)
      return absl::UnavailableError(cat("buffer ", b->id, " was held by worker ", b->worker_id,
                                        ", which restarted since; its contents are lost"));
    b_ = *b;
    // Forward the chunks as they arrive: the upload never sits whole in the scheduler.
    writer_ = svc_->d_.executor->open_writer(*w, b_.worker_buffer, deadline_);
    return absl::OkStatus();
  }

  // The client closed its side (or went away): what was written, or why not.
  void on_end() {
    if (ctx_->IsCancelled()) return end(absl::CancelledError("upload: the client went away"));
    if (!writer_) return end(absl::InvalidArgumentError("upload: no chunks"));
    absl::Status ws = writer_->finish();
    if (!ws.ok()) return end(absl::Status(ws.code(), cat("uploading: ", ws.message())));
    svc_->bytes_in(total_);
    pb::UploadResponse resp;
    resp.set_bytes(total_);
    bool own = false;
    (void)grpc::SerializationTraits<pb::UploadResponse>::Serialize(resp, response_, &own);
    end(absl::OkStatus());
  }

  // From the handler thread that owns the call (busy_): no one else ends it meanwhile.
  void end(const absl::Status& s) {
    {
      std::lock_guard<std::mutex> l(mu_);
      ended_ = true;
    }
    finish_writer_and_end(s);
  }

  // Ends the call with `s` once the writes in flight are done (or failed). ended_ is set.
  void finish_writer_and_end(const absl::Status& s) {
    if (writer_) (void)writer_->finish();
    Finish(svc_->finish("Upload", s));  // the last use of `this`: OnDone may delete it from now on
  }

  // Before any read: nothing to wait for.
  void end_now(const absl::Status& s) {
    ended_ = true;
    Finish(svc_->finish("Upload", s));
  }

  UopdService* svc_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* response_;
  const absl::Time deadline_;
  std::string tenant_;
  grpc::ByteBuffer chunk_bytes_;
  BufferInfo b_;
  std::unique_ptr<Executor::BufferWriter> writer_;
  uint64_t total_ = 0;

  std::mutex mu_;
  bool ended_ = false;  // Finish has been (or is being) called
  bool busy_ = false;   // a chunk or the end is being handled on a handler thread
  absl::Time last_activity_;
};

grpc::ServerReadReactor<grpc::ByteBuffer>* UopdService::Upload(grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  auto* call = new UploadCall(this, ctx, response);
  call->start();
  return call;
}

void UopdService::watch(WatchedStream* c) {
  std::lock_guard<std::mutex> l(watch_mu_);
  streams_.insert(c);
}

void UopdService::unwatch(WatchedStream* c) {
  std::lock_guard<std::mutex> l(watch_mu_);
  streams_.erase(c);
}

void UopdService::watchdog() {
  std::unique_lock<std::mutex> l(watch_mu_);
  while (!stop_watchdog_) {
    // A tenth of the idle limit, at most a second: an idle stream ends within 10% of it.
    absl::Duration period = std::clamp(d_.limits.stream_idle_timeout / 10, absl::Milliseconds(10), absl::Seconds(1));
    watch_cv_.wait_for(l, absl::ToChronoMilliseconds(period));
    const absl::Time now = absl::Now();
    for (WatchedStream* c : streams_) c->check(now);
  }
}

}  // namespace uop::server
