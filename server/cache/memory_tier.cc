// MemoryTier: a list in recency order plus a hash index into it; every operation is O(1)
// apart from the evictions a put causes.
#include "server/cache/memory_tier.h"

namespace uop {
namespace {
int64_t cost(const std::string& key, size_t value_size) {
  return static_cast<int64_t>(key.size() + value_size);
}
}  // namespace

MemoryTier::MemoryTier(int64_t byte_budget) : budget_(byte_budget) {}

absl::StatusOr<std::optional<std::string>> MemoryTier::get(std::string_view key) {
  std::shared_ptr<const std::string> value;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(std::string(key));
    if (it == index_.end()) return std::optional<std::string>();
    lru_.splice(lru_.begin(), lru_, it->second);
    value = it->second->value;
  }
  return std::optional<std::string>(*value);
}

absl::Status MemoryTier::put(std::string_view key_view, std::string_view value) {
  std::string key(key_view);
  int64_t c = cost(key, value.size());
  if (c > budget_)
    return absl::ResourceExhaustedError(cat("memory cache: entry of ", c,
                                            " bytes exceeds the whole budget of ", budget_,
                                            " bytes"));
  auto shared = std::make_shared<const std::string>(value);  // copied before taking the lock
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ -= cost(key, it->second->value->size());
    lru_.erase(it->second);
    index_.erase(it);
  }
  evict_to_fit(c);
  lru_.push_front(Entry{key, std::move(shared)});
  index_.emplace(std::move(key), lru_.begin());
  bytes_ += c;
  return absl::OkStatus();
}

absl::Status MemoryTier::remove(std::string_view key) {
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(std::string(key)); it != index_.end()) {
    bytes_ -= cost(it->first, it->second->value->size());
    lru_.erase(it->second);
    index_.erase(it);
  }
  return absl::OkStatus();
}

void MemoryTier::evict_to_fit(int64_t incoming) {
  while (!lru_.empty() && bytes_ + incoming > budget_) {
    Entry& victim = lru_.back();
    bytes_ -= cost(victim.key, victim.value->size());
    index_.erase(victim.key);
    lru_.pop_back();
    ++evictions_;
  }
}

int64_t MemoryTier::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

size_t MemoryTier::entries() const {
  absl::MutexLock lock(&mu_);
  return index_.size();
}

uint64_t MemoryTier::evictions() const {
  absl::MutexLock lock(&mu_);
  return evictions_;
}

}  // namespace uop
