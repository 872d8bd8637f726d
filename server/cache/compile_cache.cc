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

std::string CompileCache::count_first_tier_hit() {
  ++counters_[0].hits;
  return std::string(tiers_[0]->name());
}

void CompileCache::count_first_tier_hits(uint64_t n) { counters_[0].hits += n; }

absl::StatusOr<CacheResult> CompileCache::get_or_compute(
    std::string_view key, const std::function<absl::StatusOr<std::string>()>& compute, const Verifier& verify) {
  Lookup l = start(
      key, [&](const std::function<bool()>&) { return compute(); }, [](std::function<void()> work) { work(); },
      absl::InfiniteFuture(), verify);
  return finish(l, nullptr);
}

CompileCache::Lookup CompileCache::start(std::string_view key, Compute compute, Runner run, absl::Time deadline,
                                         const Verifier& verify) {
  Lookup l;
  l.key_ = std::string(key);
  l.deadline_ = deadline;
  if (auto s = check_cache_key(key); !s.ok()) {
    l.ready_ = s;
    return l;
  }
  for (size_t i = 0; i < tiers_.size(); ++i) {
    std::optional<std::string> got = lookup(i, key, verify, /*count_miss=*/true);
    if (!got) continue;
    ++counters_[i].hits;
    for (size_t j = 0; j < i; ++j) put_into(j, key, *got);
    l.ready_ = CacheResult{*std::move(got), CacheOutcome::Hit, std::string(tiers_[i]->name())};
    return l;
  }
  // Missed everywhere: join the compile in flight, or start one.
  l.compute_ = std::move(compute);
  l.run_ = std::move(run);
  l.verify_ = verify;
  l.ticket_ = flights_.join(l.key_, deadline, [&](const std::shared_ptr<Flights::Call>& call) {
    l.run_([this, call, key = l.key_, compute = l.compute_, verify = l.verify_] { fly(call, key, compute, verify); });
  });
  return l;
}

// The leader stores the artifact in the first tier before the waiters wake, and a caller
// that missed just before the previous leader finished looks there again before
// compiling; the slower tiers are written after the waiters are released.
void CompileCache::fly(const std::shared_ptr<Flights::Call>& call, std::string key, const Compute& compute,
                       const Verifier& verify) {
  // Queued behind others, its callers may all have gone by now: then it costs nothing.
  if (!call->wanted()) {
    ++abandoned_;
    flights_.publish(call, Flown{absl::CancelledError(cat_abandoned(key)), false, true});
    return;
  }
  if (!tiers_.empty())
    if (std::optional<std::string> again = lookup(0, key, verify, /*count_miss=*/false)) {
      flights_.publish(call, Flown{*std::move(again), false, false});
      return;
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
        lookup.run_([this, call, key = lookup.key_, compute = lookup.compute_, verify = lookup.verify_] {
          fly(call, key, compute, verify);
        });
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
