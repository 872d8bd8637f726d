// A uop-worker process started by an e2e test itself (not by uopd): its LISTENING line
// read, killed and reaped when it goes out of scope, and dead with the test
// (PR_SET_PDEATHSIG) if the test crashes; and a cluster secret file for such workers and
// the schedulers they talk to. Shared by the tests of remote workers.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "compiler/support/strings.h"
#include "transport/cluster_auth.h"

namespace uop::testing {

// Polls `cond` until it holds (true) or `limit` passed (false): waits on processes and
// schedulers end on a condition, never on a fixed sleep.
inline bool wait_until(const std::function<bool()>& cond, absl::Duration limit = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + limit;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

// A fresh random secret in a file only its owner can read, removed with the object:
// `flag()` for uopd and uop-worker, `dialer()` for calls made by the test itself.
class ClusterSecret {
 public:
  ClusterSecret()
      : dir_(std::filesystem::temp_directory_path() / cat("uopd-secret-", static_cast<int64_t>(getpid()), "-", std::rand())),
        value_(cluster_auth::random_secret()) {
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "cluster-secret").string();
    std::ofstream(path_) << value_ << "\n";
    std::filesystem::permissions(path_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  ~ClusterSecret() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ClusterSecret(const ClusterSecret&) = delete;
  ClusterSecret& operator=(const ClusterSecret&) = delete;
  const std::string& path() const { return path_; }
  const std::string& value() const { return value_; }
  std::string flag() const { return "--cluster-secret-file=" + path_; }
  cluster_auth::Dialer dialer() const {
    cluster_auth::Dialer d;
    d.secret = value_;
    return d;
  }

 private:
  std::filesystem::path dir_;
  std::string path_, value_;
};

// One secret for a whole test binary: its schedulers, its workers, its own calls.
inline const ClusterSecret& test_secret() {
  static const ClusterSecret* s = new ClusterSecret();  // never destroyed: children may outlive the tests
  return *s;
}

struct WorkerProc {
  pid_t pid = -1;
  std::string address;  // HOST:PORT from the LISTENING line
  WorkerProc() = default;
  WorkerProc(const WorkerProc&) = delete;
  WorkerProc& operator=(const WorkerProc&) = delete;
  ~WorkerProc() { kill_now(); }
  void kill_now() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  bool running() const { return pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0; }
};

// Starts `binary flags...` with stdout on a pipe and waits (up to 30 s) for its first
// line, which must be "LISTENING HOST:PORT". Fails the test (ASSERT) otherwise. Its
// stderr goes to `log` when one is named.
inline void spawn_worker(const std::string& binary, const std::vector<std::string>& flags, WorkerProc* p,
                         const std::string& log = "") {
  std::vector<std::string> args = {binary};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  pid_t parent = getpid();
  p->pid = fork();
  if (p->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    dup2(out[1], STDOUT_FILENO);
    if (!log.empty()) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd >= 0) dup2(fd, STDERR_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string got;
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (got.find('\n') == std::string::npos && absl::Now() < deadline) {
    pollfd pfd{out[0], POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  ASSERT_EQ(got.rfind("LISTENING ", 0), 0u) << got;
  p->address = got.substr(10, got.find('\n') - 10);
}

}  // namespace uop::testing
