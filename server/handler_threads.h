// Threads for the service's handlers that block: a Run waits for its workers, a Compile
// for the compile pool, an Upload for each chunk's write to the worker. gRPC's callback
// API hands the service its calls on gRPC's own threads, which must never block, so those
// calls are handed on to these. A thread starts when a task finds every thread busy, up
// to `max_threads`; past that, tasks wait in FIFO order. Idle threads stay for the next
// task.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace uop::server {

class HandlerThreads {
 public:
  explicit HandlerThreads(size_t max_threads) : max_(std::max<size_t>(max_threads, 1)) {}
  ~HandlerThreads() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  HandlerThreads(const HandlerThreads&) = delete;
  HandlerThreads& operator=(const HandlerThreads&) = delete;

  void submit(std::function<void()> task) {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(task));
    if (idle_ >= queue_.size() || threads_.size() >= max_) {
      cv_.notify_one();
      return;
    }
    threads_.emplace_back([this] { drain(); });
  }

  // Tasks waiting for a thread.
  uint64_t waiting() const {
    std::lock_guard<std::mutex> l(mu_);
    return queue_.size();
  }

 private:
  void drain() {
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      ++idle_;
      cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stopping, and nothing left
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      task();
      l.lock();
    }
  }

  const size_t max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t idle_ = 0;  // threads waiting for a task
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace uop::server
