// A fixed set of threads draining a FIFO of tasks: the compile pool. RPC threads submit
// and wait on the future, so compiles never run on (or multiply with) RPC threads, and at
// most `threads` compile at once whatever the request load. depth() is the queue length
// operators watch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace uop::server {

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

  template <typename F>
  auto submit(F fn) -> std::future<decltype(fn())> {
    auto task = std::make_shared<std::packaged_task<decltype(fn())()>>(std::move(fn));
    auto fut = task->get_future();
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return fut;
  }

  uint64_t depth() const {
    std::lock_guard<std::mutex> l(mu_);
    return queue_.size();
  }

 private:
  void drain() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace uop::server
