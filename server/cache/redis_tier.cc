// RedisTier over hiredis's synchronous API. One connection guarded by a mutex: lookups are
// one round trip, and the memory and disk tiers above absorb most of the traffic.
#include "server/cache/redis_tier.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace uop {
namespace {

// Writing to a connection Redis has closed raises SIGPIPE, whose default action kills the
// process. Block it on this thread for the duration of a command and swallow one that the
// command raised, so a dying Redis is an error status, not a dead server.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe = pipe_set();
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe = pipe_set();
      struct timespec zero = {0, 0};
      sigtimedwait(&pipe, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  static sigset_t pipe_set() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    return s;
  }
  sigset_t old_;
  bool was_pending_ = false;
};

struct timeval to_timeval(int ms) {
  struct timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

}  // namespace

void RedisTier::ReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }

RedisTier::RedisTier(std::string host, int port, int timeout_ms)
    : RedisTier(std::move(host), port, Options{.timeout_ms = timeout_ms}) {}

RedisTier::RedisTier(std::string host, int port, Options options)
    : host_(std::move(host)),
      port_(port),
      options_(std::move(options)),
      address_(cat(host_, ":", port_)) {}

RedisTier::~RedisTier() {
  absl::MutexLock lock(&mu_);
  disconnect();
}

void RedisTier::disconnect() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

absl::Status RedisTier::fail(std::string error) {
  disconnect();
  last_error_ = std::move(error);
  down_until_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.backoff_ms);
  return absl::UnavailableError(cat("redis ", address_, ": ", last_error_));
}

absl::Status RedisTier::connect() {
  if (std::chrono::steady_clock::now() < down_until_)
    return absl::UnavailableError(
        cat("redis ", address_, ": not retrying yet after: ", last_error_));
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, to_timeval(options_.timeout_ms));
  if (c == nullptr) return fail("cannot allocate a connection");
  if (c->err != 0) {
    std::string err = cat("connect: ", c->errstr);
    redisFree(c);
    return fail(std::move(err));
  }
  ctx_ = c;
  if (redisSetTimeout(ctx_, to_timeval(options_.timeout_ms)) != REDIS_OK)
    return fail(cat("cannot set the command timeout: ", ctx_->errstr));
  redisEnableKeepAlive(ctx_);  // notices a peer that vanished without closing
  return absl::OkStatus();
}

absl::StatusOr<RedisTier::Reply> RedisTier::command(const std::vector<std::string_view>& args) {
  SigpipeGuard guard;
  if (ctx_ == nullptr)
    if (auto s = connect(); !s.ok()) return s;
  std::vector<const char*> argv;
  std::vector<size_t> argvlen;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    argvlen.push_back(a.size());
  }
  Reply reply(static_cast<redisReply*>(
      redisCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), argvlen.data())));
  int err = errno;
  if (reply == nullptr) {
    // hiredis reports a timed-out read as EAGAIN; say what it means.
    bool timeout = ctx_->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK);
    return fail(timeout ? cat(args[0], ": no reply within ", options_.timeout_ms, " ms")
                        : cat(args[0], ": ", ctx_->errstr));
  }
  if (reply->type == REDIS_REPLY_ERROR)
    return absl::UnavailableError(
        cat("redis ", address_, ": ", args[0], " failed: ", std::string(reply->str, reply->len)));
  return reply;
}

absl::StatusOr<std::optional<std::string>> RedisTier::get(std::string_view key) {
  if (auto s = check_cache_key(key); !s.ok()) return s;
  std::string rkey = redis_key(key);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Reply> reply = command({"GET", rkey});
  if (!reply.ok()) return reply.status();
  redisReply* r = reply->get();
  if (r->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if (r->type != REDIS_REPLY_STRING)
    return absl::UnavailableError(
        cat("redis ", address_, ": GET ", rkey, ": unexpected reply type ", r->type));
  absl::StatusOr<std::string> payload = cache_entry::decode(
      key, std::string(r->str, r->len), cat("redis ", address_, " key ", rkey));
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
  std::string entry = cache_entry::encode(key, value);
  std::string ttl = std::to_string(options_.ttl_seconds);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Reply> reply = options_.ttl_seconds > 0
                                    ? command({"SET", rkey, entry, "EX", ttl})
                                    : command({"SET", rkey, entry});
  return reply.status();
}

}  // namespace uop
