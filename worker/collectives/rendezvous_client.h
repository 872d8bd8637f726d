// A client of the scheduler's Rendezvous service (proto/worker.proto; the store is
// server/rendezvous_service.h): Set a key, Get keys once they all exist. The Gloo
// transport's store and the NCCL transport's unique id both go through it. The service
// is on the scheduler's internal listener: the dialer presents the cluster's credentials.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/worker.grpc.pb.h"
#include "transport/cluster_auth.h"
#include "transport/grpc_absl.h"

namespace uop {

class RendezvousClient {
 public:
  // A Get's gRPC deadline is its wait plus this.
  static constexpr std::chrono::milliseconds kRpcMargin{5000};

  RendezvousClient(const std::string& address, const cluster_auth::Dialer& dial)
      : stub_(uopd::worker::v1::Rendezvous::NewStub(dial.channel(address))) {}

  absl::Status set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    uopd::worker::v1::RendezvousSetRequest req;
    req.set_key(key);
    req.set_value(value);
    uopd::worker::v1::RendezvousSetResponse resp;
    return transport::from_grpc(stub_->Set(&ctx, req, &resp));
  }

  // The values of `keys` in order, once all exist; DEADLINE_EXCEEDED (from the store,
  // naming the missing keys) after `wait`.
  absl::StatusOr<std::vector<std::string>> get(const std::vector<std::string>& keys, std::chrono::milliseconds wait) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + wait + kRpcMargin);
    uopd::worker::v1::RendezvousGetRequest req;
    for (const std::string& k : keys) req.add_keys(k);
    req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(0, wait.count())));
    uopd::worker::v1::RendezvousGetResponse resp;
    if (absl::Status st = transport::from_grpc(stub_->Get(&ctx, req, &resp)); !st.ok()) return st;
    return std::vector<std::string>(resp.values().begin(), resp.values().end());
  }

 private:
  std::unique_ptr<uopd::worker::v1::Rendezvous::Stub> stub_;
};

}  // namespace uop
