// RendezvousStore without a socket (groups, waiting gets, timeouts naming the missing
// keys, expiry, budgets, limits) and the gRPC adapter behind the cluster secret over an
// in-process server on an ephemeral port: refused without it, refused outside an open
// group with it, and a flood into a group stopped at its budget while another group
// works.
#include "server/rendezvous_service.h"

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"
#include "compiler/support/strings.h"
#include "transport/cluster_auth.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;

RendezvousGroup group(const std::string& name, int members = 2) {
  return RendezvousGroup::for_members(name, members, absl::Minutes(1));
}

// Polls until `n` Gets wait in the store (true), or gives up after a bound far past any
// honest delay (false, so a hang fails the test instead of the ctest timeout).
bool until_waiting(const RendezvousStore& s, size_t n) {
  for (int i = 0; i < 30000; ++i) {
    if (s.waiting() >= n) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

TEST(RendezvousStoreTest, GetReturnsValuesInOrder) {
  RendezvousStore s;
  ASSERT_TRUE(s.open_group(group("g")).ok());
  ASSERT_TRUE(s.set("g/a", "1").ok());
  ASSERT_TRUE(s.set("g/b", "22").ok());
  auto v = s.get({"g/b", "g/a"}, absl::ZeroDuration());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<std::string>{"22", "1"}));
  // Written once: a member cannot overwrite what another published.
  EXPECT_EQ(s.set("g/a", "333").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*s.get({"g/a"}, absl::ZeroDuration()))[0], "1");
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.bytes(), 3u + 1 + 3 + 2);
}

TEST(RendezvousStoreTest, GetWaitsForTheLastKey) {
  RendezvousStore s;
  ASSERT_TRUE(s.open_group(group("k")).ok());
  ASSERT_TRUE(s.set("k/1", "x").ok());
  std::thread later([&] {
    ASSERT_TRUE(until_waiting(s, 1)) << "the Get never waited";
    ASSERT_TRUE(s.set("k/2", "y").ok());
  });
  auto v = s.get({"k/1", "k/2"}, absl::Seconds(10));  // it waits: k/2 comes only then
  later.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[1], "y");
}

// The wait is timed on the store's clock: a Get of 150 ms still waits at 149 ms and ends
// DEADLINE_EXCEEDED at 150. The clock moves in the Get's own cancellation check, which it
// runs each time it finds a key missing, before it looks at the time again.
TEST(RendezvousStoreTest, TimeoutNamesTheMissingKeys) {
  ManualClock clock;
  RendezvousStore s({.clock = &clock});
  ASSERT_TRUE(s.open_group(group("g")).ok());
  ASSERT_TRUE(s.set("g/there", "x").ok());
  int checks = 0;
  auto v = s.get({"g/there", "g/rank_2", "g/2"}, absl::Milliseconds(150), [&] {
    ++checks;
    clock.advance(checks == 1 ? absl::Milliseconds(149) : absl::Milliseconds(1));
    return false;
  });
  EXPECT_EQ(checks, 3) << "the Get did not end exactly when its 150 ms had passed";
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("after 150 ms"), std::string::npos) << v.status();
  EXPECT_NE(v.status().message().find("g/rank_2, g/2"), std::string::npos) << v.status();
  EXPECT_EQ(v.status().message().find("there"), std::string::npos) << v.status();
}

TEST(RendezvousStoreTest, CancelledCallerStopsWaiting) {
  RendezvousStore s;
  ASSERT_TRUE(s.open_group(group("g")).ok());
  int asked = 0;
  auto v = s.get({"g/never"}, absl::Seconds(30), [&] { return ++asked > 2; });
  EXPECT_EQ(v.status().code(), absl::StatusCode::kCancelled);
}

TEST(RendezvousStoreTest, KeysOutsideAnOpenGroupAreRefused) {
  RendezvousStore s;
  EXPECT_EQ(s.set("nobody/0", "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.get({"nobody/0"}, absl::Seconds(5)).status().code(), absl::StatusCode::kNotFound)
      << "refused at once, not after a wait";
  EXPECT_EQ(s.set("no-slash", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set("g/", "x").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.open_group(group("g")).ok());
  EXPECT_EQ(s.open_group(group("g")).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.open_group(group("a/b")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.open_group(group("")).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.set("g/0", "x").ok());
  // A Get on a key of a group that closes while it waits ends then, NOT_FOUND.
  std::thread closer([&] {
    ASSERT_TRUE(until_waiting(s, 1)) << "the Get never waited";
    s.close_group("g");
  });
  auto waiting = s.get({"g/0", "g/1"}, absl::Seconds(30));
  closer.join();
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kNotFound) << waiting.status();
  EXPECT_EQ(s.set("g/1", "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.groups(), 0u);
}

// A group lives its ttl on the store's clock: up to then it works, from then on it is gone
// for every call before any sweep drops it, a Get waiting on it included; the sweep then
// frees its keys and budget.
TEST(RendezvousStoreTest, GroupsExpire) {
  ManualClock clock;
  RendezvousStore s({.clock = &clock});
  ASSERT_TRUE(s.open_group(group("old")).ok());  // a ttl of one minute
  ASSERT_TRUE(s.set("old/0", "x").ok());
  clock.advance(absl::Seconds(59));
  EXPECT_EQ(s.expire(clock.now()), 0u);
  ASSERT_TRUE(s.set("old/1", "y").ok());
  EXPECT_TRUE(s.get({"old/0"}, absl::ZeroDuration()).ok());
  // A Get that waits for a key while the group's minute runs out ends NOT_FOUND.
  auto waited = s.get({"old/never"}, absl::Minutes(5), [&] {
    clock.advance(absl::Seconds(1));
    return false;
  });
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kNotFound) << waited.status();
  EXPECT_EQ(s.set("old/2", "z").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.get({"old/0"}, absl::ZeroDuration()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.size(), 2u) << "dropped before the sweep";
  EXPECT_EQ(s.expire(clock.now()), 1u);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.bytes(), 0u);
  EXPECT_EQ(s.groups(), 0u);
  // Its name can be opened again, with a budget of its own.
  EXPECT_TRUE(s.open_group(group("old")).ok());
}

TEST(RendezvousStoreTest, AGroupHoldsNoMoreThanItsBudget) {
  RendezvousOptions o;
  RendezvousStore s(o);
  const RendezvousGroup g = group("flood", 2);
  ASSERT_TRUE(s.open_group(g).ok());
  ASSERT_TRUE(s.open_group(group("honest", 2)).ok());
  // Many small keys: stopped by the key count.
  absl::Status last;
  size_t n = 0;
  while ((last = s.set(cat("flood/k", n), "v")).ok()) ++n;
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
  EXPECT_NE(last.message().find("limit"), std::string::npos) << last;
  EXPECT_EQ(n, g.max_keys);
  // Big values: stopped by the bytes.
  ASSERT_TRUE(s.open_group(group("big", 2)).ok());
  const std::string value(64 << 10, 'x');
  uint64_t stored = 0;
  for (int i = 0; (last = s.set(cat("big/", i), value)).ok(); ++i) stored += value.size();
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
  EXPECT_NE(last.message().find("budget"), std::string::npos) << last;
  EXPECT_LE(stored, g.max_bytes);
  // The other group is untouched by either.
  ASSERT_TRUE(s.set("honest/0", "addr").ok());
  EXPECT_EQ((*s.get({"honest/0"}, absl::ZeroDuration()))[0], "addr");
}

TEST(RendezvousStoreTest, TheStoreHoldsNoMoreThanItsGroupsBudgets) {
  RendezvousOptions o;
  o.max_groups = 3;
  o.max_total_bytes = group("x").max_bytes * 2;
  RendezvousStore s(o);
  ASSERT_TRUE(s.open_group(group("a")).ok());
  ASSERT_TRUE(s.open_group(group("b")).ok());
  EXPECT_EQ(s.open_group(group("c")).code(), absl::StatusCode::kResourceExhausted);
  s.close_group("a");
  ASSERT_TRUE(s.open_group(group("c")).ok());
  o.max_total_bytes = UINT64_MAX;
  RendezvousStore few(o);
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(few.open_group(group(n)).ok());
  EXPECT_EQ(few.open_group(group("d")).code(), absl::StatusCode::kResourceExhausted);
}

TEST(RendezvousStoreTest, Limits) {
  RendezvousOptions o;
  o.max_key_bytes = 8;
  o.max_value_bytes = 4;
  o.max_keys_per_get = 2;
  RendezvousStore s(o);
  ASSERT_TRUE(s.open_group(group("g")).ok());
  EXPECT_EQ(s.set("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set("g/123456789", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set("g/k", "12345").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.set("g/k1", "1234").ok());
  EXPECT_EQ(s.get({"g/a", "g/b", "g/c"}, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.get({}, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
}

// The service behind the cluster secret, as uopd serves it on its internal listener.
class SecretServer {
 public:
  static constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";
  SecretServer() {
    cluster_auth::Gate gate;
    gate.secret = kSecret;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", gate.credentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~SecretServer() {
    if (server_) server_->Shutdown();
  }
  std::unique_ptr<wv1::Rendezvous::Stub> stub(const std::string& secret) const {
    cluster_auth::Dialer d;
    d.secret = secret;
    return wv1::Rendezvous::NewStub(d.channel(cat("127.0.0.1:", port_)));
  }
  RendezvousStore& store() { return service_.store(); }
  bool ok() const { return server_ && port_ > 0; }

 private:
  RendezvousService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

grpc::Status set(wv1::Rendezvous::Stub& stub, const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  wv1::RendezvousSetRequest req;
  req.set_key(key);
  req.set_value(value);
  wv1::RendezvousSetResponse resp;
  return stub.Set(&ctx, req, &resp);
}

grpc::Status get(wv1::Rendezvous::Stub& stub, const std::string& key, uint32_t timeout_ms, std::string* value = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  wv1::RendezvousGetRequest req;
  req.add_keys(key);
  req.set_timeout_ms(timeout_ms);
  wv1::RendezvousGetResponse resp;
  grpc::Status st = stub.Get(&ctx, req, &resp);
  if (st.ok() && value) *value = resp.values(0);
  return st;
}

TEST(RendezvousServiceTest, SetAndWaitingGetOverGrpc) {
  SecretServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE(server.store().open_group(group("g")).ok());
  auto stub = server.stub(SecretServer::kSecret);
  std::thread setter([&] {
    ASSERT_TRUE(until_waiting(server.store(), 1)) << "the Get never waited";
    grpc::Status st = set(*stub, "g/0", std::string("\0addr", 5));
    EXPECT_TRUE(st.ok()) << st.error_message();
  });
  std::string value;
  grpc::Status st = get(*stub, "g/0", 10000, &value);
  setter.join();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(value, std::string("\0addr", 5));

  st = get(*stub, "g/1", 50);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(st.error_message().find("g/1"), std::string::npos);
}

TEST(RendezvousServiceTest, RefusedWithoutTheSecretOrOutsideAGroup) {
  SecretServer server;
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE(server.store().open_group(group("g")).ok());
  for (const std::string secret : {std::string(), std::string("not-the-cluster-secret-at-all")}) {
    auto stranger = server.stub(secret);
    grpc::Status s = set(*stranger, "g/0", "junk");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_EQ(s.error_message().find(SecretServer::kSecret), std::string::npos) << s.error_message();
    EXPECT_EQ(get(*stranger, "g/0", 0).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(server.store().size(), 0u);
  auto member = server.stub(SecretServer::kSecret);
  EXPECT_EQ(set(*member, "guessed/0", "junk").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(get(*member, "guessed/0", 10000).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(set(*member, "g/0", "addr").ok());
}

// One holder of the secret floods a group it knows from several threads while the
// members of another group meet: the flood stops at its group's budget, the others
// rendezvous as if nothing happened, and the store never holds more than the two budgets.
TEST(RendezvousServiceTest, AFloodStopsAtItsGroupsBudget) {
  SecretServer server;
  ASSERT_TRUE(server.ok());
  const RendezvousGroup flooded = group("flooded", 2);
  ASSERT_TRUE(server.store().open_group(flooded).ok());
  ASSERT_TRUE(server.store().open_group(group("honest", 3)).ok());
  std::atomic<int> exhausted{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 4; ++t)
    flood.emplace_back([&, t] {
      auto stub = server.stub(SecretServer::kSecret);
      const std::string junk(32 << 10, 'j');
      for (int i = 0; i < 200; ++i) {
        grpc::Status s = set(*stub, cat("flooded/", t, "-", i), junk);
        if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
      }
    });
  std::vector<std::thread> members;
  std::vector<grpc::Status> got(3);
  for (int r = 0; r < 3; ++r)
    members.emplace_back([&, r] {
      auto stub = server.stub(SecretServer::kSecret);
      if (grpc::Status s = set(*stub, cat("honest/", r), cat("addr-", r)); !s.ok()) {
        got[r] = s;
        return;
      }
      for (int q = 0; q < 3; ++q) {
        std::string v;
        got[r] = get(*stub, cat("honest/", q), 20000, &v);
        if (!got[r].ok()) return;
        if (v != cat("addr-", q)) got[r] = grpc::Status(grpc::StatusCode::DATA_LOSS, v);
      }
    });
  for (auto& t : members) t.join();
  for (auto& t : flood) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(got[r].ok()) << "member " << r << ": " << got[r].error_message();
  EXPECT_GT(exhausted.load(), 0);
  EXPECT_LE(server.store().bytes(), flooded.max_bytes + group("honest", 3).max_bytes);
}

}  // namespace
}  // namespace uop
