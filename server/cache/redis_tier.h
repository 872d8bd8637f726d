// RedisTier: the compile cache tier shared by a cluster of uopd servers. Values use the
// verified entry format of cache_tier.h, so a value written by another server (or by hand)
// is served only if its header names this key and its SHA-256 matches. Redis is an
// optimization: any failure is an error status the caller counts as a miss, and after a
// connection failure the tier answers UNAVAILABLE at once for a short backoff instead of
// adding a timeout to every request while Redis is down.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/cache/cache_tier.h"

struct redisContext;
struct redisReply;

namespace uop {

class RedisTier : public CacheTier {
 public:
  struct Options {
    // Bounds connecting and each socket read/write of a command (not DNS resolution; give
    // an address if that matters).
    int timeout_ms = 250;
    // After a connection or I/O failure, calls fail fast for this long before reconnecting.
    int backoff_ms = 1000;
    // 0 = entries live until Redis evicts them (configure maxmemory-policy allkeys-lru).
    int64_t ttl_seconds = 0;
    // Namespaces the keys; the version part changes with the entry format.
    std::string key_prefix = "uopd:cache:v1:";
  };

  // Connects lazily, on the first call.
  RedisTier(std::string host, int port, int timeout_ms);
  RedisTier(std::string host, int port, Options options);
  ~RedisTier() override;

  std::string_view name() const override { return "redis"; }
  // UNAVAILABLE (naming host:port and the error) when Redis cannot be reached or answers
  // with an error; DATA_LOSS for a value that fails verification (the value is deleted).
  absl::StatusOr<std::optional<std::string>> get(std::string_view key) override;
  absl::Status put(std::string_view key, std::string_view value) override;

  const std::string& address() const { return address_; }  // "host:port"
  std::string redis_key(std::string_view key) const { return cat(options_.key_prefix, key); }

 private:
  struct ReplyDeleter {
    void operator()(redisReply* r) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

  // Runs one command; connects first if needed. Connection and I/O failures drop the
  // connection and start the backoff; an error reply leaves the connection alone.
  absl::StatusOr<Reply> command(const std::vector<std::string_view>& args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status connect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status fail(std::string error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void disconnect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string host_;
  const int port_;
  const Options options_;
  const std::string address_;

  absl::Mutex mu_;  // one connection, one command at a time
  redisContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::chrono::steady_clock::time_point down_until_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace uop
