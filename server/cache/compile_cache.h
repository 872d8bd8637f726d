// CompileCache: the tiers of the compile cache put together (memory -> disk -> redis, in
// the order given). A lookup tries each tier; a hit in a lower tier is copied into the
// tiers above it. Concurrent misses of one key wait on one compile (singleflight), whose
// artifact is stored in every tier. A tier that fails or holds a corrupt entry is counted
// and skipped: it costs a compile, never a wrong artifact. The caller may also pass a
// verifier, which sees every entry a tier answers with: one it refuses (an entry that
// authenticates but is not what the key names) is removed from that tier and counted as
// that tier's error, and the lookup goes on as if the tier had missed.
//
// A compile may run elsewhere (the scheduler's compile pool) while its callers wait on
// their own threads, each until its own deadline or until it gives up; a compile that no
// caller waits for any more is abandoned (its compute is told through `wanted`), one that
// a caller still waits for goes on for that caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/cache/cache_tier.h"
#include "server/cache/singleflight.h"

namespace uop {

enum class CacheOutcome { Hit, Miss, Coalesced };
std::string_view cache_outcome_name(CacheOutcome o);  // "hit", "miss", "coalesced"

struct CacheResult {
  std::string value;
  CacheOutcome outcome;
  std::string tier;  // the tier that hit (for Hit); empty otherwise
};

struct TierStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t errors = 0;  // failed lookups and corrupt entries; each also counts as a miss
                        // for the request, but not in `misses`
  uint64_t puts = 0;
  uint64_t put_errors = 0;
};

class CompileCache {
 public:
  // Called for every tier error, on the requesting thread, with no lock held; for logs.
  using ErrorListener = std::function<void(std::string_view tier, const absl::Status&)>;
  // OK to use an entry a tier answered with; an error (DATA_LOSS, say) to refuse it.
  using Verifier = std::function<absl::Status(std::string_view value)>;

  explicit CompileCache(std::vector<std::unique_ptr<CacheTier>> tiers,
                        ErrorListener on_error = nullptr);

  // `key` must be a cache key (64 lowercase hex), else INVALID_ARGUMENT. On a miss in
  // every tier `compute` runs once for all concurrent callers of the key: the leader gets
  // Miss, the others Coalesced. A compute error is returned to every waiter and nothing is
  // stored. `verify` (optional) checks every entry found in a tier outside this process
  // (disk, Redis) before it is used or copied up; not what `compute` returns, nor hits in
  // the memory tier, which only ever holds what passed or what this process computed.
  // This form computes on the caller's thread and waits as long as it takes.
  absl::StatusOr<CacheResult> get_or_compute(std::string_view key,
                                             const std::function<absl::StatusOr<std::string>()>& compute,
                                             const Verifier& verify = nullptr);

  // The same in two steps, so that one caller can have many lookups under way and the
  // compute can run elsewhere. `compute` asks `wanted()` between its steps: false once no
  // caller waits for it (each has given up or passed its deadline), and then it should
  // stop with CANCELLED or DEADLINE_EXCEEDED, which mean just that (nothing is stored,
  // and a caller that joined meanwhile starts it again). `run` is where the compute
  // goes: it is handed the work and must run it once, now or later, on any thread.
  using Compute = std::function<absl::StatusOr<std::string>(const std::function<bool()>& wanted)>;
  using Runner = std::function<void(std::function<void()>)>;
  class Lookup;
  // Asks the tiers now, on this thread (entries checked by `verify` as in get_or_compute);
  // on a miss everywhere joins the compile in flight for the key or starts one through
  // `run`. This caller wants the result until `deadline` (or until it gives up in finish).
  Lookup start(std::string_view key, Compute compute, Runner run, absl::Time deadline,
               const Verifier& verify = nullptr);
  // Waits for the lookup's result. Polls `gone` (may be empty) and stops waiting when it
  // says so (CANCELLED) or when the deadline passes (DEADLINE_EXCEEDED); a compile
  // abandoned by everyone just as this caller came is started again for it.
  absl::StatusOr<CacheResult> finish(Lookup& lookup, const std::function<bool()>& gone);

  // The entry if the first tier holds it and answers from memory (no I/O, no waiting):
  // what the caller may do on its own thread before handing a lookup to a compile pool. A
  // hit counts as that tier's hit; a miss counts nothing (the get_or_compute that follows
  // counts it). An entry `verify` refuses is removed and counted, as in get_or_compute.
  std::optional<CacheResult> get_fast(std::string_view key, const Verifier& verify = nullptr);

  // Whether the first tier is in this process's memory: then a caller may keep what it
  // made of an entry (the planner's resolved kernels: the entry of a key never changes)
  // and answer later lookups of the key itself, as that tier would have.
  bool first_tier_in_process() const { return !tiers_.empty() && tiers_[0]->in_process(); }
  // Such a hit, counted as the first tier's; its name.
  std::string count_first_tier_hit();
  // n of them at once (a warm Run's kernels, Planner::compile_shared).
  void count_first_tier_hits(uint64_t n);
  std::string first_tier_name() const { return tiers_.empty() ? std::string() : std::string(tiers_[0]->name()); }
  std::vector<std::pair<std::string, TierStats>> stats() const;  // per tier, in order
  uint64_t computes() const { return computes_.load(); }
  uint64_t compute_errors() const { return compute_errors_.load(); }
  uint64_t coalesced() const { return coalesced_.load(); }
  // Callers waiting for the compile in flight for `key` (0: none in flight).
  size_t waiters(std::string_view key) const { return flights_.waiters(std::string(key)); }
  // Compiles given up because no caller waited for them any more.
  uint64_t abandoned() const { return abandoned_.load(); }
  const std::vector<std::unique_ptr<CacheTier>>& tiers() const { return tiers_; }

 private:
  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, errors{0}, puts{0}, put_errors{0};
  };
  void put_into(size_t tier, std::string_view key, std::string_view value);
  // Tier `tier`'s entry for `key` if it has one that `verify` accepts. A failed lookup and
  // a refused entry count as the tier's error (the refused one is removed); with
  // `count_miss` an absent entry counts as its miss.
  std::optional<std::string> lookup(size_t tier, std::string_view key, const Verifier& verify, bool count_miss);
  void tier_error(size_t tier, const absl::Status& status);

  // What a compile in flight ends with: the value (or error), whether it was computed
  // (and not found in the first tier on a second look), whether it was abandoned.
  struct Flown {
    absl::StatusOr<std::string> value;
    bool computed = false;
    bool abandoned = false;
  };
  using Flights = Singleflight<Flown>;
  void fly(const std::shared_ptr<Flights::Call>& call, std::string key, const Compute& compute,
           const Verifier& verify);

  std::vector<std::unique_ptr<CacheTier>> tiers_;
  std::vector<Counters> counters_;  // parallel to tiers_
  ErrorListener on_error_;
  Flights flights_;
  std::atomic<uint64_t> computes_{0};
  std::atomic<uint64_t> compute_errors_{0};
  std::atomic<uint64_t> coalesced_{0};
  std::atomic<uint64_t> abandoned_{0};
};

class CompileCache::Lookup {
 private:
  friend class CompileCache;
  std::string key_;
  std::optional<absl::StatusOr<CacheResult>> ready_;  // answered by a tier, or refused
  Flights::Ticket ticket_;
  Compute compute_;
  Runner run_;
  Verifier verify_;
  absl::Time deadline_ = absl::InfiniteFuture();
};

}  // namespace uop
