#include "worker/launch_watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "compiler/support/strings.h"

namespace uop {
namespace {

void exit_stuck(const std::string& what) {
  std::string line = cat("uop-worker[", static_cast<int64_t>(getpid()), "] ", what,
                         "; exiting (status ", kExitStuckLaunch, ") so that the scheduler starts this worker again\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  _exit(kExitStuckLaunch);
}

}  // namespace

LaunchWatchdog::LaunchWatchdog(LaunchWatchdogOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { loop(); });
}

LaunchWatchdog::~LaunchWatchdog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

LaunchWatchdog::Watch::Watch(LaunchWatchdog& dog, std::string what, absl::Time deadline,
                             const std::function<bool()>* cancelled)
    : dog_(dog), what_(std::move(what)), deadline_(deadline), cancelled_(cancelled && *cancelled ? cancelled : nullptr) {
  std::lock_guard lock(dog_.mu_);
  dog_.watches_.push_back(this);
  if (dog_.sleeping_) dog_.cv_.notify_one();
}

LaunchWatchdog::Watch::~Watch() {
  std::lock_guard lock(dog_.mu_);
  dog_.watches_.erase(std::find(dog_.watches_.begin(), dog_.watches_.end(), this));
}

absl::Status LaunchWatchdog::Watch::status() const {
  switch (word_.load(std::memory_order_acquire)) {
    case kRunning: return absl::OkStatus();
    case kDeadline:
      return absl::DeadlineExceededError(
          cat("stopped at its deadline, after ", absl::FormatDuration(absl::Trunc(deadline_ - started_, absl::Milliseconds(1))),
              " of running"));
    default: return absl::CancelledError("stopped: the caller went away");
  }
}

void LaunchWatchdog::loop() {
  std::unique_lock lock(mu_);
  absl::Time last_busy = absl::Now();
  while (!stopping_) {
    if (watches_.empty() && absl::Now() - last_busy >= options_.linger) {
      sleeping_ = true;
      cv_.wait(lock, [&] { return stopping_ || !watches_.empty(); });
      sleeping_ = false;
    } else {
      cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.tick));
    }
    const absl::Time now = absl::Now();
    if (!watches_.empty()) last_busy = now;
    for (Watch* w : watches_) {
      if (w->word_.load(std::memory_order_relaxed) == kRunning) {
        Reason why = now >= w->deadline_ ? kDeadline : w->cancelled_ && (*w->cancelled_)() ? kCancelled : kRunning;
        if (why == kRunning) continue;
        w->stopped_at_ = now;
        w->word_.store(why, std::memory_order_release);
      } else if (now - w->stopped_at_ >= options_.grace) {
        std::string what = cat(w->what_, " did not stop within ", absl::FormatDuration(options_.grace), " of being told to (",
                               w->status().message(), ")");
        if (options_.on_stuck) options_.on_stuck(what);
        else exit_stuck(what);
        w->stopped_at_ = absl::InfiniteFuture();  // reported once, when on_stuck returns at all
      }
    }
  }
}

}  // namespace uop
