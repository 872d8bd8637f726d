// Test helpers for the compile cache: a scratch directory, cache keys, cluster keys, an
// entry in the old (checksummed, unauthenticated) format as a forger would write it, and
// RedisServer, which runs a real redis-server on a free loopback port for one test (plain
// or TLS, with a password or ACL users if asked) and stops it by PID.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compiler/ir/digest.h"
#include "compiler/support/strings.h"
#include "server/cache/cluster_key.h"
#include "server/cache/redis_client.h"

namespace uop::testing {

// A cache key (SHA-256 hex) derived from a readable name.
inline std::string key_of(std::string_view name) { return sha256(name).hex(); }

// A cluster key derived from a readable name (32 bytes).
inline ClusterKey cluster_key(std::string_view name = "test cluster") {
  std::string bytes = sha256(cat("cluster key: ", name)).hex().substr(0, 32);
  return *ClusterKey::from_bytes(bytes);
}

// A fresh --cache-key-file at `path`: 32 random bytes, mode 0600. Returns `path`.
inline std::string write_cache_key_file(const std::string& path) {
  std::random_device rd;
  std::string bytes;
  while (bytes.size() < 32) bytes.push_back(static_cast<char>(rd()));
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    (void)!::write(fd, bytes.data(), bytes.size());
    ::fchmod(fd, 0600);
    ::close(fd);
  }
  return path;
}

// An entry as the previous format stored it, and as anyone who can write the cache
// directory or Redis can make it without a key: "UOPDCACHE1" | key | SHA-256(payload) |
// length (u64 LE) | payload.
inline std::string checksummed_entry(std::string_view hex_key, std::string_view payload) {
  std::string out = "UOPDCACHE1";
  for (size_t i = 0; i + 1 < hex_key.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(std::string(hex_key.substr(i, 2)), nullptr, 16)));
  Digest d = sha256(payload);
  out.append(reinterpret_cast<const char*>(d.bytes.data()), d.bytes.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((uint64_t{payload.size()} >> (8 * i)) & 0xff));
  out.append(payload);
  return out;
}

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

// A CA, a certificate it signs for 127.0.0.1 and localhost (for servers and clients
// alike), and an unrelated CA: made with the openssl command in a scratch directory.
class TestCerts {
 public:
  TestCerts() { ok_ = make("ca", "") && make("leaf", "ca") && make("rogue-ca", ""); }
  bool ok() const { return ok_; }
  std::string pem(const std::string& name) const { return cat(dir_.path(), "/", name, ".pem"); }
  std::string key(const std::string& name) const { return cat(dir_.path(), "/", name, ".key"); }

 private:
  // A self-signed CA when `ca` is empty; otherwise a leaf that `ca` signs.
  bool make(const std::string& name, const std::string& ca) {
    std::string cmd = cat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=",
                          name, " -keyout ", key(name), " -out ", pem(name));
    if (!ca.empty())
      cmd += cat(" -CA ", pem(ca), " -CAkey ", key(ca), " -addext subjectAltName=IP:127.0.0.1,DNS:localhost",
                 " -addext basicConstraints=critical,CA:FALSE -addext extendedKeyUsage=serverAuth,clientAuth");
    return std::system(cat(cmd, " >/dev/null 2>&1").c_str()) == 0;
  }
  ScratchDir dir_;
  bool ok_ = false;
};

inline constexpr const char* kRedisServer = "/usr/bin/redis-server";

class RedisServer {
 public:
  struct Config {
    std::vector<std::string> args;  // more redis-server arguments (--requirepass, --user, TLS files)
    bool tls = false;               // listen with --tls-port only (the TLS files go in args)
    // How the fixture's own connection (readiness, raw()) reaches it: credentials and
    // TLS settings; host and port are filled in.
    RedisEndpoint admin;
  };

  static bool installed() { return ::access(kRedisServer, X_OK) == 0; }

  RedisServer() = default;
  explicit RedisServer(Config config) : config_(std::move(config)) {}
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

  // The fixture's own endpoint (its credentials and TLS settings, this server's port).
  RedisEndpoint endpoint() const {
    RedisEndpoint e = config_.admin;
    e.host = "127.0.0.1";
    e.port = port_;
    return e;
  }

  // One command on a fresh connection of the fixture's own, for tests that poke at values
  // by hand: the reply as text ("" for nil, the number for an integer, "ERR: message" for
  // an error reply, an array's strings one a line (KEYS), "FAILED: status" when no reply
  // came).
  std::string raw(std::vector<std::string> args) const {
    auto connector = RedisConnector::create(endpoint());
    if (!connector.ok()) return cat("FAILED: ", connector.status().ToString());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    auto conn = connector->connect(deadline);
    if (!conn.ok()) return cat("FAILED: ", conn.status().ToString());
    std::vector<std::string_view> argv(args.begin(), args.end());
    auto r = (*conn)->command(argv, deadline);
    if (!r.ok()) return cat("FAILED: ", r.status().ToString());
    switch (r->type) {
      case RedisReply::Type::Integer: return std::to_string(r->integer);
      case RedisReply::Type::Error: return cat("ERR: ", r->str);
      case RedisReply::Type::Nil: return "";
      case RedisReply::Type::Array: {
        std::string lines;
        for (const RedisReply& e : r->elements) lines += cat(lines.empty() ? "" : "\n", e.str);
        return lines;
      }
      default: return r->str;
    }
  }

 private:
  bool launch(int port) {
    std::string port_s = std::to_string(port);
    std::vector<std::string> args = {kRedisServer, "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"};
    for (const std::string& a : config_.tls ? std::vector<std::string>{"--port", "0", "--tls-port", port_s}
                                            : std::vector<std::string>{"--port", port_s})
      args.push_back(a);
    for (const std::string& a : config_.args) args.push_back(a);
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
      if (raw({"PING"}) == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
    return false;
  }

  Config config_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace uop::testing
