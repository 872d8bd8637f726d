// Where gRPC meets code that speaks Abseil: statuses both ways, and deadlines.
// Handlers answer with grpc::Status what the code behind them says as absl::Status, and
// callers turn a call's grpc::Status back into one. gRPC and Abseil number their codes
// identically (both follow google.rpc.Code), so the code passes as a number; one from a
// peer that is no code at all becomes UNKNOWN, not a value outside the enum.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace uop::transport {

inline grpc::Status to_grpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// A status from a gRPC code as a number and its message (what the client library, whose
// header carries no gRPC type, receives).
inline absl::Status status_from_code(int code, std::string_view message) {
  if (code == 0) return absl::OkStatus();
  const bool known = code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated);
  return absl::Status(known ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
                      absl::string_view(message.data(), message.size()));
}

inline absl::Status from_grpc(const grpc::Status& s) {
  return status_from_code(static_cast<int>(s.error_code()), s.error_message());
}

inline void set_deadline(grpc::ClientContext& ctx, absl::Time deadline) {
  ctx.set_deadline(absl::ToChronoTime(deadline));
}

}  // namespace uop::transport
