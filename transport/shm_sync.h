// Waiting across processes on words of a MAP_SHARED mapping, and telling whether a peer
// process is still there: what the shared-memory collectives (worker/collectives/shm_ring.cc)
// and the execute lane (exec_lane.cc) both synchronize with.
#pragma once

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>

namespace uop::shm {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "a futex word must be a plain 32-bit word");

// Sleeps while *word == expected, at most `slice` (a wake, a change or a signal may end it
// sooner; callers re-check). Not FUTEX_PRIVATE: the waker is another process.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds slice) {
  if (slice.count() <= 0) return;
  timespec ts{static_cast<time_t>(slice.count() / 1000000000), static_cast<long>(slice.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// -1 where the kernel has no pidfd_open or the process is gone already.
inline int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// True once the process has exited, even before it is reaped: a pidfd polls readable then.
// Without a pidfd (-1), kill(pid, 0), which sees a zombie as alive.
inline bool process_exited(int pidfd, pid_t pid) {
  if (pidfd >= 0) {
    pollfd pfd{pidfd, POLLIN, 0};
    return poll(&pfd, 1, 0) > 0;
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace uop::shm
