// The compile cache against whoever can write its directory or its Redis, end to end: real
// uopd processes and a real redis-server on loopback, results checked against the
// reference interpreter. An entry forged without the cluster key (the previous checksummed
// format around another kernel's machine code), one made with the key but naming another
// kernel, or a FIFO at an entry's path: each is a miss, counted as a cache error, removed
// and recompiled in the same request, and it never travels from Redis into a disk. Also
// the startup rules for the key file and the Redis settings (AUTH as an ACL user, TLS).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/embedded_server.h"
#include "proto/artifact.pb.h"
#include "server/cache/cache_entry.h"
#include "tests/e2e/forged_cache.h"
#include "tests/e2e/softmax_model.h"
#include "tests/unit/server/cache/test_util.h"

namespace uop {
namespace {

namespace fs = std::filesystem;
using client::CacheStatus;
using testing::artifact_at;
using testing::entry_path;
using testing::forged_entry;
using testing::overwrite;
using testing::RedisServer;
using testing::slurp;
using testing::ScratchDir;
using Model = testing::SoftmaxModel;

// One uopd with a client, for the length of a test.
class Scheduler {
 public:
  explicit Scheduler(std::vector<std::string> args) {
    auto p = client::EmbeddedServer::start(UOPD_BINARY, args);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return;
    proc_ = std::move(*p);
    client::ClientOptions o;
    o.address = proc_->address();
    // A request that blocks for good fails the test instead of hanging it.
    o.deadline = absl::Seconds(60);
    auto c = client::Client::connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) client_ = std::move(*c);
  }
  bool up() const { return client_ != nullptr; }
  client::Client& client() { return *client_; }
  client::EmbeddedServer& proc() { return *proc_; }

  // Runs `m` in a fresh session; OK only if the outputs are the interpreter's.
  absl::StatusOr<client::RunResult> run(Model& m) {
    auto session = client_->create_session();
    if (!session.ok()) return session.status();
    auto got = session->run(m.root, m.names, m.bindings);
    if (!got.ok()) return got.status();
    std::vector<HostTensor> want = m.expected();
    if (want.size() != got->outputs.size())
      return absl::InternalError("output count differs from the interpreter's");
    for (size_t i = 0; i < want.size(); ++i)
      if (CompareResult c = compare(want[i], got->outputs[i].tensor); !c.ok)
        return absl::InternalError(
            cat("output ", got->outputs[i].name, " differs from the interpreter's: ", c.message));
    return got;
  }
  std::vector<client::Kernel> compile(Model& m) {
    auto r = client_->compile(m.root, m.names);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->kernels : std::vector<client::Kernel>{};
  }
  client::Stats stats() {
    auto s = client_->stats();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : client::Stats{};
  }

 private:
  std::unique_ptr<client::EmbeddedServer> proc_;
  std::unique_ptr<client::Client> client_;
};

// The kernels of a model and of another one (different shapes, so other kernels),
// compiled once by a scheduler on `dir` that is then stopped.
struct Compiled {
  std::vector<client::Kernel> victims, donors;
};
Compiled compile_both(const std::vector<std::string>& args, Model& m, Model& other) {
  Scheduler s(args);
  Compiled c;
  if (!s.up()) return c;
  c.victims = s.compile(m);
  c.donors = s.compile(other);
  EXPECT_TRUE(s.proc().stop().ok()) << s.proc().log_tail();
  EXPECT_GE(c.victims.size(), 2u);
  EXPECT_FALSE(c.donors.empty());
  return c;
}

// Every kernel of `r` was compiled in this request (a miss), none served from a tier.
void expect_all_compiled(const client::RunResult& r) {
  for (const auto& k : r.kernels)
    EXPECT_EQ(k.status, CacheStatus::Miss) << k.name << " came from " << k.tier;
}

// A scheduler started with `args` over `poisoned` bad entries of `m`'s kernels: it runs `m`
// right, compiling every kernel again and counting each bad entry as a cache error.
std::unique_ptr<Scheduler> expect_recompiled(const std::vector<std::string>& args, Model& m,
                                             size_t poisoned) {
  auto s = std::make_unique<Scheduler>(args);
  if (!s->up()) return s;
  auto r = s->run(m);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) expect_all_compiled(*r);
  client::Stats st = s->stats();
  EXPECT_GE(st.cache_errors, poisoned);
  EXPECT_EQ(st.compiles, poisoned);
  return s;
}

// A cache directory holding the kernels of `m_` (the victims) and of `other_` (donors of
// machine code), written by a scheduler that has stopped.
class CacheTrustOnDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = compile_both(args(), m_, other_);
    ASSERT_GE(c_.victims.size(), 2u);
  }
  std::vector<std::string> args() const { return {"--cache-dir=" + dir_, "--workers=1"}; }
  std::string path(const client::Kernel& k) const { return entry_path(dir_, k.cache_key); }

  ScratchDir d_;
  const std::string dir_ = d_.path() + "/cache";
  Model m_{1}, other_{2, 32, 8, 4};
  Compiled c_;
};

TEST_F(CacheTrustOnDisk, ForgedEntriesAreMissesCountedRemovedAndRecompiled) {
  const uopd::v1::Artifact donor = artifact_at(path(c_.donors[0]));
  for (const auto& k : c_.victims) overwrite(path(k), forged_entry(k, artifact_at(path(k)), donor));
  expect_recompiled(args(), m_, c_.victims.size());
  // Each forged file was replaced by the recompiled, authenticated entry.
  for (const auto& k : c_.victims) {
    EXPECT_TRUE(slurp(path(k)).starts_with(cache_entry::kMagic)) << path(k);
    uopd::v1::Artifact a = artifact_at(path(k));
    EXPECT_EQ(a.kernel_digest(), k.digest);
    EXPECT_NE(a.object(), donor.object()) << k.name;
  }
}

TEST_F(CacheTrustOnDisk, AnAuthenticEntryNamingAnotherKernelIsRemovedCountedAndTheRunSucceeds) {
  // Made with the embedded default's own key, so it authenticates: what a bug in another
  // server or a key holder's mistake would leave. It names the donor kernel, not this one.
  auto key = ClusterKey::from_file(dir_ + "/" + std::string(ClusterKey::kFileName));
  ASSERT_TRUE(key.ok()) << key.status();
  const std::string donor = slurp(path(c_.donors[0])).substr(cache_entry::kHeaderSize);
  for (const auto& k : c_.victims)
    overwrite(path(k), cache_entry::encode(*key, k.cache_key, donor));
  auto s = expect_recompiled(args(), m_, c_.victims.size());
  ASSERT_TRUE(s->up());
  for (const auto& k : c_.victims) EXPECT_EQ(artifact_at(path(k)).kernel_digest(), k.digest);
  // Healed: the next run is served from memory.
  auto r = s->run(m_);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& k : r->kernels) EXPECT_EQ(k.status, CacheStatus::Hit) << k.name;
  EXPECT_EQ(s->stats().compiles, c_.victims.size());
}

TEST(CacheTrust, ForgedRedisEntriesAreRefusedAndNeverReachAnotherSchedulersDisk) {
  if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  ScratchDir d;
  const std::string key_file = testing::write_cache_key_file(d.path() + "/cache.key");
  auto args = [&](const std::string& dir) {
    return std::vector<std::string>{"--cache-dir=" + dir, "--workers=1",
                                    "--redis=127.0.0.1:" + std::to_string(redis.port()),
                                    "--cache-key-file=" + key_file};
  };
  const std::string da = d.path() + "/a", db = d.path() + "/b";
  Model m(3), other(4, 32, 8, 4);
  Compiled c = compile_both(args(da), m, other);
  ASSERT_GE(c.victims.size(), 2u);
  // Whoever can reach Redis (no AUTH needed) puts another kernel's code under each key.
  const uopd::v1::Artifact donor = artifact_at(entry_path(da, c.donors[0].cache_key));
  for (const auto& k : c.victims)
    ASSERT_EQ(redis.raw({"SET", "uopd:cache:v2:" + k.cache_key,
                         forged_entry(k, artifact_at(entry_path(da, k.cache_key)), donor)}),
              "OK");

  expect_recompiled(args(db), m, c.victims.size());
  for (const auto& k : c.victims) {
    // b's disk holds b's own compile, not the forged bytes; so does Redis now.
    uopd::v1::Artifact a = artifact_at(entry_path(db, k.cache_key));
    EXPECT_EQ(a.kernel_digest(), k.digest);
    EXPECT_NE(a.object(), donor.object()) << k.name;
    EXPECT_TRUE(redis.raw({"GET", "uopd:cache:v2:" + k.cache_key}).starts_with(cache_entry::kMagic))
        << k.name;
  }
  // A third scheduler finds b's authenticated entries in Redis and is served from them.
  ScratchDir dc;
  Scheduler third(args(dc.path()));
  ASSERT_TRUE(third.up());
  auto r = third.run(m);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& k : r->kernels) EXPECT_EQ(k.tier, "redis") << k.name;
  EXPECT_EQ(third.stats().compiles, 0u);
}

TEST(CacheTrust, AFifoAtAnEntryPathBlocksNothingAndSigtermStillStopsUopd) {
  ScratchDir d;
  const std::string dir = d.path() + "/cache";
  Model m(7), other(8, 32, 8, 4);
  std::vector<client::Kernel> victims;
  {
    Scheduler s({"--cache-dir=" + dir, "--workers=1"});
    ASSERT_TRUE(s.up());
    victims = s.compile(m);
    ASSERT_TRUE(s.proc().stop().ok());
  }
  ASSERT_GE(victims.size(), 2u);
  for (const auto& k : victims) {
    std::string path = entry_path(dir, k.cache_key);
    ASSERT_EQ(::unlink(path.c_str()), 0);
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path;
  }
  Scheduler s({"--cache-dir=" + dir, "--workers=1", "--compile-threads=2"});
  ASSERT_TRUE(s.up());
  // Several requests for the poisoned keys at once, and one for unrelated kernels: a FIFO
  // used to hold a compile thread for good, the requests for its key piling up behind it.
  std::vector<std::future<absl::StatusOr<client::RunResult>>> runs;
  for (int i = 0; i < 4; ++i)
    runs.push_back(std::async(std::launch::async, [&] { return s.run(m); }));
  runs.push_back(std::async(std::launch::async, [&] { return s.run(other); }));
  for (auto& f : runs) {
    auto r = f.get();
    EXPECT_TRUE(r.ok()) << r.status();
  }
  EXPECT_GE(s.stats().cache_errors, victims.size());
  for (const auto& k : victims) {
    std::string path = entry_path(dir, k.cache_key);
    bool regular = fs::is_regular_file(fs::symlink_status(path));
    EXPECT_TRUE(regular) << path << " is still not a regular file";
    if (regular)
      EXPECT_EQ(artifact_at(path).kernel_digest(), k.digest);  // (reading a FIFO would block)
  }
  absl::Status stopped = s.proc().stop();  // SIGTERM; OK only if uopd exited on it
  EXPECT_TRUE(stopped.ok()) << stopped << "\n" << s.proc().log_tail();
}

// Startup fails with a message naming the problem; the log tail carries it.
std::string refused_start(const std::vector<std::string>& args) {
  auto p = client::EmbeddedServer::start(UOPD_BINARY, args);
  EXPECT_FALSE(p.ok()) << "uopd started with " << absl::StrJoin(args, " ");
  return p.ok() ? std::string() : std::string(p.status().message());
}

TEST(CacheTrust, KeyFilesMustBePrivateAndRedisNeedsOne) {
  ScratchDir d;
  const std::string dir = d.path() + "/cache";
  const std::string key_file = testing::write_cache_key_file(d.path() + "/cache.key");
  EXPECT_NE(refused_start({"--cache-dir=" + dir, "--workers=0", "--redis=127.0.0.1:1"})
                .find("--redis needs --cache-key-file"),
            std::string::npos);
  ::chmod(key_file.c_str(), 0640);
  std::string msg =
      refused_start({"--cache-dir=" + dir, "--workers=0", "--cache-key-file=" + key_file});
  EXPECT_NE(msg.find("chmod 600"), std::string::npos) << msg;
  overwrite(key_file, "short");
  ::chmod(key_file.c_str(), 0600);
  msg = refused_start({"--cache-dir=" + dir, "--workers=0", "--cache-key-file=" + key_file});
  EXPECT_NE(msg.find("at least 32"), std::string::npos) << msg;

  // The embedded default makes its key in the cache directory, private, and keeps it: a
  // restart authenticates the entries it wrote before.
  Model m(9);
  {
    Scheduler s({"--cache-dir=" + dir, "--workers=1"});
    ASSERT_TRUE(s.up());
    EXPECT_FALSE(s.compile(m).empty());
    ASSERT_TRUE(s.proc().stop().ok());
  }
  const std::string embedded = dir + "/" + std::string(ClusterKey::kFileName);
  struct stat st;
  ASSERT_EQ(::stat(embedded.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  const std::string bytes = slurp(embedded);
  {
    Scheduler s({"--cache-dir=" + dir, "--workers=1"});
    ASSERT_TRUE(s.up());
    for (const auto& k : s.compile(m)) EXPECT_EQ(k.tier, "disk") << k.name;
    EXPECT_EQ(s.stats().cache_errors, 0u);
    ASSERT_TRUE(s.proc().stop().ok());
  }
  EXPECT_EQ(slurp(embedded), bytes);
  // One that others can read is not used: uopd refuses to start rather than trust it.
  ::chmod(embedded.c_str(), 0644);
  msg = refused_start({"--cache-dir=" + dir, "--workers=0"});
  EXPECT_NE(msg.find(embedded), std::string::npos) << msg;
}

TEST(CacheTrust, SchedulersShareARedisOverTlsAsAnAclUser) {
  if (!RedisServer::installed()) GTEST_SKIP() << testing::kRedisServer << " is not installed";
  testing::TestCerts certs;
  ASSERT_TRUE(certs.ok()) << "the openssl command could not make the test certificates";
  RedisServer::Config rc;
  rc.tls = true;
  rc.args = {"--tls-cert-file",
             certs.pem("leaf"),
             "--tls-key-file",
             certs.key("leaf"),
             "--tls-ca-cert-file",
             certs.pem("ca"),
             "--tls-auth-clients",
             "no",
             "--user",
             "default",
             "off",
             "--user",
             "uopd",
             "on",
             ">uopd-pw",
             "~uopd:cache:*",
             "+get",
             "+set",
             "+del",
             "--user",
             "admin",
             "on",
             ">admin-pw",
             "~*",
             "+@all"};
  rc.admin = RedisEndpoint{.user = "admin",
                           .password = "admin-pw",
                           .tls = {.enabled = true, .ca_file = certs.pem("ca")}};
  RedisServer redis(rc);
  ASSERT_TRUE(redis.start()) << "redis-server with TLS did not start";
  ScratchDir d;
  const std::string key_file = testing::write_cache_key_file(d.path() + "/cache.key");
  const std::string password = d.path() + "/redis.pw", wrong = d.path() + "/wrong.pw";
  overwrite(password, "uopd-pw\n");  // a trailing newline, as `echo` leaves it, is not part of it
  overwrite(wrong, "not-the-password\n");
  ::chmod(password.c_str(), 0600);
  ::chmod(wrong.c_str(), 0600);
  auto args = [&](const std::string& dir, const std::string& pw, bool tls) {
    std::vector<std::string> a = {"--cache-dir=" + d.path() + "/" + dir,
                                  "--workers=1",
                                  "--redis=127.0.0.1:" + std::to_string(redis.port()),
                                  "--cache-key-file=" + key_file,
                                  "--redis-user=uopd",
                                  "--redis-password-file=" + pw};
    if (tls) a.insert(a.end(), {"--redis-tls", "--redis-tls-ca=" + certs.pem("ca")});
    return a;
  };
  Model m(11);
  {
    Scheduler a(args("a", password, true));
    ASSERT_TRUE(a.up());
    EXPECT_FALSE(a.compile(m).empty());
    EXPECT_EQ(a.stats().cache_errors, 0u);
  }
  Scheduler b(args("b", password, true));
  ASSERT_TRUE(b.up());
  auto r = b.run(m);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& k : r->kernels) EXPECT_EQ(k.tier, "redis") << k.name;
  EXPECT_EQ(b.stats().compiles, 0u);
  // A wrong password, or no TLS: Redis is an error on every lookup, and compiles go on.
  for (auto [dir, pw, tls] : {std::tuple{"c", wrong, true}, std::tuple{"e", password, false}}) {
    Scheduler c(args(dir, pw, tls));
    ASSERT_TRUE(c.up());
    r = c.run(m);
    ASSERT_TRUE(r.ok()) << r.status();
    expect_all_compiled(*r);
    EXPECT_GT(c.stats().cache_errors, 0u) << dir;
  }
  // The password file is a secret too.
  ::chmod(password.c_str(), 0644);
  std::string msg = refused_start(args("f", password, true));
  EXPECT_NE(msg.find("chmod 600"), std::string::npos) << msg;
}

}  // namespace
}  // namespace uop
