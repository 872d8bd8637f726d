#include "server/sessions.h"

#include <algorithm>
#include <random>

#include "compiler/support/strings.h"

namespace uop::server {

std::string random_id() {
  static thread_local std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 32; i += 8) {
    uint32_t v = rd();
    for (int j = 0; j < 8; ++j) s[i + j] = kHex[(v >> (4 * j)) & 15];
  }
  return s;
}

SessionManager::SessionManager(SessionOptions opts) : opts_(opts) {}

std::string SessionManager::create(std::vector<std::string> devices, absl::Duration idle_timeout) {
  return *open(std::move(devices), idle_timeout, SessionOwner{});  // no limits: cannot fail
}

absl::StatusOr<std::string> SessionManager::open(std::vector<std::string> devices, absl::Duration idle_timeout,
                                                 const SessionOwner& owner) {
  std::lock_guard<std::mutex> l(mu_);
  Owner& o = owners_[owner.tenant];
  o.max_sessions = owner.max_sessions;
  o.max_bytes = owner.max_bytes;
  if (o.max_sessions != 0 && o.used.sessions >= o.max_sessions)
    return absl::ResourceExhaustedError(cat("tenant '", owner.tenant, "': session limit of ", o.max_sessions,
                                            " open sessions reached; close one first"));
  ++o.used.sessions;
  std::string id = random_id();
  Session s;
  s.tenant = owner.tenant;
  s.devices = std::move(devices);
  s.idle_timeout = idle_timeout > absl::ZeroDuration() ? idle_timeout : opts_.idle_timeout;
  s.last_used = absl::Now();
  sessions_.emplace(id, std::move(s));
  return id;
}

void SessionManager::release_locked(const std::string& tenant, uint64_t buffers, uint64_t bytes, bool session) {
  auto it = owners_.find(tenant);
  if (it == owners_.end()) return;
  TenantUsage& u = it->second.used;
  u.buffers -= std::min(u.buffers, buffers);
  u.bytes -= std::min(u.bytes, bytes);
  if (session && u.sessions > 0) --u.sessions;
}

TenantUsage SessionManager::usage(const std::string& tenant) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = owners_.find(tenant);
  return it == owners_.end() ? TenantUsage{} : it->second.used;
}

bool SessionManager::uses_device(const std::string& tenant, const std::string& device) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [id, s] : sessions_)
    if (s.tenant == tenant && std::find(s.devices.begin(), s.devices.end(), device) != s.devices.end()) return true;
  return false;
}

void SessionManager::set_limits(const SessionOwner& owner) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = owners_.find(owner.tenant);
  if (it == owners_.end()) return;  // open() sets them with its first session
  it->second.max_sessions = owner.max_sessions;
  it->second.max_bytes = owner.max_bytes;
}

absl::StatusOr<SessionManager::Session*> SessionManager::find(const std::string& id, const std::string& tenant) {
  auto it = sessions_.find(id);
  // Another tenant's session is one that does not exist, word for word.
  if (it == sessions_.end() || it->second.tenant != tenant)
    return absl::NotFoundError(cat("session '", id.substr(0, 64), "' does not exist (closed, timed out, or never created)"));
  it->second.last_used = absl::Now();
  return &it->second;
}

absl::StatusOr<std::vector<std::string>> SessionManager::devices(const std::string& session, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  return (*s)->devices;
}

absl::Status SessionManager::touch(const std::string& session, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  return find(session, tenant).status();
}

absl::StatusOr<std::string> SessionManager::add_buffer(const std::string& session, BufferInfo info,
                                                       const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  Session& ss = **s;
  if (ss.bytes + info.bytes > opts_.max_bytes)
    return absl::ResourceExhaustedError(cat("session byte quota: ", ss.bytes, " bytes held + ", info.bytes,
                                            " requested > limit ", opts_.max_bytes, " (--session-bytes)"));
  if (ss.buffers.size() >= opts_.max_buffers)
    return absl::ResourceExhaustedError(cat("session buffer count: limit ", opts_.max_buffers, " reached"));
  Owner& o = owners_[ss.tenant];
  if (o.max_bytes != 0 && o.used.bytes + info.bytes > o.max_bytes)
    return absl::ResourceExhaustedError(cat("tenant '", ss.tenant, "' byte quota: ", o.used.bytes, " bytes held + ", info.bytes,
                                            " requested > limit ", o.max_bytes));
  o.used.bytes += info.bytes;
  ++o.used.buffers;
  info.id = random_id();
  ss.bytes += info.bytes;
  std::string id = info.id;
  ss.buffers.emplace(id, std::move(info));
  return id;
}

absl::StatusOr<BufferInfo> SessionManager::buffer(const std::string& session, const std::string& buffer_id,
                                                  const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  auto it = (*s)->buffers.find(buffer_id);
  if (it == (*s)->buffers.end())
    return absl::NotFoundError(cat("buffer '", buffer_id.substr(0, 64), "' does not exist in this session"));
  return it->second;
}

absl::StatusOr<BufferInfo> SessionManager::remove_buffer(const std::string& session, const std::string& buffer_id,
                                                         const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  auto it = (*s)->buffers.find(buffer_id);
  if (it == (*s)->buffers.end())
    return absl::NotFoundError(cat("buffer '", buffer_id.substr(0, 64), "' does not exist in this session"));
  BufferInfo b = std::move(it->second);
  (*s)->bytes -= b.bytes;
  (*s)->buffers.erase(it);
  release_locked((*s)->tenant, 1, b.bytes, false);
  return b;
}

absl::StatusOr<std::vector<BufferInfo>> SessionManager::close(const std::string& session, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end() || it->second.tenant != tenant) return absl::NotFoundError(cat("session '", session.substr(0, 64), "' does not exist"));
  std::vector<BufferInfo> out;
  for (auto& [id, b] : it->second.buffers) out.push_back(std::move(b));
  release_locked(it->second.tenant, it->second.buffers.size(), it->second.bytes, true);
  sessions_.erase(it);
  return out;
}

std::vector<BufferInfo> SessionManager::reap_idle(absl::Time now) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<BufferInfo> out;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (now - it->second.last_used < it->second.idle_timeout) {
      ++it;
      continue;
    }
    for (auto& [id, b] : it->second.buffers) out.push_back(std::move(b));
    release_locked(it->second.tenant, it->second.buffers.size(), it->second.bytes, true);
    sessions_.erase(it++);
  }
  return out;
}

uint64_t SessionManager::sessions() const {
  std::lock_guard<std::mutex> l(mu_);
  return sessions_.size();
}

uint64_t SessionManager::buffers() const {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t n = 0;
  for (auto& [id, s] : sessions_) n += s.buffers.size();
  return n;
}

uint64_t SessionManager::bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t n = 0;
  for (auto& [id, s] : sessions_) n += s.bytes;
  return n;
}

}  // namespace uop::server
