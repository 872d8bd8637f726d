// FakeUopd: see fake_uopd.h. Deliberately simple; what it checks (chunk order and bounds,
// session ownership, bindings) is what the client must get right on the wire.
#include "tests/unit/client/fake_uopd.h"

#include <algorithm>

#include "compiler/ir/codec.h"
#include "compiler/ir/dtype.h"
#include "compiler/support/strings.h"

namespace uop::testing {

namespace pb = ::uopd::v1;
using ::grpc::Status;
using ::grpc::StatusCode;

namespace {
// The IR's Scalar and uop.v1.DType.Scalar number their values alike; the real server goes
// by name, a fake may take the shortcut.
int element_bytes(int dtype) { return dtype > 0 && dtype < kNumScalars ? scalar_bytes(static_cast<Scalar>(dtype)) : 0; }
}  // namespace

void FakeUopd::note(Ctx* ctx) {
  auto it = ctx->client_metadata().find("authorization");
  last_authorization = it == ctx->client_metadata().end() ? "" : std::string(it->second.data(), it->second.size());
}

Status FakeUopd::session_ok(const std::string& id) const {
  if (open_sessions.count(id)) return Status::OK;
  return Status(StatusCode::NOT_FOUND, cat("no session '", id, "'"));
}

Status FakeUopd::CreateSession(Ctx* ctx, const pb::CreateSessionRequest* req, pb::CreateSessionResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  note(ctx);
  std::string id = cat("s", next_id_++);
  open_sessions.insert(id);
  resp->set_session_id(id);
  if (req->devices().empty()) resp->add_devices("CPU:0");
  for (const std::string& d : req->devices()) resp->add_devices(d);
  return Status::OK;
}

Status FakeUopd::CloseSession(Ctx* ctx, const pb::CloseSessionRequest* req, pb::CloseSessionResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  note(ctx);
  if (Status s = session_ok(req->session_id()); !s.ok()) return s;
  open_sessions.erase(req->session_id());
  ++sessions_closed;
  for (auto it = buffers_.begin(); it != buffers_.end();) {
    if (it->second.session == req->session_id()) {
      it = buffers_.erase(it);
      resp->set_buffers_freed(resp->buffers_freed() + 1);
    } else {
      ++it;
    }
  }
  return Status::OK;
}

Status FakeUopd::CreateBuffer(Ctx* ctx, const pb::CreateBufferRequest* req, pb::CreateBufferResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  note(ctx);
  if (Status s = session_ok(req->session_id()); !s.ok()) return s;
  int size = element_bytes(req->dtype());
  if (size == 0 || req->elements() > (64u << 20)) return Status(StatusCode::INVALID_ARGUMENT, "bad buffer");
  std::string id = cat("b", next_id_++);
  buffers_[id] = Buffer{req->session_id(), req->dtype(), std::string(req->elements() * size, '\0')};
  resp->set_buffer_id(id);
  resp->set_bytes(req->elements() * size);
  return Status::OK;
}

Status FakeUopd::Upload(Ctx* ctx, ::grpc::ServerReader<pb::UploadChunk>* reader, pb::UploadResponse* resp) {
  pb::UploadChunk chunk;
  std::string session, buffer;
  uint64_t total = 0;
  std::optional<uint64_t> next;
  while (reader->Read(&chunk)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!next) {
      note(ctx);
      session = chunk.session_id();
      buffer = chunk.buffer_id();
    } else if (!chunk.session_id().empty() || chunk.offset() != *next) {
      return Status(StatusCode::INVALID_ARGUMENT, "chunks out of order");
    }
    if (Status s = session_ok(session); !s.ok()) return s;
    auto it = buffers_.find(buffer);
    if (it == buffers_.end() || it->second.session != session) return Status(StatusCode::NOT_FOUND, cat("no buffer '", buffer, "'"));
    std::string& bytes = it->second.bytes;
    if (chunk.offset() > bytes.size() || chunk.data().size() > bytes.size() - chunk.offset())
      return Status(StatusCode::OUT_OF_RANGE, cat("chunk at ", chunk.offset(), " overruns the buffer"));
    bytes.replace(chunk.offset(), chunk.data().size(), chunk.data());
    ++upload_chunks;
    max_upload_chunk = std::max<uint64_t>(max_upload_chunk, chunk.data().size());
    total += chunk.data().size();
    next = chunk.offset() + chunk.data().size();
  }
  resp->set_bytes(total);
  return Status::OK;
}

Status FakeUopd::Download(Ctx* ctx, const pb::DownloadRequest* req, ::grpc::ServerWriter<pb::DownloadChunk>* writer) {
  std::string data;
  {
    std::lock_guard<std::mutex> lock(mu_);
    note(ctx);
    if (Status s = session_ok(req->session_id()); !s.ok()) return s;
    auto it = buffers_.find(req->buffer_id());
    if (it == buffers_.end()) return Status(StatusCode::NOT_FOUND, cat("no buffer '", req->buffer_id(), "'"));
    const std::string& b = it->second.bytes;
    if (req->offset() > b.size()) return Status(StatusCode::OUT_OF_RANGE, "offset past the end");
    uint64_t len = req->length() == 0 ? b.size() - req->offset() : req->length();
    if (len > b.size() - req->offset()) return Status(StatusCode::OUT_OF_RANGE, "length past the end");
    data = b.substr(req->offset(), len);
  }
  uint64_t chunk = req->chunk_bytes() == 0 ? (1u << 20) : req->chunk_bytes();
  for (uint64_t done = 0; done < data.size(); done += chunk) {
    pb::DownloadChunk c;
    c.set_offset(req->offset() + done);
    c.set_data(data.substr(done, chunk));
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++download_chunks;
    }
    if (!writer->Write(c)) break;
  }
  return Status::OK;
}

Status FakeUopd::FreeBuffer(Ctx* ctx, const pb::FreeBufferRequest* req, pb::FreeBufferResponse*) {
  std::lock_guard<std::mutex> lock(mu_);
  note(ctx);
  if (Status s = session_ok(req->session_id()); !s.ok()) return s;
  if (!buffers_.erase(req->buffer_id())) return Status(StatusCode::NOT_FOUND, cat("no buffer '", req->buffer_id(), "'"));
  return Status::OK;
}

Status FakeUopd::Compile(Ctx* ctx, const pb::CompileRequest* req, pb::CompileResponse* resp) {
  auto g = decode_proto(req->graph());
  if (!g.ok()) return Status(StatusCode::INVALID_ARGUMENT, std::string(g.status().message()));
  std::lock_guard<std::mutex> lock(mu_);
  note(ctx);
  std::string digest = g->root->digest().hex();
  pb::Kernel* k = resp->add_kernels();
  k->set_name("E_fake");
  k->set_digest(digest);
  k->set_cache_key(digest);
  if (compiled_.insert(digest).second) {
    k->set_status(pb::MISS);
    k->set_compile_ms(12.5);
  } else {
    k->set_status(pb::HIT);
    k->set_tier("memory");
  }
  k->set_abi("slot 0: float32[12] read\nslot 1: float32[12] written\n");
  if (req->include_binary()) k->set_binary(cat("binary for ", req->target().backend()));
  if (req->include_source()) k->set_source("; source");
  resp->set_graph_digest(digest);
  return Status::OK;
}

Status FakeUopd::Run(Ctx* ctx, const pb::RunRequest* req, pb::RunResponse* resp) {
  auto g = decode_proto(req->graph());
  if (!g.ok()) return Status(StatusCode::INVALID_ARGUMENT, std::string(g.status().message()));
  std::lock_guard<std::mutex> lock(mu_);
  note(ctx);
  last_run = *req;
  if (Status s = session_ok(req->session_id()); !s.ok()) return s;
  std::string first_data;
  int first_dtype = 0;
  for (int i = 0; i < req->inputs_size(); ++i) {
    const pb::Binding& b = req->inputs(i);
    if (b.has_name()) {
      bool found = std::any_of(g->names.begin(), g->names.end(), [&](auto& n) { return n.first == b.name(); });
      if (!found) return Status(StatusCode::INVALID_ARGUMENT, cat("the graph has no input named '", b.name(), "'"));
    } else if (b.index() >= g->nodes.size()) {
      return Status(StatusCode::INVALID_ARGUMENT, cat("no node ", b.index()));
    }
    std::string data;
    int dtype = 0;
    if (b.has_tensor()) {
      data = b.tensor().data();
      dtype = b.tensor().dtype();
    } else {
      auto it = buffers_.find(b.buffer_id());
      if (it == buffers_.end() || it->second.session != req->session_id())
        return Status(StatusCode::NOT_FOUND, cat("no buffer '", b.buffer_id(), "'"));
      data = it->second.bytes;
      dtype = it->second.dtype;
    }
    if (i == 0) first_data = std::move(data), first_dtype = dtype;
  }
  if (first_dtype == 0) return Status(StatusCode::INVALID_ARGUMENT, "the fake needs one input");
  std::string out_name = "out0";
  if (!g->root->src().empty())
    for (auto& [n, u] : g->names)
      if (u == g->root->src(0)) out_name = n;
  pb::Output* o = resp->add_outputs();
  o->set_name(out_name);
  o->set_dtype(static_cast<uop::v1::DType::Scalar>(first_dtype));
  o->add_shape(static_cast<int64_t>(first_data.size() / element_bytes(first_dtype)));
  if (req->keep_outputs()) {
    std::string id = cat("b", next_id_++);
    buffers_[id] = Buffer{req->session_id(), first_dtype, first_data};
    o->set_buffer_id(id);
  } else {
    o->set_data(first_data);
  }
  pb::Kernel* k = resp->add_kernels();
  k->set_name("E_fake");
  k->set_digest(g->root->digest().hex());
  k->set_status(pb::HIT);
  k->set_tier("disk");
  resp->set_device("CPU:0");
  return Status::OK;
}

Status FakeUopd::Explain(Ctx* ctx, const pb::ExplainRequest* req, pb::ExplainResponse* resp) {
  auto g = decode_proto(req->graph());
  if (!g.ok()) return Status(StatusCode::INVALID_ARGUMENT, std::string(g.status().message()));
  if (!req->stage().empty() && req->stage() != "decode")
    return Status(StatusCode::INVALID_ARGUMENT, cat("unknown stage '", req->stage(), "'; stages: decode"));
  auto* s = resp->add_stages();
  s->set_name("decode");
  s->set_text(cat(g->nodes.size(), " nodes\n"));
  return Status::OK;
}

Status FakeUopd::Stats(Ctx* ctx, const pb::StatsRequest*, pb::StatsResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  note(ctx);
  resp->set_compiles(compiled_.size());
  resp->set_cache_hits_memory(7);
  resp->set_sessions(open_sessions.size());
  resp->set_buffers(buffers_.size());
  resp->set_compiler_build_id("fake-1");
  auto* w = resp->add_workers();
  w->set_id("cpu0");
  w->set_device("CPU:0");
  w->set_state("up");
  w->set_pid(42);
  return Status::OK;
}

std::unique_ptr<FakeServer> FakeServer::start() {
  auto f = std::make_unique<FakeServer>();
  ::grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", ::grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&f->service);
  f->server = b.BuildAndStart();
  if (!f->server || port == 0) return nullptr;
  f->address = cat("127.0.0.1:", port);
  return f;
}

}  // namespace uop::testing
