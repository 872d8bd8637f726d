// RedisTier: the compile cache tier shared by a cluster of uopd servers. Values use the
// authenticated entry format of cache_entry.h under the cluster key, so a value written by
// anyone who lacks the key (Redis is often reachable by more than the schedulers) is
// refused, deleted and counted, never served. Redis is an optimization: any failure is an
// error status the caller counts as a miss, and after a connection failure the tier
// answers UNAVAILABLE at once for a short backoff instead of adding a timeout to every
// request while Redis is down. The connection may use TLS and AUTH (redis_client.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "compiler/support/clock.h"
#include "server/cache/cache_entry.h"
#include "server/cache/cache_tier.h"
#include "server/cache/redis_client.h"

namespace uop {

class RedisTier : public CacheTier {
 public:
  struct Options {
    // Bounds connecting (TCP, TLS handshake and AUTH together) and, apart from it, each
    // command's whole exchange; not DNS resolution (give an address if that matters).
    int timeout_ms = 250;
    // After a connection or I/O failure (or a refused AUTH), calls fail fast for this long
    // before reconnecting.
    int backoff_ms = 1000;
    // 0 = entries live until Redis evicts them (configure maxmemory-policy allkeys-lru).
    int64_t ttl_seconds = 0;
    // Namespaces the keys; the version part changes with the entry format.
    std::string key_prefix = "uopd:cache:v2:";
    // The largest entry read or written; a bigger reply is refused unread.
    int64_t max_entry_bytes = int64_t{256} << 20;
    // Times the backoff (not the I/O deadlines, which are the socket's real time); not
    // owned, outlives the tier.
    const Clock* clock = Clock::real();
  };

  // INVALID_ARGUMENT / FAILED_PRECONDITION for settings or TLS files that cannot work
  // (redis_client.h). Connects lazily, on the first call.
  static absl::StatusOr<std::unique_ptr<RedisTier>> create(RedisEndpoint endpoint, ClusterKey key,
                                                           Options options);
  ~RedisTier() override;

  std::string_view name() const override { return "redis"; }
  // UNAVAILABLE (naming host:port and the error) when Redis cannot be reached or answers
  // with an error; DATA_LOSS for a value that fails verification (the value is deleted).
  absl::StatusOr<std::optional<std::string>> get(std::string_view key) override;
  absl::Status put(std::string_view key, std::string_view value) override;
  absl::Status remove(std::string_view key) override;

  // SET name value NX PX ttl_ms: true when this call made `name` (a lease: server/tuner.h),
  // false when it exists already; UNAVAILABLE when Redis cannot say. `name` is used as it
  // is, outside the cache's key prefix.
  absl::StatusOr<bool> set_if_absent(std::string_view name, std::string_view value, int64_t ttl_ms);
  // The lease's holder renews and ends it: while `name` holds `token`, extend_if_holds sets
  // its time to live to ttl_ms (PEXPIRE) and remove_if_holds deletes it (DEL). Each is one
  // Lua script (EVAL), so the GET and what follows it are atomic: a lease that expired and
  // that another server took in between is never extended nor deleted by the one that lost
  // it. true when `name` held `token` (extended, removed), false when it is gone or holds
  // another value; UNAVAILABLE when Redis cannot say.
  absl::StatusOr<bool> extend_if_holds(std::string_view name, std::string_view token, int64_t ttl_ms);
  absl::StatusOr<bool> remove_if_holds(std::string_view name, std::string_view token);

  const std::string& address() const { return address_; }  // "host:port"
  std::string redis_key(std::string_view key) const { return cat(options_.key_prefix, key); }

 private:
  RedisTier(RedisConnector connector, ClusterKey key, Options options);

  // Runs one command; connects first if needed. Connection and I/O failures drop the
  // connection and start the backoff; an error reply leaves the connection alone, except
  // one saying the connection is not allowed (NOAUTH, WRONGPASS, NOPERM), which starts
  // the backoff too: it will not heal by retrying at once.
  absl::StatusOr<RedisReply> command(const std::vector<std::string_view>& args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status fail(std::string error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // EVAL of a script that answers 1 (it held) or 0 on the key `name`.
  absl::StatusOr<bool> eval_if_holds(std::string_view script, std::string_view name,
                                     const std::vector<std::string_view>& args);

  const RedisConnector connector_;
  const ClusterKey mac_key_;
  const Options options_;
  const std::string address_;

  absl::Mutex mu_;  // one connection, one command at a time
  std::unique_ptr<RedisConnection> conn_ ABSL_GUARDED_BY(mu_);
  absl::Time down_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // on options_.clock
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace uop
