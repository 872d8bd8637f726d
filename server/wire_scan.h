// What a protobuf message would cost in memory once parsed, read off its wire bytes
// without parsing them. A request from the network is small on the wire and can be huge
// in memory: an empty uop.v1.Node is 2 bytes on the wire and a message object of ~80
// once parsed, so 200 MiB of them would take ~10 GiB. The service scans every request
// that carries a graph before it lets protobuf build anything, refusing those over their
// node or memory limits; the scan itself allocates nothing per message (one pass, a
// bounded recursion over the message types).
//
// The estimate is an upper bound for the protobuf C++ runtime parsing on an arena: each
// sub-message costs its class's size plus a slot in its repeated field, each string or
// bytes value its length plus a std::string, each repeated scalar 32 bytes (an 8-byte
// value in a field that grew by doubling, its outgrown arrays kept by the arena), each
// unknown field its wire bytes plus bookkeeping. It is type-driven (descriptors), so any
// request type can be scanned the same way.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace google::protobuf {
class Descriptor;
namespace io {
class ZeroCopyInputStream;
}
}  // namespace google::protobuf

namespace uop::server {

// What a decoded node costs beyond its protobuf message: the interned UOp, its sources
// and arg, the wire-index tables of DecodedGraph (~210 bytes measured for ALU nodes with
// constant operands; more sources are counted on the wire already).
constexpr uint64_t kDecodedNodeBytes = 256;

struct WireCost {
  uint64_t messages = 0;  // sub-messages (the top-level one not counted)
  uint64_t counted = 0;   // sub-messages of the type asked for (WireScanLimits::count)
  uint64_t bytes = 0;     // estimated memory of the parsed message, the top level included
  bool stopped = false;   // the scan stopped early, at a limit below
};

struct WireScanLimits {
  // Messages of this type are counted (a graph's nodes: uop.v1.Node); null: none.
  const google::protobuf::Descriptor* count = nullptr;
  // The scan stops as soon as `counted` or `bytes` passes these (the request is refused
  // anyway; there is no need to read the rest).
  uint64_t max_counted = UINT64_MAX;
  uint64_t max_bytes = UINT64_MAX;
  int max_depth = 100;  // nesting, as protobuf's own parser limits it
};

// Scans `in` as a message of `type`. INVALID_ARGUMENT when the bytes are not the wire
// form of any message (the parse would refuse them too); nesting past max_depth as well.
absl::StatusOr<WireCost> scan_wire(google::protobuf::io::ZeroCopyInputStream& in, const google::protobuf::Descriptor& type,
                                   const WireScanLimits& limits = {});

}  // namespace uop::server
