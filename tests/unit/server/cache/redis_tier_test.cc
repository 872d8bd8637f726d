#include "server/cache/redis_tier.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "server/cache/compile_cache.h"
#include "server/cache/memory_tier.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

using testing::key_of;
using testing::RedisServer;
std::unique_ptr<RedisTier> make_tier(RedisEndpoint endpoint, RedisTier::Options o,
                                     ClusterKey key = testing::cluster_key()) {
  auto t = RedisTier::create(std::move(endpoint), std::move(key), std::move(o));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

RedisTier::Options options(int timeout_ms = 200, int backoff_ms = 300) {
  RedisTier::Options o;
  o.timeout_ms = timeout_ms;
  o.backoff_ms = backoff_ms;
  return o;
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
    ASSERT_TRUE(redis_.start()) << "redis-server did not start";
  }

  std::unique_ptr<RedisTier> tier(RedisTier::Options o, ClusterKey key = testing::cluster_key()) {
    return make_tier(redis_.endpoint(), std::move(o), std::move(key));
  }
  std::unique_ptr<RedisTier> tier() { return tier(options()); }
  std::string raw(std::vector<std::string> args) { return redis_.raw(std::move(args)); }

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
  EXPECT_TRUE(stored.starts_with("UOPDCACHE2"));
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

// The schedule search's lease (server/tuner.h): taken once, then extended and removed by
// its holder's token only; another token, or a lease that is gone, is left as it is.
TEST_F(RedisTierTest, ALeaseIsExtendedAndRemovedByItsHolderOnly) {
  auto t = tier();
  const std::string lease = "uopd:tune-lease:v1:test";
  ASSERT_EQ(t->set_if_absent(lease, "mine", 1000).value_or(false), true);
  EXPECT_EQ(t->set_if_absent(lease, "theirs", 1000).value_or(true), false);

  auto extended = t->extend_if_holds(lease, "mine", 600000);
  ASSERT_TRUE(extended.ok()) << extended.status();
  EXPECT_TRUE(*extended);
  EXPECT_GT(std::stoll(raw({"PTTL", lease})), 1000) << "the holder's lease lives ttl_ms from the extension";

  auto other = t->extend_if_holds(lease, "theirs", 1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(*other);
  EXPECT_GT(std::stoll(raw({"PTTL", lease})), 1000) << "another token does not shorten it";
  auto not_theirs = t->remove_if_holds(lease, "theirs");
  ASSERT_TRUE(not_theirs.ok()) << not_theirs.status();
  EXPECT_FALSE(*not_theirs);
  EXPECT_EQ(raw({"GET", lease}), "mine") << "another token does not remove it";

  auto removed = t->remove_if_holds(lease, "mine");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(*removed);
  EXPECT_EQ(raw({"EXISTS", lease}), "0");
  // Gone: nothing to extend (PEXPIRE makes no key) nor remove.
  EXPECT_EQ(t->extend_if_holds(lease, "mine", 600000).value_or(true), false);
  EXPECT_EQ(t->remove_if_holds(lease, "mine").value_or(true), false);
  EXPECT_EQ(raw({"EXISTS", lease}), "0");

  // Taken by another server after it expired: the old holder touches nothing.
  ASSERT_EQ(raw({"SET", lease, "theirs", "PX", "600000"}), "OK");
  EXPECT_EQ(t->extend_if_holds(lease, "mine", 1).value_or(true), false);
  EXPECT_EQ(t->remove_if_holds(lease, "mine").value_or(true), false);
  EXPECT_EQ(raw({"GET", lease}), "theirs");
  EXPECT_GT(std::stoll(raw({"PTTL", lease})), 1000);

  // Redis gone: UNAVAILABLE, not "not held".
  redis_.kill();
  EXPECT_EQ(t->extend_if_holds(lease, "theirs", 1000).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(t->remove_if_holds(lease, "theirs").status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RedisTierTest, CorruptValuesAreDataLossAndDeleted) {
  auto t = tier();
  std::string k = key_of("kernel");
  std::string good = cache_entry::encode(testing::cluster_key(), k, std::string(1000, 'p'));
  std::string flipped = good;
  flipped[cache_entry::kHeaderSize + 10] ^= 0x04;
  std::vector<std::string> corrupt = {
      "garbage", "", flipped, good.substr(0, good.size() - 1),
      cache_entry::encode(testing::cluster_key(), key_of("another kernel"), std::string(1000, 'p')),
      // What anyone who can write Redis can make without the key: the previous format, or
      // the current one under a key of their own.
      testing::checksummed_entry(k, "another kernel's machine code"),
      cache_entry::encode(testing::cluster_key("theirs"), k, std::string(1000, 'p'))};
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

// The backoff is timed on the tier's clock, here a manual one: within it the tier does not
// even try (no timeout added per request while Redis is down), so it stays UNAVAILABLE
// after Redis is back until the clock passes the backoff, and reconnects then.
TEST_F(RedisTierTest, KilledRedisIsUnavailableAndRecoversAfterTheBackoff) {
  ManualClock clock;
  auto o = options(/*timeout_ms=*/500, /*backoff_ms=*/300);
  o.clock = &clock;
  auto t = tier(o);
  std::string k = key_of("kernel");
  ASSERT_TRUE(t->put(k, "v").ok());
  int port = redis_.port();
  redis_.kill();

  auto r = t->get(k);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find(cat("127.0.0.1:", port)), std::string::npos) << r.status();
  EXPECT_EQ(r.status().message().find("not retrying yet"), std::string::npos) << "the first failure tried: " << r.status();

  for (int i = 0; i < 100; ++i) {
    r = t->get(k);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find("not retrying yet"), std::string::npos) << r.status();
    EXPECT_EQ(t->put(k, "v").code(), absl::StatusCode::kUnavailable);
  }

  ASSERT_TRUE(redis_.start(port)) << "redis-server did not restart on port " << port;
  clock.advance(absl::Milliseconds(299));
  r = t->get(k);
  EXPECT_NE(r.status().message().find("not retrying yet"), std::string::npos)
      << "retried within the backoff: " << r.status();
  clock.advance(absl::Milliseconds(1));  // the backoff is over
  EXPECT_EQ(get_ok(*t, k), std::nullopt);  // a fresh server: empty, but reachable
  ASSERT_TRUE(t->put(k, "again").ok());
  EXPECT_EQ(get_ok(*t, k), "again");
}

// A Redis that accepts and never answers: the command's own deadline (real time: it is
// the socket's) ends the call, the tier backs off on its clock, and reconnects once that
// has passed and Redis answers again.
TEST_F(RedisTierTest, HungRedisTimesOut) {
  ManualClock clock;
  auto o = options(/*timeout_ms=*/200, /*backoff_ms=*/100);
  o.clock = &clock;
  auto t = tier(o);
  std::string k = key_of("kernel");
  ASSERT_TRUE(t->put(k, "v").ok());
  redis_.pause();
  auto r = t->get(k);
  redis_.resume();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("no reply within 200 ms"), std::string::npos) << r.status();
  r = t->get(k);
  EXPECT_NE(r.status().message().find("not retrying yet after: GET: no reply within 200 ms"), std::string::npos)
      << r.status();
  clock.advance(absl::Milliseconds(100));
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
  auto r = cache.get_or_compute(key_of("kernel"), compile);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value, "artifact");
  EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  EXPECT_EQ(compiles, 1);

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

TEST_F(RedisTierTest, ForgedEntryIsAMissCountedAndReplacedByTheCompile) {
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(1 << 20));
  tiers.push_back(tier());
  auto* redis = static_cast<RedisTier*>(tiers[1].get());
  CompileCache cache(std::move(tiers));
  std::string k = key_of("kernel");
  ASSERT_EQ(raw({"SET", redis->redis_key(k), testing::checksummed_entry(k, "another kernel's machine code")}), "OK");
  auto r = cache.get_or_compute(k, [] { return absl::StatusOr<std::string>("this kernel's machine code"); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, CacheOutcome::Miss);
  EXPECT_EQ(r->value, "this kernel's machine code");
  EXPECT_EQ(cache.stats()[1].second.errors, 1u);
  EXPECT_EQ(cache.stats()[1].second.hits, 0u);
  // What Redis holds now is the compile's authenticated entry.
  EXPECT_TRUE(raw({"GET", redis->redis_key(k)}).starts_with("UOPDCACHE2"));
  EXPECT_EQ(get_ok(*tier(), k), "this kernel's machine code");
}

// A hostile or broken server on the Redis port: the tier is bounded by the cap on a reply
// and by the deadline on a whole command, however the bytes arrive.
class HostileRedis {
 public:
  // `reply` is what it answers to anything; with `trickle` it sends it one byte at a time,
  // 20 ms apart, for as long as the client listens.
  HostileRedis(std::string reply, bool trickle) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 4) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return;
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, reply = std::move(reply), trickle] {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      (void)!::recv(c, buf, sizeof buf, 0);  // the command, whatever it is
      if (!trickle) {
        (void)!::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      } else {
        // The client gives up long before the end; stop when it has hung up.
        for (size_t i = 0; i < reply.size() && !done_; ++i) {
          if (::send(c, &reply[i], 1, MSG_NOSIGNAL) != 1) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
      while (!done_ && ::recv(c, buf, sizeof buf, 0) > 0) {
      }
      ::close(c);
    });
  }
  ~HostileRedis() {
    done_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(RedisTierBounds, AReplyOverTheCapIsRefusedUnread) {
  HostileRedis hostile("$99999999999\r\n", /*trickle=*/false);
  ASSERT_GT(hostile.port(), 0);
  auto t = make_tier(RedisEndpoint{.host = "127.0.0.1", .port = hostile.port()}, options(2000));
  auto r = t->get(key_of("kernel"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("over the"), std::string::npos) << r.status();
}

TEST(RedisTierBounds, ATricklingReplyIsCutOffAtTheCommandDeadline) {
  // 40 bytes at 20 ms each would take 800 ms; each byte comes well within any per-read
  // timeout, but the command as a whole has 200 ms.
  HostileRedis hostile(cat("$30\r\n", std::string(30, 'x'), "\r\n"), /*trickle=*/true);
  ASSERT_GT(hostile.port(), 0);
  auto t = make_tier(RedisEndpoint{.host = "127.0.0.1", .port = hostile.port()}, options(200));
  auto r = t->get(key_of("kernel"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("no reply within 200 ms"), std::string::npos) << r.status();
}

// A Redis that wants a password (requirepass) or ACL users (and no anonymous default user).
TEST(RedisAuth, RequirepassTakesTheRightPasswordOnly) {
  if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
  RedisServer::Config c;
  c.args = {"--requirepass", "s3cret pass"};
  c.admin.password = "s3cret pass";
  RedisServer redis(c);
  ASSERT_TRUE(redis.start());
  RedisEndpoint ep{.host = "127.0.0.1", .port = redis.port(), .password = "s3cret pass"};
  auto good = make_tier(ep, options());
  std::string k = key_of("kernel");
  ASSERT_TRUE(good->put(k, "v").ok());
  EXPECT_EQ(get_ok(*good, k), "v");

  ep.password = "wrong";
  auto r = make_tier(ep, options())->get(k);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("AUTH refused"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("WRONGPASS"), std::string::npos) << r.status();
  EXPECT_EQ(r.status().message().find("wrong"), std::string::npos) << "the password is not repeated: " << r.status();

  ep.password.clear();
  r = make_tier(ep, options())->get(k);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("NOAUTH"), std::string::npos) << r.status();

  // Compiles go on through a Redis that refuses the tier: a miss and an error each time.
  std::vector<std::unique_ptr<CacheTier>> tiers;
  tiers.push_back(std::make_unique<MemoryTier>(1 << 20));
  tiers.push_back(make_tier(RedisEndpoint{.host = "127.0.0.1", .port = redis.port(), .password = "wrong"}, options()));
  CompileCache cache(std::move(tiers));
  auto got = cache.get_or_compute(key_of("other"), [] { return absl::StatusOr<std::string>("artifact"); });
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value, "artifact");
  EXPECT_EQ(cache.stats()[1].second.errors, 1u);
  EXPECT_EQ(cache.stats()[1].second.put_errors, 1u);
}

// The cache's keys and the search's leases (server/cache/README.md: the ACL uopd needs; the
// lease scripts' PEXPIRE is checked against it too).
TEST(RedisAuth, AnAclUserConfinedToTheCacheKeys) {
  if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
  RedisServer::Config c;
  c.args = {"--user", "default", "off",
            "--user", "uopd", "on", ">uopd-pw", "~uopd:cache:*", "~uopd:tune-lease:*", "+get", "+set", "+del",
            "+ping", "+eval", "+pexpire",
            "--user", "admin", "on", ">admin-pw", "~*", "&*", "+@all"};
  c.admin.user = "admin";
  c.admin.password = "admin-pw";
  RedisServer redis(c);
  ASSERT_TRUE(redis.start());
  RedisEndpoint ep{.host = "127.0.0.1", .port = redis.port(), .user = "uopd", .password = "uopd-pw"};
  auto t = make_tier(ep, options());
  std::string k = key_of("kernel");
  ASSERT_TRUE(t->put(k, "v").ok());
  EXPECT_EQ(get_ok(*t, k), "v");
  EXPECT_TRUE(redis.raw({"GET", t->redis_key(k)}).starts_with("UOPDCACHE2"));
  const std::string lease = "uopd:tune-lease:v1:" + k;
  EXPECT_EQ(t->set_if_absent(lease, "token", 1000).value_or(false), true);
  auto extended = t->extend_if_holds(lease, "token", 1000);
  EXPECT_TRUE(extended.ok() && *extended) << extended.status();
  auto removed = t->remove_if_holds(lease, "token");
  EXPECT_TRUE(removed.ok() && *removed) << removed.status();

  ep.password = "admin-pw";  // another user's password
  auto r = make_tier(ep, options())->get(k);
  EXPECT_NE(r.status().message().find("AUTH as uopd refused: WRONGPASS"), std::string::npos) << r.status();
  r = make_tier(RedisEndpoint{.host = "127.0.0.1", .port = redis.port()}, options())->get(k);
  EXPECT_NE(r.status().message().find("NOAUTH"), std::string::npos) << r.status();
  // The user reaches nothing but the cache's keys.
  auto o = options();
  o.key_prefix = "elsewhere:";
  r = make_tier(RedisEndpoint{.host = "127.0.0.1", .port = redis.port(), .user = "uopd", .password = "uopd-pw"}, o)->get(k);
  EXPECT_NE(r.status().message().find("NOPERM"), std::string::npos) << r.status();
}

// TLS: certificates made for the test; redis-server on a TLS port only.
class RedisTlsTest : public ::testing::Test {
 protected:
  void start(bool client_certificates) {
    if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
    ASSERT_TRUE(certs_.ok()) << "the openssl command could not make the test certificates";
    RedisServer::Config c;
    c.tls = true;
    c.args = {"--tls-cert-file", certs_.pem("leaf"), "--tls-key-file", certs_.key("leaf"),
              "--tls-ca-cert-file", certs_.pem("ca"), "--tls-auth-clients", client_certificates ? "yes" : "no"};
    c.admin.tls = tls("127.0.0.1", client_certificates);
    redis_ = std::make_unique<RedisServer>(c);
    ASSERT_TRUE(redis_->start()) << "redis-server with TLS did not start";
  }
  RedisEndpoint::Tls tls(std::string server_name, bool client_cert, std::string ca = "ca") {
    RedisEndpoint::Tls t;
    t.enabled = true;
    t.ca_file = certs_.pem(ca);
    t.server_name = std::move(server_name);
    if (client_cert) {
      t.cert_file = certs_.pem("leaf");
      t.key_file = certs_.key("leaf");
    }
    return t;
  }
  RedisEndpoint endpoint(RedisEndpoint::Tls t) {
    return RedisEndpoint{.host = "127.0.0.1", .port = redis_->port(), .tls = std::move(t)};
  }
  absl::Status get_status(RedisEndpoint ep) {
    auto t = make_tier(std::move(ep), options(1000));
    return t ? t->get(key_of("kernel")).status() : absl::InternalError("no tier");
  }

  testing::TestCerts certs_;
  std::unique_ptr<RedisServer> redis_;
};

TEST_F(RedisTlsTest, ServesOverTlsAndChecksTheCertificateAndItsName) {
  start(/*client_certificates=*/false);
  for (std::string name : {"127.0.0.1", "localhost"}) {
    auto t = make_tier(endpoint(tls(name, false)), options(1000));
    std::string k = key_of(name);
    ASSERT_TRUE(t->put(k, "over tls").ok()) << name;
    EXPECT_EQ(get_ok(*t, k), "over tls") << name;
  }
  std::string big(4 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  auto t = make_tier(endpoint(tls("", false)), options(2000));  // the name: the host, 127.0.0.1
  ASSERT_TRUE(t->put(key_of("big"), big).ok());
  EXPECT_EQ(get_ok(*t, key_of("big")), big);

  absl::Status s = get_status(endpoint(tls("redis.example.com", false)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("certificate is refused"), std::string::npos) << s;
  s = get_status(endpoint(tls("127.0.0.1", false, "rogue-ca")));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("certificate is refused"), std::string::npos) << s;
  s = get_status(RedisEndpoint{.host = "127.0.0.1", .port = redis_->port()});  // no TLS at all
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_F(RedisTlsTest, AServerThatWantsClientCertificatesGetsThem) {
  start(/*client_certificates=*/true);
  auto t = make_tier(endpoint(tls("127.0.0.1", true)), options(1000));
  ASSERT_TRUE(t->put(key_of("k"), "v").ok());
  EXPECT_EQ(get_ok(*t, key_of("k")), "v");
  absl::Status s = get_status(endpoint(tls("127.0.0.1", false)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(RedisTierConfig, SettingsThatCannotWorkAreRefusedAtCreation) {
  auto bad = [](RedisEndpoint ep) { return RedisTier::create(std::move(ep), testing::cluster_key(), options()).status(); };
  EXPECT_EQ(bad({.host = "127.0.0.1", .port = 6379, .user = "uopd"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad({.host = "", .port = 6379}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad({.host = "127.0.0.1", .port = 6379, .tls = {.ca_file = "/x"}}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = bad({.host = "127.0.0.1", .port = 6379, .tls = {.enabled = true, .ca_file = "/nonexistent/ca.pem"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("/nonexistent/ca.pem"), std::string::npos) << s;
}

}  // namespace
}  // namespace uop
