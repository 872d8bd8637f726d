// A Uopd call made in a thread on a connection of its own, that the caller can cancel:
// for tests and benchmarks that keep a server busy while they measure something else.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "proto/uopd.grpc.pb.h"

namespace uop::testing {

// A local subchannel pool gives the call a connection of its own: gRPC would otherwise
// share one between channels to the same address, and uopd tells clients apart by
// connection.
class BackgroundCall {
 public:
  template <typename Request, typename Response>
  BackgroundCall(const std::string& address, const std::string& token, Request req,
                 grpc::Status (::uopd::v1::Uopd::Stub::*method)(grpc::ClientContext*, const Request&, Response*)) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    stub_ = ::uopd::v1::Uopd::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    if (!token.empty()) ctx_.AddMetadata("authorization", "Bearer " + token);
    thread_ = std::thread([this, req = std::move(req), method] {
      Response resp;
      status_ = ((*stub_).*method)(&ctx_, req, &resp);
      done_ = true;
    });
  }
  ~BackgroundCall() {
    ctx_.TryCancel();
    if (thread_.joinable()) thread_.join();
  }
  BackgroundCall(const BackgroundCall&) = delete;
  BackgroundCall& operator=(const BackgroundCall&) = delete;

  void cancel() { ctx_.TryCancel(); }
  bool done() const { return done_.load(); }
  grpc::Status finish() {
    thread_.join();
    return status_;
  }

 private:
  std::unique_ptr<::uopd::v1::Uopd::Stub> stub_;
  grpc::ClientContext ctx_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  grpc::Status status_;
};

}  // namespace uop::testing
