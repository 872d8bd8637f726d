// RedisTier over RedisConnection. One connection guarded by a mutex: lookups are one round
// trip, and the memory and disk tiers above absorb most of the traffic.
#include "server/cache/redis_tier.h"

namespace uop {
namespace {

using IoClock = std::chrono::steady_clock;  // the sockets' deadlines

bool refuses_access(const RedisReply& r) {
  std::string_view e = r.str;
  return e.starts_with("NOAUTH") || e.starts_with("WRONGPASS") || e.starts_with("NOPERM");
}

// KEYS[1] the lease, ARGV[1] the holder's token (ARGV[2] the time to live, ms). A GET of a
// missing key is false in Lua, never equal to a token.
constexpr std::string_view kExtendIfHolds =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
constexpr std::string_view kRemoveIfHolds =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

}  // namespace

absl::StatusOr<std::unique_ptr<RedisTier>> RedisTier::create(RedisEndpoint endpoint, ClusterKey key,
                                                             Options options) {
  // A reply bigger than the largest entry is not one, whatever Redis says it is.
  endpoint.max_reply_bytes = static_cast<size_t>(options.max_entry_bytes);
  absl::StatusOr<RedisConnector> connector = RedisConnector::create(std::move(endpoint));
  if (!connector.ok()) return connector.status();
  return std::unique_ptr<RedisTier>(
      new RedisTier(*std::move(connector), std::move(key), std::move(options)));
}

RedisTier::RedisTier(RedisConnector connector, ClusterKey key, Options options)
    : connector_(std::move(connector)),
      mac_key_(std::move(key)),
      options_(std::move(options)),
      address_(connector_.endpoint().address()) {}

RedisTier::~RedisTier() = default;

absl::Status RedisTier::fail(std::string error) {
  conn_.reset();
  last_error_ = std::move(error);
  down_until_ = options_.clock->now() + absl::Milliseconds(options_.backoff_ms);
  return absl::UnavailableError(cat("redis ", address_, ": ", last_error_));
}

absl::StatusOr<RedisReply> RedisTier::command(const std::vector<std::string_view>& args) {
  auto timeout = std::chrono::milliseconds(options_.timeout_ms);
  if (conn_ == nullptr) {
    if (options_.clock->now() < down_until_)
      return absl::UnavailableError(
          cat("redis ", address_, ": not retrying yet after: ", last_error_));
    absl::StatusOr<std::unique_ptr<RedisConnection>> c = connector_.connect(IoClock::now() + timeout);
    if (!c.ok())
      return fail(absl::IsDeadlineExceeded(c.status())
                      ? cat("connect: no answer within ", options_.timeout_ms, " ms (",
                            c.status().message(), ")")
                      : std::string(c.status().message()));
    conn_ = *std::move(c);
  }
  absl::StatusOr<RedisReply> reply = conn_->command(args, IoClock::now() + timeout);
  if (!reply.ok())
    return fail(absl::IsDeadlineExceeded(reply.status())
                    ? cat(args[0], ": no reply within ", options_.timeout_ms, " ms")
                    : cat(args[0], ": ", reply.status().message()));
  if (reply->type == RedisReply::Type::Error) {
    std::string what = cat(args[0], " failed: ", reply->str);
    if (refuses_access(*reply)) return fail(std::move(what));
    return absl::UnavailableError(cat("redis ", address_, ": ", what));
  }
  return reply;
}

absl::StatusOr<std::optional<std::string>> RedisTier::get(std::string_view key) {
  if (auto s = check_cache_key(key); !s.ok()) return s;
  std::string rkey = redis_key(key);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<RedisReply> reply = command({"GET", rkey});
  if (!reply.ok()) return reply.status();
  if (reply->type == RedisReply::Type::Nil) return std::optional<std::string>();
  if (reply->type != RedisReply::Type::Bulk)
    return absl::UnavailableError(
        cat("redis ", address_, ": GET ", rkey, ": a reply that is not a string"));
  absl::StatusOr<std::string> payload = cache_entry::decode(mac_key_, key, std::move(reply->str),
                                                            cat("redis ", address_, " key ", rkey));
  if (!payload.ok()) {
    // Best effort: if the DEL fails the next reader finds the same corruption and tries again.
    (void)command({"DEL", rkey});
    return payload.status();
  }
  return std::optional<std::string>(*std::move(payload));
}

absl::Status RedisTier::put(std::string_view key, std::string_view value) {
  if (auto s = check_cache_key(key); !s.ok()) return s;
  std::string rkey = redis_key(key);
  std::string entry = cache_entry::encode(mac_key_, key, value);
  if (static_cast<int64_t>(entry.size()) > options_.max_entry_bytes)
    return absl::ResourceExhaustedError(cat("redis ", address_, ": entry of ", entry.size(),
                                            " bytes exceeds the cap on one entry of ",
                                            options_.max_entry_bytes, " bytes"));
  std::string ttl = std::to_string(options_.ttl_seconds);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<RedisReply> reply = options_.ttl_seconds > 0
                                         ? command({"SET", rkey, entry, "EX", ttl})
                                         : command({"SET", rkey, entry});
  return reply.status();
}

absl::Status RedisTier::remove(std::string_view key) {
  if (auto s = check_cache_key(key); !s.ok()) return s;
  std::string rkey = redis_key(key);
  absl::MutexLock lock(&mu_);
  return command({"DEL", rkey}).status();
}

absl::StatusOr<bool> RedisTier::set_if_absent(std::string_view name, std::string_view value, int64_t ttl_ms) {
  const std::string ttl = std::to_string(std::max<int64_t>(ttl_ms, 1));
  absl::MutexLock lock(&mu_);
  absl::StatusOr<RedisReply> reply = command({"SET", name, value, "NX", "PX", ttl});
  if (!reply.ok()) return reply.status();
  return reply->type == RedisReply::Type::Status;  // OK; nil when the name exists
}

absl::StatusOr<bool> RedisTier::eval_if_holds(std::string_view script, std::string_view name,
                                              const std::vector<std::string_view>& args) {
  std::vector<std::string_view> argv = {"EVAL", script, "1", name};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::MutexLock lock(&mu_);
  absl::StatusOr<RedisReply> reply = command(argv);
  if (!reply.ok()) return reply.status();
  if (reply->type != RedisReply::Type::Integer)
    return absl::UnavailableError(cat("redis ", address_, ": EVAL on ", name, ": a reply that is not an integer"));
  return reply->integer == 1;
}

absl::StatusOr<bool> RedisTier::extend_if_holds(std::string_view name, std::string_view token, int64_t ttl_ms) {
  const std::string ttl = std::to_string(std::max<int64_t>(ttl_ms, 1));
  return eval_if_holds(kExtendIfHolds, name, {token, ttl});
}

absl::StatusOr<bool> RedisTier::remove_if_holds(std::string_view name, std::string_view token) {
  return eval_if_holds(kRemoveIfHolds, name, {token});
}

}  // namespace uop
