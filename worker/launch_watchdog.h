// Ends launches that must not go on: past their deadline, or when their caller went away.
// Each launch is watched while it runs (a Watch on the launching thread's stack). One
// thread, awake only while launches run (and a moment after, so back-to-back launches do
// not wake it each time), looks at them every tick and, for one that must end, sets its
// stop word: a CPU kernel reads it at its loop headers and returns (compiler/codegen/
// stop_checks.h), its tasks with it, and the launch fails with DEADLINE_EXCEEDED or
// CANCELLED while the worker goes on serving.
//
// Code that does not read the word (a CUSTOM call that blocks, a CUDA kernel, an older
// artifact) cannot be stopped from outside: a thread cannot be unwound or cancelled in
// the middle of foreign code without leaving its locks and the heap in an unknown state,
// and a GPU kernel holds its context until it ends. So a launch still running `grace`
// after its word was set ends the process (on_stuck, by default _exit with
// kExitStuckLaunch): the scheduler sees its worker exit, fails what ran on it with
// UNAVAILABLE naming it, and starts it again. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace uop {

// uop-worker's exit status after a launch would not stop (worker/main.cc).
inline constexpr int kExitStuckLaunch = 5;

struct LaunchWatchdogOptions {
  absl::Duration tick = absl::Milliseconds(10);  // how often running launches are looked at
  absl::Duration grace = absl::Seconds(3);       // from the stop word set to on_stuck
  absl::Duration linger = absl::Seconds(1);      // awake this long after the last launch
  // Called on the watchdog's thread with the stuck launch's description; it should not
  // return. Default: a line on stderr, then _exit(kExitStuckLaunch).
  std::function<void(const std::string& what)> on_stuck;
};

class LaunchWatchdog {
 public:
  explicit LaunchWatchdog(LaunchWatchdogOptions options = {});
  ~LaunchWatchdog();
  LaunchWatchdog(const LaunchWatchdog&) = delete;
  LaunchWatchdog& operator=(const LaunchWatchdog&) = delete;

  // One launch, watched from construction to destruction. `what` names it in messages;
  // `cancelled` (may be null; must outlive the Watch) says whether the caller went away.
  class Watch {
   public:
    Watch(LaunchWatchdog& dog, std::string what, absl::Time deadline, const std::function<bool()>* cancelled);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // The launch's stop word: 0 while it may run.
    const std::atomic<uint32_t>* word() const { return &word_; }
    // OK while the word is clear; else DEADLINE_EXCEEDED or CANCELLED saying why.
    absl::Status status() const;

   private:
    friend class LaunchWatchdog;
    LaunchWatchdog& dog_;
    const std::string what_;
    const absl::Time deadline_;
    const std::function<bool()>* const cancelled_;
    const absl::Time started_ = absl::Now();
    std::atomic<uint32_t> word_{0};  // a Reason
    absl::Time stopped_at_;          // the watchdog's, under its lock
  };

 private:
  enum Reason : uint32_t { kRunning = 0, kDeadline = 1, kCancelled = 2 };
  void loop();

  const LaunchWatchdogOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Watch*> watches_;
  bool sleeping_ = false;  // waiting for a launch, not ticking
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace uop
