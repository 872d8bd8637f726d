#include "server/cache/redis_tier.h"

#include <gtest/gtest.h>

#include <chrono>

#include "server/cache/compile_cache.h"
#include "server/cache/memory_tier.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using testing::key_of;
using testing::RedisServer;
using Clock = std::chrono::steady_clock;

int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
    ASSERT_TRUE(redis_.start()) << "redis-server did not start";
  }

  RedisTier::Options options(int timeout_ms = 200, int backoff_ms = 300) {
    RedisTier::Options o;
    o.timeout_ms = timeout_ms;
    o.backoff_ms = backoff_ms;
    return o;
  }
  std::unique_ptr<RedisTier> tier(RedisTier::Options o) {
    return std::make_unique<RedisTier>("127.0.0.1", redis_.port(), std::move(o));
  }
  std::unique_ptr<RedisTier> tier() { return tier(options()); }

  // Runs one command on a direct connection and returns the reply as text ("" for nil).
  std::string raw(std::vector<std::string> args) {
    redisContext* c = redis_.connect();
    EXPECT_TRUE(c != nullptr && c->err == 0);
    std::vector<const char*> argv;
    std::vector<size_t> len;
    for (auto& a : args) {
      argv.push_back(a.data());
      len.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), len.data()));
    std::string out;
    if (r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS))
      out.assign(r->str, r->len);
    if (r != nullptr && r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
    return out;
  }

  RedisServer redis_;
};

std::optional<std::string> get_ok(CacheTier& t, const std::string& key) {
  auto r = t.get(key);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::nullopt;
}

TEST_F(RedisTierTest, RoundTrip) {
  auto t = tier();
  EXPECT_EQ(t->name(), "redis");
  std::string k = key_of("kernel");
  EXPECT_EQ(get_ok(*t, k), std::nullopt);
  ASSERT_TRUE(t->put(k, "machine code").ok());
  EXPECT_EQ(get_ok(*t, k), "machine code");
  // Stored in the verified entry format, under the prefixed key.
  std::string stored = raw({"GET", t->redis_key(k)});
  EXPECT_TRUE(stored.starts_with("UOPDCACHE1"));
  EXPECT_EQ(stored.size(), cache_entry::kHeaderSize + 12);

  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131);
  ASSERT_TRUE(t->put(key_of("big"), big).ok());
  EXPECT_EQ(get_ok(*t, key_of("big")), big);
  EXPECT_EQ(t->put("../not-a-key", "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RedisTierTest, TwoServersSeeEachOthersEntries) {
  auto a = tier(), b = tier();
  ASSERT_TRUE(a->put(key_of("from a"), "A").ok());
  ASSERT_TRUE(b->put(key_of("from b"), "B").ok());
  EXPECT_EQ(get_ok(*b, key_of("from a")), "A");
  EXPECT_EQ(get_ok(*a, key_of("from b")), "B");
}

TEST_F(RedisTierTest, TtlIsApplied) {
  auto o = options();
  o.ttl_seconds = 3600;
  auto t = tier(o);
  ASSERT_TRUE(t->put(key_of("k"), "v").ok());
  int64_t ttl = std::stoll(raw({"TTL", t->redis_key(key_of("k"))}));
  EXPECT_GT(ttl, 3500);
  EXPECT_LE(ttl, 3600);
}

TEST_F(RedisTierTest, CorruptValuesAreDataLossAndDeleted) {
  auto t = tier();
  std::string k = key_of("kernel");
  std::string good = cache_entry::encode(k, std::string(1000, 'p'));
  std::string flipped = good;
  flipped[cache_entry::kHeaderSize + 10] ^= 0x04;
  std::vector<std::string> corrupt = {
      "garbage", "", flipped, good.substr(0, good.size() - 1),
      cache_entry::encode(key_of("another kernel"), std::string(1000, 'p'))};
  for (const std::string& bad : corrupt) {
    raw({"SET", t->redis_key(k), bad});
    auto r = t->get(k);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status();
    EXPECT_EQ(raw({"EXISTS", t->redis_key(k)}), "0");
    EXPECT_EQ(get_ok(*t, k), std::nullopt);
  }
  // The well-formed entry, set by hand, is served.
  raw({"SET", t->redis_key(k), good});
  EXPECT_EQ(get_ok(*t, k), std::string(1000, 'p'));
}

TEST_F(RedisTierTest, KilledRedisIsUnavailableQuicklyAndRecoversAfterRestart) {
  auto t = tier(options(/*timeout_ms=*/500, /*backoff_ms=*/300));
  std::string k = key_of("kernel");
  ASSERT_TRUE(t->put(k, "v").ok());
  int port = redis_.port();
  redis_.kill();

  auto start = Clock::now();
  auto r = t->get(k);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find(cat("127.0.0.1:", port)), std::string::npos) << r.status();
  EXPECT_LT(ms_since(start), 2000);

  // Within the backoff the tier does not even try: no timeout added per request.
  start = Clock::now();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(t->get(k).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(t->put(k, "v").code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_LT(ms_since(start), 250);

  ASSERT_TRUE(redis_.start(port)) << "redis-server did not restart on port " << port;
  std::this_thread::sleep_for(std::chrono::milliseconds(350));  // past the backoff
  EXPECT_EQ(get_ok(*t, k), std::nullopt);  // a fresh server: empty, but reachable
  ASSERT_TRUE(t->put(k, "again").ok());
  EXPECT_EQ(get_ok(*t, k), "again");
}

TEST_F(RedisTierTest, HungRedisTimesOut) {
  auto t = tier(options(/*timeout_ms=*/200, /*backoff_ms=*/100));
  std::string k = key_of("kernel");
  ASSERT_TRUE(t->put(k, "v").ok());
  redis_.pause();
  auto start = Clock::now();
  auto r = t->get(k);
  int64_t took = ms_since(start);
  redis_.resume();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("no reply within 200 ms"), std::string::npos) << r.status();
  EXPECT_GE(took, 150);
  EXPECT_LT(took, 2000);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(get_ok(*t, k), "v");  // reconnects once Redis answers again
}

TEST_F(RedisTierTest, CompileCacheWorksThroughADeadRedis) {
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(1 << 20));
  tiers.push_back(tier(options(/*timeout_ms=*/300, /*backoff_ms=*/1000)));
  std::vector<std::string> errors;
  CompileCache cache(std::move(tiers), [&](std::string_view tier, const absl::Status& s) {
    errors.push_back(cat(tier, ": ", s.ToString()));
  });
  redis_.kill();

  int compiles = 0;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("artifact");
  };
  auto start = Clock::now();
  auto r = cache.get_or_compute(key_of("kernel"), compile);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, "artifact");
  EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  EXPECT_EQ(compiles, 1);
  EXPECT_LT(ms_since(start), 2000);

  auto stats = cache.stats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[1].first, "redis");
  EXPECT_EQ(stats[1].second.errors, 1u);
  EXPECT_EQ(stats[1].second.hits, 0u);
  EXPECT_EQ(stats[1].second.put_errors, 1u);
  EXPECT_EQ(stats[0].second.puts, 1u);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_TRUE(errors[0].starts_with("redis: UNAVAILABLE")) << errors[0];

  // The memory tier still serves it.
  r = cache.get_or_compute(key_of("kernel"), compile);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, CacheOutcome::Hit);
  EXPECT_EQ(r->tier, "memory");
  EXPECT_EQ(compiles, 1);
}

}  // namespace
}  // namespace uop
