// CompileCache: lookup order, promotion, singleflight and the per-tier counters.
#include "server/cache/compile_cache.h"

namespace uop {

std::string_view cache_outcome_name(CacheOutcome o) {
  switch (o) {
    case CacheOutcome::Hit: return "hit";
    case CacheOutcome::Miss: return "miss";
    case CacheOutcome::Coalesced: return "coalesced";
  }
  return "?";
}

CompileCache::CompileCache(std::vector<std::unique_ptr<CacheTier>> tiers, ErrorListener on_error)
    : tiers_(std::move(tiers)), counters_(tiers_.size()), on_error_(std::move(on_error)) {}

void CompileCache::tier_error(size_t tier, const absl::Status& status) {
  if (on_error_) on_error_(tiers_[tier]->name(), status);
}

void CompileCache::put_into(size_t tier, std::string_view key, std::string_view value) {
  absl::Status s = tiers_[tier]->put(key, value);
  if (s.ok()) {
    ++counters_[tier].puts;
  } else {
    ++counters_[tier].put_errors;
    tier_error(tier, s);
  }
}

std::optional<CacheResult> CompileCache::get_fast(std::string_view key) {
  if (tiers_.empty() || !tiers_[0]->in_process() || !is_cache_key(key)) return std::nullopt;
  absl::StatusOr<std::optional<std::string>> got = tiers_[0]->get(key);
  if (!got.ok() || !got->has_value()) return std::nullopt;
  ++counters_[0].hits;
  return CacheResult{std::move(**got), CacheOutcome::Hit, std::string(tiers_[0]->name())};
}

absl::StatusOr<CacheResult> CompileCache::get_or_compute(
    std::string_view key, const std::function<absl::StatusOr<std::string>()>& compute) {
  if (auto s = check_cache_key(key); !s.ok()) return s;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    absl::StatusOr<std::optional<std::string>> got = tiers_[i]->get(key);
    if (!got.ok()) {
      ++counters_[i].errors;
      tier_error(i, got.status());
      continue;
    }
    if (!got->has_value()) {
      ++counters_[i].misses;
      continue;
    }
    ++counters_[i].hits;
    for (size_t j = 0; j < i; ++j) put_into(j, key, **got);
    return CacheResult{std::move(**got), CacheOutcome::Hit, std::string(tiers_[i]->name())};
  }

  // Missed everywhere. The leader stores the artifact in the first tier before the waiters
  // wake, and a caller that missed just before the previous leader finished looks there
  // again before compiling; the slower tiers are written after the waiters are released.
  bool computed = false;
  auto [result, leader] = flights_.do_call(std::string(key), [&]() -> absl::StatusOr<std::string> {
    if (!tiers_.empty()) {
      absl::StatusOr<std::optional<std::string>> again = tiers_[0]->get(key);
      if (again.ok() && again->has_value()) return **std::move(again);
    }
    computed = true;
    ++computes_;
    absl::StatusOr<std::string> value = compute();
    if (value.ok() && !tiers_.empty()) put_into(0, key, *value);
    return value;
  });
  if (!leader || !computed) {
    ++coalesced_;
    if (!result.ok()) return result.status();
    return CacheResult{*std::move(result), CacheOutcome::Coalesced, ""};
  }
  if (!result.ok()) {
    ++compute_errors_;
    return result.status();
  }
  for (size_t i = 1; i < tiers_.size(); ++i) put_into(i, key, *result);
  return CacheResult{*std::move(result), CacheOutcome::Miss, ""};
}

std::vector<std::pair<std::string, TierStats>> CompileCache::stats() const {
  std::vector<std::pair<std::string, TierStats>> out;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    const Counters& c = counters_[i];
    out.emplace_back(std::string(tiers_[i]->name()),
                     TierStats{c.hits.load(), c.misses.load(), c.errors.load(), c.puts.load(),
                               c.put_errors.load()});
  }
  return out;
}

}  // namespace uop
