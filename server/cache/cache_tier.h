// CacheTier: one level of the compile cache (memory, disk, redis), and the entry format the
// persistent tiers share. A tier answers "present and verified", "absent", or an error;
// it never hands back bytes it has not checked, so a broken tier costs a compile, never a
// wrong artifact. See server/cache/README.md for the format and the failure rules.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/digest.h"
#include "compiler/support/strings.h"

namespace uop {

class CacheTier {
 public:
  virtual ~CacheTier() = default;
  virtual std::string_view name() const = 0;  // "memory", "disk", "redis"
  // OK(nullopt): absent. OK(bytes): present AND verified. An error status: the tier failed
  // or the entry was corrupt (the caller counts it as an error and treats it as a miss; a
  // corrupt entry is also deleted by the tier).
  virtual absl::StatusOr<std::optional<std::string>> get(std::string_view key) = 0;
  virtual absl::Status put(std::string_view key, std::string_view value) = 0;
  // True for a tier answering from this process's memory (no I/O): CompileCache::get_fast
  // asks only such a tier.
  virtual bool in_process() const { return false; }
};

// Keys are SHA-256 digests in lowercase hex. Tiers that turn keys into file names or
// remote keys accept nothing else, so a key can never be a path ("../x") or alias another
// key by case.
inline bool is_cache_key(std::string_view key) {
  if (key.size() != 64) return false;
  for (char c : key)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

inline absl::Status check_cache_key(std::string_view key) {
  if (is_cache_key(key)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      cat("cache key must be 64 lowercase hex characters (a SHA-256), got ", key.size(),
          " bytes"));
}

// The stored form of an entry in the disk and redis tiers:
//   "UOPDCACHE1" | key (32 raw bytes) | SHA-256(payload) (32) | payload length (u64 LE) | payload
// The key is in the header so an entry filed under the wrong name (a copied file, a bug in
// another server version) fails verification instead of being served for the wrong key.
namespace cache_entry {

inline constexpr std::string_view kMagic = "UOPDCACHE1";
inline constexpr size_t kHeaderSize = 10 + 32 + 32 + 8;

inline void append_key_bytes(std::string& out, std::string_view hex_key) {
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < hex_key.size(); i += 2)
    out.push_back(static_cast<char>(nib(hex_key[i]) << 4 | nib(hex_key[i + 1])));
}

// `key` must be a valid cache key.
inline std::string encode(std::string_view key, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  out.append(kMagic);
  append_key_bytes(out, key);
  Digest d = sha256(payload);
  out.append(reinterpret_cast<const char*>(d.bytes.data()), d.bytes.size());
  uint64_t n = payload.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(payload);
  return out;
}

// Checks magic, key, length and SHA-256; returns the payload, or DATA_LOSS naming the key
// and `where` (a file path, a redis address) and what did not match. Takes the stored
// bytes by value so the payload is returned without another copy.
inline absl::StatusOr<std::string> decode(std::string_view key, std::string stored,
                                          std::string_view where) {
  auto loss = [&](std::string_view what) {
    return absl::DataLossError(cat("corrupt cache entry ", key, " in ", where, ": ", what));
  };
  if (stored.size() < kHeaderSize)
    return loss(cat("truncated: ", stored.size(), " bytes, header alone is ", kHeaderSize));
  std::string_view view = stored;
  if (view.substr(0, kMagic.size()) != kMagic) return loss("bad magic");
  std::string want_key;
  append_key_bytes(want_key, key);
  if (view.substr(kMagic.size(), 32) != want_key) return loss("header names another key");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t{static_cast<unsigned char>(stored[kMagic.size() + 64 + i])} << (8 * i);
  std::string_view payload = std::string_view(stored).substr(kHeaderSize);
  if (n != payload.size())
    return loss(cat("length mismatch: header says ", n, " bytes, found ", payload.size()));
  Digest d = sha256(payload);
  if (std::memcmp(d.bytes.data(), stored.data() + kMagic.size() + 32, 32) != 0)
    return loss("SHA-256 mismatch");
  stored.erase(0, kHeaderSize);
  return stored;
}

}  // namespace cache_entry
}  // namespace uop
