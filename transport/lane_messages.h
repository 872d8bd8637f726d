// What uopd and its embedded workers say over an execute lane (exec_lane.h). A request's
// first byte names its kind; integers are little-endian 64-bit.
//
//   Execute     [1][worker.proto ExecuteRequest]     reply: an ExecuteResponse
//   Write       [2][buffer id][offset][data ...]     reply: nothing
//   Read        [3][buffer id][offset][length]       reply: the bytes
//   Collective  [4][worker.proto CollectiveRequest]  reply: a CollectiveResponse
//   Free        [5][worker.proto FreeBuffersRequest] reply: a FreeBuffersResponse
//
// A collective's members each wait in their own slot while the ring runs; uopd abandons a
// member's call when another member failed, and the worker asks its slot whether it was
// abandoned while it waits for its peers (the lane's `abandoned`, as gRPC's cancellation).
//
// Buffer bytes travel raw, not in protobuf: one copy into the slot, one out of it.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>

namespace uop::lane {

enum class Kind : uint8_t { Execute = 1, Write = 2, Read = 3, Collective = 4, Free = 5 };

// The header of a Write or a Read: what comes before a Write's data.
struct Range {
  uint64_t buffer_id = 0, offset = 0, length = 0;  // length: a Read's; a Write's is its data's
};
inline constexpr size_t kWriteHeader = 1 + 2 * sizeof(uint64_t);
inline constexpr size_t kReadRequest = 1 + 3 * sizeof(uint64_t);

inline void put_u64(char* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>(v >> (8 * i));
}
inline uint64_t get_u64(const char* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(at[i])) << (8 * i);
  return v;
}

// Writes a Write's header at the start of `out` (kWriteHeader bytes); the data follows.
inline void encode_write_header(std::span<char> out, uint64_t buffer_id, uint64_t offset) {
  out[0] = static_cast<char>(Kind::Write);
  put_u64(out.data() + 1, buffer_id);
  put_u64(out.data() + 9, offset);
}

inline void encode_read(std::span<char> out, const Range& r) {
  out[0] = static_cast<char>(Kind::Read);
  put_u64(out.data() + 1, r.buffer_id);
  put_u64(out.data() + 9, r.offset);
  put_u64(out.data() + 17, r.length);
}

// A request's kind, or nullopt for an empty request or an unknown first byte.
inline std::optional<Kind> kind_of(std::string_view request) {
  if (request.empty()) return std::nullopt;
  const auto k = static_cast<uint8_t>(request[0]);
  if (k < 1 || k > 5) return std::nullopt;
  return static_cast<Kind>(k);
}

// A Write's header and data; nullopt when it is too short to be one.
inline std::optional<std::pair<Range, std::string_view>> decode_write(std::string_view request) {
  if (request.size() < kWriteHeader) return std::nullopt;
  Range r{get_u64(request.data() + 1), get_u64(request.data() + 9), request.size() - kWriteHeader};
  return std::make_pair(r, request.substr(kWriteHeader));
}

// A Read; nullopt unless it is exactly one.
inline std::optional<Range> decode_read(std::string_view request) {
  if (request.size() != kReadRequest) return std::nullopt;
  return Range{get_u64(request.data() + 1), get_u64(request.data() + 9), get_u64(request.data() + 17)};
}

}  // namespace uop::lane
