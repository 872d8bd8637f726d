// The Registry gRPC service (proto/worker.proto): workers started elsewhere announce their
// address, device and the name they want (their device, another KIND:N, or "auto") here,
// at start and every heartbeat, and the scheduler's WorkerPool takes them on. A thin
// adapter: decode, WorkerPool::register_remote, encode (the response names the slot).
#pragma once

#include "proto/worker.grpc.pb.h"
#include "server/workers.h"

namespace uop {

class RegistryService final : public uopd::worker::v1::Registry::Service {
 public:
  explicit RegistryService(WorkerPool* pool) : pool_(pool) {}

  grpc::Status Register(grpc::ServerContext*, const uopd::worker::v1::RegisterRequest*,
                        uopd::worker::v1::RegisterResponse*) override;

 private:
  WorkerPool* pool_;
};

}  // namespace uop
