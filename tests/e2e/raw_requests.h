// Requests written byte by byte, for the e2e tests of what uopd does with requests no
// client library would send: protobuf's wire format by hand (so that a flood of nodes
// costs the test its wire bytes, not a message object per node) and a unary call that
// sends such bytes as they are.
#pragma once

#include <cstdint>
#include <future>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "transport/grpc_absl.h"

namespace uop::testing {

using transport::from_grpc;

// A unary call with hand-made bytes as its request (no protobuf object is built for it),
// as the tenant whose bearer token is `token` (none when empty).
inline absl::Status raw_unary(const std::string& address, const std::string& method, const std::string& bytes,
                              const std::string& token = "") {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  // The slice points at the string, which outlives the call: no copy of it.
  grpc::Slice slice(bytes.data(), bytes.size(), grpc::Slice::STATIC_SLICE);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) { done.set_value(s); });
  return from_grpc(done.get_future().get());
}

// Protobuf's wire format, written by hand: a varint, a length-delimited field.
inline void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>(v | 0x80));
  out.push_back(static_cast<char>(v));
}
inline void put_field(std::string& out, int field, std::string_view bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
// `n` copies of one empty length-delimited field (2 bytes each).
inline std::string empty_fields(int field, uint64_t n) {
  std::string out(2 * n, '\0');
  for (uint64_t i = 0; i < n; ++i) out[2 * i] = static_cast<char>((field << 3) | 2);
  return out;
}

}  // namespace uop::testing
