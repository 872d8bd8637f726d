// A private uopd for the length of one command (`uop --embedded`) or one test: started as
// a child process on an ephemeral loopback port, stopped (SIGTERM, a grace period, then
// SIGKILL) when this object goes, with nothing left behind.
//
// The contract with uopd (the same one uop-worker follows): started with
// `--listen=127.0.0.1:0 --metrics-listen=` (a private server binds no fixed port, so
// no Prometheus endpoint), it prints one line `LISTENING <host>:<port>` on stdout once it
// accepts connections. Its stderr goes to an unlinked temporary file, so its log stays
// out of the command's output yet can be shown when it fails (log_tail()).
//
// The child runs in its own process group (stop() sweeps the group, so workers uopd
// started do not outlive it) and gets SIGTERM if the thread that started it dies
// (PR_SET_PDEATHSIG), so even a `uop` killed by a signal leaves no orphan. Start it from a
// thread that lives as long as the server should.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace uop::client {

class EmbeddedServer {
 public:
  // Starts `uopd_path --listen=127.0.0.1:0 --metrics-listen= [extra_args...]` and waits up
  // to `timeout` for its LISTENING line. UNAVAILABLE with the end of its log if it exits
  // or stays silent.
  static absl::StatusOr<std::unique_ptr<EmbeddedServer>> start(const std::string& uopd_path,
                                                               const std::vector<std::string>& extra_args = {},
                                                               absl::Duration timeout = absl::Seconds(30));
  ~EmbeddedServer();
  EmbeddedServer(const EmbeddedServer&) = delete;
  EmbeddedServer& operator=(const EmbeddedServer&) = delete;

  const std::string& address() const { return address_; }  // HOST:PORT from its LISTENING line
  // HOST:PORT of its internal services (worker Registry, Rendezvous), from the INTERNAL
  // line it prints before LISTENING; empty if it printed none.
  const std::string& internal_address() const { return internal_address_; }
  pid_t pid() const { return pid_; }

  // SIGTERM, up to `grace` for it to exit, then SIGKILL; then SIGKILL whatever is left of
  // its process group. OK if it exited by itself or on SIGTERM with status 0 or SIGTERM;
  // INTERNAL naming the exit status otherwise. Idempotent.
  absl::Status stop(absl::Duration grace = absl::Seconds(5));

  // The last `max_bytes` of its stderr, for messages when something went wrong.
  std::string log_tail(size_t max_bytes = 4096) const;

 private:
  EmbeddedServer() = default;
  void drain_stdout();        // the reader thread: collects lines, finds LISTENING
  bool exited_unreaped();     // the child is a zombie (or gone): waitid with WNOWAIT
  absl::Status reap();        // waitpid, and the verdict on its exit status

  pid_t pid_ = -1;
  bool stopped_ = false;
  int stdout_fd_ = -1;  // read end of the child's stdout
  int log_fd_ = -1;     // the child's stderr (unlinked temporary file)
  std::string address_, internal_address_;

  std::thread reader_;
  std::atomic<bool> stop_reader_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> listening_;  // guarded by mu_
  std::string internal_;                  // guarded by mu_
  bool stdout_closed_ = false;            // guarded by mu_
};

// "LISTENING 127.0.0.1:4242" -> "127.0.0.1:4242"; nullopt for any other line. Another
// prefix reads other lines of that form ("INTERNAL 127.0.0.1:4243").
std::optional<std::string> parse_listening_line(std::string_view line, std::string_view prefix = "LISTENING ");

// The uopd to start: `flag` (--uopd=PATH) when given; else `server/uopd` beside the
// directory of this executable (the build tree: build/client/uop -> build/server/uopd);
// else the first `uopd` on PATH. NOT_FOUND saying where it looked otherwise.
absl::StatusOr<std::string> find_uopd(const std::string& flag, const std::string& self_exe, const char* path_env);

}  // namespace uop::client
