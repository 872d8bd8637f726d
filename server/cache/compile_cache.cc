// CompileCache: lookup order, promotion, singleflight and the per-tier counters.
#include "server/cache/compile_cache.h"

#include "absl/time/clock.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

std::string cat_abandoned(std::string_view key) {
  return cat("compile of cache key ", key.substr(0, 12), " abandoned: no request waits for it any more");
}
std::string cat_stopped(std::string_view key, std::string_view why) {
  return cat("stopped waiting for the compile of cache key ", key.substr(0, 12), ": ", why);
}

}  // namespace

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
  Lookup lookup = start(
      key, [&](const std::function<bool()>&) { return compute(); }, [](std::function<void()> work) { work(); },
      absl::InfiniteFuture());
  return finish(lookup, nullptr);
}

CompileCache::Lookup CompileCache::start(std::string_view key, Compute compute, Runner run, absl::Time deadline) {
  Lookup lookup;
  lookup.key_ = std::string(key);
  lookup.deadline_ = deadline;
  if (auto s = check_cache_key(key); !s.ok()) {
    lookup.ready_ = s;
    return lookup;
  }
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
    lookup.ready_ = CacheResult{std::move(**got), CacheOutcome::Hit, std::string(tiers_[i]->name())};
    return lookup;
  }
  // Missed everywhere: join the compile in flight, or start one.
  lookup.compute_ = std::move(compute);
  lookup.run_ = std::move(run);
  lookup.ticket_ = flights_.join(lookup.key_, deadline, [&](const std::shared_ptr<Flights::Call>& call) {
    lookup.run_([this, call, key = lookup.key_, compute = lookup.compute_] { fly(call, key, compute); });
  });
  return lookup;
}

// The leader stores the artifact in the first tier before the waiters wake, and a caller
// that missed just before the previous leader finished looks there again before
// compiling; the slower tiers are written after the waiters are released.
void CompileCache::fly(const std::shared_ptr<Flights::Call>& call, std::string key, const Compute& compute) {
  // Queued behind others, its callers may all have gone by now: then it costs nothing.
  if (!call->wanted()) {
    ++abandoned_;
    flights_.publish(call, Flown{absl::CancelledError(cat_abandoned(key)), false, true});
    return;
  }
  if (!tiers_.empty()) {
    absl::StatusOr<std::optional<std::string>> again = tiers_[0]->get(key);
    if (again.ok() && again->has_value()) {
      flights_.publish(call, Flown{**std::move(again), false, false});
      return;
    }
  }
  ++computes_;
  absl::StatusOr<std::string> value = compute([&call] { return call->wanted(); });
  // A compute that stopped (CANCELLED, DEADLINE_EXCEEDED) did so for want of callers: a
  // caller that joined since then starts it again rather than take that for an answer.
  if (!value.ok() && (value.status().code() == absl::StatusCode::kCancelled ||
                      value.status().code() == absl::StatusCode::kDeadlineExceeded)) {
    ++abandoned_;
    flights_.publish(call, Flown{std::move(value), true, true});
    return;
  }
  if (value.ok() && !tiers_.empty()) put_into(0, key, *value);
  if (!value.ok()) ++compute_errors_;
  std::optional<std::string> store;
  if (value.ok() && tiers_.size() > 1) store = *value;
  flights_.publish(call, Flown{std::move(value), true, false});
  if (store)
    for (size_t i = 1; i < tiers_.size(); ++i) put_into(i, key, *store);
}

absl::StatusOr<CacheResult> CompileCache::finish(Lookup& lookup, const std::function<bool()>& gone) {
  if (lookup.ready_) return *std::move(lookup.ready_);
  while (true) {
    const bool leader = lookup.ticket_.leader();
    std::optional<Flown> r = lookup.ticket_.wait(lookup.deadline_, gone);
    const bool live = absl::Now() < lookup.deadline_ && !(gone && gone());
    if (!r) {
      if (absl::Now() >= lookup.deadline_) return absl::DeadlineExceededError(cat_stopped(lookup.key_, "the deadline passed"));
      return absl::CancelledError(cat_stopped(lookup.key_, "the caller gave up"));
    }
    if (r->abandoned && live) {
      // Everyone else gave up on that compile just as this caller joined it: start anew.
      lookup.ticket_ = flights_.join(lookup.key_, lookup.deadline_, [&](const std::shared_ptr<Flights::Call>& call) {
        lookup.run_([this, call, key = lookup.key_, compute = lookup.compute_] { fly(call, key, compute); });
      });
      continue;
    }
    if (!leader || !r->computed) {
      ++coalesced_;
      if (!r->value.ok()) return r->value.status();
      return CacheResult{*std::move(r->value), CacheOutcome::Coalesced, ""};
    }
    if (!r->value.ok()) return r->value.status();
    return CacheResult{*std::move(r->value), CacheOutcome::Miss, ""};
  }
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
