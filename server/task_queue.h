// The compile pool: a fixed set of threads running planning and compile tasks apart from
// the RPC threads, so at most `threads` of them run at once whatever the request load.
//
// Tasks do not wait in one FIFO but in one queue per owner, served round robin on two
// levels: between groups (a tenant; without tokens, a client host) and, inside a group,
// between flows (one client connection). A client that queues a thousand kernels makes
// another client wait for the next thread that frees up, not for the thousand; a tenant
// with many connections gets one group's share, not one share per connection.
//
// The pool is work-conserving: a flow may use every thread while nobody else waits, so a
// lone client compiling a model is not slowed down. Tasks are not preempted, so a newcomer
// may wait for the shortest of the running tasks to end; what bounds that is the size of
// one task (the planner refuses kernels over --max-kernel-ops before LLVM, planning over
// --max-plan-nodes, and every task stops at its next stage check once no request waits
// for it). Holding a thread back for newcomers instead would halve a lone client's cold
// compiles on the default two threads, for a wait the bounds already keep to seconds.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compiler/support/strings.h"

namespace uop::server {

// Whom a task is for: its group (a tenant, or a client host without tokens) and, inside
// the group, its flow (a client connection).
struct TaskOwner {
  std::string group;
  std::string flow;
};

// The scheduling order alone, without threads: items queue per (group, flow) and pop()
// takes them round robin, first between groups, then between the flows of the group. A
// group or flow that empties leaves the rotation; one that comes (back) joins at the end,
// after every group already waiting has had its turn.
template <typename T>
class FairQueue {
 public:
  void push(const TaskOwner& owner, T item) {
    auto g = group_of_.find(owner.group);
    if (g == group_of_.end()) {
      groups_.push_back(Group{owner.group, {}, {}});
      g = group_of_.emplace(owner.group, std::prev(groups_.end())).first;
    }
    Group& group = *g->second;
    auto f = group.flow_of.find(owner.flow);
    if (f == group.flow_of.end()) {
      group.flows.push_back(Flow{owner.flow, {}});
      f = group.flow_of.emplace(owner.flow, std::prev(group.flows.end())).first;
    }
    f->second->items.push_back(std::move(item));
    ++size_;
    ++queued_[owner.group];
  }

  // The next item, and whom it is for; nullopt when nothing waits.
  std::optional<std::pair<TaskOwner, T>> pop() {
    if (groups_.empty()) return std::nullopt;
    Group& group = groups_.front();
    Flow& flow = group.flows.front();
    std::pair<TaskOwner, T> out{TaskOwner{group.name, flow.name}, std::move(flow.items.front())};
    flow.items.pop_front();
    --size_;
    if (--queued_[group.name] == 0) queued_.erase(group.name);
    // The flow served goes to the back of its group, the group to the back of the ring.
    if (flow.items.empty()) {
      group.flow_of.erase(flow.name);
      group.flows.pop_front();
    } else {
      group.flows.splice(group.flows.end(), group.flows, group.flows.begin());
    }
    if (group.flows.empty()) {
      group_of_.erase(group.name);
      groups_.pop_front();
    } else {
      groups_.splice(groups_.end(), groups_, groups_.begin());
    }
    return out;
  }

  size_t size() const { return size_; }
  size_t size(std::string_view group) const {
    auto it = queued_.find(absl::string_view(group.data(), group.size()));
    return it == queued_.end() ? 0 : it->second;
  }
  bool empty() const { return size_ == 0; }

 private:
  struct Flow {
    std::string name;
    std::deque<T> items;
  };
  struct Group {
    std::string name;
    std::list<Flow> flows;  // rotation order: front is served next
    absl::flat_hash_map<std::string, typename std::list<Flow>::iterator> flow_of;
  };
  std::list<Group> groups_;  // rotation order: front is served next
  absl::flat_hash_map<std::string, typename std::list<Group>::iterator> group_of_;
  absl::flat_hash_map<std::string, size_t> queued_;  // per group
  size_t size_ = 0;
};

class TaskQueue;

// A task run for one request alone (planning, explaining). The task is handed
// `keep_going`, to ask between its steps: non-OK (CANCELLED, DEADLINE_EXCEEDED, naming
// what the task is) once its request has stopped waiting or its deadline has passed. The
// requesting thread waits with wait(); dropping the Pending unfinished also tells the task
// to stop, and it stops at its next step.
template <typename T>
class Pending {
 public:
  Pending(Pending&&) noexcept = default;
  Pending& operator=(Pending&&) noexcept = default;
  ~Pending() {
    if (state_) state_->gone = true;
  }

  // The task's result; or, once `gone()` says the client went away (asked every 20 ms,
  // may be empty) or the deadline passes, CANCELLED / DEADLINE_EXCEEDED without waiting
  // for the task to notice.
  absl::StatusOr<T> wait(const std::function<bool()>& gone) {
    constexpr absl::Duration kPoll = absl::Milliseconds(20);
    while (result_.wait_for(absl::ToChronoNanoseconds(std::max(absl::ZeroDuration(),
                                                                std::min(kPoll, state_->deadline - absl::Now())))) !=
           std::future_status::ready) {
      if (absl::Now() >= state_->deadline || (gone && gone())) {
        state_->gone = true;
        return state_->stopped();
      }
    }
    absl::StatusOr<T> r = result_.get();
    state_.reset();
    return r;
  }

 private:
  friend class TaskQueue;
  struct State {
    State(absl::Time d, std::string w) : deadline(d), what(std::move(w)) {}
    const absl::Time deadline;
    const std::string what;
    std::atomic<bool> gone{false};
    absl::Status stopped() const {
      if (absl::Now() >= deadline) return absl::DeadlineExceededError(cat(what, ": the request's deadline passed"));
      return absl::CancelledError(cat(what, ": abandoned, the client went away"));
    }
  };
  Pending(std::shared_ptr<State> state, std::future<absl::StatusOr<T>> result)
      : state_(std::move(state)), result_(std::move(result)) {}
  std::shared_ptr<State> state_;
  std::future<absl::StatusOr<T>> result_;
};

class TaskQueue {
 public:
  explicit TaskQueue(int threads) {
    for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { drain(); });
  }
  ~TaskQueue() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Queues `fn` for `owner`. A task whose request has gone should find out itself, first
  // thing (the planner's tasks do): it is still popped in its turn, and then costs nothing.
  template <typename F>
  auto submit(const TaskOwner& owner, F fn) -> std::future<decltype(fn())> {
    auto task = std::make_shared<std::packaged_task<decltype(fn())()>>(std::move(fn));
    auto fut = task->get_future();
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push(owner, [task] { (*task)(); });
    }
    cv_.notify_one();
    return fut;
  }

  // Queues `fn` for one request (Pending above): `what` names it in the statuses of a
  // request that stopped waiting; `deadline` is the request's.
  template <typename T>
  Pending<T> submit_for(const TaskOwner& owner, absl::Time deadline, std::string what,
                        std::function<absl::StatusOr<T>(const std::function<absl::Status()>& keep_going)> fn) {
    auto state = std::make_shared<typename Pending<T>::State>(deadline, std::move(what));
    auto result = submit(owner, [this, state, fn = std::move(fn)]() -> absl::StatusOr<T> {
      bool told = false;
      auto keep_going = [&state, &told]() -> absl::Status {
        if (!state->gone && absl::Now() < state->deadline) return absl::OkStatus();
        told = true;
        return state->stopped();
      };
      if (absl::Status s = keep_going(); !s.ok()) {  // its turn came after its request left
        ++abandoned_;
        return s;
      }
      absl::StatusOr<T> r = fn(keep_going);
      if (told && !r.ok()) ++abandoned_;
      return r;
    });
    return Pending<T>(std::move(state), std::move(result));
  }

  // Tasks of submit_for that stopped early because their request no longer waited.
  uint64_t abandoned() const { return abandoned_.load(); }

  // Tasks waiting for a thread / running now: all of them, or one group's.
  uint64_t depth() const {
    std::lock_guard<std::mutex> l(mu_);
    return queue_.size();
  }
  uint64_t depth(std::string_view group) const {
    std::lock_guard<std::mutex> l(mu_);
    return queue_.size(group);
  }
  uint64_t running() const {
    std::lock_guard<std::mutex> l(mu_);
    return running_total_;
  }
  uint64_t running(std::string_view group) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = running_.find(absl::string_view(group.data(), group.size()));
    return it == running_.end() ? 0 : it->second;
  }
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void drain() {
    while (true) {
      std::optional<std::pair<TaskOwner, std::function<void()>>> next;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
        next = queue_.pop();
        if (!next) return;  // stopping, and nothing left
        ++running_[next->first.group];
        ++running_total_;
      }
      next->second();
      std::lock_guard<std::mutex> l(mu_);
      if (--running_[next->first.group] == 0) running_.erase(next->first.group);
      --running_total_;
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  FairQueue<std::function<void()>> queue_;
  absl::flat_hash_map<std::string, uint64_t> running_;  // per group
  uint64_t running_total_ = 0;
  std::atomic<uint64_t> abandoned_{0};
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace uop::server
