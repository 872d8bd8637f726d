#include "server/cache/compile_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "server/cache/disk_tier.h"
#include "server/cache/memory_tier.h"
#include "server/cache/redis_tier.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using testing::key_of;
using testing::RedisServer;
using testing::ScratchDir;

// A tier that fails every call, standing for a broken remote or an unreadable disk.
class FailingTier : public CacheTier {
 public:
  std::string_view name() const override { return "failing"; }
  absl::StatusOr<std::optional<std::string>> get(std::string_view) override {
    return absl::UnavailableError("failing tier: get");
  }
  absl::Status put(std::string_view, std::string_view) override {
    return absl::UnavailableError("failing tier: put");
  }
  absl::Status remove(std::string_view) override { return absl::UnavailableError("failing tier: remove"); }
};

std::vector<std::unique_ptr<CacheTier>> memory_and_disk(const std::string& dir) {
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(1 << 20));
  tiers.push_back(std::make_unique<DiskTier>(dir, 1 << 20, testing::cluster_key()));
  return tiers;
}

TierStats stats_of(const CompileCache& c, std::string_view tier) {
  for (auto& [name, s] : c.stats())
    if (name == tier) return s;
  ADD_FAILURE() << "no tier " << tier;
  return {};
}

// Polls until `n` callers wait for the compile of `key` in flight (true), or gives up
// after a bound far past any honest delay (false).
bool wait_for_waiters(const CompileCache& cache, const std::string& key, size_t n) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (cache.waiters(key) < n) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(CompileCache, SixteenConcurrentMissesCompileOnce) {
  ScratchDir d;
  CompileCache cache(memory_and_disk(d.path()));
  constexpr int kThreads = 16;
  std::atomic<int> compiles{0};
  const std::string key = key_of("cold kernel");
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    // Hold the compile until every caller has joined it, so all of them overlap with it.
    if (!wait_for_waiters(cache, key, kThreads)) return absl::InternalError("the callers never joined");
    return std::string("the artifact");
  };
  std::vector<absl::StatusOr<CacheResult>> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      results[i] = cache.get_or_compute(key, compile);
    });
  for (auto& t : threads) t.join();

  EXPECT_EQ(compiles.load(), 1);
  EXPECT_EQ(cache.computes(), 1u);
  EXPECT_EQ(cache.coalesced(), 15u);
  int misses = 0, coalesced = 0;
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->value, "the artifact");
    misses += r->outcome == CacheOutcome::Miss;
    coalesced += r->outcome == CacheOutcome::Coalesced;
  }
  EXPECT_EQ(misses, 1);
  EXPECT_EQ(coalesced, 15);
  EXPECT_EQ(stats_of(cache, "memory").puts, 1u);
  EXPECT_EQ(stats_of(cache, "disk").puts, 1u);

  auto again = cache.get_or_compute(key, compile);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, CacheOutcome::Hit);
  EXPECT_EQ(again->tier, "memory");
  EXPECT_EQ(compiles.load(), 1);
}

// get_fast answers from the memory tier only: never from disk (I/O on the caller's
// thread), never by computing, and a miss leaves the counters to the full lookup.
TEST(CompileCache, GetFastAnswersOnlyFromMemory) {
  ScratchDir d;
  CompileCache cache(memory_and_disk(d.path()));
  const std::string key = key_of("fast kernel");
  EXPECT_FALSE(cache.get_fast(key).has_value());
  EXPECT_EQ(stats_of(cache, "memory").misses, 0u);
  EXPECT_FALSE(cache.get_fast("not a key").has_value());
  ASSERT_TRUE(cache.get_or_compute(key, [] { return absl::StatusOr<std::string>("bytes"); }).ok());
  std::optional<CacheResult> hit = cache.get_fast(key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->value, "bytes");
  EXPECT_EQ(hit->outcome, CacheOutcome::Hit);
  EXPECT_EQ(hit->tier, "memory");
  EXPECT_EQ(stats_of(cache, "memory").hits, 1u);

  // A cache whose first tier is the disk: the entry is there, but get_fast does not look.
  std::vector<std::unique_ptr<CacheTier>> disk_only;
  disk_only.push_back(std::make_unique<DiskTier>(d.path(), 1 << 20, testing::cluster_key()));
  CompileCache on_disk(std::move(disk_only));
  EXPECT_FALSE(on_disk.get_fast(key).has_value());
  auto full = on_disk.get_or_compute(key, [] { return absl::StatusOr<std::string>("recompiled"); });
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->value, "bytes");
  EXPECT_EQ(full->tier, "disk");
}

TEST(CompileCache, ComputeErrorReachesEveryWaiterAndIsNotStored) {
  ScratchDir d;
  CompileCache cache(memory_and_disk(d.path()));
  std::atomic<int> compiles{0};
  const std::string key = key_of("bad kernel");
  auto failing = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    if (!wait_for_waiters(cache, key, 4)) return absl::InternalError("the callers never joined");
    return absl::InvalidArgumentError("kernel does not compile");
  };
  std::vector<absl::StatusOr<CacheResult>> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      results[i] = cache.get_or_compute(key, failing);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 1);
  for (auto& r : results) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "kernel does not compile");
  }
  EXPECT_EQ(cache.compute_errors(), 1u);
  EXPECT_EQ(stats_of(cache, "memory").puts, 0u);
  EXPECT_EQ(stats_of(cache, "disk").puts, 0u);

  // Nothing was cached: the next call compiles again.
  auto ok = cache.get_or_compute(key, [] { return absl::StatusOr<std::string>("fixed"); });
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->outcome, CacheOutcome::Miss);
}

TEST(CompileCache, RestartHitsDiskAndPromotesToMemory) {
  ScratchDir d;
  std::string key = key_of("kernel");
  int compiles = 0;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("artifact");
  };
  {
    CompileCache first(memory_and_disk(d.path()));
    auto r = first.get_or_compute(key, compile);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  }
  // A restarted server: empty memory, the same disk.
  auto tiers = memory_and_disk(d.path());
  auto* memory = static_cast<MemoryTier*>(tiers[0].get());
  CompileCache cache(std::move(tiers));
  auto r = cache.get_or_compute(key, compile);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, CacheOutcome::Hit);
  EXPECT_EQ(r->tier, "disk");
  EXPECT_EQ(r->value, "artifact");
  EXPECT_EQ(memory->entries(), 1u);  // promoted
  EXPECT_EQ(stats_of(cache, "memory").misses, 1u);
  EXPECT_EQ(stats_of(cache, "memory").puts, 1u);
  EXPECT_EQ(stats_of(cache, "disk").hits, 1u);

  r = cache.get_or_compute(key, compile);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tier, "memory");
  EXPECT_EQ(compiles, 1);
}

TEST(CompileCache, CorruptDiskEntryIsRecompiledAndCounted) {
  ScratchDir d;
  std::string key = key_of("kernel");
  int compiles = 0;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string(4096, 'a');
  };
  {
    CompileCache first(memory_and_disk(d.path()));
    ASSERT_TRUE(first.get_or_compute(key, compile).ok());
  }
  std::string path = DiskTier(d.path(), 1 << 20, testing::cluster_key()).path_for(key);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(cache_entry::kHeaderSize + 100);
    f.put('b');
  }
  std::vector<std::string> errors;
  CompileCache cache(memory_and_disk(d.path()), [&](std::string_view tier, const absl::Status& s) {
    errors.push_back(cat(tier, ": ", s.ToString()));
  });
  auto r = cache.get_or_compute(key, compile);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  EXPECT_EQ(r->value, std::string(4096, 'a'));  // never the corrupt bytes
  EXPECT_EQ(compiles, 2);
  EXPECT_EQ(stats_of(cache, "disk").errors, 1u);
  EXPECT_EQ(stats_of(cache, "disk").puts, 1u);  // the fresh artifact replaced it
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(errors[0].starts_with("disk: DATA_LOSS")) << errors[0];
  EXPECT_NE(errors[0].find(key), std::string::npos);

  // The rewritten entry is good: another restart hits it.
  CompileCache after(memory_and_disk(d.path()));
  r = after.get_or_compute(key, compile);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tier, "disk");
  EXPECT_EQ(r->value, std::string(4096, 'a'));
  EXPECT_EQ(compiles, 2);
}

TEST(CompileCache, FailingTierIsCountedAndSkipped) {
  ScratchDir d;
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(1 << 20));
  tiers.push_back(std::make_unique<FailingTier>());
  tiers.push_back(std::make_unique<DiskTier>(d.path(), 1 << 20, testing::cluster_key()));
  CompileCache cache(std::move(tiers));
  int compiles = 0;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("artifact");
  };
  auto r = cache.get_or_compute(key_of("k"), compile);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  TierStats f = stats_of(cache, "failing");
  EXPECT_EQ(f.errors, 1u);
  EXPECT_EQ(f.put_errors, 1u);
  EXPECT_EQ(stats_of(cache, "disk").misses, 1u);
  EXPECT_EQ(stats_of(cache, "disk").puts, 1u);

  // A hit below the failing tier is found through it and promoted above it.
  auto* disk = static_cast<DiskTier*>(cache.tiers()[2].get());
  ASSERT_TRUE(disk->put(key_of("only on disk"), "from disk").ok());
  r = cache.get_or_compute(key_of("only on disk"), compile);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tier, "disk");
  EXPECT_EQ(r->value, "from disk");
  EXPECT_EQ(stats_of(cache, "failing").errors, 2u);
  EXPECT_EQ(stats_of(cache, "failing").put_errors, 2u);
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(cache.stats()[0].first, "memory");
}

TEST(CompileCache, InvalidKeyIsRefusedWithoutCompiling) {
  CompileCache cache({});
  bool called = false;
  auto r = cache.get_or_compute("not a digest", [&]() -> absl::StatusOr<std::string> {
    called = true;
    return std::string();
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
}

TEST(CompileCache, NoTiersStillCoalesces) {
  CompileCache cache({});
  auto r = cache.get_or_compute(key_of("k"), [] { return absl::StatusOr<std::string>("v"); });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  EXPECT_EQ(cache.computes(), 1u);
}

TEST(CompileCache, TwoServersWithSeparateDisksShareOneRedis) {
  if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  ScratchDir da, db;
  auto server = [&](const ScratchDir& d) {
    auto tiers = memory_and_disk(d.path());
    auto r = RedisTier::create(redis.endpoint(), testing::cluster_key(), RedisTier::Options{.timeout_ms = 500});
    EXPECT_TRUE(r.ok()) << r.status();
    tiers.push_back(*std::move(r));
    return std::make_unique<CompileCache>(std::move(tiers));
  };
  auto a = server(da), b = server(db);
  int compiles = 0;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("shared artifact");
  };
  auto ra = a->get_or_compute(key_of("kernel"), compile);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(ra->outcome, CacheOutcome::Miss);
  EXPECT_EQ(stats_of(*a, "redis").puts, 1u);

  auto rb = b->get_or_compute(key_of("kernel"), compile);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->outcome, CacheOutcome::Hit);
  EXPECT_EQ(rb->tier, "redis");
  EXPECT_EQ(rb->value, "shared artifact");
  EXPECT_EQ(compiles, 1);
  // Promoted into b's own tiers: b's disk now has it too.
  EXPECT_EQ(stats_of(*b, "disk").puts, 1u);
  EXPECT_TRUE(DiskTier(db.path(), 1 << 20, testing::cluster_key()).get(key_of("kernel"))->has_value());
}

// What a caller's verifier refuses: here, any artifact but kernel A's.
absl::Status only_kernel_a(std::string_view value) {
  if (value.starts_with("artifact of kernel A")) return absl::OkStatus();
  return absl::DataLossError(cat("the entry names another kernel: ", value));
}

TEST(CompileCache, AnEntryTheVerifierRefusesIsRemovedCountedAndRecompiled) {
  ScratchDir d;
  std::string key = key_of("kernel A");
  // An entry that authenticates but holds another kernel's artifact: what a key holder's
  // mistake or a bug in another server would leave behind.
  ASSERT_TRUE(DiskTier(d.path(), 1 << 20, testing::cluster_key()).put(key, "artifact of kernel B").ok());
  std::vector<std::string> errors;
  CompileCache cache(memory_and_disk(d.path()), [&](std::string_view tier, const absl::Status& s) {
    errors.push_back(cat(tier, ": ", s.ToString()));
  });
  int compiles = 0;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("artifact of kernel A");
  };
  auto r = cache.get_or_compute(key, compile, only_kernel_a);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, "artifact of kernel A");
  EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(stats_of(cache, "disk").errors, 1u);
  EXPECT_EQ(stats_of(cache, "disk").hits, 0u);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(errors[0].starts_with("disk: DATA_LOSS")) << errors[0];
  EXPECT_NE(errors[0].find("names another kernel"), std::string::npos) << errors[0];
  // The disk now holds the recompiled artifact: a restart hits it.
  EXPECT_EQ(*DiskTier(d.path(), 1 << 20, testing::cluster_key()).get(key), "artifact of kernel A");

  // What the memory tier holds came from this process's compile or passed the check on its
  // way up, so hits there are not checked again (a cached Run would pay a parse for it).
  int checks = 0;
  auto counting = [&](std::string_view value) {
    ++checks;
    return only_kernel_a(value);
  };
  std::optional<CacheResult> hit = cache.get_fast(key, counting);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->value, "artifact of kernel A");
  EXPECT_EQ(checks, 0);
  r = cache.get_or_compute(key, compile, counting);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tier, "memory");
  EXPECT_EQ(checks, 0);
  EXPECT_EQ(compiles, 1);
}

TEST(CompileCache, OnlyVerifiedEntriesTravelThroughRedisIntoAnotherServersDisk) {
  if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  ScratchDir da, db, dc;
  auto server = [&](const ScratchDir& d, std::string_view cluster) {
    std::vector<std::unique_ptr<CacheTier>> tiers;
    tiers.push_back(std::make_unique<MemoryTier>(1 << 20));
    tiers.push_back(std::make_unique<DiskTier>(d.path(), 1 << 20, testing::cluster_key(cluster)));
    auto r = RedisTier::create(redis.endpoint(), testing::cluster_key(cluster), RedisTier::Options{.timeout_ms = 500});
    EXPECT_TRUE(r.ok()) << r.status();
    tiers.push_back(*std::move(r));
    return std::make_unique<CompileCache>(std::move(tiers));
  };
  auto a = server(da, "ours"), b = server(db, "ours");
  auto disk_of = [](const ScratchDir& d, const std::string& key) {
    auto got = DiskTier(d.path(), 1 << 20, testing::cluster_key("ours")).get(key);
    return got.ok() ? got->value_or("(absent)") : got.status().ToString();
  };
  auto compiled = [](std::string value) {
    return [value]() -> absl::StatusOr<std::string> { return value; };
  };

  // Whoever can write Redis but lacks the key plants another kernel's code in the format
  // that used to be accepted (a valid header and checksum).
  std::string key = key_of("kernel A");
  ASSERT_EQ(redis.raw({"SET", cat("uopd:cache:v2:", key), testing::checksummed_entry(key, "artifact of kernel B")}), "OK");
  auto rb = b->get_or_compute(key, compiled("artifact of kernel A"));
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->outcome, CacheOutcome::Miss);
  EXPECT_EQ(rb->value, "artifact of kernel A");
  EXPECT_EQ(stats_of(*b, "redis").errors, 1u);
  EXPECT_EQ(disk_of(db, key), "artifact of kernel A");
  // Redis now holds b's authenticated entry, which a finds and copies into its own disk.
  auto ra = a->get_or_compute(key, compiled("compiled again"));
  ASSERT_TRUE(ra.ok()) << ra.status();
  EXPECT_EQ(ra->tier, "redis");
  EXPECT_EQ(ra->value, "artifact of kernel A");
  EXPECT_EQ(disk_of(da, key), "artifact of kernel A");

  // An entry authenticated under another cluster's key is refused the same way.
  std::string key2 = key_of("kernel A2");
  auto theirs = server(dc, "theirs");
  ASSERT_TRUE(theirs->get_or_compute(key2, compiled("artifact of kernel B2")).ok());
  auto r2 = a->get_or_compute(key2, compiled("artifact of kernel A2"));
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->outcome, CacheOutcome::Miss);
  EXPECT_EQ(r2->value, "artifact of kernel A2");
  EXPECT_EQ(stats_of(*a, "redis").errors, 1u);
  EXPECT_EQ(disk_of(da, key2), "artifact of kernel A2");

  // And one under the right key that the verifier refuses (another kernel's artifact) is
  // removed from Redis and not copied anywhere.
  std::string key3 = key_of("kernel A3");
  auto* redis_of_a = static_cast<RedisTier*>(a->tiers()[2].get());
  ASSERT_TRUE(redis_of_a->put(key3, "artifact of kernel B3").ok());
  auto r3 = b->get_or_compute(key3, compiled("artifact of kernel A3"), only_kernel_a);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->outcome, CacheOutcome::Miss);
  EXPECT_EQ(stats_of(*b, "redis").errors, 2u);
  EXPECT_EQ(disk_of(db, key3), "artifact of kernel A3");
  EXPECT_EQ(*redis_of_a->get(key3), "artifact of kernel A3");  // b's compile replaced it
}

}  // namespace
}  // namespace uop
