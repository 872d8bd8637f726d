// A small synchronous Redis client for the cache's redis tier (and the tests that poke at
// Redis by hand): RESP2 over TCP, optionally TLS (OpenSSL, the server's certificate checked
// against a CA and a name), optionally AUTH as the default user or an ACL user. Every step
// runs against a deadline on a non-blocking socket, so a slow, silent or trickling server
// costs at most that long: a command's whole exchange is bounded, not each read. Replies
// are bounded too (max_reply_bytes), since the server is not trusted to send sane lengths.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace uop {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  // With a password, every connection starts with AUTH: `AUTH user password` for an ACL
  // user (Redis 6+), `AUTH password` for the default user (requirepass).
  std::string user;
  std::string password;
  struct Tls {
    bool enabled = false;
    std::string ca_file;    // PEM CAs the server's certificate must chain to; empty: the system's
    std::string cert_file;  // a client certificate and its key, for a server that asks for one
    std::string key_file;
    std::string server_name;  // the DNS name or IP address the certificate must carry; empty: host
  } tls;
  size_t max_reply_bytes = size_t{512} << 20;  // Redis's own cap on a string

  std::string address() const;  // "host:port"
};

struct RedisReply {
  enum class Type { Status, Error, Integer, Bulk, Nil, Array };
  Type type = Type::Nil;
  std::string str;  // Status, Error, Bulk
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // Array
};

using RedisDeadline = std::chrono::steady_clock::time_point;

// One open connection. A command that returns an error status (rather than an Error
// reply) has left the connection in an unknown state: drop it.
class RedisConnection {
 public:
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // UNAVAILABLE for a broken connection or a reply that is not RESP (or over the cap),
  // DEADLINE_EXCEEDED when the exchange did not finish in time. An error reply from Redis
  // is a reply of Type::Error.
  absl::StatusOr<RedisReply> command(const std::vector<std::string_view>& args,
                                     RedisDeadline deadline);

 private:
  friend class RedisConnector;
  RedisConnection(int fd, SSL* ssl, size_t max_reply_bytes)
      : fd_(fd), ssl_(ssl), max_reply_bytes_(max_reply_bytes) {}
  absl::Status wait(short events, RedisDeadline deadline);
  absl::Status write_all(std::string_view data, RedisDeadline deadline);
  absl::Status fill(RedisDeadline deadline);  // reads more bytes into in_
  absl::StatusOr<std::string> read_line(RedisDeadline deadline);
  absl::StatusOr<RedisReply> read_reply(RedisDeadline deadline, int depth);
  absl::Status handshake(RedisDeadline deadline);

  int fd_;
  SSL* ssl_;
  size_t max_reply_bytes_;
  std::string in_;  // received, not yet parsed
  size_t pos_ = 0;  // parsed up to here
};

// What to connect to and how, made once: TLS files are loaded here, so a missing CA or a
// key that does not match its certificate is an error at startup, not on every connect.
class RedisConnector {
 public:
  // INVALID_ARGUMENT / FAILED_PRECONDITION naming the file or setting that is wrong.
  static absl::StatusOr<RedisConnector> create(RedisEndpoint endpoint);

  // Connects, does the TLS handshake and AUTH, all before `deadline`. UNAVAILABLE (or
  // DEADLINE_EXCEEDED) saying which step failed; PERMISSION_DENIED when AUTH is refused.
  // Name resolution (getaddrinfo) is not bounded: give an address where that matters.
  absl::StatusOr<std::unique_ptr<RedisConnection>> connect(RedisDeadline deadline) const;

  const RedisEndpoint& endpoint() const { return endpoint_; }

 private:
  RedisEndpoint endpoint_;
  std::shared_ptr<SSL_CTX> tls_;
};

}  // namespace uop
