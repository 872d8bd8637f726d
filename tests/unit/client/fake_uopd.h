// A stand-in for uopd that speaks proto/uopd.proto without compiling anything, so the
// client library and the `uop` command are tested before (and apart from) the real
// server. Sessions and buffers are real (bytes in memory, chunked streams checked for
// order and bounds); Compile reports one kernel per graph with the root's digest (a miss
// the first time, then a memory hit); Run decodes the graph, resolves every binding and
// returns the first input's data as the output (named after the root's first source when
// the graph names it, else "out0"). It records what it saw for tests to inspect.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <grpcpp/grpcpp.h>

#include "proto/uopd.grpc.pb.h"

namespace uop::testing {

class FakeUopd final : public ::uopd::v1::Uopd::Service {
 public:
  using Ctx = ::grpc::ServerContext;
  ::grpc::Status CreateSession(Ctx*, const ::uopd::v1::CreateSessionRequest*, ::uopd::v1::CreateSessionResponse*) override;
  ::grpc::Status CloseSession(Ctx*, const ::uopd::v1::CloseSessionRequest*, ::uopd::v1::CloseSessionResponse*) override;
  ::grpc::Status CreateBuffer(Ctx*, const ::uopd::v1::CreateBufferRequest*, ::uopd::v1::CreateBufferResponse*) override;
  ::grpc::Status Upload(Ctx*, ::grpc::ServerReader<::uopd::v1::UploadChunk>*, ::uopd::v1::UploadResponse*) override;
  ::grpc::Status Download(Ctx*, const ::uopd::v1::DownloadRequest*, ::grpc::ServerWriter<::uopd::v1::DownloadChunk>*) override;
  ::grpc::Status FreeBuffer(Ctx*, const ::uopd::v1::FreeBufferRequest*, ::uopd::v1::FreeBufferResponse*) override;
  ::grpc::Status Compile(Ctx*, const ::uopd::v1::CompileRequest*, ::uopd::v1::CompileResponse*) override;
  ::grpc::Status Run(Ctx*, const ::uopd::v1::RunRequest*, ::uopd::v1::RunResponse*) override;
  ::grpc::Status Explain(Ctx*, const ::uopd::v1::ExplainRequest*, ::uopd::v1::ExplainResponse*) override;
  ::grpc::Status Stats(Ctx*, const ::uopd::v1::StatsRequest*, ::uopd::v1::StatsResponse*) override;

  // What tests look at (under mu()).
  std::mutex& mu() { return mu_; }
  std::set<std::string> open_sessions;
  uint64_t sessions_closed = 0;
  uint64_t upload_chunks = 0, max_upload_chunk = 0, download_chunks = 0;
  std::string last_authorization;  // the "authorization" metadata of the last request
  ::uopd::v1::RunRequest last_run;

 private:
  struct Buffer {
    std::string session;
    int dtype = 0;
    std::string bytes;
  };
  ::grpc::Status session_ok(const std::string& id) const;  // NOT_FOUND unless open
  void note(Ctx* ctx);

  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<std::string, Buffer> buffers_;
  std::set<std::string> compiled_;  // digests compiled once (later compiles are hits)
};

// A server on 127.0.0.1 with an ephemeral port, for in-process tests.
struct FakeServer {
  FakeUopd service;
  std::unique_ptr<::grpc::Server> server;
  std::string address;
  static std::unique_ptr<FakeServer> start();
};

}  // namespace uop::testing
