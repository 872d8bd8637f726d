// The stored form of an entry in the disk and redis tiers, authenticated under the
// cluster key:
//   "UOPDCACHE2" | key (32 raw bytes) | HMAC-SHA256 (32) | payload length (u64 LE) | payload
// The HMAC covers everything but itself (magic, key, length, payload), so only a holder of
// the key can make an entry that verifies, and the key inside it ties it to one name: an
// entry filed under the wrong name (a copied file, a hand-edited redis key) is refused
// too. Checksums alone (the previous format) stopped accidents, not whoever could write the
// cache directory or Redis.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/cache/cluster_key.h"

namespace uop::cache_entry {

inline constexpr std::string_view kMagic = "UOPDCACHE2";
inline constexpr size_t kHeaderSize = 10 + 32 + 32 + 8;

// `key` must be a valid cache key.
std::string encode(const ClusterKey& mac_key, std::string_view key, std::string_view payload);

// Checks magic, key, length and the HMAC (in constant time); returns the payload, or
// DATA_LOSS naming the key, `where` (a file path, a redis address) and what did not match.
// Takes the stored bytes by value so the payload is returned without another copy.
absl::StatusOr<std::string> decode(const ClusterKey& mac_key, std::string_view key,
                                   std::string stored, std::string_view where);

}  // namespace uop::cache_entry
