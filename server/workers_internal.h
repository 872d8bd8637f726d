// What the two halves of WorkerPool share: process supervision (server/workers.cc) and
// remote registration (server/remote_workers.cc). Not for anyone else.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "compiler/support/strings.h"
#include "proto/worker.grpc.pb.h"
#include "transport/grpc_absl.h"

namespace uop::workers_internal {

namespace wv1 = ::uopd::worker::v1;

constexpr absl::Duration kProbeTimeout = absl::Seconds(1);

template <typename... Args>
void log(const Args&... args) {
  std::string line = cat("uopd: ", args..., "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// A worker's Info within `timeout`: whether it answers, and who it says it is.
struct ProbeResult {
  absl::Status status;
  wv1::InfoResponse info;
};

inline ProbeResult probe(wv1::Worker::Stub* stub, absl::Duration timeout) {
  ProbeResult r;
  if (!stub) {
    r.status = absl::UnavailableError("no connection");
    return r;
  }
  grpc::ClientContext ctx;
  transport::set_deadline(ctx, absl::Now() + timeout);
  r.status = transport::from_grpc(stub->Info(&ctx, wv1::InfoRequest(), &r.info));
  return r;
}

}  // namespace uop::workers_internal
