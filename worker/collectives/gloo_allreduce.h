// Allreduce among processes on different hosts with Gloo over TCP (docs/ARCHITECTURE.md, The service). The
// members find each other through the scheduler's Rendezvous service (a
// gloo::rendezvous::Store over gRPC, keys under "<group>/"), connect a full mesh from
// the interface that routes to the scheduler, and run Gloo's ring allreduce with
// reduce.h's combine, so the arithmetic is eval.h's. Gloo reports failures by throwing:
// this file is the boundary, every exception becomes a status here.
//
// Errors name the peer: a member that never joins is DEADLINE_EXCEEDED "rank i never
// joined"; when the ring breaks mid-allreduce the survivors close their connections (so
// that everyone notices at once), report to each other through the rendezvous, and the
// one that does not report is named (UNAVAILABLE "rank i (pid P on H) stopped answering").
// A buffer of up to 16 KiB goes with the members' agreement check (one Gloo all-gather)
// and every member reduces it locally in the shm ring's order: the shm ring's bits, in
// one exchange. A larger one goes through Gloo's ring allreduce, which is not bit for bit
// the shm ring's answer for float ADD / MUL: it cuts the buffer into other parts, so the
// order of the additions differs.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/arg.h"
#include "compiler/ir/dtype.h"

namespace uop {

namespace cluster_auth {
struct Dialer;
}

struct GlooOptions {
  std::string group;       // unique per collective instance: the rendezvous namespace
  int rank = 0;
  int size = 1;
  std::string rendezvous;  // host:port of the Rendezvous service (the scheduler)
  std::shared_ptr<const cluster_auth::Dialer> rendezvous_dial;  // how to reach it; null: plaintext, no secret
  // Bounds joining (rendezvous and connecting) and each step of an allreduce.
  std::chrono::milliseconds timeout{30000};
  // The address to listen on for peers; empty: this host's address on the route to the
  // rendezvous (what the peers, which reach the same scheduler, can most likely reach).
  std::string hostname;
};

class GlooGroup {
 public:
  // Rendezvous and full-mesh connect; returns once connected to every member.
  static absl::StatusOr<std::unique_ptr<GlooGroup>> connect(const GlooOptions& options);
  ~GlooGroup();
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  // In place; every member calls it with the same (elements, op, dtype) in the same order
  // (checked: INVALID_ARGUMENT naming the member that differs). After a failure the group
  // is closed and later calls return that failure.
  absl::Status allreduce(void* data, uint64_t elements, ReduceOp op, Scalar dtype);

 private:
  struct Impl;
  explicit GlooGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// connect, allreduce, close: one collective instance (what the Collective RPC does).
absl::Status gloo_allreduce(const GlooOptions& options, void* data, uint64_t elements, ReduceOp op, Scalar dtype);

// What Gloo reads from /sys once per process, on its first device (which PCI device each
// network interface is on), read now: a sandboxed worker (worker/sandbox.h) calls this
// before its filter, which leaves it no files to read later.
void gloo_read_system_once();

// This host's address on the route to host:port (a UDP connect, no packet sent).
absl::StatusOr<std::string> local_address_toward(const std::string& host_port);

}  // namespace uop
