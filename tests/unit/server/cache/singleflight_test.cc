// Singleflight<T> (server/cache/singleflight.h) on its own: one execution per key for the
// callers that overlap with it, a fresh one after its result is published, tickets that
// count as wanting the result until their deadline or until dropped, a waiter that stops
// at its deadline or when it says it is gone, and work that runs off the leader's thread.
// Every wait is on a condition (the call's waiters, a notification), never a sleep.
#include "server/cache/singleflight.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace uop {
namespace {

using Flights = Singleflight<std::string>;

// Polls until `n` callers hold tickets for the call of `key` (true), or a bound far past
// any honest delay has passed (false).
bool until_waiters(const Flights& f, const std::string& key, size_t n) {
  for (int i = 0; i < 30000; ++i) {
    if (f.waiters(key) >= n) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

// Eight callers that all join before the work ends share one execution: one leader, seven
// that joined; all get its result. The key is forgotten afterwards.
TEST(Singleflight, OverlappingCallersShareOneExecution) {
  Flights f;
  constexpr int kCallers = 8;
  std::atomic<int> runs{0};
  std::vector<std::pair<std::string, bool>> got(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i)
    callers.emplace_back([&, i] {
      got[i] = f.do_call("k", [&] {
        ++runs;
        // Held until every caller has joined: they all overlap with this execution.
        return until_waiters(f, "k", kCallers) ? std::string("value") : std::string("never joined");
      });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(runs.load(), 1);
  int leaders = 0;
  for (const auto& [value, leader] : got) {
    EXPECT_EQ(value, "value");
    leaders += leader;
  }
  EXPECT_EQ(leaders, 1);
  EXPECT_EQ(f.in_flight(), 0u);
  EXPECT_EQ(f.waiters("k"), 0u);

  // Published and forgotten: the next caller runs the work again, as the leader.
  auto again = f.do_call("k", [&] {
    ++runs;
    return std::string("second");
  });
  EXPECT_EQ(again, std::make_pair(std::string("second"), true));
  EXPECT_EQ(runs.load(), 2);
}

// Different keys never share an execution.
TEST(Singleflight, KeysAreSeparate) {
  Flights f;
  std::vector<Flights::Ticket> held;
  std::vector<std::shared_ptr<Flights::Call>> started;
  for (const char* key : {"a", "b"})
    held.push_back(f.join(key, absl::InfiniteFuture(), [&](const std::shared_ptr<Flights::Call>& c) { started.push_back(c); }));
  EXPECT_TRUE(held[0].leader());
  EXPECT_TRUE(held[1].leader());
  ASSERT_EQ(started.size(), 2u);
  EXPECT_NE(started[0], started[1]);
  EXPECT_EQ(f.in_flight(), 2u);
  f.publish(started[0], "A");
  f.publish(started[1], "B");
  EXPECT_EQ(held[0].wait(absl::InfiniteFuture(), nullptr), "A");
  EXPECT_EQ(held[1].wait(absl::InfiniteFuture(), nullptr), "B");
  EXPECT_EQ(f.in_flight(), 0u);
}

// The work may run on another thread: join() only starts it, and the result reaches the
// leader and a follower that joined before it was published.
TEST(Singleflight, WorkRunsOffTheLeadersThread) {
  Flights f;
  std::shared_ptr<Flights::Call> call;
  Flights::Ticket leader = f.join("k", absl::InfiniteFuture(), [&](const std::shared_ptr<Flights::Call>& c) { call = c; });
  ASSERT_TRUE(call);
  Flights::Ticket follower = f.join("k", absl::InfiniteFuture(), [](const std::shared_ptr<Flights::Call>&) {
    ADD_FAILURE() << "a follower started the work";
  });
  EXPECT_TRUE(leader.leader());
  EXPECT_FALSE(follower.leader());
  EXPECT_EQ(follower.call(), call);
  EXPECT_EQ(call->waiters(), 2u);
  std::thread worker([&] { f.publish(call, "done elsewhere"); });
  EXPECT_EQ(leader.wait(absl::InfiniteFuture(), nullptr), "done elsewhere");
  EXPECT_EQ(follower.wait(absl::InfiniteFuture(), nullptr), "done elsewhere");
  worker.join();
  EXPECT_EQ(call->waiters(), 0u) << "a ticket that got its result has left the call";
}

// wanted() is true while one ticket's deadline is ahead, at the time it is asked about;
// dropping the tickets makes it false however far their deadlines are.
TEST(Singleflight, WantedFollowsTheTicketsDeadlines) {
  Flights f;
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  std::shared_ptr<Flights::Call> call;
  auto early = f.join("k", t0 + absl::Seconds(1), [&](const std::shared_ptr<Flights::Call>& c) { call = c; });
  auto late = f.join("k", t0 + absl::Seconds(5), [](const std::shared_ptr<Flights::Call>&) {});
  ASSERT_TRUE(call);
  EXPECT_TRUE(call->wanted(t0));
  EXPECT_TRUE(call->wanted(t0 + absl::Seconds(3))) << "the later deadline still wants it";
  EXPECT_FALSE(call->wanted(t0 + absl::Seconds(5)));
  { auto gone = std::move(late); }
  EXPECT_FALSE(call->wanted(t0 + absl::Seconds(3)));
  EXPECT_TRUE(call->wanted(t0));
  { auto gone = std::move(early); }
  EXPECT_FALSE(call->wanted(t0));
  EXPECT_EQ(call->waiters(), 0u);
  // Nobody waits, but the call is still in flight until published: a new caller joins it.
  auto newcomer = f.join("k", absl::InfiniteFuture(), [](const std::shared_ptr<Flights::Call>&) {
    ADD_FAILURE() << "a second execution while the first is in flight";
  });
  EXPECT_EQ(newcomer.call(), call);
  f.publish(call, "late");
  EXPECT_EQ(newcomer.wait(absl::InfiniteFuture(), nullptr), "late");
}

// A waiter stops when gone() says so or at its deadline (nullopt), and leaves the call;
// the call goes on for the others and its result still reaches them.
TEST(Singleflight, AWaiterStopsWhenGoneOrAtItsDeadline) {
  Flights f;
  std::shared_ptr<Flights::Call> call;
  auto leader = f.join("k", absl::InfiniteFuture(), [&](const std::shared_ptr<Flights::Call>& c) { call = c; });
  auto quitter = f.join("k", absl::InfiniteFuture(), [](const std::shared_ptr<Flights::Call>&) {});
  auto hurried = f.join("k", absl::InfinitePast(), [](const std::shared_ptr<Flights::Call>&) {});
  ASSERT_EQ(call->waiters(), 3u);
  int asked = 0;
  EXPECT_EQ(quitter.wait(absl::InfiniteFuture(), [&] { return ++asked >= 2; }, absl::Milliseconds(1)), std::nullopt);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(hurried.wait(absl::InfinitePast(), nullptr), std::nullopt) << "a deadline already passed";
  EXPECT_EQ(call->waiters(), 1u);
  EXPECT_TRUE(call->wanted());
  f.publish(call, "for the leader");
  EXPECT_EQ(leader.wait(absl::InfiniteFuture(), nullptr), "for the leader");
  // A ticket that left returns nothing more.
  EXPECT_EQ(quitter.wait(absl::InfiniteFuture(), nullptr), std::nullopt);
}

// A caller that joins after the result was published starts a new execution, and the
// new one's result is not confused with the old one's.
TEST(Singleflight, APublishedCallIsNotJoinedAgain) {
  Flights f;
  std::shared_ptr<Flights::Call> first, second;
  auto a = f.join("k", absl::InfiniteFuture(), [&](const std::shared_ptr<Flights::Call>& c) { first = c; });
  f.publish(first, "old");
  auto b = f.join("k", absl::InfiniteFuture(), [&](const std::shared_ptr<Flights::Call>& c) { second = c; });
  EXPECT_TRUE(b.leader());
  ASSERT_TRUE(second);
  EXPECT_NE(first, second);
  EXPECT_EQ(a.wait(absl::InfiniteFuture(), nullptr), "old");
  f.publish(second, "new");
  EXPECT_EQ(b.wait(absl::InfiniteFuture(), nullptr), "new");
}

}  // namespace
}  // namespace uop
