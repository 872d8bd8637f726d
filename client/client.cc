// The client library over the generated Uopd stub: plain structs and IR nodes in,
// protobuf messages on the wire, absl::Status out. Every gRPC status passes through
// to_status() (one place); every response is checked before it becomes a HostTensor,
// since a buggy or hostile server must not make the client misread memory.
#include "client/client.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <optional>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "compiler/support/status_macros.h"
#include "compiler/support/strings.h"
#include "proto/uopd.grpc.pb.h"
#include "transport/grpc_absl.h"

namespace uop::client {

namespace pb = ::uopd::v1;

// ---------------------------------------------------------------------------------------
// Pure helpers (no server): statuses, chunks, targets, cache status.

absl::Status status_from_grpc(int code, std::string_view message) { return transport::status_from_code(code, message); }

uint32_t effective_chunk_bytes(uint64_t requested) {
  if (requested == 0) return kDefaultChunkBytes;
  return static_cast<uint32_t>(std::min<uint64_t>(requested, kMaxChunkBytes));
}

std::vector<ByteRange> chunk_ranges(uint64_t offset, uint64_t size, uint64_t chunk_bytes) {
  const uint64_t chunk = effective_chunk_bytes(chunk_bytes);
  std::vector<ByteRange> out;
  out.reserve(size / chunk + 1);
  uint64_t done = 0;
  do {
    uint64_t n = std::min(chunk, size - done);
    out.push_back({offset + done, n});
    done += n;
  } while (done < size);
  return out;
}

absl::StatusOr<Target> parse_target(std::string_view text) {
  if (text == "cpu") return Target{"cpu", ""};
  if (text == "cuda") return Target{"cuda", ""};
  constexpr std::string_view kSm = "cuda:sm_";
  if (text.size() > kSm.size() && text.substr(0, kSm.size()) == kSm &&
      std::all_of(text.begin() + kSm.size(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return Target{"cuda", std::string(text.substr(5))};
  return absl::InvalidArgumentError(cat("unknown target '", text, "' (cpu, cuda or cuda:sm_NN, e.g. cuda:sm_90)"));
}

std::string target_str(const Target& t) {
  std::string backend = t.backend.empty() ? "cpu" : t.backend;
  return t.arch.empty() ? backend : cat(backend, ":", t.arch);
}

std::string_view cache_status_name(CacheStatus s) {
  switch (s) {
    case CacheStatus::Hit: return "hit";
    case CacheStatus::Miss: return "miss";
    case CacheStatus::Coalesced: return "coalesced";
    case CacheStatus::Unspecified: break;
  }
  return "unspecified";
}

namespace {

// Milliseconds as a person reads them: "0.4 ms", "12 ms".
std::string ms_str(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, ms < 10 ? "%.1f ms" : "%.0f ms", ms);
  return buf;
}

}  // namespace

std::string describe_cache(const Kernel& k) {
  switch (k.status) {
    case CacheStatus::Miss: return cat("miss, compiled in ", ms_str(k.compile_ms));
    case CacheStatus::Hit: return k.tier.empty() ? std::string("hit") : cat("hit (", k.tier, ")");
    case CacheStatus::Coalesced: return "coalesced (waited for a concurrent compile)";
    case CacheStatus::Unspecified: break;
  }
  return "cache status not reported";
}

// ---------------------------------------------------------------------------------------
// The connection: channel, stub, and the per-request context.

namespace detail {

struct Connection {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Uopd::Stub> stub;

  // A context carrying the deadline (options.deadline, or `limit` if shorter) and the
  // bearer token. A ClientContext serves one call only, hence one per request.
  std::unique_ptr<grpc::ClientContext> context(absl::Duration limit = absl::InfiniteDuration()) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    absl::Duration d = std::min(options.deadline, limit);
    // An infinite (or absurd) deadline is no deadline; adding it to now() would overflow.
    if (d < absl::Hours(24 * 365)) ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d));
    // Over TLS the token is the channel's call credentials (see connect()).
    if (!options.bearer_token.empty() && !options.uses_tls())
      ctx->AddMetadata("authorization", cat("Bearer ", options.bearer_token));
    return ctx;
  }
};

}  // namespace detail

namespace {

// The client never reports the status of a call it cancelled itself, so a CANCELLED that
// arrives is the server's or the connection's doing (seen while a scheduler shuts down, with
// no message): as retryable as UNAVAILABLE, and said so.
absl::Status to_status(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::CANCELLED)
    return absl::UnavailableError(cat("uopd or the connection cancelled the call (",
                                      s.error_message().empty() ? std::string("no reason given") : s.error_message(),
                                      "); the server may be shutting down: retry"));
  return status_from_grpc(s.error_code(), s.error_message());
}

// The IR and the wire name scalars alike ("float32" / FLOAT32); going by name keeps the
// two enums free to number differently, as the codec does.
std::optional<uop::v1::DType::Scalar> scalar_to_wire(Scalar s) {
  std::string name(scalar_name(s));
  for (char& c : name) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  uop::v1::DType::Scalar w;
  if (!uop::v1::DType::Scalar_Parse(name, &w)) return std::nullopt;
  return w;
}

std::optional<Scalar> scalar_from_wire(int number) {
  if (!uop::v1::DType::Scalar_IsValid(number)) return std::nullopt;
  std::string name = uop::v1::DType::Scalar_Name(static_cast<uop::v1::DType::Scalar>(number));
  for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return scalar_from_name(name);
}

void target_to_wire(const Target& t, pb::Target* out) {
  out->set_backend(t.backend);
  out->set_arch(t.arch);
}

Kernel kernel_from_wire(const pb::Kernel& k) {
  Kernel out;
  out.name = k.name();
  out.digest = k.digest();
  out.cache_key = k.cache_key();
  switch (k.status()) {
    case pb::HIT: out.status = CacheStatus::Hit; break;
    case pb::MISS: out.status = CacheStatus::Miss; break;
    case pb::COALESCED: out.status = CacheStatus::Coalesced; break;
    default: out.status = CacheStatus::Unspecified; break;
  }
  out.tier = k.tier();
  out.compile_ms = k.compile_ms();
  out.abi = k.abi();
  out.binary = k.binary();
  out.source = k.source();
  return out;
}

std::vector<Kernel> kernels_from_wire(const google::protobuf::RepeatedPtrField<pb::Kernel>& ks) {
  std::vector<Kernel> out;
  out.reserve(ks.size());
  for (const pb::Kernel& k : ks) out.push_back(kernel_from_wire(k));
  return out;
}

absl::Status tensor_to_wire(const HostTensor& t, pb::Tensor* out) {
  std::optional<uop::v1::DType::Scalar> dt = scalar_to_wire(t.dtype);
  std::optional<int64_t> n = checked_numel(t.shape);
  if (!dt || t.dtype == Scalar::Void)
    return absl::InvalidArgumentError(cat("a tensor of dtype ", scalar_name(t.dtype), " cannot be sent"));
  if (!n || *n * t.itemsize() != t.nbytes())
    return absl::InvalidArgumentError(cat("tensor ", scalar_name(t.dtype), shape_str(t.shape), " holds ", t.nbytes(), " bytes"));
  out->set_dtype(*dt);
  for (int64_t d : t.shape) out->add_shape(d);
  out->set_data(t.data);
  return absl::OkStatus();
}

// The dtype and shape the server gave an output (or a kept buffer) become a HostTensor
// with no data yet; nothing is allocated from the server's numbers before they check out.
absl::StatusOr<HostTensor> tensor_header(const std::string& what, int dtype,
                                         const google::protobuf::RepeatedField<int64_t>& shape) {
  std::optional<Scalar> s = scalar_from_wire(dtype);
  std::vector<int64_t> dims(shape.begin(), shape.end());
  if (!s || *s == Scalar::Void) return absl::InternalError(cat("uopd sent ", what, " with dtype number ", dtype));
  std::optional<int64_t> n = checked_numel(dims);
  if (!n || *n > (int64_t{1} << 62) / scalar_bytes(*s))
    return absl::InternalError(cat("uopd sent ", what, " with shape ", shape_str(dims)));
  HostTensor t;
  t.dtype = *s;
  t.shape = std::move(dims);
  return t;
}

absl::Status check_data_size(const std::string& what, const HostTensor& t, uint64_t bytes) {
  uint64_t want = static_cast<uint64_t>(t.numel()) * t.itemsize();
  if (bytes == want) return absl::OkStatus();
  return absl::DataLossError(cat("uopd sent ", bytes, " bytes for ", what, " (", scalar_name(t.dtype),
                                 shape_str(t.shape), ": ", want, " bytes)"));
}

// Wire indices of nodes as encode_proto numbers them: codec.h promises the nodes of
// toposort({named..., root}) in that order.
absl::flat_hash_map<const UOp*, uint32_t> wire_indices(const UOp* root, const Names& names) {
  std::vector<const UOp*> roots;
  for (const auto& [name, u] : names) roots.push_back(u);
  roots.push_back(root);
  absl::flat_hash_map<const UOp*, uint32_t> out;
  for (const UOp* u : toposort(roots)) out.emplace(u, static_cast<uint32_t>(out.size()));
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Client

Client::Client(std::shared_ptr<detail::Connection> conn) : conn_(std::move(conn)) {}
Client::~Client() = default;

const std::string& Client::address() const { return conn_->options.address; }

namespace {

absl::StatusOr<std::string> read_pem(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(cat(what, " ", path, ": cannot open it"));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN ") == std::string::npos)
    return absl::InvalidArgumentError(cat(what, " ", path, ": not a PEM file"));
  return ss.str();
}

// TLS channel credentials from the options' PEM files, with the bearer token (if any) as
// call credentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls_credentials(const ClientOptions& o) {
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_ca.empty()) {
    auto ca = read_pem(o.tls_ca, "TLS CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  if (o.tls_cert.empty() != o.tls_key.empty())
    return absl::InvalidArgumentError("a TLS client certificate needs its key, and a key its certificate");
  if (!o.tls_cert.empty()) {
    auto cert = read_pem(o.tls_cert, "TLS certificate");
    if (!cert.ok()) return cert.status();
    auto key = read_pem(o.tls_key, "TLS key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  if (!o.bearer_token.empty())
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(o.bearer_token));
  return creds;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::connect(const ClientOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("no uopd address given");
  // Transfers receive and send 1-4 MiB blocks (gRPC's slices, protobuf's strings). With
  // glibc's default (dynamic) thresholds those blocks end up mmap'ed or trimmed back to
  // the kernel when freed, and every chunk page-faults its memory in again: a 256 MiB
  // download spent most of its time in page faults. Blocks up to 64 MiB stay on the heap
  // and up to 256 MiB of freed heap stays mapped. Once per process, and not where the
  // process chose its own malloc settings (GLIBC_TUNABLES) or said no (tune_malloc).
  if (options.tune_malloc) {
    static const bool tuned = [] {
      if (std::getenv("GLIBC_TUNABLES") != nullptr) return false;
      mallopt(M_MMAP_THRESHOLD, 64 << 20);
      mallopt(M_TRIM_THRESHOLD, 256 << 20);
      return true;
    }();
    (void)tuned;
  }
  auto conn = std::make_shared<detail::Connection>();
  conn->options = options;
  conn->options.chunk_bytes = effective_chunk_bytes(options.chunk_bytes);
  grpc::ChannelArguments args;
  // Run outputs and compiled binaries come back inline and may exceed gRPC's 4 MiB
  // default; what the client receives is bounded by what it asked for.
  args.SetMaxReceiveMessageSize(-1);
  // After a server restart, reconnect within a second or two rather than gRPC's default
  // backoff of up to two minutes: calls fail fast (UNAVAILABLE) while it is away.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options.uses_tls()) {
    auto tls = tls_credentials(options);
    if (!tls.ok()) return tls.status();
    creds = *tls;
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  conn->channel = grpc::CreateCustomChannel(options.address, creds, args);
  absl::Duration wait = std::min(options.connect_timeout, options.deadline);
  if (!conn->channel->WaitForConnected(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(wait)))
    return absl::UnavailableError(
        cat("cannot reach uopd at ", options.address, " (not ready after ", absl::FormatDuration(wait), ")"));
  conn->stub = pb::Uopd::NewStub(conn->channel);
  return std::unique_ptr<Client>(new Client(std::move(conn)));
}

absl::StatusOr<Session> Client::create_session(std::vector<std::string> devices, absl::Duration idle_timeout) {
  pb::CreateSessionRequest req;
  for (std::string& d : devices) req.add_devices(std::move(d));
  if (idle_timeout > absl::ZeroDuration()) req.set_idle_timeout_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(idle_timeout)));
  pb::CreateSessionResponse resp;
  auto ctx = conn_->context();
  if (absl::Status s = to_status(conn_->stub->CreateSession(ctx.get(), req, &resp)); !s.ok()) return s;
  if (resp.session_id().empty()) return absl::InternalError("uopd created a session without an id");
  return Session(conn_, resp.session_id(), {resp.devices().begin(), resp.devices().end()});
}

absl::StatusOr<CompileResult> Client::compile(const UOp* root, const Names& names, const Target& target,
                                              bool include_binary, bool include_source,
                                              const std::vector<KernelSchedule>& schedules) {
  pb::CompileRequest req;
  for (const KernelSchedule& s : schedules) {
    pb::KernelSchedule* w = req.add_schedules();
    w->set_digest(s.digest);
    w->set_schedule(s.schedule);
  }
  encode_proto(root, names, req.mutable_graph());
  target_to_wire(target, req.mutable_target());
  req.set_include_binary(include_binary);
  req.set_include_source(include_source);
  pb::CompileResponse resp;
  auto ctx = conn_->context();
  if (absl::Status s = to_status(conn_->stub->Compile(ctx.get(), req, &resp)); !s.ok()) return s;
  CompileResult out;
  out.kernels = kernels_from_wire(resp.kernels());
  out.graph_digest = resp.graph_digest();
  out.plan_cached = resp.plan_cached();
  return out;
}

absl::StatusOr<std::vector<ExplainStage>> Client::explain(const UOp* root, const Names& names,
                                                          const std::string& stage, const Target& target) {
  pb::ExplainRequest req;
  encode_proto(root, names, req.mutable_graph());
  target_to_wire(target, req.mutable_target());
  req.set_stage(stage);
  pb::ExplainResponse resp;
  auto ctx = conn_->context();
  if (absl::Status s = to_status(conn_->stub->Explain(ctx.get(), req, &resp)); !s.ok()) return s;
  std::vector<ExplainStage> out;
  for (const auto& st : resp.stages()) out.push_back({st.name(), st.kernel(), st.text()});
  return out;
}

absl::StatusOr<TuneResult> Client::tune(const UOp* root, const Names& names, const std::string& digest, uint32_t width,
                                        uint32_t budget_s) {
  pb::TuneRequest req;
  encode_proto(root, names, req.mutable_graph());
  req.set_digest(digest);
  req.set_width(width);
  req.set_budget_s(budget_s);
  pb::TuneResponse r;
  auto ctx = conn_->context();
  if (absl::Status s = to_status(conn_->stub->Tune(ctx.get(), req, &r)); !s.ok()) return s;
  TuneResult out;
  out.name = r.name();
  out.digest = r.digest();
  out.heuristic_schedule = r.heuristic_schedule();
  out.schedule = r.schedule();
  out.before_ms = r.before_ms();
  out.after_ms = r.after_ms();
  out.from_record = r.from_record();
  out.skipped = r.skipped();
  out.candidates_timed = r.candidates_timed();
  out.dropped_compile = r.dropped_compile();
  out.dropped_mismatch = r.dropped_mismatch();
  out.dropped_crash = r.dropped_crash();
  out.dropped_timeout = r.dropped_timeout();
  out.seconds = r.seconds();
  return out;
}

absl::StatusOr<Stats> Client::stats() {
  pb::StatsResponse r;
  auto ctx = conn_->context();
  if (absl::Status s = to_status(conn_->stub->Stats(ctx.get(), pb::StatsRequest(), &r)); !s.ok()) return s;
  Stats out;
  out.compiles = r.compiles();
  out.cache_hits_memory = r.cache_hits_memory();
  out.cache_hits_disk = r.cache_hits_disk();
  out.cache_hits_redis = r.cache_hits_redis();
  out.cache_misses = r.cache_misses();
  out.cache_coalesced = r.cache_coalesced();
  out.cache_errors = r.cache_errors();
  out.plan_cache_hits = r.plan_cache_hits();
  out.plan_cache_misses = r.plan_cache_misses();
  out.kernels_run = r.kernels_run();
  out.worker_executes_lane = r.worker_executes_lane();
  out.worker_executes_grpc = r.worker_executes_grpc();
  out.launches_timed = r.launches_timed();
  out.sessions = r.sessions();
  out.buffers = r.buffers();
  out.buffer_bytes = r.buffer_bytes();
  out.compile_queue_depth = r.compile_queue_depth();
  out.compile_tasks_running = r.compile_tasks_running();
  out.compiles_in_progress = r.compiles_in_progress();
  out.model_weight_buffers_written = r.model_weight_buffers_written();
  out.model_weight_bytes_written = r.model_weight_bytes_written();
  out.bytes_uploaded = r.bytes_uploaded();
  out.run_graph_bytes = r.run_graph_bytes();
  out.compiler_build_id = r.compiler_build_id();
  out.searches = r.searches();
  out.candidates_timed = r.candidates_timed();
  out.candidates_dropped_compile = r.candidates_dropped_compile();
  out.candidates_dropped_mismatch = r.candidates_dropped_mismatch();
  out.candidates_dropped_crash = r.candidates_dropped_crash();
  out.candidates_dropped_timeout = r.candidates_dropped_timeout();
  out.leases_held_elsewhere = r.leases_held_elsewhere();
  out.leases_lost = r.leases_lost();
  out.tuning_records_memory = r.tuning_records_memory();
  out.tuning_records_disk = r.tuning_records_disk();
  out.tuning_records_redis = r.tuning_records_redis();
  out.tuning_record_misses = r.tuning_record_misses();
  out.tuning_record_errors = r.tuning_record_errors();
  out.tuning_records_written = r.tuning_records_written();
  out.search = r.search();
  for (const pb::WorkerStatus& w : r.workers())
    out.workers.push_back({w.id(), w.device(), w.address(), w.state(), w.pid(), w.restarts(), w.last_error()});
  return out;
}

// ---------------------------------------------------------------------------------------
// Session

Session::Session(std::shared_ptr<detail::Connection> conn, std::string id, std::vector<std::string> devices)
    : conn_(std::move(conn)), id_(std::move(id)), devices_(std::move(devices)), open_(true) {}

Session::Session(Session&& o) noexcept
    : conn_(std::move(o.conn_)), id_(std::move(o.id_)), devices_(std::move(o.devices_)), open_(std::exchange(o.open_, false)) {}

Session& Session::operator=(Session&& o) noexcept {
  if (this != &o) {
    (void)close();
    conn_ = std::move(o.conn_);
    id_ = std::move(o.id_);
    devices_ = std::move(o.devices_);
    open_ = std::exchange(o.open_, false);
  }
  return *this;
}

// Best effort: a server that is gone frees the session itself after its idle timeout, and
// a destructor has nobody to report to.
Session::~Session() { (void)close(); }

absl::Status Session::close() {
  if (!open_ || !conn_) return absl::OkStatus();
  open_ = false;
  pb::CloseSessionRequest req;
  req.set_session_id(id_);
  pb::CloseSessionResponse resp;
  // Closing should not hold a finishing program for a full request deadline.
  auto ctx = conn_->context(absl::Seconds(5));
  return to_status(conn_->stub->CloseSession(ctx.get(), req, &resp));
}

absl::StatusOr<std::string> Session::create_buffer(Scalar dtype, uint64_t elements, const std::string& device) {
  std::optional<uop::v1::DType::Scalar> dt = scalar_to_wire(dtype);
  if (!dt || dtype == Scalar::Void) return absl::InvalidArgumentError(cat("a buffer cannot hold ", scalar_name(dtype)));
  pb::CreateBufferRequest req;
  req.set_session_id(id_);
  req.set_device(device);
  req.set_dtype(*dt);
  req.set_elements(elements);
  pb::CreateBufferResponse resp;
  auto ctx = conn_->context();
  if (absl::Status s = to_status(conn_->stub->CreateBuffer(ctx.get(), req, &resp)); !s.ok()) return s;
  if (resp.buffer_id().empty()) return absl::InternalError("uopd created a buffer without an id");
  return resp.buffer_id();
}

namespace {
// A large download's string is filled page by page as chunks arrive; with 4 KiB pages
// that is a page fault per 4 KiB (on a VM, microseconds each: most of a 256 MiB
// download's time). Transparent huge pages, where the kernel offers them on request,
// fault it in 2 MiB at a time. Only whole huge pages inside the block are advised.
void advise_huge_pages(char* p, size_t n) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (n < 2 * kHuge) return;
  uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(kHuge - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}
}  // namespace

absl::Status Session::upload(const std::string& buffer_id, std::string_view bytes, uint64_t offset) {
  if (offset > UINT64_MAX - bytes.size())
    return absl::InvalidArgumentError(cat("upload of ", bytes.size(), " bytes at offset ", offset, " overflows"));
  pb::UploadResponse resp;
  auto ctx = conn_->context();
  std::unique_ptr<grpc::ClientWriter<pb::UploadChunk>> writer = conn_->stub->Upload(ctx.get(), &resp);
  bool first = true;
  pb::UploadChunk chunk;  // reused: its data string keeps its capacity from chunk to chunk
  for (const ByteRange& r : chunk_ranges(offset, bytes.size(), conn_->options.chunk_bytes)) {
    if (first) {
      chunk.set_session_id(id_);
      chunk.set_buffer_id(buffer_id);
      first = false;
    } else if (!chunk.session_id().empty()) {
      chunk.clear_session_id();
      chunk.clear_buffer_id();
    }
    chunk.set_offset(r.offset);
    chunk.set_data(bytes.data() + (r.offset - offset), r.length);
    // A failed write means the server ended the call; Finish() says why.
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  if (absl::Status s = to_status(writer->Finish()); !s.ok()) return s;
  if (resp.bytes() != bytes.size())
    return absl::DataLossError(cat("uopd took ", resp.bytes(), " of ", bytes.size(), " bytes uploaded to ", buffer_id));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Session::download(const std::string& buffer_id, uint64_t offset, uint64_t length) {
  pb::DownloadRequest req;
  req.set_session_id(id_);
  req.set_buffer_id(buffer_id);
  req.set_offset(offset);
  req.set_length(length);
  req.set_chunk_bytes(conn_->options.chunk_bytes);
  auto ctx = conn_->context();
  std::unique_ptr<grpc::ClientReader<pb::DownloadChunk>> reader = conn_->stub->Download(ctx.get(), req);
  std::string out;
  out.reserve(std::min<uint64_t>(length, 256u << 20));  // our own number, still capped
  advise_huge_pages(out.data(), out.capacity());
  pb::DownloadChunk chunk;
  std::string broken;
  while (reader->Read(&chunk)) {
    if (chunk.offset() != offset + out.size())
      broken = cat("chunk at offset ", chunk.offset(), " where ", offset + out.size(), " was next");
    else if (length != 0 && out.size() + chunk.data().size() > length)
      broken = cat("more than the ", length, " bytes asked for");
    if (!broken.empty()) {
      ctx->TryCancel();
      break;
    }
    out.append(chunk.data());
  }
  absl::Status st = to_status(reader->Finish());
  if (!broken.empty()) return absl::DataLossError(cat("download of ", buffer_id, ": uopd sent a ", broken));
  if (!st.ok()) return st;
  if (length != 0 && out.size() != length)
    return absl::DataLossError(cat("download of ", buffer_id, ": uopd sent ", out.size(), " of ", length, " bytes"));
  return out;
}

absl::Status Session::free_buffer(const std::string& buffer_id) {
  pb::FreeBufferRequest req;
  req.set_session_id(id_);
  req.set_buffer_id(buffer_id);
  pb::FreeBufferResponse resp;
  auto ctx = conn_->context();
  return to_status(conn_->stub->FreeBuffer(ctx.get(), req, &resp));
}

absl::Status Session::free_buffers(const std::vector<std::string>& buffer_ids) {
  if (buffer_ids.size() == 1) return free_buffer(buffer_ids[0]);
  struct Call {
    std::unique_ptr<grpc::ClientContext> ctx;
    pb::FreeBufferRequest req;
    pb::FreeBufferResponse resp;
    grpc::Status status;
  };
  std::vector<Call> calls(buffer_ids.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t left = calls.size();
  for (size_t i = 0; i < calls.size(); ++i) {
    Call& c = calls[i];
    c.ctx = conn_->context();
    c.req.set_session_id(id_);
    c.req.set_buffer_id(buffer_ids[i]);
    conn_->stub->async()->FreeBuffer(c.ctx.get(), &c.req, &c.resp, [&c, &mu, &cv, &left](grpc::Status s) {
      std::lock_guard l(mu);
      c.status = std::move(s);
      if (--left == 0) cv.notify_all();
    });
  }
  std::unique_lock l(mu);
  cv.wait(l, [&] { return left == 0; });
  for (const Call& c : calls)
    if (!c.status.ok()) return to_status(c.status);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Session::upload_tensor(const HostTensor& t, const std::string& device) {
  std::optional<int64_t> n = checked_numel(t.shape);
  if (!n || *n * t.itemsize() != t.nbytes())
    return absl::InvalidArgumentError(cat("tensor ", scalar_name(t.dtype), shape_str(t.shape), " holds ", t.nbytes(), " bytes"));
  absl::StatusOr<std::string> id = create_buffer(t.dtype, static_cast<uint64_t>(*n), device);
  if (!id.ok()) return id;
  if (absl::Status s = upload(*id, t.data); !s.ok()) return s;
  return id;
}

absl::StatusOr<HostTensor> Session::download_tensor(const RunOutput& out) {
  if (!out.kept()) return absl::FailedPreconditionError(cat("output ", out.name, " was not kept in the session"));
  std::optional<int64_t> n = checked_numel(out.tensor.shape);
  if (!n) return absl::InvalidArgumentError(cat("output ", out.name, " has shape ", shape_str(out.tensor.shape)));
  uint64_t bytes = static_cast<uint64_t>(*n) * out.tensor.itemsize();
  absl::StatusOr<std::string> data = bytes == 0 ? std::string() : download(out.buffer_id, 0, bytes);
  if (!data.ok()) return data.status();
  HostTensor t = out.tensor;
  t.data = std::move(*data);
  return t;
}

namespace {
// An input's value on the wire: a buffer id, or the tensor inline.
absl::Status bind_value(const Input& in, pb::Binding* b) {
  if (const std::string* id = std::get_if<std::string>(&in.value)) {
    b->set_buffer_id(*id);
    return absl::OkStatus();
  }
  return tensor_to_wire(std::get<HostTensor>(in.value), b->mutable_tensor());
}

// A Run's answer as the caller sees it (Run and RunModel answer alike).
// `assigned`: outputs written into buffers the caller named (RunOptions::assign), which
// stay whatever keep_outputs says.
absl::StatusOr<RunResult> run_result(Session& session, pb::RunResponse& resp, bool keep_outputs,
                                     const std::vector<std::pair<size_t, std::string>>& assigned = {}) {
  RunResult out;
  for (const pb::Output& o : resp.outputs()) {
    const size_t k = out.outputs.size();
    const bool stays = keep_outputs || std::any_of(assigned.begin(), assigned.end(), [&](const auto& a) { return a.first == k; });
    std::string what = cat("output ", o.name());
    absl::StatusOr<HostTensor> t = tensor_header(what, o.dtype(), o.shape());
    if (!t.ok()) return t.status();
    RunOutput r{o.name(), std::move(*t), ""};
    if (o.value_case() == pb::Output::kBufferId && !stays) {
      // Over the server's inline limit: it stays in the session for us to stream down,
      // then it is freed (here whatever the download did, so nothing is left behind).
      r.buffer_id = o.buffer_id();
      absl::StatusOr<HostTensor> data = session.download_tensor(r);
      absl::Status freed = session.free_buffer(r.buffer_id);
      if (!data.ok()) return data.status();
      if (!freed.ok()) return freed;
      r.tensor = std::move(*data);
      r.buffer_id.clear();
    } else if (o.value_case() == pb::Output::kBufferId) {
      r.buffer_id = o.buffer_id();
    } else {
      if (absl::Status s = check_data_size(what, r.tensor, o.data().size()); !s.ok()) return s;
      r.tensor.data = o.data();
    }
    out.outputs.push_back(std::move(r));
  }
  out.kernels = kernels_from_wire(resp.kernels());
  out.device = resp.device();
  out.plan_ms = resp.plan_ms();
  out.compile_ms = resp.compile_ms();
  out.run_ms = resp.run_ms();
  out.collective_ms = resp.collective_ms();
  for (const pb::KernelProfile& k : resp.profile())
    out.profile.push_back({k.name(), k.digest(), k.device(), k.launches(), k.total_ms(), k.per_launch_ms(), k.flops(),
                           k.bytes(), k.gflops(), k.gbytes_per_s(), k.schedule()});
  return out;
}
}  // namespace

absl::StatusOr<RunResult> Session::run(const UOp* root, const Names& names, const std::vector<Input>& inputs, bool keep_outputs,
                                       bool profile) {
  RunOptions o;
  o.keep_outputs = keep_outputs;
  o.profile = profile;
  return run(root, names, inputs, o);
}

absl::StatusOr<RunResult> Session::run(const UOp* root, const Names& names, const std::vector<Input>& inputs,
                                       const RunOptions& opts) {
  pb::RunRequest req;
  req.set_session_id(id_);
  // A held graph is known by its digest and its names (the server answers with the names
  // it was sent with).
  std::string held_key;
  bool by_digest = false;
  if (opts.hold_graph) {
    held_key = root->digest().hex();
    for (const auto& [name, node] : names) held_key += cat("|", name.size(), ":", name, "=", node->digest().hex());
    by_digest = std::find(held_graphs_.begin(), held_graphs_.end(), held_key) != held_graphs_.end();
  }
  if (by_digest) {
    req.set_graph_digest(root->digest().hex());
  } else {
    encode_proto(root, names, req.mutable_graph());
    req.set_hold_graph(opts.hold_graph);
  }
  req.set_keep_outputs(opts.keep_outputs);
  req.set_profile(opts.profile);
  for (const auto& [output, buffer_id] : opts.assign) {
    pb::OutputAssign* a = req.add_assign();
    a->set_output(static_cast<uint32_t>(output));
    a->set_buffer_id(buffer_id);
  }
  std::optional<absl::flat_hash_map<const UOp*, uint32_t>> index;  // built on first need
  for (const Input& in : inputs) {
    pb::Binding* b = req.add_inputs();
    if (const std::string* name = std::get_if<std::string>(&in.node)) {
      b->set_name(*name);
    } else if (const uint32_t* i = std::get_if<uint32_t>(&in.node)) {
      b->set_index(*i);
    } else {
      const UOp* u = std::get<const UOp*>(in.node);
      if (!index) index = wire_indices(root, names);
      auto it = index->find(u);
      if (it == index->end()) return absl::InvalidArgumentError("an input node is not part of the graph being run");
      b->set_index(it->second);
    }
    RETURN_IF_ERROR(bind_value(in, b));
  }
  pb::RunResponse resp;
  auto ctx = conn_->context();
  absl::Status s = to_status(conn_->stub->Run(ctx.get(), req, &resp));
  if (by_digest && absl::IsNotFound(s)) {
    // The server no longer holds it (it keeps the last few per session): sent again.
    std::erase(held_graphs_, held_key);
    req.clear_graph_digest();
    encode_proto(root, names, req.mutable_graph());
    req.set_hold_graph(true);
    by_digest = false;
    resp.Clear();
    ctx = conn_->context();
    s = to_status(conn_->stub->Run(ctx.get(), req, &resp));
  }
  if (!s.ok()) return s;
  if (opts.hold_graph && !by_digest) {
    std::erase(held_graphs_, held_key);
    held_graphs_.push_back(held_key);
    // As many as the server keeps (server/sessions.h kMaxHeldGraphs): an older one is
    // displaced there too.
    if (held_graphs_.size() > 8) held_graphs_.erase(held_graphs_.begin());
  }
  return run_result(*this, resp, opts.keep_outputs, opts.assign);
}

absl::StatusOr<LoadedModel> Session::load_model(std::string_view onnx_bytes,
                                                const std::map<std::string, std::vector<int64_t>>& input_shapes) {
  pb::LoadModelResponse resp;
  auto ctx = conn_->context();
  std::unique_ptr<grpc::ClientWriter<pb::LoadModelChunk>> writer = conn_->stub->LoadModel(ctx.get(), &resp);
  pb::LoadModelChunk chunk;
  bool first = true;
  for (const ByteRange& r : chunk_ranges(0, onnx_bytes.size(), conn_->options.chunk_bytes)) {
    chunk.Clear();
    if (first) {
      chunk.set_session_id(id_);
      for (const auto& [name, shape] : input_shapes) {
        auto* s = chunk.add_input_shapes();
        s->set_name(name);
        for (int64_t d : shape) s->add_shape(d);
      }
      first = false;
    }
    chunk.set_data(onnx_bytes.data() + r.offset, r.length);
    if (!writer->Write(chunk)) break;  // the server ended the call; Finish() says why
  }
  writer->WritesDone();
  if (absl::Status s = to_status(writer->Finish()); !s.ok()) return s;
  LoadedModel m;
  m.id = resp.model_id();
  auto tensors = [](const auto& from, std::vector<ModelTensor>& to) {
    for (const pb::ModelTensor& t : from) to.push_back({t.name(), static_cast<Scalar>(t.dtype()), {t.shape().begin(), t.shape().end()}});
  };
  tensors(resp.inputs(), m.inputs);
  tensors(resp.outputs(), m.outputs);
  m.weight_buffers = resp.weight_buffers();
  m.weight_bytes = resp.weight_bytes();
  m.import_ms = resp.import_ms();
  return m;
}

absl::StatusOr<RunResult> Session::run_model(const std::string& model_id, const std::vector<Input>& inputs, bool keep_outputs,
                                             bool profile) {
  pb::RunModelRequest req;
  req.set_session_id(id_);
  req.set_model_id(model_id);
  req.set_keep_outputs(keep_outputs);
  req.set_profile(profile);
  for (const Input& in : inputs) {
    const std::string* name = std::get_if<std::string>(&in.node);
    if (!name) return absl::InvalidArgumentError("a model's input is bound by its name");
    pb::Binding* b = req.add_inputs();
    b->set_name(*name);
    RETURN_IF_ERROR(bind_value(in, b));
  }
  pb::RunResponse resp;
  auto ctx = conn_->context();
  if (absl::Status s = to_status(conn_->stub->RunModel(ctx.get(), req, &resp)); !s.ok()) return s;
  return run_result(*this, resp, keep_outputs);
}

}  // namespace uop::client
