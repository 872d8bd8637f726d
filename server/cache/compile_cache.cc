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

std::optional<std::string> CompileCache::lookup(size_t tier, std::string_view key, const Verifier& verify,
                                                bool count_miss) {
  absl::StatusOr<std::optional<std::string>> got = tiers_[tier]->get(key);
  if (!got.ok()) {
    ++counters_[tier].errors;
    tier_error(tier, got.status());
    return std::nullopt;
  }
  if (!got->has_value()) {
    if (count_miss) ++counters_[tier].misses;
    return std::nullopt;
  }
  // An in-process tier holds only what this process computed or already verified on its
  // way up from a lower tier: checking it again would cost every cached Run a parse.
  if (verify && !tiers_[tier]->in_process()) {
    if (absl::Status v = verify(**got); !v.ok()) {
      ++counters_[tier].errors;
      tier_error(tier, v);
      if (absl::Status r = tiers_[tier]->remove(key); !r.ok()) tier_error(tier, r);
      return std::nullopt;
    }
  }
  return *std::move(got);
}

std::optional<CacheResult> CompileCache::get_fast(std::string_view key, const Verifier& verify) {
  if (tiers_.empty() || !tiers_[0]->in_process() || !is_cache_key(key)) return std::nullopt;
  std::optional<std::string> got = lookup(0, key, verify, /*count_miss=*/false);
  if (!got) return std::nullopt;
  ++counters_[0].hits;
  return CacheResult{*std::move(got), CacheOutcome::Hit, std::string(tiers_[0]->name())};
}

absl::StatusOr<CacheResult> CompileCache::get_or_compute(
    std::string_view key, const std::function<absl::StatusOr<std::string>()>& compute, const Verifier& verify) {
  if (auto s = check_cache_key(key); !s.ok()) return s;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    std::optional<std::string> got = lookup(i, key, verify, /*count_miss=*/true);
    if (!got) continue;
    ++counters_[i].hits;
    for (size_t j = 0; j < i; ++j) put_into(j, key, *got);
    return CacheResult{*std::move(got), CacheOutcome::Hit, std::string(tiers_[i]->name())};
  }

  // Missed everywhere. The leader stores the artifact in the first tier before the waiters
  // wake, and a caller that missed just before the previous leader finished looks there
  // again before compiling; the slower tiers are written after the waiters are released.
  bool computed = false;
  auto [result, leader] = flights_.do_call(std::string(key), [&]() -> absl::StatusOr<std::string> {
    if (!tiers_.empty())
      if (std::optional<std::string> again = lookup(0, key, verify, /*count_miss=*/false)) return *std::move(again);
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
