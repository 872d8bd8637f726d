// fork/exec/waitpid for WorkerPool. Everything the child touches is prepared before fork.
#include "server/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "compiler/support/strings.h"

namespace uop {

namespace {

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return abbrev ? cat("killed by signal ", sig, " (SIG", abbrev, ")") : cat("killed by signal ", sig);
  }
  if (WIFEXITED(status)) return cat("exited with status ", WEXITSTATUS(status));
  return cat("ended with wait status ", status);
}

void close_pair(int fds[2]) {
  close(fds[0]);
  close(fds[1]);
}

}  // namespace

absl::StatusOr<ChildProcess> spawn_child(const std::vector<std::string>& args, const std::vector<int>& inherit) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (argv.size() < 2) return absl::InvalidArgumentError("no program to run");

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(cat("pipe: ", strerrordesc_np(errno)));
  if (pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    close_pair(out);
    return absl::InternalError(cat("pipe: ", strerrordesc_np(e)));
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // If the parent died before prctl took effect, nobody wants this worker any more.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(0);
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (dup2(out[1], STDOUT_FILENO) < 0) _exit(126);  // dup2 clears close-on-exec on fd 1
    // Only in this child: a worker forked meanwhile by another thread does not get them.
    for (int fd : inherit)
      if (fcntl(fd, F_SETFD, 0) != 0) _exit(126);
    execv(argv[0], argv.data());
    int e = errno;
    ssize_t ignored = write(err[1], &e, sizeof e);
    (void)ignored;
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    int e = errno;
    close(out[0]);
    close(err[0]);
    return absl::InternalError(cat("fork: ", strerrordesc_np(e)));
  }
  // The error pipe closes on a successful exec, or carries exec's errno.
  int e = 0;
  ssize_t n;
  do n = read(err[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  close(err[0]);
  if (n == static_cast<ssize_t>(sizeof e)) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    close(out[0]);
    return absl::FailedPreconditionError(cat("cannot run ", args[0], ": ", strerrordesc_np(e)));
  }
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  return ChildProcess{pid, out[0]};
}

absl::StatusOr<int> readable_pipe(std::string_view bytes) {
  if (bytes.size() > 65536) return absl::InvalidArgumentError("more than a pipe holds");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(cat("pipe: ", strerrordesc_np(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fds[1], bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      close_pair(fds);
      return absl::InternalError(cat("writing a pipe: ", strerrordesc_np(e)));
    }
    done += static_cast<size_t>(n);
  }
  close(fds[1]);
  return fds[0];
}

std::optional<std::string> reap_child(pid_t pid, bool block) {
  int status = 0;
  pid_t r;
  do r = waitpid(pid, &status, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return std::nullopt;
  if (r < 0) return std::string("vanished (it cannot be waited for)");
  return describe_exit(status);
}

}  // namespace uop
