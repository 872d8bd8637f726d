// The Uopd gRPC service (proto/uopd.proto). Each handler checks the request, calls into
// the library (SessionManager, Planner, Executor, WorkerPool) and encodes the answer;
// the logic lives in those classes, where tests reach it without a socket. Errors leave
// as gRPC statuses naming what was wrong; every request is counted by method and code.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "compiler/ir/codec.h"
#include "proto/uopd.grpc.pb.h"
#include "server/auth.h"
#include "server/cache/compile_cache.h"
#include "server/executor.h"
#include "server/metrics.h"
#include "server/planner.h"
#include "server/sessions.h"
#include "server/workers.h"

namespace uop::server {

struct ServiceLimits {
  DecodeLimits decode;                              // nodes, bytes, ... per graph
  absl::Duration request_deadline = absl::Minutes(5);
  uint64_t max_inline_bytes = uint64_t{1} << 30;   // inline tensors of one Run
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
};

class UopdService final : public ::uopd::v1::Uopd::Service {
 public:
  explicit UopdService(ServiceDeps deps) : d_(deps) {
    if (!d_.tenants) {
      own_tenants_ = Tenants::anonymous();
      d_.tenants = own_tenants_.get();
    }
  }

  grpc::Status CreateSession(grpc::ServerContext*, const ::uopd::v1::CreateSessionRequest*, ::uopd::v1::CreateSessionResponse*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const ::uopd::v1::CloseSessionRequest*, ::uopd::v1::CloseSessionResponse*) override;
  grpc::Status CreateBuffer(grpc::ServerContext*, const ::uopd::v1::CreateBufferRequest*, ::uopd::v1::CreateBufferResponse*) override;
  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<::uopd::v1::UploadChunk>*, ::uopd::v1::UploadResponse*) override;
  grpc::Status Download(grpc::ServerContext*, const ::uopd::v1::DownloadRequest*, grpc::ServerWriter<::uopd::v1::DownloadChunk>*) override;
  grpc::Status FreeBuffer(grpc::ServerContext*, const ::uopd::v1::FreeBufferRequest*, ::uopd::v1::FreeBufferResponse*) override;
  grpc::Status Compile(grpc::ServerContext*, const ::uopd::v1::CompileRequest*, ::uopd::v1::CompileResponse*) override;
  grpc::Status Run(grpc::ServerContext*, const ::uopd::v1::RunRequest*, ::uopd::v1::RunResponse*) override;
  grpc::Status Explain(grpc::ServerContext*, const ::uopd::v1::ExplainRequest*, ::uopd::v1::ExplainResponse*) override;
  grpc::Status Stats(grpc::ServerContext*, const ::uopd::v1::StatsRequest*, ::uopd::v1::StatsResponse*) override;

  // Requests being handled now (drain waits for zero).
  uint64_t in_flight() const { return in_flight_.load(); }
  // SIGTERM: from now on every new request is refused with UNAVAILABLE "uopd is shutting
  // down" (a clear, retryable status), while those already running finish.
  void begin_drain() { draining_ = true; }

  // Frees buffers on their workers (sessions closed or reaped), best effort.
  void free_buffers(const std::vector<BufferInfo>& buffers);

 private:
  absl::Time deadline(grpc::ServerContext* ctx) const;
  grpc::Status finish(std::string_view method, const absl::Status& s);
  // The request's tenant from its bearer token, within its request rate; or why not.
  absl::StatusOr<Tenant*> admit(grpc::ServerContext* ctx);

  ServiceDeps d_;
  std::unique_ptr<Tenants> own_tenants_;
  std::atomic<uint64_t> kernels_run_{0};
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
};

}  // namespace uop::server
