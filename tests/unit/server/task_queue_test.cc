// The compile pool's scheduling (server/task_queue.h): the round-robin order between
// groups and flows, the pool serving a newcomer before the rest of a long queue, and
// tasks run for one request stopping once that request stops waiting. No sleeps: the
// pool's one thread is held by a task that waits on a promise the test fulfils.
#include "server/task_queue.h"

#include <future>
#include <optional>
#include <thread>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace uop::server {
namespace {

std::vector<std::string> drain(FairQueue<std::string>& q) {
  std::vector<std::string> out;
  while (auto next = q.pop()) out.push_back(next->second);
  return out;
}

TEST(FairQueue, ServesFlowsRoundRobinNotFirstComeFirstServed) {
  FairQueue<std::string> q;
  for (int i = 0; i < 4; ++i) q.push({"host", "bomb"}, "bomb" + std::to_string(i));
  q.push({"host", "small"}, "small");
  EXPECT_EQ(q.size(), 5u);
  EXPECT_EQ(drain(q), (std::vector<std::string>{"bomb0", "small", "bomb1", "bomb2", "bomb3"}));
  EXPECT_TRUE(q.empty());
}

TEST(FairQueue, GroupsShareFirstThenTheirFlows) {
  // Tenant a has two connections with three tasks each; tenant b one connection. b gets
  // every other turn, and a's two connections share a's turns.
  FairQueue<std::string> q;
  for (int i = 0; i < 3; ++i) q.push({"a", "a1"}, "a1." + std::to_string(i));
  for (int i = 0; i < 3; ++i) q.push({"a", "a2"}, "a2." + std::to_string(i));
  for (int i = 0; i < 3; ++i) q.push({"b", "b1"}, "b1." + std::to_string(i));
  EXPECT_EQ(q.size("a"), 6u);
  EXPECT_EQ(q.size("b"), 3u);
  EXPECT_EQ(q.size("nobody"), 0u);
  EXPECT_EQ(drain(q), (std::vector<std::string>{"a1.0", "b1.0", "a2.0", "b1.1", "a1.1", "b1.2", "a2.1", "a1.2", "a2.2"}));
}

TEST(FairQueue, ANewcomerWaitsForOneTurnOfEachGroupNotForTheirQueues) {
  FairQueue<std::string> q;
  for (int i = 0; i < 100; ++i) q.push({"x", "x"}, "x");
  for (int i = 0; i < 100; ++i) q.push({"y", "y"}, "y");
  EXPECT_EQ(q.pop()->second, "x");
  q.push({"z", "z"}, "z");  // joins the rotation at its end: after y and x have had a turn
  EXPECT_EQ(q.pop()->second, "y");
  auto third = q.pop();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->second, "x");
  EXPECT_EQ(third->first.group, "x");
  EXPECT_EQ(q.pop()->second, "z");
  EXPECT_EQ(q.size(), 197u);
  EXPECT_EQ(q.size("z"), 0u);
}

TEST(FairQueue, AFlowThatEmptiedComesBackAtTheEnd) {
  FairQueue<std::string> q;
  q.push({"g", "a"}, "a0");
  q.push({"g", "b"}, "b0");
  q.push({"g", "b"}, "b1");
  EXPECT_EQ(q.pop()->second, "a0");  // a leaves the rotation
  q.push({"g", "a"}, "a1");          // and comes back after b
  EXPECT_EQ(drain(q), (std::vector<std::string>{"b0", "a1", "b1"}));
}

// A pool of one thread, held by a task until release(): what is queued meanwhile runs in
// the pool's order once released, and the test sees the order and the counts.
class HeldPool {
 public:
  HeldPool() : pool_(1) {
    held_ = pool_.submit({"holder", "holder"}, [this] {
      started_.set_value();
      release_.get_future().wait();
    });
    started_.get_future().wait();
  }
  void queue(const TaskOwner& who, std::string name) {
    done_.push_back(pool_.submit(who, [this, name] {
      std::lock_guard<std::mutex> l(mu_);
      order_.push_back(name);
    }));
  }
  std::vector<std::string> release() {
    release_.set_value();
    held_.wait();
    for (auto& f : done_) f.wait();
    std::lock_guard<std::mutex> l(mu_);
    return order_;
  }
  TaskQueue& pool() { return pool_; }

 private:
  TaskQueue pool_;
  std::promise<void> started_, release_;
  std::future<void> held_;
  std::vector<std::future<void>> done_;
  std::mutex mu_;
  std::vector<std::string> order_;
};

TEST(TaskQueue, ASmallRequestRunsBeforeTheRestOfABomb) {
  HeldPool p;
  EXPECT_EQ(p.pool().running(), 1u);
  EXPECT_EQ(p.pool().running("holder"), 1u);
  for (int i = 0; i < 50; ++i) p.queue({"host", "bomb"}, "bomb");
  p.queue({"host", "small"}, "small");
  EXPECT_EQ(p.pool().depth(), 51u);
  EXPECT_EQ(p.pool().depth("host"), 51u);
  std::vector<std::string> order = p.release();
  ASSERT_EQ(order.size(), 51u);
  EXPECT_EQ(order[0], "bomb");
  EXPECT_EQ(order[1], "small") << "a FIFO would have run it last";
  EXPECT_EQ(p.pool().depth(), 0u);
}

TEST(TaskQueue, CountsRunningTasksPerGroup) {
  TaskQueue pool(2);
  std::promise<void> a_in, b_in, go;
  std::shared_future<void> gate = go.get_future().share();
  auto a = pool.submit({"tenant:a", "c1"}, [&] { a_in.set_value(); gate.wait(); });
  auto b = pool.submit({"tenant:b", "c2"}, [&] { b_in.set_value(); gate.wait(); });
  a_in.get_future().wait();
  b_in.get_future().wait();
  EXPECT_EQ(pool.running(), 2u);
  EXPECT_EQ(pool.running("tenant:a"), 1u);
  EXPECT_EQ(pool.running("tenant:b"), 1u);
  EXPECT_EQ(pool.running("tenant:c"), 0u);
  auto c = pool.submit({"tenant:a", "c1"}, [] {});
  EXPECT_EQ(pool.depth("tenant:a"), 1u);
  EXPECT_EQ(pool.depth("tenant:b"), 0u);
  go.set_value();
  a.wait();
  b.wait();
  c.wait();
}

TEST(TaskQueue, ATaskWhoseRequestLeftBeforeItsTurnDoesNotRun) {
  HeldPool p;
  bool ran = false;
  std::optional<Pending<int>> late;
  late.emplace(p.pool().submit_for<int>({"g", "f"}, absl::InfiniteFuture(), "planning",
                                        [&](const std::function<absl::Status()>&) -> absl::StatusOr<int> {
                                          ran = true;
                                          return 1;
                                        }));
  late.reset();                   // the request went away while its task waited
  p.queue({"g", "f"}, "after");   // the same flow: runs after it
  p.release();
  EXPECT_FALSE(ran);
  EXPECT_EQ(p.pool().abandoned(), 1u);
}

TEST(TaskQueue, ARequestPastItsDeadlineIsToldSoWithoutWaiting) {
  TaskQueue pool(1);
  auto r = pool.submit_for<int>({"g", "f"}, absl::InfinitePast(), "planning",
                                [](const std::function<absl::Status()>&) -> absl::StatusOr<int> { return 1; })
               .wait(nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("planning"), std::string_view::npos) << r.status();
}

TEST(TaskQueue, ARunningTaskStopsAtItsNextCheckOnceItsClientHasGone) {
  TaskQueue pool(1);
  std::promise<void> started, stopped;
  auto pending = pool.submit_for<int>({"g", "f"}, absl::InfiniteFuture(), "explain",
                                      [&](const std::function<absl::Status()>& keep_going) -> absl::StatusOr<int> {
                                        started.set_value();
                                        absl::Status s;
                                        while ((s = keep_going()).ok()) std::this_thread::yield();  // stage after stage
                                        stopped.set_value();
                                        return s;
                                      });
  started.get_future().wait();
  auto r = pending.wait([] { return true; });  // the client has gone
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  stopped.get_future().wait();  // the task noticed, at its next check
  // The task's return and the count happen after `stopped`: the pool's one thread is
  // free again only then, so a task queued now runs after it.
  pool.submit({"g", "f"}, [] {}).wait();
  EXPECT_EQ(pool.abandoned(), 1u);
}

TEST(TaskQueue, AWaitingRequestGetsTheTasksResult) {
  TaskQueue pool(2);
  auto r = pool.submit_for<std::string>({"g", "f"}, absl::InfiniteFuture(), "planning",
                                        [](const std::function<absl::Status()>& keep_going) -> absl::StatusOr<std::string> {
                                          if (absl::Status s = keep_going(); !s.ok()) return s;
                                          return std::string("plan");
                                        })
               .wait([] { return false; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "plan");
  EXPECT_EQ(pool.abandoned(), 0u);
}

}  // namespace
}  // namespace uop::server
