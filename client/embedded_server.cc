// EmbeddedServer: fork + exec of uopd with its stdout on a pipe (read by one thread that
// looks for the LISTENING line and then keeps draining, so a chatty server never blocks on
// a full pipe) and its stderr in an unlinked temporary file. See embedded_server.h.
#include "client/embedded_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "compiler/support/strings.h"

namespace uop::client {

std::optional<std::string> parse_listening_line(std::string_view line, std::string_view kPrefix) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  if (line.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view addr = line.substr(kPrefix.size());
  auto colon = addr.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == addr.size()) return std::nullopt;
  for (char c : addr.substr(colon + 1))
    if (c < '0' || c > '9') return std::nullopt;
  if (addr.find(' ') != std::string_view::npos) return std::nullopt;
  return std::string(addr);
}

namespace {

bool is_executable(const std::string& path) {
  struct stat st;
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

absl::StatusOr<std::string> find_uopd(const std::string& flag, const std::string& self_exe, const char* path_env) {
  if (!flag.empty()) {
    if (is_executable(flag)) return flag;
    return absl::NotFoundError(cat("--uopd=", flag, " is not an executable file"));
  }
  std::vector<std::string> looked;
  if (!self_exe.empty()) {
    namespace fs = std::filesystem;
    std::string beside = (fs::path(self_exe).parent_path() / ".." / "server" / "uopd").lexically_normal().string();
    if (is_executable(beside)) return beside;
    looked.push_back(beside);
  }
  std::string_view path = path_env ? path_env : "";
  while (!path.empty()) {
    auto colon = path.find(':');
    std::string_view dir = path.substr(0, colon);
    path = colon == std::string_view::npos ? std::string_view() : path.substr(colon + 1);
    std::string candidate = cat(dir.empty() ? std::string_view(".") : dir, "/uopd");
    if (is_executable(candidate)) return candidate;
  }
  looked.push_back("PATH");
  return absl::NotFoundError(cat("no uopd found (looked at ", join(looked, ", "), "); give --uopd=PATH"));
}

absl::StatusOr<std::unique_ptr<EmbeddedServer>> EmbeddedServer::start(const std::string& uopd_path,
                                                                       const std::vector<std::string>& extra_args,
                                                                       absl::Duration timeout) {
  std::unique_ptr<EmbeddedServer> s(new EmbeddedServer());  // its destructor cleans up any failure below

  // Everything the child needs is prepared before fork(): after it, only async-signal-safe
  // calls, since gRPC (or a test) may have threads holding locks at the moment of the fork.
  // A private server takes no fixed port: no metrics endpoint (9464 by default).
  std::vector<std::string> args = {uopd_path, "--listen=127.0.0.1:0", "--metrics-listen="};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string exec_failed = cat("uop: cannot execute ", uopd_path, "\n");

  const char* tmpdir = std::getenv("TMPDIR");
  std::string log_name = cat(tmpdir && *tmpdir ? tmpdir : "/tmp", "/uopd-log-XXXXXX");
  s->log_fd_ = ::mkostemp(log_name.data(), O_CLOEXEC);
  if (s->log_fd_ < 0) return absl::InternalError(cat("cannot create a log file in ", log_name, ": ", std::strerror(errno)));
  ::unlink(log_name.c_str());
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(cat("pipe: ", std::strerror(errno)));
  s->stdout_fd_ = out[0];
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[1]);
    if (devnull >= 0) ::close(devnull);
    return absl::InternalError(cat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the parent died before prctl took effect
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(s->log_fd_, 2);
    ::execv(argv[0], argv.data());
    ssize_t ignored = ::write(2, exec_failed.data(), exec_failed.size());
    (void)ignored;
    ::_exit(127);
  }
  // Also set from this side, so a stop() right away cannot miss the group.
  ::setpgid(pid, pid);
  s->pid_ = pid;
  ::close(out[1]);
  if (devnull >= 0) ::close(devnull);
  s->reader_ = std::thread([p = s.get()] { p->drain_stdout(); });

  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  std::string failure;
  {
    std::unique_lock<std::mutex> lock(s->mu_);
    while (!s->listening_) {
      if (s->stdout_closed_ || s->exited_unreaped()) {
        failure = cat("uopd (", uopd_path, ") exited before it was listening");
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        failure = cat("uopd (", uopd_path, ") printed no LISTENING line within ", absl::FormatDuration(timeout));
        break;
      }
      s->cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
    if (s->listening_) s->address_ = *s->listening_;
    s->internal_address_ = s->internal_;
  }
  if (!failure.empty()) {
    absl::Status st = s->stop(absl::Seconds(1));
    std::string log = s->log_tail();
    if (!st.ok()) failure += cat(" (", st.message(), ")");
    if (!log.empty()) failure += cat("; its log ends:\n", log);
    return absl::UnavailableError(failure);
  }
  return s;
}

EmbeddedServer::~EmbeddedServer() {
  (void)stop();
  if (reader_.joinable()) {
    stop_reader_ = true;
    reader_.join();
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  if (log_fd_ >= 0) ::close(log_fd_);
}

void EmbeddedServer::drain_stdout() {
  std::string pending;
  bool found = false;
  while (!stop_reader_) {
    pollfd p{stdout_fd_, POLLIN, 0};
    int r = ::poll(&p, 1, 100);  // wakes up now and then to notice stop_reader_
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (r == 0) continue;
    char buf[4096];
    ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // EOF: the child (and everything it started) closed stdout
    if (found) continue;  // after LISTENING, stdout is only drained
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; !found && (nl = pending.find('\n')) != std::string::npos;) {
      std::string_view line = std::string_view(pending).substr(0, nl);
      std::optional<std::string> addr = parse_listening_line(line);
      if (std::optional<std::string> internal = parse_listening_line(line, "INTERNAL ")) {
        std::lock_guard<std::mutex> lock(mu_);
        internal_ = std::move(*internal);
      }
      pending.erase(0, nl + 1);
      if (addr) {
        found = true;
        std::lock_guard<std::mutex> lock(mu_);
        listening_ = std::move(addr);
        cv_.notify_all();
      }
    }
    if (pending.size() > (64u << 10)) pending.clear();  // an endless line is not ours
  }
  std::lock_guard<std::mutex> lock(mu_);
  stdout_closed_ = true;
  cv_.notify_all();
}

bool EmbeddedServer::exited_unreaped() {
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno != EINTR;
  return info.si_pid == pid_;
}

absl::Status EmbeddedServer::stop(absl::Duration grace) {
  if (stopped_ || pid_ <= 0) return absl::OkStatus();
  stopped_ = true;
  bool killed = false;
  if (!exited_unreaped()) {
    ::kill(pid_, SIGTERM);
    const auto until = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(grace);
    while (!exited_unreaped() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!exited_unreaped()) {
      ::kill(pid_, SIGKILL);
      killed = true;
    }
  }
  // While uopd is an unreaped zombie its pid (and so its group id) cannot be reused, so
  // this reaches only what it started and left behind.
  ::kill(-pid_, SIGKILL);
  absl::Status st = reap();
  if (killed)
    return absl::InternalError(
        cat("uopd (pid ", pid_, ") did not stop within ", absl::FormatDuration(grace), " of SIGTERM; killed"));
  return st;
}

absl::Status EmbeddedServer::reap() {
  int status = 0;
  pid_t r;
  do r = ::waitpid(pid_, &status, 0);
  while (r < 0 && errno == EINTR);
  if (r < 0) return absl::OkStatus();  // already reaped by someone else: nothing to judge
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) return absl::OkStatus();
  if (WIFEXITED(status)) return absl::InternalError(cat("uopd exited with status ", WEXITSTATUS(status)));
  return absl::InternalError(cat("uopd was killed by signal ", WTERMSIG(status), " (", ::strsignal(WTERMSIG(status)), ")"));
}

std::string EmbeddedServer::log_tail(size_t max_bytes) const {
  if (log_fd_ < 0) return "";
  struct stat st;
  if (::fstat(log_fd_, &st) != 0 || st.st_size <= 0) return "";
  size_t size = static_cast<size_t>(st.st_size);
  size_t n = std::min(size, max_bytes);
  std::string out(n, '\0');
  ssize_t got = ::pread(log_fd_, out.data(), n, static_cast<off_t>(size - n));
  out.resize(got > 0 ? static_cast<size_t>(got) : 0);
  // Start at a whole line when the tail cut one.
  if (n < size)
    if (auto nl = out.find('\n'); nl != std::string::npos) out.erase(0, nl + 1);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace uop::client
