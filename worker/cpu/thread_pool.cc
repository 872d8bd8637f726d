// Tasks are claimed from a shared counter per call, so a call with many tasks spreads
// over every idle thread and a thread that finds a call exhausted moves to the next.
#include "worker/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace uop {

struct ThreadPool::Job {
  const std::function<void(int64_t)>* fn;
  int64_t n;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> remaining;
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  Job(const std::function<void(int64_t)>* f, int64_t count) : fn(f), n(count), remaining(count) {}
};

ThreadPool::ThreadPool(int n) : size_(std::max(1, n)) {
  threads_.reserve(size_ - 1);
  for (int i = 1; i < size_; ++i) threads_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::run_tasks(const std::shared_ptr<Job>& job) {
  for (int64_t i; (i = job->next.fetch_add(1, std::memory_order_relaxed)) < job->n;) {
    (*job->fn)(i);
    if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(job->mu);
      job->done = true;
      job->done_cv.notify_all();
    }
  }
  // Every task is claimed: nobody else needs to find this job.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(jobs_.begin(), jobs_.end(), job);
  if (it != jobs_.end()) jobs_.erase(it);
}

void ThreadPool::worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping
      job = jobs_.front();
    }
    run_tasks(job);
  }
}

void ThreadPool::parallel_for(int64_t ntasks, const std::function<void(int64_t)>& fn) {
  if (ntasks <= 0) return;
  if (ntasks == 1 || threads_.empty()) {
    for (int64_t i = 0; i < ntasks; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>(&fn, ntasks);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
  }
  if (ntasks - 1 >= static_cast<int64_t>(threads_.size())) cv_.notify_all();
  else for (int64_t i = 0; i < ntasks - 1; ++i) cv_.notify_one();
  run_tasks(job);
  std::unique_lock<std::mutex> lock(job->mu);
  job->done_cv.wait(lock, [&] { return job->done; });
}

}  // namespace uop
