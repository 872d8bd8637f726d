// A process's memory as the kernel reports it (/proc/PID/status), for e2e tests that hold
// a server to a memory bound.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

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

}  // namespace uop::testing
