// ClusterKey: the secret under which the compile cache's persistent tiers authenticate
// their entries (HMAC-SHA256). Whoever holds it can mint entries that workers will run, so
// it is read only from a file nobody else can read, and the embedded default makes its own
// in the cache directory on first start. See server/cache/README.md (trust model).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace uop {

class ClusterKey {
 public:
  static constexpr size_t kMinBytes = 32;
  static constexpr size_t kMaxBytes = 4096;
  // The embedded default's key file, at the top of the cache directory (the disk tier only
  // looks inside its two-hex-digit subdirectories).
  static constexpr std::string_view kFileName = "cluster.key";

  // --cache-key-file: the file's bytes, exactly, are the key. It must be a regular file of
  // kMinBytes..kMaxBytes that neither group nor others may read or write (symbolic links
  // are followed, for mounted secrets). FAILED_PRECONDITION naming the path and what is
  // wrong otherwise (NOT_FOUND when it does not exist, PERMISSION_DENIED when this user
  // may not open it).
  static absl::StatusOr<ClusterKey> from_file(const std::string& path);

  // The embedded default: `dir`/cluster.key, made on first use (32 random bytes, mode
  // 0600). It is written to a temp file and published with link(), which fails when the
  // name exists, so servers starting at once on one directory all end up reading the one
  // key that was linked first. An existing file must pass from_file's checks, belong to
  // this user and not be a link (a directory others can write, like /tmp, must not hand us
  // their key).
  // UNAVAILABLE when the key can neither be read nor made (a read-only or unusable
  // directory: the caller runs without the disk tier); any other error means the file
  // there is unsafe or broken and the caller should refuse to start.
  static absl::StatusOr<ClusterKey> in_directory(const std::string& dir);

  // A key from bytes already in hand (tests); INVALID_ARGUMENT under kMinBytes.
  static absl::StatusOr<ClusterKey> from_bytes(std::string bytes);

  // HMAC-SHA256 of the concatenation of `parts`.
  std::array<uint8_t, 32> mac(std::initializer_list<std::string_view> parts) const;

  // 16 hex digits that name the key without revealing it, for logs: servers that are to
  // share entries must print the same one.
  std::string fingerprint() const;

 private:
  explicit ClusterKey(std::string bytes) : bytes_(std::move(bytes)) {}
  std::string bytes_;
};

// The contents of a secret file (a cache key, a Redis password): a regular file of at most
// `max_bytes` that neither group nor others may read or write, else FAILED_PRECONDITION
// naming `what` and the path (NOT_FOUND when it does not exist, PERMISSION_DENIED when this
// user may not open it).
absl::StatusOr<std::string> read_secret_file(const std::string& path, std::string_view what,
                                             size_t max_bytes);

}  // namespace uop
