// MemoryTier: the first compile-cache tier, an in-process LRU bounded by bytes. Values
// never leave the process, so they are not re-verified; the disk and redis tiers below it
// are what check digests.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/cache/cache_tier.h"

namespace uop {

class MemoryTier : public CacheTier {
 public:
  // An entry costs its key plus its value in bytes; the least recently used entries go
  // first when a put would exceed `byte_budget`.
  explicit MemoryTier(int64_t byte_budget);

  std::string_view name() const override { return "memory"; }
  bool in_process() const override { return true; }
  absl::StatusOr<std::optional<std::string>> get(std::string_view key) override;
  // RESOURCE_EXHAUSTED for a value that alone exceeds the budget (a budget too small for
  // one artifact is a misconfiguration worth seeing in the put-error metric).
  absl::Status put(std::string_view key, std::string_view value) override;
  absl::Status remove(std::string_view key) override;

  int64_t bytes() const;
  size_t entries() const;
  uint64_t evictions() const;

 private:
  struct Entry {
    std::string key;
    // Shared so that a get copies the bytes out after releasing the lock.
    std::shared_ptr<const std::string> value;
  };
  void evict_to_fit(int64_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t budget_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // front = most recently used
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace uop
