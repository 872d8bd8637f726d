// CacheTier: one level of the compile cache (memory, disk, redis). A tier answers "present
// and verified", "absent", or an error; it never hands back bytes it has not checked, so a
// broken tier costs a compile, never a wrong artifact. The persistent tiers store entries
// in the authenticated format of cache_entry.h. See server/cache/README.md for the format
// and the failure rules.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  // Drops the entry (OK if there was none): for one the tier verified but its user found
  // to be something else than what the key names.
  virtual absl::Status remove(std::string_view key) = 0;
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

}  // namespace uop
