// A compile in flight when its callers give up (server/cache/compile_cache.h start /
// finish): abandoned once nobody waits, kept going while one caller still does, started
// again for a caller that joined just as it was abandoned. The compute runs where the
// test says (a deferred runner), so the order of events is the test's, not the clock's.
#include <atomic>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/cache/compile_cache.h"
#include "server/cache/memory_tier.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using testing::key_of;

std::vector<std::unique_ptr<CacheTier>> memory() {
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(1 << 20));
  return tiers;
}

// Holds the works handed to it until the test runs them.
struct Deferred {
  std::vector<std::function<void()>> works;
  CompileCache::Runner runner() {
    return [this](std::function<void()> w) { works.push_back(std::move(w)); };
  }
};

const auto kGone = [] { return true; };
const CompileCache::Runner kInline = [](std::function<void()> w) { w(); };

TEST(CompileFlight, ACompileNobodyWaitsForIsAbandonedAtItsNextCheck) {
  CompileCache cache(memory());
  Deferred d;
  std::atomic<bool> started{false};
  std::string key = key_of("bomb");
  auto lookup = cache.start(
      key,
      [&](const std::function<bool()>& wanted) -> absl::StatusOr<std::string> {
        started = true;
        while (wanted()) std::this_thread::yield();  // stage after stage, asking each time
        return absl::CancelledError("abandoned");
      },
      d.runner(), absl::InfiniteFuture());
  ASSERT_EQ(d.works.size(), 1u);
  std::thread pool(d.works[0]);
  auto r = cache.finish(lookup, [&] { return started.load(); });  // gives up once it runs
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  pool.join();  // the compute saw that nobody wanted it, and stopped
  EXPECT_EQ(cache.abandoned(), 1u);
  EXPECT_EQ(cache.compute_errors(), 0u);
  auto again = cache.get_or_compute(key, [] { return absl::StatusOr<std::string>("artifact"); });
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, CacheOutcome::Miss) << "nothing was stored for the abandoned compile";
}

TEST(CompileFlight, ACompileOneCallerStillWantsKeepsGoingForIt) {
  CompileCache cache(memory());
  Deferred d;
  std::string key = key_of("shared");
  int computes = 0;
  CompileCache::Compute compute = [&](const std::function<bool()>& wanted) -> absl::StatusOr<std::string> {
    ++computes;
    if (!wanted()) return absl::CancelledError("abandoned");
    return std::string("artifact");
  };
  auto a = cache.start(key, compute, d.runner(), absl::InfiniteFuture());
  auto b = cache.start(key, compute, d.runner(), absl::InfiniteFuture());
  ASSERT_EQ(d.works.size(), 1u) << "the second caller joined the first's compile";
  EXPECT_EQ(cache.finish(a, kGone).status().code(), absl::StatusCode::kCancelled);  // a gives up
  d.works[0]();
  auto rb = cache.finish(b, nullptr);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->value, "artifact");
  EXPECT_EQ(rb->outcome, CacheOutcome::Coalesced);
  EXPECT_EQ(computes, 1);
  EXPECT_EQ(cache.abandoned(), 0u);
}

TEST(CompileFlight, ACompileWhoseCallersAllPassedTheirDeadlineDoesNotStart) {
  CompileCache cache(memory());
  Deferred d;
  bool computed = false;
  auto lookup = cache.start(
      key_of("late"),
      [&](const std::function<bool()>&) -> absl::StatusOr<std::string> {
        computed = true;
        return std::string("artifact");
      },
      d.runner(), absl::InfinitePast());
  EXPECT_EQ(cache.finish(lookup, nullptr).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_EQ(d.works.size(), 1u);
  d.works[0]();  // its turn on the pool comes
  EXPECT_FALSE(computed);
  EXPECT_EQ(cache.abandoned(), 1u);
  EXPECT_EQ(cache.computes(), 0u);
}

TEST(CompileFlight, ACallerThatJoinsAsACompileIsAbandonedGetsItStartedAgain) {
  CompileCache cache(memory());
  Deferred d;
  std::string key = key_of("rejoined");
  std::atomic<bool> started{false};
  std::optional<CompileCache::Lookup> b;
  auto a = cache.start(
      key,
      [&](const std::function<bool()>& wanted) -> absl::StatusOr<std::string> {
        started = true;
        while (wanted()) std::this_thread::yield();
        // Nobody wants it any more; just then b comes, and joins this compile.
        b.emplace(cache.start(
            key, [](const std::function<bool()>&) -> absl::StatusOr<std::string> { return std::string("fresh"); },
            kInline, absl::InfiniteFuture()));
        return absl::CancelledError("abandoned");
      },
      d.runner(), absl::InfiniteFuture());
  std::thread pool(d.works[0]);
  EXPECT_EQ(cache.finish(a, [&] { return started.load(); }).status().code(), absl::StatusCode::kCancelled);
  pool.join();
  ASSERT_TRUE(b.has_value());
  auto rb = cache.finish(*b, nullptr);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->value, "fresh");
  EXPECT_EQ(rb->outcome, CacheOutcome::Miss) << "b led the compile started again for it";
  EXPECT_EQ(cache.abandoned(), 1u);
}

}  // namespace
}  // namespace uop
