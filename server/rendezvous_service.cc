// RendezvousStore: one map under one mutex; every Set wakes all waiting Gets, which
// re-check their keys (a rendezvous has a handful of waiters at a time). Waiters also wake
// every 100 ms to notice a caller that went away.
#include "server/rendezvous_service.h"

#include <algorithm>
#include <utility>

#include "compiler/support/strings.h"

namespace uop {

namespace wv1 = uopd::worker::v1;

namespace {
constexpr absl::Duration kCancelCheck = absl::Milliseconds(100);
constexpr size_t kMissingNamed = 8;  // keys named in a timeout message, at most
}  // namespace

RendezvousStore::RendezvousStore(RendezvousOptions options) : opts_(options) {}

absl::Status RendezvousStore::set(const std::string& key, std::string value) {
  if (key.empty() || key.size() > opts_.max_key_bytes)
    return absl::InvalidArgumentError(cat("rendezvous: a key has 1 to ", opts_.max_key_bytes, " bytes, not ", key.size()));
  if (value.size() > opts_.max_value_bytes)
    return absl::InvalidArgumentError(
        cat("rendezvous: the value of ", key, " has ", value.size(), " bytes, more than ", opts_.max_value_bytes));
  absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (now >= next_sweep_) {
    expire_locked(now);
    next_sweep_ = now + opts_.ttl / 8;
  }
  auto it = entries_.find(key);
  uint64_t old_bytes = it == entries_.end() ? 0 : key.size() + it->second.value.size();
  uint64_t new_bytes = key.size() + value.size();
  if (bytes_ - old_bytes + new_bytes > opts_.max_total_bytes)
    return absl::ResourceExhaustedError(cat("rendezvous: the store is full (", bytes_, " bytes)"));
  bytes_ = bytes_ - old_bytes + new_bytes;
  entries_[key] = Entry{std::move(value), now + opts_.ttl};
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::get(const std::vector<std::string>& keys, absl::Duration wait,
                                                              const std::function<bool()>& cancelled) {
  if (keys.empty() || keys.size() > opts_.max_keys_per_get)
    return absl::InvalidArgumentError(cat("rendezvous: a get names 1 to ", opts_.max_keys_per_get, " keys, not ", keys.size()));
  const absl::Time deadline = absl::Now() + std::clamp(wait, absl::ZeroDuration(), opts_.max_wait);
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Expired keys count as missing even before a sweep drops them.
    absl::Time now = absl::Now();
    std::vector<std::string> missing;
    for (const std::string& k : keys) {
      auto it = entries_.find(k);
      if (it == entries_.end() || it->second.expires <= now) missing.push_back(k);
    }
    if (missing.empty()) {
      std::vector<std::string> values;
      values.reserve(keys.size());
      for (const std::string& k : keys) values.push_back(entries_.find(k)->second.value);
      return values;
    }
    if (cancelled && cancelled()) return absl::CancelledError("rendezvous: the caller went away");
    if (now >= deadline) {
      size_t named = std::min(missing.size(), kMissingNamed);
      std::string list = join(std::vector<std::string>(missing.begin(), missing.begin() + named), ", ");
      if (named < missing.size()) list += cat(" and ", missing.size() - named, " more");
      return absl::DeadlineExceededError(
          cat("rendezvous: timed out after ", absl::ToInt64Milliseconds(wait), " ms waiting for ", list));
    }
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + kCancelCheck));
  }
}

size_t RendezvousStore::expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  return expire_locked(now);
}

size_t RendezvousStore::expire_locked(absl::Time now) {
  size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    bytes_ -= it->first.size() + it->second.value.size();
    entries_.erase(it++);
    ++dropped;
  }
  return dropped;
}

size_t RendezvousStore::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

uint64_t RendezvousStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

namespace {
grpc::Status to_grpc_status(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}
}  // namespace

grpc::Status RendezvousService::Set(grpc::ServerContext*, const wv1::RendezvousSetRequest* req,
                                    wv1::RendezvousSetResponse*) {
  return to_grpc_status(store_.set(req->key(), req->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* ctx, const wv1::RendezvousGetRequest* req,
                                    wv1::RendezvousGetResponse* resp) {
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  auto values = store_.get(keys, absl::Milliseconds(req->timeout_ms()), [ctx] { return ctx->IsCancelled(); });
  if (!values.ok()) return to_grpc_status(values.status());
  for (std::string& v : *values) resp->add_values(std::move(v));
  return grpc::Status::OK;
}

}  // namespace uop
