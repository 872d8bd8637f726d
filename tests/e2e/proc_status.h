// A process's memory and CPU time as the kernel reports them (/proc/PID/status and stat),
// for e2e tests that hold a server to a memory bound or wait for a kernel to run.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace uop::testing {

// VmRSS and VmHWM (the peak RSS) of a process, in KiB (0 when it is gone).
inline std::pair<uint64_t, uint64_t> memory_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  uint64_t rss = 0, hwm = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6));
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::stoull(line.substr(6));
  }
  return {rss, hwm};
}

// User plus system CPU time of a process, in clock ticks (/proc/PID/stat fields 14, 15);
// -1 when it is gone.
inline int64_t cpu_ticks(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return utime + stime;
}

// CPU time that `pids` used together since `since` (their cpu_ticks summed, taken before
// the work was sent), polled until it reaches `cpu`: how a test knows that a kernel runs
// in one of them, since an idle worker uses none. False after `limit`, or when one is gone.
inline bool burned(std::initializer_list<int64_t> pids, int64_t since, absl::Duration cpu = absl::Milliseconds(200),
                   absl::Duration limit = absl::Seconds(60)) {
  const double want = absl::ToDoubleSeconds(cpu) * static_cast<double>(sysconf(_SC_CLK_TCK));
  for (absl::Time until = absl::Now() + limit; absl::Now() < until; absl::SleepFor(absl::Milliseconds(10))) {
    int64_t total = 0;
    for (int64_t pid : pids) {
      const int64_t t = cpu_ticks(pid);
      if (t < 0) return false;
      total += t;
    }
    if (static_cast<double>(total - since) >= want) return true;
  }
  return false;
}

// cpu_ticks of `pids` together: the `since` of burned().
inline int64_t cpu_ticks(std::initializer_list<int64_t> pids) {
  int64_t total = 0;
  for (int64_t pid : pids) total += cpu_ticks(pid);
  return total;
}

}  // namespace uop::testing
