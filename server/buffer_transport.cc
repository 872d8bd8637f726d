// Executor's buffer traffic: allocating, writing, reading and freeing worker buffers, for
// the buffer RPCs (CreateBuffer, Upload, Download, FreeBuffer) and for the runs. Writes and
// reads go through the worker's execute lane (transport/exec_lane.h) while it has one with
// a slot free, else over gRPC, in chunks of Executor::kChunk bytes; a failure is reported
// as Executor::failed says (a worker that died, through the pool).
#include "server/executor.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "compiler/support/strings.h"
#include "proto/worker.grpc.pb.h"
#include "transport/grpc_absl.h"
#include "transport/lane_messages.h"

namespace uop::server {
namespace {

namespace wpb = ::uopd::worker::v1;

using transport::from_grpc;
using transport::set_deadline;

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
  const uint64_t generation = w->generation();
  auto st = stub(w);
  absl::Status s = st.ok() ? from_grpc((*st)->AllocBuffer(&ctx, req, &resp)) : st.status();
  if (s.ok()) return s;
  const uint64_t ids[] = {id};
  w->release_buffer_ids(ids, generation);
  return st.ok() ? failed(w, s, "allocating a buffer") : s;
}

namespace {

// A writer that sends each piece through the lane while a slot is free, and what is left
// over one gRPC WriteBuffer stream, opened when first needed.
class LaneOrStreamWriter final : public Executor::BufferWriter {
 public:
  LaneOrStreamWriter(Executor* ex, Executor::Worker w, uint64_t id, absl::Time deadline)
      : ex_(ex), w_(std::move(w)), id_(id), deadline_(deadline), generation_(w_->generation()), lane_(w_->lane()) {}
  ~LaneOrStreamWriter() override { (void)finish(); }

  absl::Status write(uint64_t offset, std::string& data) override {
    if (!status_.ok()) return status_;
    if (broken_) return absl::AbortedError("writing a buffer: the stream to the worker closed");
    std::string_view rest = data;
    if (lane_) {
      const size_t room = lane_->capacity() - lane::kWriteHeader;
      while (!rest.empty()) {
        std::optional<ExecLane::Call> call = lane_->claim();
        if (!call) break;  // every slot busy: the rest goes over gRPC
        const size_t n = std::min(room, rest.size());
        std::span<char> req = call->request();
        lane::encode_write_header(req, id_, offset);
        std::memcpy(req.data() + lane::kWriteHeader, rest.data(), n);
        absl::StatusOr<std::string_view> reply = call->call(lane::kWriteHeader + n, deadline_);
        if (!reply.ok()) return status_ = ex_->failed(w_, reply.status(), "writing a buffer", generation_);
        rest.remove_prefix(n);
        offset += n;
      }
      if (rest.empty()) return absl::OkStatus();
    }
    if (!stream_) {
      auto st = Executor::stub(w_);
      if (!st.ok()) return status_ = st.status();
      stub_ = *st;
      set_deadline(ctx_, deadline_);
      stream_ = stub_->WriteBuffer(&ctx_, &resp_);
      chunk_.set_buffer_id(id_);
    }
    chunk_.set_offset(offset);
    // The whole string: trade buffers with the chunk (they are reused chunk after chunk).
    if (rest.size() == data.size()) chunk_.mutable_data()->swap(data);
    else chunk_.mutable_data()->assign(rest.data(), rest.size());
    if (stream_->Write(chunk_)) return absl::OkStatus();
    broken_ = true;  // finish() says why
    return absl::AbortedError("writing a buffer: the stream to the worker closed");
  }

  absl::Status finish() override {
    if (stream_) {
      stream_->WritesDone();
      absl::Status s = from_grpc(stream_->Finish());
      stream_.reset();
      if (!s.ok() && status_.ok()) status_ = ex_->failed(w_, s, "writing a buffer", generation_);
      else if (broken_ && status_.ok()) status_ = absl::InternalError("writing a buffer: the stream broke");
    }
    return status_;
  }

 private:
  Executor* ex_;
  Executor::Worker w_;
  uint64_t id_;
  absl::Time deadline_;
  uint64_t generation_;
  std::shared_ptr<ExecLane> lane_;
  absl::Status status_;
  std::shared_ptr<Executor::Stub> stub_;
  grpc::ClientContext ctx_;
  wpb::WriteBufferResponse resp_;
  std::unique_ptr<grpc::ClientWriter<wpb::WriteChunk>> stream_;
  wpb::WriteChunk chunk_;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Executor::BufferWriter> Executor::open_writer(const Worker& w, uint64_t id, absl::Time deadline) {
  return std::make_unique<LaneOrStreamWriter>(this, w, id, deadline);
}

absl::Status Executor::write(const Worker& w, uint64_t id, uint64_t offset, std::string_view data, absl::Time deadline) {
  LaneOrStreamWriter writer(this, w, id, deadline);
  std::string piece;
  for (uint64_t at = 0; at < data.size(); at += kChunk) {
    std::string_view part = data.substr(at, kChunk);
    piece.assign(part.data(), part.size());
    if (!writer.write(offset + at, piece).ok()) break;
  }
  return writer.finish();
}

absl::Status Executor::read_into(const Worker& w, uint64_t id, uint64_t offset, uint64_t length, absl::Time deadline,
                                 const std::function<bool(uint64_t, std::string&)>& sink) {
  const uint64_t end = offset + length;
  if (std::shared_ptr<ExecLane> lane = w->lane(); lane && length > 0) {
    const uint64_t generation = w->generation();
    const uint64_t most = std::min<uint64_t>(kChunk, lane->capacity());
    std::string piece;
    while (offset < end) {
      const uint64_t n = std::min(most, end - offset);
      {
        std::optional<ExecLane::Call> call = lane->claim();
        if (!call) break;  // every slot busy: the rest comes over gRPC
        lane::encode_read(call->request(), {id, offset, n});
        absl::StatusOr<std::string_view> reply = call->call(lane::kReadRequest, deadline);
        if (!reply.ok()) return failed(w, reply.status(), "reading a buffer", generation);
        if (reply->size() != n)
          return absl::InternalError(cat("worker ", w->id(), " returned ", reply->size(), " of ", n, " bytes"));
        piece.assign(reply->data(), reply->size());
      }  // the slot is free again before the sink (a client's pace) runs
      if (!sink(offset, piece)) return absl::OkStatus();
      offset += n;
    }
    if (offset == end) return absl::OkStatus();
    length = end - offset;
  }
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
    if (!sink(chunk.offset(), *chunk.mutable_data())) {
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
  absl::Status s = read_into(w, id, offset, length, deadline, [&](uint64_t at, std::string& data) {
    if (at != offset + out.size()) return false;  // chunks arrive in order; anything else is a bug
    out.append(data);
    return true;
  });
  if (!s.ok()) return s;
  if (out.size() != length)
    return absl::InternalError(cat("worker ", w->id(), " returned ", out.size(), " of ", length, " bytes"));
  return out;
}

std::optional<absl::Status> Executor::call_on_lane(ExecLane& lane, lane::Kind kind,
                                                   const google::protobuf::MessageLite& req, uint64_t reply_bound,
                                                   absl::Time deadline, google::protobuf::MessageLite* resp,
                                                   const std::atomic<bool>* cancel) {
  const size_t n = 1 + req.ByteSizeLong();
  if (n > lane.capacity() || reply_bound > lane.capacity()) return std::nullopt;
  std::optional<ExecLane::Call> call = lane.claim();
  if (!call) return std::nullopt;
  std::span<char> out = call->request();
  out[0] = static_cast<char>(kind);
  req.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + 1));
  absl::StatusOr<std::string_view> reply = call->call(n, deadline, cancel);
  if (!reply.ok()) return reply.status();
  if (!resp->ParseFromArray(reply->data(), static_cast<int>(reply->size())))
    return absl::InternalError(
        cat("the worker's ", reply->size(), "-byte reply on the execute lane is not a ", resp->GetTypeName()));
  return absl::OkStatus();
}

absl::Status Executor::free(const Worker& w, const std::vector<uint64_t>& ids, std::optional<uint64_t> of) {
  if (ids.empty()) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  wpb::FreeBuffersRequest req;
  for (uint64_t id : ids) req.add_buffer_ids(id);
  wpb::FreeBuffersResponse resp;
  const uint64_t generation = of.value_or(w->generation());
  std::optional<absl::Status> on_lane;
  if (std::shared_ptr<ExecLane> lane = w->lane()) on_lane = call_on_lane(*lane, lane::Kind::Free, req, 16, deadline, &resp);
  absl::Status s;
  if (on_lane) {
    s = *on_lane;
  } else {
    auto st = stub(w);
    if (!st.ok()) return st.status();
    grpc::ClientContext ctx;
    set_deadline(ctx, deadline);
    s = from_grpc((*st)->FreeBuffers(&ctx, req, &resp));
  }
  if (!s.ok()) return failed(w, s, "freeing buffers", generation);
  w->release_buffer_ids(ids, generation);
  return s;
}

void Executor::free_later(const Worker& w, uint64_t generation, const std::vector<uint64_t>& ids) {
  if (ids.empty() || w->generation() != generation) return;
  std::lock_guard l(frees_mu_);
  if (frees_stop_) return;
  frees_.push_back({w, generation, ids});
  ++frees_queued_;
  if (!freer_.joinable()) freer_ = std::thread([this] { send_frees(); });
  frees_cv_.notify_one();
}

// An id is handed out again only once its buffer is surely gone (free() releases it after
// the worker's answer). A worker that fails to answer is the pool's business, as for any
// call; its frees are not retried (its buffers go with its process).
void Executor::send_frees() {
  std::unique_lock l(frees_mu_);
  for (;;) {
    frees_cv_.wait(l, [&] { return frees_stop_ || !frees_.empty(); });
    if (frees_stop_) return;
    LaterFree f = std::move(frees_.front());
    frees_.pop_front();
    l.unlock();
    if (f.w->generation() == f.generation) (void)free(f.w, f.ids, f.generation);
    l.lock();
    ++frees_done_;
    frees_cv_.notify_all();
  }
}

void Executor::wait_for_frees() {
  std::unique_lock l(frees_mu_);
  const uint64_t target = frees_queued_;
  frees_cv_.wait(l, [&] { return frees_stop_ || frees_done_ >= target; });
}

Executor::~Executor() {
  {
    std::lock_guard l(frees_mu_);
    frees_stop_ = true;
  }
  frees_cv_.notify_all();
  if (freer_.joinable()) freer_.join();
}

}  // namespace uop::server
