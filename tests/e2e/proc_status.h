// A process as the kernel reports it (/proc/PID/status, /proc/PID/stat), for e2e tests
// that hold a server to a memory bound, or its workers to not burning a core.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/e2e/worker_proc.h"

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

// /proc/PID/stat's fields after the command (which may hold spaces and parentheses):
// fields[0] is field 3 (the state). Empty when the process is gone.
inline std::vector<std::string> stat_fields(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos || close + 2 > line.size()) return fields;
  std::istringstream rest(line.substr(close + 2));
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

// User plus system CPU time of a process, in clock ticks (/proc/PID/stat fields 14, 15);
// -1 when it is gone.
inline int64_t cpu_ticks(int64_t pid) {
  std::vector<std::string> f = stat_fields(pid);
  if (f.size() < 13) return -1;
  return std::stoll(f[11]) + std::stoll(f[12]);
}

// Waits until the process has used less than a quarter of a core over a whole second: a
// kernel still running would use all of one. A process that is gone burns nothing.
inline bool stops_burning(int64_t pid) {
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  absl::Time since = absl::Now();
  int64_t ticks = cpu_ticks(pid);
  return wait_until([&] {
    const absl::Time now = absl::Now();
    if (now - since < absl::Seconds(1)) return false;
    const int64_t t = cpu_ticks(pid);
    if (t < 0) return true;
    const bool idle = static_cast<double>(t - ticks) < 0.25 * hz * absl::ToDoubleSeconds(now - since);
    since = now;
    ticks = t;
    return idle;
  }, absl::Seconds(30));
}

}  // namespace uop::testing
