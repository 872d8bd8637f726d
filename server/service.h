// The Uopd gRPC service (proto/uopd.proto). Each handler checks the request, calls into
// the library (SessionManager, Planner, Executor, WorkerPool) and encodes the answer;
// the logic lives in those classes, where tests reach it without a socket. Errors leave
// as gRPC statuses naming what was wrong; every request is counted by method and code.
//
// The calls that carry a graph (Compile, Run, Explain) arrive as bytes (gRPC's raw
// callback API): each is scanned (server/wire_scan.h) for its node count and the memory
// it would take once parsed, against --max-nodes, --max-request-memory and the budget for
// bytes in flight (server/inflight.h), before protobuf builds a single Node; a Run's
// response is written as slices that take over its output bytes, so no output is held
// twice. Upload is a reactor whose chunks arrive as bytes too, ended by the server when
// its client stops sending (--stream-idle-timeout-s) or the request deadline passes.
// These handlers block (on workers, on the compile pool), so they run on the service's
// own threads (server/handler_threads.h), never on gRPC's.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "compiler/ir/codec.h"
#include "proto/uopd.grpc.pb.h"
#include "server/auth.h"
#include "server/cache/compile_cache.h"
#include "server/executor.h"
#include "server/handler_threads.h"
#include "server/inflight.h"
#include "server/metrics.h"
#include "server/models.h"
#include "server/planner.h"
#include "server/sessions.h"
#include "server/tuner.h"
#include "server/workers.h"

namespace uop::server {

struct ServiceLimits {
  DecodeLimits decode;                              // nodes, bytes, ... per graph
  absl::Duration request_deadline = absl::Minutes(5);
  uint64_t max_inline_bytes = uint64_t{1} << 30;   // inline tensors of one Run
  // Outputs of one Run returned inline; the others stay in the session as buffers, for
  // the client to download (streamed) and free.
  uint64_t max_inline_output_bytes = uint64_t{64} << 20;
  // What one request may hold in the scheduler at once: its body as received and parsed,
  // its decoded graph, its inline outputs.
  uint64_t max_request_memory = uint64_t{1} << 30;
  // All requests together (--max-inflight-bytes).
  uint64_t max_inflight_bytes = uint64_t{4} << 30;
  // An Upload whose client sends nothing for this long is ended (DEADLINE_EXCEEDED).
  absl::Duration stream_idle_timeout = absl::Seconds(30);
  size_t handler_threads = 256;  // handlers blocking at once; more wait their turn
};

struct ServiceDeps {
  Planner* planner;
  CompileCache* cache;
  SessionManager* sessions;
  WorkerPool* workers;
  Executor* executor;
  Metrics* metrics;
  ServiceLimits limits;
  Tenants* tenants = nullptr;  // tokens and quotas (server/auth.h); null: one anonymous tenant
  Tuner* tuner = nullptr;      // schedule search and tuning records (server/tuner.h); null: none
};

// The generated service with the calls above taken as bytes / reactors.
using UopdServiceBase = ::uopd::v1::Uopd::WithRawCallbackMethod_Compile<::uopd::v1::Uopd::WithRawCallbackMethod_Run<
    ::uopd::v1::Uopd::WithRawCallbackMethod_Explain<::uopd::v1::Uopd::WithRawCallbackMethod_Upload<
        ::uopd::v1::Uopd::WithRawCallbackMethod_RunModel<::uopd::v1::Uopd::WithRawCallbackMethod_Tune<::uopd::v1::Uopd::Service>>>>>>;

class UopdService final : public UopdServiceBase {
 public:
  explicit UopdService(ServiceDeps deps);
  ~UopdService() override;

  grpc::Status CreateSession(grpc::ServerContext*, const ::uopd::v1::CreateSessionRequest*, ::uopd::v1::CreateSessionResponse*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const ::uopd::v1::CloseSessionRequest*, ::uopd::v1::CloseSessionResponse*) override;
  grpc::Status CreateBuffer(grpc::ServerContext*, const ::uopd::v1::CreateBufferRequest*, ::uopd::v1::CreateBufferResponse*) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext*, grpc::ByteBuffer*) override;
  grpc::Status Download(grpc::ServerContext*, const ::uopd::v1::DownloadRequest*, grpc::ServerWriter<::uopd::v1::DownloadChunk>*) override;
  grpc::Status FreeBuffer(grpc::ServerContext*, const ::uopd::v1::FreeBufferRequest*, ::uopd::v1::FreeBufferResponse*) override;
  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext*, const grpc::ByteBuffer*, grpc::ByteBuffer*) override;
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext*, const grpc::ByteBuffer*, grpc::ByteBuffer*) override;
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext*, const grpc::ByteBuffer*, grpc::ByteBuffer*) override;
  grpc::Status Stats(grpc::ServerContext*, const ::uopd::v1::StatsRequest*, ::uopd::v1::StatsResponse*) override;
  // Models held by the server (server/models.h). LoadModel's chunks count against
  // --max-request-memory and the bytes in flight as they arrive; RunModel enters like Run.
  grpc::Status LoadModel(grpc::ServerContext*, grpc::ServerReader<::uopd::v1::LoadModelChunk>*, ::uopd::v1::LoadModelResponse*) override;
  grpc::ServerUnaryReactor* RunModel(grpc::CallbackServerContext*, const grpc::ByteBuffer*, grpc::ByteBuffer*) override;
  // A graph like Compile's; the search runs on the compile pool and the tenant's CPU worker.
  grpc::ServerUnaryReactor* Tune(grpc::CallbackServerContext*, const grpc::ByteBuffer*, grpc::ByteBuffer*) override;

  // Bytes requests hold in the scheduler now (of limits.max_inflight_bytes), and
  // reservations refused.
  const ByteBudget& inflight() const { return inflight_; }

  // Requests being handled now (drain waits for zero).
  uint64_t in_flight() const { return in_flight_.load(); }
  // SIGTERM: from now on every new request is refused with UNAVAILABLE "uopd is shutting
  // down" (a clear, retryable status), while those already running finish.
  void begin_drain() { draining_ = true; }

  // Frees buffers on their workers (sessions closed or reaped), best effort.
  void free_buffers(const std::vector<BufferInfo>& buffers);

 private:
  // The handlers behind the raw calls, on parsed requests; `held` is the request's share
  // of the budget for bytes in flight.
  grpc::Status Compile(grpc::ServerContextBase* ctx, const ::uopd::v1::CompileRequest* req, ::uopd::v1::CompileResponse* resp);
  grpc::Status Tune(grpc::ServerContextBase* ctx, const ::uopd::v1::TuneRequest* req, ::uopd::v1::TuneResponse* resp);
  grpc::Status Run(grpc::ServerContextBase* ctx, ::uopd::v1::RunRequest* req, ::uopd::v1::RunResponse* resp, ByteBudget::Hold& held);
  // What Run does once the request is admitted and its graph decoded: plan, bind the
  // inputs, compile for the devices the kernels run on, run, and answer with the outputs
  // (inline, or left in the session as buffers).
  absl::Status run_graph(grpc::ServerContextBase* ctx, Tenant& tenant, const std::vector<std::string>& devices,
                         std::shared_ptr<const DecodedGraph> g, ::uopd::v1::RunRequest* req,
                         ::uopd::v1::RunResponse* resp, ByteBudget::Hold& held);
  // A Run's graph: decoded from the request (and held by the session with hold_graph), or
  // the one the session holds under graph_digest.
  absl::StatusOr<std::shared_ptr<const DecodedGraph>> run_request_graph(Tenant& tenant, ::uopd::v1::RunRequest* req);
  // The session's devices with the one a call names first (empty: the session's first);
  // a device of the server the session has not used yet joins it (SessionManager::use_device),
  // one the server lacks is the worker pool's error naming it.
  absl::StatusOr<std::vector<std::string>> devices_for(const std::string& session, const std::string& who,
                                                       const std::string& device);
  // RunRequest.assign checked against the plan and the session: per plan output, the
  // buffer it is written into ("" none); assigned outputs are marked in `keep`.
  absl::StatusOr<std::vector<std::string>> check_assign(const Plan& p, const std::string& device, const std::string& who,
                                                        const ::uopd::v1::RunRequest& req, std::vector<bool>& keep);
  grpc::Status Explain(grpc::ServerContextBase* ctx, const ::uopd::v1::ExplainRequest* req, ::uopd::v1::ExplainResponse* resp);
  grpc::Status RunModel(grpc::ServerContextBase* ctx, ::uopd::v1::RunModelRequest* req, ::uopd::v1::RunResponse* resp, ByteBudget::Hold& held);
  // A buffer of the session on `device` holding `data`, counted against its quotas.
  absl::StatusOr<std::string> buffer_with(Tenant& tenant, const std::string& session, const std::string& device,
                                          const HostTensor& data, absl::Time deadline);

  // A raw unary call: checked as bytes, parsed, handled by `body` on a handler thread,
  // answered by `encode` (server/service_calls.cc). The one way a request carrying a
  // graph (or a model) enters.
  template <class Req, class Resp>
  using RawBody = std::function<grpc::Status(grpc::ServerContextBase*, Req*, Resp*, ByteBudget::Hold&)>;
  template <class Req, class Resp>
  grpc::ServerUnaryReactor* serve_raw(std::string_view method, grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request, grpc::ByteBuffer* response, RawBody<Req, Resp> body);
  class RawUnaryCall;
  // An open stream the watchdog thread looks at a few times a second: check() ends it when
  // its client has stopped (sending an Upload's chunks, reading a Download's) for
  // --stream-idle-timeout-s, or when its deadline has passed.
  class WatchedStream {
   public:
    virtual ~WatchedStream() = default;
    virtual void check(absl::Time now) = 0;
  };
  class UploadCall;
  class DownloadWatch;
  void watch(WatchedStream* c);
  void unwatch(WatchedStream* c);
  void watchdog();

  absl::Time deadline(grpc::ServerContextBase* ctx) const;
  grpc::Status finish(std::string_view method, const absl::Status& s);
  // The request's tenant from its bearer token, within its request rate; or why not.
  absl::StatusOr<Tenant*> admit(grpc::ServerContextBase* ctx);

  ServiceDeps d_;
  std::unique_ptr<Tenants> own_tenants_;
  std::atomic<uint64_t> kernels_run_{0};
  std::atomic<uint64_t> weight_buffers_written_{0}, weight_bytes_written_{0};  // by LoadModel
  // StatsResponse.bytes_uploaded / run_graph_bytes; data in goes through bytes_in().
  std::atomic<uint64_t> bytes_uploaded_{0}, run_graph_bytes_{0};
  void bytes_in(uint64_t n);
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  ByteBudget inflight_;
  std::unique_ptr<HandlerThreads> threads_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::set<WatchedStream*> streams_;  // guarded by watch_mu_
  bool stop_watchdog_ = false;     // guarded by watch_mu_
  std::thread watchdog_;
};

}  // namespace uop::server
