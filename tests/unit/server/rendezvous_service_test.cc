// RendezvousStore without a socket (waiting gets, timeouts naming the missing keys,
// expiry, limits) and the gRPC adapter over an in-process server on an ephemeral port.
#include "server/rendezvous_service.h"

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"

namespace uop {
namespace {

namespace wv1 = uopd::worker::v1;

TEST(RendezvousStoreTest, GetReturnsValuesInOrder) {
  RendezvousStore s;
  ASSERT_TRUE(s.set("g/a", "1").ok());
  ASSERT_TRUE(s.set("g/b", "22").ok());
  auto v = s.get({"g/b", "g/a"}, absl::ZeroDuration());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, (std::vector<std::string>{"22", "1"}));
  ASSERT_TRUE(s.set("g/a", "333").ok());  // replaces
  EXPECT_EQ((*s.get({"g/a"}, absl::ZeroDuration()))[0], "333");
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.bytes(), 3u + 3 + 3 + 2);
}

TEST(RendezvousStoreTest, GetWaitsForTheLastKey) {
  RendezvousStore s;
  ASSERT_TRUE(s.set("k1", "x").ok());
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(s.set("k2", "y").ok());
  });
  auto v = s.get({"k1", "k2"}, absl::Seconds(10));  // woken by the Set, else DEADLINE_EXCEEDED
  later.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[1], "y");
}

TEST(RendezvousStoreTest, TimeoutNamesTheMissingKeys) {
  RendezvousStore s;
  ASSERT_TRUE(s.set("there", "x").ok());
  absl::Time start = absl::Now();
  auto v = s.get({"there", "g/rank_2", "g/2"}, absl::Milliseconds(150));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(140));
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("g/rank_2, g/2"), std::string::npos) << v.status();
  EXPECT_EQ(v.status().message().find("there"), std::string::npos) << v.status();
}

TEST(RendezvousStoreTest, CancelledCallerStopsWaiting) {
  RendezvousStore s;
  absl::Time start = absl::Now();
  auto v = s.get({"never"}, absl::Seconds(30), [&] { return absl::Now() - start > absl::Milliseconds(200); });
  EXPECT_EQ(v.status().code(), absl::StatusCode::kCancelled);
}

TEST(RendezvousStoreTest, KeysExpire) {
  RendezvousOptions o;
  o.ttl = absl::Milliseconds(100);
  RendezvousStore s(o);
  ASSERT_TRUE(s.set("old", "x").ok());
  absl::SleepFor(absl::Milliseconds(150));
  // Expired counts as missing at once, before any sweep.
  EXPECT_EQ(s.get({"old"}, absl::ZeroDuration()).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(s.set("new", "y").ok());  // a set sweeps now and then
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s.expire(absl::Now() + absl::Seconds(1)), 1u);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.bytes(), 0u);
}

TEST(RendezvousStoreTest, Limits) {
  RendezvousOptions o;
  o.max_key_bytes = 8;
  o.max_value_bytes = 4;
  o.max_total_bytes = 15;  // two 6-byte entries fit, a third does not
  o.max_keys_per_get = 2;
  RendezvousStore s(o);
  EXPECT_EQ(s.set("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set("123456789", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set("k", "12345").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.set("k1", "1234").ok());
  ASSERT_TRUE(s.set("k2", "1234").ok());
  EXPECT_EQ(s.set("k3", "1234").code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.set("k2", "12").ok());  // replacing counts only the difference
  EXPECT_EQ(s.get({"a", "b", "c"}, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.get({}, absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RendezvousServiceTest, SetAndWaitingGetOverGrpc) {
  RendezvousService service;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  ASSERT_TRUE(server && port > 0);
  auto stub = wv1::Rendezvous::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                           grpc::InsecureChannelCredentials()));
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    grpc::ClientContext ctx;
    wv1::RendezvousSetRequest req;
    req.set_key("g/0");
    req.set_value(std::string("\0addr", 5));
    wv1::RendezvousSetResponse resp;
    EXPECT_TRUE(stub->Set(&ctx, req, &resp).ok());
  });
  grpc::ClientContext ctx;
  wv1::RendezvousGetRequest req;
  req.add_keys("g/0");
  req.set_timeout_ms(10000);
  wv1::RendezvousGetResponse resp;
  grpc::Status st = stub->Get(&ctx, req, &resp);
  setter.join();
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(resp.values_size(), 1);
  EXPECT_EQ(resp.values(0), std::string("\0addr", 5));

  grpc::ClientContext ctx2;
  wv1::RendezvousGetRequest missing;
  missing.add_keys("g/1");
  missing.set_timeout_ms(50);
  st = stub->Get(&ctx2, missing, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(st.error_message().find("g/1"), std::string::npos);
  server->Shutdown();
}

}  // namespace
}  // namespace uop
