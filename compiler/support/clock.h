// Clock: where code whose behaviour depends on the passage of time (a backoff, an expiry,
// a wait's deadline) reads the time, so that a test can move time itself instead of
// sleeping through it and asserting how long things took. Production code takes the real
// clock by default (Clock::real()); a test passes a ManualClock and advances it.
//
// Only what the code decides from the time goes through it. Waiting on a socket or a
// condition variable still happens in real time: such waits take durations computed from
// this clock, and a waiter that must notice a manual clock moving re-reads it when it
// wakes.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace uop {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time now() const = 0;

  // The system's clock (absl::Now()), shared by the process; never null.
  static const Clock* real();
};

class RealClock final : public Clock {
 public:
  absl::Time now() const override { return absl::Now(); }
};

inline const Clock* Clock::real() {
  static const RealClock clock;
  return &clock;
}

// A clock that moves only when told: now() is `start` plus what advance() added. Safe to
// read and advance from several threads.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000))
      : nanos_(absl::ToUnixNanos(start)) {}
  absl::Time now() const override { return absl::FromUnixNanos(nanos_.load(std::memory_order_acquire)); }
  void advance(absl::Duration d) { nanos_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel); }

 private:
  std::atomic<int64_t> nanos_;
};

}  // namespace uop
