// The scheduler's Rendezvous service for collective tests that need one (Gloo, NCCL).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <unistd.h>

#include "compiler/support/strings.h"
#include "tests/unit/server/open_groups_rendezvous.h"
#include "tests/unit/worker/collectives/collective_testing.h"

namespace uop::testing {

// The Rendezvous service in a child process of its own (see collective_testing.h on
// gRPC and fork), opening every group it is asked about; its port comes back through
// shared memory.
class RendezvousServer {
 public:
  RendezvousServer() : port_(sizeof(std::atomic<int>)) {
    auto* port = new (port_.data()) std::atomic<int>(0);
    child_.pid = fork_child([port] {
      OpenGroupsRendezvous service;
      grpc::ServerBuilder b;
      int bound = 0;
      b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &bound);
      b.RegisterService(&service);
      auto server = b.BuildAndStart();
      port->store(server ? bound : -1);
      if (!server) return;
      for (;;) pause();  // until the test kills us
    });
    while (port->load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    address_ = cat("127.0.0.1:", port->load());
  }
  const std::string& address() const { return address_; }
  bool ok() const { return reinterpret_cast<std::atomic<int>*>(port_.data())->load() > 0; }

 private:
  SharedMemory port_;
  Child child_;
  std::string address_;
};

}  // namespace uop::testing
