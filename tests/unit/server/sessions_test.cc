// The scheduler's sessions (server/sessions.h) without a server: owners that see only their
// own sessions (another's is NOT_FOUND, worded as one that never existed), unguessable
// ids, buffers within the session's byte quota and buffer count, idle sessions reaped at
// the time they are asked about (times are passed in, never waited for), a Run's
// reservation, and the limits on sessions.
#include "server/sessions.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/time/clock.h"
#include "compiler/ir/codec.h"
#include "compiler/support/strings.h"
#include "server/models.h"

namespace uop::server {
namespace {

BufferInfo buffer_of(uint64_t bytes, const std::string& device = "CPU:0") {
  BufferInfo b;
  b.device = device;
  b.bytes = bytes;
  b.elements = bytes / 4;
  return b;
}

// Another tenant's session is NOT_FOUND for every call, worded exactly as a session that
// does not exist, and nothing of it changes.
TEST(Sessions, AnOwnerFindsOnlyItsOwnSessions) {
  SessionManager m(SessionOptions{});
  auto s = m.open({"CPU:0", "CPU:1"}, absl::ZeroDuration(), SessionOwner{"alice"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto mine = m.devices(*s, "alice");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*mine, (std::vector<std::string>{"CPU:0", "CPU:1"}));
  auto buf = m.add_buffer(*s, buffer_of(64), "alice");
  ASSERT_TRUE(buf.ok()) << buf.status();

  const std::string never = std::string(32, 'f');
  const absl::Status absent = m.devices(never, "bob").status();
  EXPECT_EQ(absent.code(), absl::StatusCode::kNotFound);
  for (const absl::Status& st : {m.devices(*s, "bob").status(), m.touch(*s, "bob"), m.buffer(*s, *buf, "bob").status(),
                                 m.remove_buffer(*s, *buf, "bob").status(), m.add_buffer(*s, buffer_of(8), "bob").status(),
                                 m.reserve(*s, 8, "a run", "bob").status(), m.close(*s, "bob").status()}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    EXPECT_EQ(st.message().find(*buf), std::string::npos) << "names the other tenant's buffer: " << st;
  }
  EXPECT_EQ(std::string(m.devices(*s, "bob").status().message()),
            std::string(absent.message()).replace(absent.message().find(never), never.size(), *s));
  // Alice's session is as it was.
  EXPECT_EQ(m.buffers(), 1u);
  EXPECT_TRUE(m.buffer(*s, *buf, "alice").ok());
  EXPECT_EQ(m.usage("alice").sessions, 1u);
  EXPECT_EQ(m.usage("bob").sessions, 0u);
  EXPECT_TRUE(m.uses_device("alice", "CPU:1"));
  EXPECT_FALSE(m.uses_device("bob", "CPU:1"));
  EXPECT_FALSE(m.uses_device("alice", "CPU:2"));
}

// Session and buffer ids: 128 random bits in hex, none repeated.
TEST(Sessions, IdsAreRandomHex) {
  SessionManager m(SessionOptions{});
  std::set<std::string> ids;
  for (int i = 0; i < 64; ++i) {
    auto s = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{});
    ASSERT_TRUE(s.ok()) << s.status();
    auto b = m.add_buffer(*s, buffer_of(4));
    ASSERT_TRUE(b.ok()) << b.status();
    for (const std::string& id : {*s, *b}) {
      EXPECT_EQ(id.size(), 32u) << id;
      EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
      EXPECT_TRUE(ids.insert(id).second) << "an id handed out twice: " << id;
    }
  }
}

// Buffers count against the session's bytes and buffer count; removing one gives its share
// back; closing returns the rest for the workers to free.
TEST(Sessions, BuffersStayWithinTheQuotaAndCloseReturnsThem) {
  SessionOptions o;
  o.max_bytes = 100;
  o.max_buffers = 3;
  SessionManager m(o);
  auto s = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{});
  ASSERT_TRUE(s.ok());
  auto a = m.add_buffer(*s, buffer_of(60));
  ASSERT_TRUE(a.ok()) << a.status();
  auto over = m.add_buffer(*s, buffer_of(41));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("session byte quota"), std::string::npos) << over.status();
  auto b = m.add_buffer(*s, buffer_of(40));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(m.bytes(), 100u);
  auto got = m.buffer(*s, *b);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->bytes, 40u);
  EXPECT_EQ(got->id, *b);

  auto removed = m.remove_buffer(*s, *a);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->bytes, 60u);
  EXPECT_EQ(m.buffer(*s, *a).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.bytes(), 40u);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(m.add_buffer(*s, buffer_of(1)).ok());
  auto fourth = m.add_buffer(*s, buffer_of(1));
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(fourth.status().message().find("buffer count"), std::string::npos) << fourth.status();

  auto closed = m.close(*s);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->size(), 3u);
  EXPECT_EQ(m.sessions(), 0u);
  EXPECT_EQ(m.buffers(), 0u);
  EXPECT_EQ(m.bytes(), 0u);
  EXPECT_EQ(m.close(*s).status().code(), absl::StatusCode::kNotFound) << "closed twice";
}

// A session idles out at its own timeout, counted from its last use; reaping returns its
// buffers. Reaping is asked about a time, so nothing here waits.
TEST(Sessions, IdleSessionsAreReapedAtTheirTimeout) {
  SessionManager m(SessionOptions{});
  const absl::Time opened = absl::Now();
  auto short_lived = m.open({"CPU:0"}, absl::Minutes(1), SessionOwner{});
  auto lasting = m.open({"CPU:0"}, absl::Hours(1), SessionOwner{});
  ASSERT_TRUE(short_lived.ok() && lasting.ok());
  ASSERT_TRUE(m.add_buffer(*short_lived, buffer_of(8)).ok());
  EXPECT_TRUE(m.reap_idle(opened + absl::Seconds(30)).empty());
  EXPECT_EQ(m.sessions(), 2u);
  std::vector<BufferInfo> freed = m.reap_idle(absl::Now() + absl::Seconds(61));
  ASSERT_EQ(freed.size(), 1u);
  EXPECT_EQ(freed[0].bytes, 8u);
  EXPECT_EQ(m.sessions(), 1u);
  EXPECT_EQ(m.devices(*short_lived).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(m.devices(*lasting).ok());
  EXPECT_TRUE(m.reap_idle(absl::Now() + absl::Hours(2)).empty()) << "it held no buffers";
  EXPECT_EQ(m.sessions(), 0u);
}

// A tenant's limits: sessions and bytes across all its sessions; lowered below what it
// holds, they refuse what is new and take nothing away.
TEST(Sessions, ATenantsLimitsSpanItsSessions) {
  SessionManager m(SessionOptions{});
  SessionOwner carol{"carol", 2, 100};
  auto a = m.open({"CPU:0"}, absl::ZeroDuration(), carol);
  auto b = m.open({"CPU:0"}, absl::ZeroDuration(), carol);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = m.open({"CPU:0"}, absl::ZeroDuration(), carol);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("session limit"), std::string::npos) << c.status();
  EXPECT_TRUE(m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{"dave"}).ok()) << "another tenant's are its own";
  ASSERT_TRUE(m.add_buffer(*a, buffer_of(70), "carol").ok());
  auto spill = m.add_buffer(*b, buffer_of(31), "carol");
  EXPECT_EQ(spill.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(spill.status().message().find("tenant 'carol' byte quota"), std::string::npos) << spill.status();

  m.set_limits(SessionOwner{"carol", 1, 50});
  EXPECT_EQ(m.usage("carol").sessions, 2u) << "nothing taken away";
  EXPECT_EQ(m.usage("carol").bytes, 70u);
  EXPECT_EQ(m.add_buffer(*b, buffer_of(1), "carol").status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(m.close(*a, "carol").ok());
  ASSERT_TRUE(m.close(*b, "carol").ok());
  EXPECT_EQ(m.usage("carol").bytes, 0u);
  EXPECT_TRUE(m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{"carol", 1, 50}).ok());
}

TEST(Sessions, ARunsReservationCountsUntilItEndsAndKeptOutputsStay) {
  SessionOptions o;
  o.max_bytes = 1000;
  SessionManager m(o);
  auto s = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{"t", 0, 800});
  ASSERT_TRUE(s.ok());
  {
    auto r = m.reserve(*s, 700, "for the run", "t");
    ASSERT_TRUE(r.ok()) << r.status();
    // Nothing else fits meanwhile: not a buffer, not a second run.
    BufferInfo b;
    b.bytes = 200;
    auto buf = m.add_buffer(*s, b, "t");
    EXPECT_EQ(buf.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(buf.status().message().find("tenant 't' byte quota"), std::string::npos) << buf.status();
    EXPECT_NE(buf.status().message().find("700 reserved by runs"), std::string::npos) << buf.status();
    EXPECT_FALSE(m.reserve(*s, 200, "for another run", "t").ok());
    // An output kept from the reservation moves over without a second check.
    b.bytes = 300;
    ASSERT_TRUE(m.add_buffer(*s, b, "t", &*r).ok());
    EXPECT_EQ(r->bytes(), 400u);
    // A session with a run in flight is never idle.
    EXPECT_TRUE(m.reap_idle(absl::Now() + absl::Hours(1)).empty());
  }
  EXPECT_EQ(m.usage("t").bytes, 300u);
  EXPECT_TRUE(m.reserve(*s, 500, "for the next run", "t").ok());
  EXPECT_EQ(m.reserve(*s, 501, "for a larger run", "t").status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(Sessions, IdleTimeoutsAreClampedAndSessionsLimited) {
  SessionOptions o;
  o.max_idle_timeout = absl::Seconds(5);
  o.max_sessions = 2;
  SessionManager m(o);
  auto forever = m.open({"CPU:0"}, absl::Milliseconds(int64_t{1} << 62), SessionOwner{});
  ASSERT_TRUE(forever.ok());
  auto other = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{});
  ASSERT_TRUE(other.ok());
  auto third = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{});
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-sessions"), std::string::npos) << third.status();
  m.reap_idle(absl::Now() + absl::Seconds(6));
  EXPECT_EQ(m.sessions(), 0u) << "both timeouts clamped to 5 s";
}

// A held model: found by its session's owner only, its bytes within the session's quota,
// and gone, with its bytes given back, when the session closes.
TEST(Sessions, ModelsAreTheirSessionsAndCountItsBytes) {
  SessionOptions o;
  o.max_bytes = 1000;
  SessionManager m(o);
  auto s = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{"alice"});
  auto other = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{"alice"});
  ASSERT_TRUE(s.ok() && other.ok());
  auto model = std::make_shared<HeldModel>();
  auto id = m.add_model(*s, model, 600, "alice");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 32u);
  auto found = m.model(*s, *id, "alice");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->get(), model.get());
  EXPECT_EQ(m.model(*s, *id, "bob").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.model(*other, *id, "alice").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.bytes(), 600u);
  // 600 + 600 is past the session's 1000 bytes.
  auto second = m.add_model(*s, model, 600, "alice");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_EQ(m.add_buffer(*s, buffer_of(500), "alice").status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(m.close(*s, "alice").ok());
  EXPECT_EQ(m.bytes(), 0u);
  EXPECT_EQ(m.usage("alice").bytes, 0u);
  EXPECT_EQ(m.model(*s, *id, "alice").status().code(), absl::StatusCode::kNotFound);
}

// Held graphs count against the session's quota until displaced (the last
// kMaxHeldGraphs stay) or the session closes; holding a digest again replaces it.
TEST(Sessions, HeldGraphsStayWithinTheQuotaAndTheLastFewAreKept) {
  SessionOptions o;
  o.max_bytes = 1000;
  SessionManager m(o);
  auto s = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{});
  ASSERT_TRUE(s.ok());
  auto graph = std::make_shared<const DecodedGraph>();
  EXPECT_EQ(m.hold_graph(*s, "big", graph, 1001).code(), absl::StatusCode::kResourceExhausted);
  for (size_t i = 0; i <= SessionManager::kMaxHeldGraphs; ++i) ASSERT_TRUE(m.hold_graph(*s, cat("g", i), graph, 100).ok());
  EXPECT_EQ(m.bytes(), 100 * SessionManager::kMaxHeldGraphs);  // g0 displaced, its bytes given back
  EXPECT_EQ(m.held_graph(*s, "g0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(m.held_graph(*s, "g1").ok());
  ASSERT_TRUE(m.hold_graph(*s, "g1", graph, 50).ok());  // replaced, not held twice
  EXPECT_EQ(m.bytes(), 100 * SessionManager::kMaxHeldGraphs - 50);
  EXPECT_EQ(m.held_graph("nope", "g1").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(m.close(*s).ok());
  EXPECT_EQ(m.bytes(), 0u);
}

// replace_buffer: the id stays and names the new worker buffer; the old one comes back.
TEST(Sessions, AReplacedBufferKeepsItsIdAndGivesBackWhatItHeld) {
  SessionManager m(SessionOptions{});
  auto s = m.open({"CPU:0"}, absl::ZeroDuration(), SessionOwner{});
  ASSERT_TRUE(s.ok());
  BufferInfo before = buffer_of(40);
  before.worker_buffer = 7;
  auto id = m.add_buffer(*s, before);
  ASSERT_TRUE(id.ok());
  BufferInfo now = buffer_of(40);
  now.worker_buffer = 9;
  auto old = m.replace_buffer(*s, *id, now);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->worker_buffer, 7u);
  auto got = m.buffer(*s, *id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->worker_buffer, 9u);
  EXPECT_EQ(got->id, *id);
  EXPECT_EQ(m.bytes(), 40u);
  EXPECT_EQ(m.replace_buffer(*s, "nope", now).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace uop::server
