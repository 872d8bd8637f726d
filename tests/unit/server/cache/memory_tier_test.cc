#include "server/cache/memory_tier.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using testing::key_of;

std::optional<std::string> get_ok(CacheTier& t, const std::string& key) {
  auto r = t.get(key);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::nullopt;
}

TEST(MemoryTier, RoundTripAndMiss) {
  MemoryTier t(1 << 20);
  EXPECT_EQ(t.name(), "memory");
  EXPECT_EQ(get_ok(t, key_of("a")), std::nullopt);
  ASSERT_TRUE(t.put(key_of("a"), "artifact a").ok());
  EXPECT_EQ(get_ok(t, key_of("a")), "artifact a");
  ASSERT_TRUE(t.put(key_of("e"), "").ok());  // an empty value is a value, not a miss
  EXPECT_EQ(get_ok(t, key_of("e")), "");
}

TEST(MemoryTier, EvictsLeastRecentlyUsedWithinBudget) {
  // Each entry costs 64 (key) + 36 (value) = 100 bytes; room for three.
  MemoryTier t(300);
  std::string v(36, 'x');
  for (auto k : {"a", "b", "c"}) ASSERT_TRUE(t.put(key_of(k), v).ok());
  EXPECT_EQ(t.bytes(), 300);
  EXPECT_TRUE(get_ok(t, key_of("a")));  // a is now the most recent; b the least
  ASSERT_TRUE(t.put(key_of("d"), v).ok());
  EXPECT_EQ(get_ok(t, key_of("b")), std::nullopt);
  EXPECT_TRUE(get_ok(t, key_of("a")));
  EXPECT_TRUE(get_ok(t, key_of("c")));
  EXPECT_TRUE(get_ok(t, key_of("d")));
  EXPECT_EQ(t.entries(), 3u);
  EXPECT_EQ(t.evictions(), 1u);
  EXPECT_LE(t.bytes(), 300);

  // The reads above left the order d, c, a (most recent first): an entry costing 200
  // pushes out as many as it needs, least recent first.
  ASSERT_TRUE(t.put(key_of("big"), std::string(136, 'y')).ok());  // costs 200
  EXPECT_EQ(get_ok(t, key_of("a")), std::nullopt);
  EXPECT_EQ(get_ok(t, key_of("c")), std::nullopt);
  EXPECT_TRUE(get_ok(t, key_of("d")));
  EXPECT_EQ(t.bytes(), 300);
}

TEST(MemoryTier, ReplacingAKeyRecountsItsBytes) {
  MemoryTier t(1000);
  ASSERT_TRUE(t.put(key_of("a"), std::string(100, 'x')).ok());
  ASSERT_TRUE(t.put(key_of("a"), std::string(10, 'y')).ok());
  EXPECT_EQ(t.entries(), 1u);
  EXPECT_EQ(t.bytes(), 64 + 10);
  EXPECT_EQ(get_ok(t, key_of("a")), std::string(10, 'y'));
}

TEST(MemoryTier, ValueLargerThanBudgetIsRefused) {
  MemoryTier t(100);
  ASSERT_TRUE(t.put(key_of("a"), "small").ok());
  absl::Status s = t.put(key_of("b"), std::string(200, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(get_ok(t, key_of("a")));  // nothing was evicted for it
}

TEST(MemoryTier, ConcurrentUseStaysWithinBudget) {
  MemoryTier t(64 * 1024);
  std::vector<std::thread> threads;
  for (int th = 0; th < 8; ++th)
    threads.emplace_back([&t, th] {
      for (int i = 0; i < 2000; ++i) {
        std::string key = key_of(std::to_string((i * 7 + th) % 300));
        if (i % 3 == 0) {
          ASSERT_TRUE(t.put(key, std::string(200 + i % 50, 'v')).ok());
        } else {
          auto r = t.get(key);
          ASSERT_TRUE(r.ok());
          if (r->has_value()) {
            EXPECT_EQ((*r)->find_first_not_of('v'), std::string::npos);
          }
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(t.bytes(), 64 * 1024);
  EXPECT_GT(t.entries(), 0u);
}

}  // namespace
}  // namespace uop
