// A process as the kernel reports it (/proc/PID/...), for e2e tests that hold a server to
// a memory bound, wait for a kernel to run or for its workers to stop burning a core, or
// look for its workers' ports as a local user could.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
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

// The processes whose parent is `pid` now (a server's workers).
inline std::vector<int64_t> child_pids(int64_t pid) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::vector<std::string> f = stat_fields(std::stoll(name));
    if (f.size() > 1 && f[1] == std::to_string(pid)) out.push_back(std::stoll(name));  // field 4: the parent
  }
  return out;
}

// The TCP ports a process listens on: its sockets (/proc/PID/fd) found among the
// listening ones of the kernel's tables (/proc/PID/net/tcp, tcp6), as a local user who
// looks for them would find them.
inline std::vector<int> listening_ports(int64_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(e.path(), link_ec).string();
    if (!link_ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<int> ports;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      std::istringstream f(line);
      std::string field[10];
      for (std::string& x : field) f >> x;
      if (field[3] != "0A" || !inodes.count(field[9])) continue;  // 0A: LISTEN
      ports.push_back(std::stoi(field[1].substr(field[1].rfind(':') + 1), nullptr, 16));
    }
  }
  return ports;
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
