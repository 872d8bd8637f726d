// RendezvousStore: one map of groups under one mutex; every Set (and every close) wakes
// all waiting Gets, which re-check their keys (a rendezvous has a handful of waiters at a
// time). Waiters also wake every 100 ms to notice a caller that went away, and to re-read
// the store's clock (a test's manual clock moves without waking anyone).
#include "server/rendezvous_service.h"

#include <algorithm>
#include <utility>

#include "compiler/support/strings.h"
#include "transport/grpc_absl.h"

namespace uop {

namespace wv1 = uopd::worker::v1;

namespace {
constexpr absl::Duration kCancelCheck = absl::Milliseconds(100);
constexpr size_t kMissingNamed = 8;  // keys named in a timeout message, at most
constexpr size_t kMaxGroupName = 128;
// A group's budget per member, and per member and peer (Gloo's address of each pair).
constexpr size_t kKeysPerMember = 8;
constexpr uint64_t kBytesPerMember = 64 << 10;
constexpr uint64_t kBytesPerPair = 1 << 10;

bool valid_group_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxGroupName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

// Keys are shown in messages (they come from members, and name what is missing): cut
// a long one short.
std::string shown(const std::string& key) { return key.size() <= 80 ? key : cat(key.substr(0, 77), "..."); }
}  // namespace

RendezvousGroup RendezvousGroup::for_members(std::string name, int members, absl::Duration ttl) {
  const uint64_t n = static_cast<uint64_t>(std::max(members, 1));
  RendezvousGroup g;
  g.name = std::move(name);
  g.max_keys = kKeysPerMember * (n + 1);
  g.max_bytes = n * (kBytesPerMember + n * kBytesPerPair);
  g.ttl = ttl;
  return g;
}

RendezvousStore::RendezvousStore(RendezvousOptions options) : opts_(options) {}

absl::Status RendezvousStore::open_group(const RendezvousGroup& g) {
  if (!valid_group_name(g.name))
    return absl::InvalidArgumentError(cat("rendezvous: a group name has 1 to ", kMaxGroupName,
                                          " letters, digits, '_', '.' or '-', not '", shown(g.name), "'"));
  if (g.max_keys == 0 || g.max_bytes == 0 || g.ttl <= absl::ZeroDuration())
    return absl::InvalidArgumentError(cat("rendezvous: group ", g.name, " needs a key and byte budget and a ttl"));
  const absl::Time now = opts_.clock->now();
  absl::MutexLock lock(&mu_);
  expire_locked(now);
  if (groups_.contains(g.name)) return absl::AlreadyExistsError(cat("rendezvous: group ", g.name, " is open already"));
  if (groups_.size() >= opts_.max_groups)
    return absl::ResourceExhaustedError(cat("rendezvous: ", groups_.size(), " groups are open, the limit"));
  if (budgets_ + g.max_bytes > opts_.max_total_bytes)
    return absl::ResourceExhaustedError(cat("rendezvous: the open groups' budgets (", budgets_, " bytes) and ",
                                            g.max_bytes, " more would pass the store's ", opts_.max_total_bytes));
  Group& group = groups_[g.name];
  group.max_keys = g.max_keys;
  group.max_bytes = g.max_bytes;
  group.expires = now + g.ttl;
  budgets_ += g.max_bytes;
  return absl::OkStatus();
}

void RendezvousStore::close_group(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(name);
  if (it == groups_.end()) return;
  budgets_ -= it->second.max_bytes;
  groups_.erase(it);
  changed_.SignalAll();
}

RendezvousStore::Group* RendezvousStore::group_of_locked(const std::string& key, absl::Time now, absl::Status* why) {
  const size_t slash = key.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == key.size()) {
    *why = absl::InvalidArgumentError(cat("rendezvous: a key is <group>/<name>, not '", shown(key), "'"));
    return nullptr;
  }
  auto it = groups_.find(absl::string_view(key).substr(0, slash));
  if (it == groups_.end() || it->second.expires <= now) {
    *why = absl::NotFoundError(cat("rendezvous: no open group for key '", shown(key), "'"));
    return nullptr;
  }
  return &it->second;
}

absl::Status RendezvousStore::set(const std::string& key, std::string value) {
  if (key.empty() || key.size() > opts_.max_key_bytes)
    return absl::InvalidArgumentError(cat("rendezvous: a key has 1 to ", opts_.max_key_bytes, " bytes, not ", key.size()));
  if (value.size() > opts_.max_value_bytes)
    return absl::InvalidArgumentError(
        cat("rendezvous: the value of ", shown(key), " has ", value.size(), " bytes, more than ", opts_.max_value_bytes));
  absl::MutexLock lock(&mu_);
  absl::Status why;
  Group* g = group_of_locked(key, opts_.clock->now(), &why);
  if (!g) return why;
  if (g->entries.contains(key)) return absl::AlreadyExistsError(cat("rendezvous: ", shown(key), " is set already"));
  if (g->entries.size() >= g->max_keys)
    return absl::ResourceExhaustedError(cat("rendezvous: the group of ", shown(key), " holds ", g->entries.size(),
                                            " keys, its limit"));
  const uint64_t more = key.size() + value.size();
  if (g->bytes + more > g->max_bytes)
    return absl::ResourceExhaustedError(cat("rendezvous: ", shown(key), " (", more, " bytes) would pass its group's budget of ",
                                            g->max_bytes, " bytes (", g->bytes, " used)"));
  g->bytes += more;
  g->entries.emplace(key, std::move(value));
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RendezvousStore::get(const std::vector<std::string>& keys, absl::Duration wait,
                                                              const std::function<bool()>& cancelled) {
  if (keys.empty() || keys.size() > opts_.max_keys_per_get)
    return absl::InvalidArgumentError(cat("rendezvous: a get names 1 to ", opts_.max_keys_per_get, " keys, not ", keys.size()));
  const absl::Time deadline = opts_.clock->now() + std::clamp(wait, absl::ZeroDuration(), opts_.max_wait);
  absl::MutexLock lock(&mu_);
  for (;;) {
    absl::Time now = opts_.clock->now();
    std::vector<std::string> missing;
    std::vector<const std::string*> found;
    for (const std::string& k : keys) {
      absl::Status why;
      Group* g = group_of_locked(k, now, &why);
      if (!g) return why;
      auto it = g->entries.find(k);
      if (it == g->entries.end()) missing.push_back(k);
      else found.push_back(&it->second);
    }
    if (missing.empty()) {
      std::vector<std::string> values;
      values.reserve(keys.size());
      for (const std::string* v : found) values.push_back(*v);
      return values;
    }
    if (cancelled && cancelled()) return absl::CancelledError("rendezvous: the caller went away");
    if (now >= deadline) {
      size_t named = std::min(missing.size(), kMissingNamed);
      std::vector<std::string> list;
      for (size_t i = 0; i < named; ++i) list.push_back(shown(missing[i]));
      std::string text = join(list, ", ");
      if (named < missing.size()) text += cat(" and ", missing.size() - named, " more");
      return absl::DeadlineExceededError(
          cat("rendezvous: timed out after ", absl::ToInt64Milliseconds(wait), " ms waiting for ", text));
    }
    ++waiting_;
    changed_.WaitWithTimeout(&mu_, std::min(deadline - now, kCancelCheck));
    --waiting_;
  }
}

size_t RendezvousStore::expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  return expire_locked(now);
}

size_t RendezvousStore::expire_locked(absl::Time now) {
  size_t dropped = 0;
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    budgets_ -= it->second.max_bytes;
    groups_.erase(it++);
    ++dropped;
  }
  if (dropped) changed_.SignalAll();
  return dropped;
}

size_t RendezvousStore::groups() const {
  absl::MutexLock lock(&mu_);
  return groups_.size();
}

size_t RendezvousStore::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

size_t RendezvousStore::size() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [name, g] : groups_) n += g.entries.size();
  return n;
}

uint64_t RendezvousStore::bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [name, g] : groups_) n += g.bytes;
  return n;
}

using transport::to_grpc;

grpc::Status RendezvousService::Set(grpc::ServerContext*, const wv1::RendezvousSetRequest* req,
                                    wv1::RendezvousSetResponse*) {
  return to_grpc(store_.set(req->key(), req->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* ctx, const wv1::RendezvousGetRequest* req,
                                    wv1::RendezvousGetResponse* resp) {
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  auto values = store_.get(keys, absl::Milliseconds(req->timeout_ms()), [ctx] { return ctx->IsCancelled(); });
  if (!values.ok()) return to_grpc(values.status());
  for (std::string& v : *values) resp->add_values(std::move(v));
  return grpc::Status::OK;
}

}  // namespace uop
