// A fixed-size pool of threads for running a kernel's tasks. parallel_for blocks until
// every task has run and the calling thread runs tasks too, so a pool of n keeps n - 1
// threads of its own. Several threads may call parallel_for at once (the worker runs
// kernels for several requests); each call finishes its own tasks even if the pool's
// threads are busy with another call's, so calls never wait on each other to progress.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace uop {

class ThreadPool {
 public:
  // n threads in all, the caller's included (n < 1 is taken as 1).
  explicit ThreadPool(int n);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }
  // Runs fn(0) .. fn(ntasks - 1), each once, in any order and on any of the pool's
  // threads or the caller's, and returns when all have returned.
  void parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn);

 private:
  struct Job;
  void worker();
  void run_tasks(const std::shared_ptr<Job>& job);

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;  // calls with tasks nobody has claimed yet
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace uop
