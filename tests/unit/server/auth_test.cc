// Tenants without a server (server/auth.h): the tokens file parsed and refused with the
// line that is wrong, the rate and compile limits each refusing with its own name, and a
// reload that keeps every tenant by name with what it holds. Times are passed in, never
// waited for. (tests/e2e/tenants_test.cc drives a real uopd with a tokens file.)
#include "server/auth.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "absl/time/clock.h"
#include "compiler/ir/digest.h"

namespace uop {
namespace {

using server::Tenant;
using server::Tenants;

bool contains(const absl::Status& s, std::string_view what) {
  return std::string_view(s.message().data(), s.message().size()).find(what) != std::string_view::npos;
}

TEST(Tenants, ParsesTheTokensFile) {
  auto t = Tenants::parse(
      "# tenants\n"
      "alice  alice-token-0123456789  bytes=4096 sessions=2 compiles=1 rps=2.5 burst=5\n"
      "\n"
      "bob sha256:" + sha256("bob-token").hex() + " cache=private   # hashed token\n",
      "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->enabled());
  auto alice = (*t)->authenticate({"Bearer alice-token-0123456789"});
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ((*alice)->name(), "alice");
  EXPECT_EQ((*alice)->quota().max_bytes, 4096u);
  EXPECT_EQ((*alice)->quota().max_sessions, 2u);
  EXPECT_EQ((*alice)->quota().max_compiles, 1u);
  EXPECT_DOUBLE_EQ((*alice)->quota().requests_per_second, 2.5);
  EXPECT_DOUBLE_EQ((*alice)->quota().burst, 5);
  EXPECT_EQ((*alice)->cache_namespace(), "");
  auto bob = (*t)->authenticate({"Bearer bob-token"});
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ((*bob)->name(), "bob");
  EXPECT_NE((*bob)->cache_namespace(), "");

  for (std::vector<std::string_view> bad : {std::vector<std::string_view>{}, {"Bearer nope"}, {"alice-token-0123456789"},
                                            {"Basic alice-token-0123456789"}}) {
    auto r = (*t)->authenticate(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_FALSE(contains(r.status(), "alice-token")) << "the token is never echoed";
  }
  EXPECT_EQ((*t)->auth_failures(), 4u);
}

TEST(Tenants, RefusesBadTokensFiles) {
  struct Case {
    std::string text, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"alice\n", "tokens:1"},
           {"alice t1\nalice t2\n", "listed twice"},
           {"alice t1\nbob t1\n", "token of another tenant"},
           {"al/ce t1\n", "tenant name"},
           {"alice t1 bytes=lots\n", "bad value for bytes"},
           {"alice t1 colour=red\n", "unknown setting"},
           {"alice sha256:abc\n", "64 lowercase hex"},
           {"# nobody\n", "no tenants"},
       }) {
    auto t = Tenants::parse(c.text, "tokens");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(t.status(), c.expect)) << t.status() << " wants " << c.expect;
  }
  EXPECT_EQ(Tenants::load("/nonexistent/tokens").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Tenants::anonymous()->enabled());
}

TEST(Tenants, RateAndCompileLimitsSayWhichLimit) {
  // One request per 1000 s with a burst of 2: the third one now is refused, whatever the
  // speed of the machine.
  Tenant t("carol", {.max_compiles = 1, .requests_per_second = 0.001, .burst = 2}, false);
  absl::Time now = absl::Now();
  EXPECT_TRUE(t.admit_request(now).ok());
  EXPECT_TRUE(t.admit_request(now).ok());
  absl::Status third = t.admit_request(now);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(third, "request rate")) << third;
  EXPECT_TRUE(t.admit_request(now + absl::Seconds(1001)).ok()) << "the bucket refills";

  auto first = t.begin_compile();
  ASSERT_TRUE(first.ok());
  auto second = t.begin_compile();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(second.status(), "concurrent compile")) << second.status();
  { auto done = std::move(*first); }  // released
  EXPECT_TRUE(t.begin_compile().ok());
  EXPECT_EQ(t.rejections()["rps"], 1u);
  EXPECT_EQ(t.rejections()["compiles"], 1u);
}

TEST(Tenants, AReloadKeepsEachTenantByNameWithItsUsage) {
  auto t = Tenants::parse("alice a-token compiles=1\nbob b-token\n", "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  Tenant* alice = *(*t)->authenticate({"Bearer a-token"});
  Tenant* bob = *(*t)->authenticate({"Bearer b-token"});
  auto running = alice->begin_compile();  // in flight across the reload
  ASSERT_TRUE(running.ok());
  EXPECT_FALSE(alice->begin_compile().ok());

  // A file that does not parse changes nothing.
  auto broken = Tenants::parse("alice a-token compiles=2\nerin e-token colour=red\n", "tokens");
  EXPECT_FALSE(broken.ok());
  EXPECT_TRUE(contains(broken.status(), "tokens:2")) << broken.status();

  auto next = Tenants::parse("alice a-token2 compiles=2 cache=private\ncarol c-token\n", "tokens");
  ASSERT_TRUE(next.ok()) << next.status();
  auto summary = (*t)->adopt(std::move(*next));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_NE(summary->find("added carol"), std::string::npos) << *summary;
  EXPECT_NE(summary->find("removed bob"), std::string::npos) << *summary;
  EXPECT_NE(summary->find("changed alice"), std::string::npos) << *summary;
  EXPECT_EQ((*t)->reloads_ok(), 1u);

  // Same object for the same name: the compile in flight still counts against the new limit.
  EXPECT_EQ((*t)->authenticate({"Bearer a-token"}).status().code(), absl::StatusCode::kUnauthenticated);
  auto alice2 = (*t)->authenticate({"Bearer a-token2"});
  ASSERT_TRUE(alice2.ok());
  EXPECT_EQ(*alice2, alice);
  EXPECT_EQ(alice->quota().max_compiles, 2u);
  EXPECT_NE(alice->cache_namespace(), "");
  auto second = alice->begin_compile();
  EXPECT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(alice->begin_compile().ok()) << "two running, limit 2";
  // Bob's token is refused, his object stays valid for what he had in flight.
  EXPECT_EQ((*t)->authenticate({"Bearer b-token"}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(bob->name(), "bob");
  EXPECT_EQ((*t)->all().size(), 2u);
  EXPECT_TRUE((*t)->authenticate({"Bearer c-token"}).ok());

  // Bob back under his name is the same tenant again.
  auto again = Tenants::parse("alice a-token2\nbob b-token3\n", "tokens");
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*t)->adopt(std::move(*again)).ok());
  EXPECT_EQ(*(*t)->authenticate({"Bearer b-token3"}), bob);
  EXPECT_EQ(alice->cache_namespace(), "") << "cache=shared again";
  { auto done = std::move(*running); }
  EXPECT_EQ(alice->compiles_running(), 1u);

  // The anonymous configuration has nothing to reload.
  auto anon = Tenants::anonymous();
  EXPECT_EQ(anon->adopt(*Tenants::parse("x y\n", "t")).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace uop
