// Test helpers for the compile cache: a scratch directory, cache keys, and RedisServer,
// which runs a real redis-server on a free loopback port for one test and stops it by PID.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "compiler/ir/digest.h"
#include "compiler/support/strings.h"

namespace uop::testing {

// A cache key (SHA-256 hex) derived from a readable name.
inline std::string key_of(std::string_view name) { return sha256(name).hex(); }

// A fresh directory under $TMPDIR, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = cat(base != nullptr ? base : "/tmp", "/uopd_cache_test.XXXXXX");
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~ScratchDir() {
    std::error_code ec;
    // Restore write permission first, in case a test made the tree read-only.
    for (auto& e : std::filesystem::recursive_directory_iterator(path_, ec))
      std::filesystem::permissions(e.path(), std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, ec);
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A loopback TCP port free right now (the kernel picks it), or -1.
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

inline constexpr const char* kRedisServer = "/usr/bin/redis-server";

class RedisServer {
 public:
  static bool installed() { return ::access(kRedisServer, X_OK) == 0; }

  ~RedisServer() { stop(); }

  // Starts redis-server on `port`, or on a free one when 0. Returns false if it did not
  // answer PING within a few seconds.
  bool start(int port = 0) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      int p = port != 0 ? port : free_port();
      if (p > 0 && launch(p)) return true;
      if (port != 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  // SIGTERM, then SIGKILL if it has not exited after `timeout`.
  void stop(std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);  // a paused server cannot handle SIGTERM
    ::kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }
  int port() const { return port_; }

  // A direct hiredis connection, for tests that poke at values by hand.
  redisContext* connect() const {
    struct timeval tv = {2, 0};
    return redisConnectWithTimeout("127.0.0.1", port_, tv);
  }

 private:

  bool launch(int port) {
    std::string port_s = std::to_string(port);
    std::vector<std::string> args = {kRedisServer, "--save", "", "--appendonly", "no",
                                     "--port", port_s, "--bind", "127.0.0.1"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      int devnull = ::open("/dev/null", O_RDWR);
      if (devnull >= 0) {
        ::dup2(devnull, 0);
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
      }
      ::chdir("/tmp");
      ::execv(kRedisServer, argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    port_ = port;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: port taken, say
        pid_ = -1;
        return false;
      }
      if (ping()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
    return false;
  }

  bool ping() const {
    redisContext* c = connect();
    bool ok = false;
    if (c != nullptr && c->err == 0) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      ok = r != nullptr && r->type == REDIS_REPLY_STATUS && std::string(r->str) == "PONG";
      if (r != nullptr) freeReplyObject(r);
    }
    if (c != nullptr) redisFree(c);
    return ok;
  }

  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace uop::testing
