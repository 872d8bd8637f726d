#include "server/sessions.h"

#include <algorithm>
#include <random>

#include "compiler/support/status_macros.h"
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

absl::StatusOr<std::string> SessionManager::open(std::vector<std::string> devices, absl::Duration idle_timeout,
                                                 const SessionOwner& owner) {
  std::lock_guard<std::mutex> l(mu_);
  Owner& o = owners_[owner.tenant];
  o.max_sessions = owner.max_sessions;
  o.max_bytes = owner.max_bytes;
  if (o.max_sessions != 0 && o.used.sessions >= o.max_sessions)
    return absl::ResourceExhaustedError(cat("tenant '", owner.tenant, "': session limit of ", o.max_sessions,
                                            " open sessions reached; close one first"));
  if (sessions_.size() >= opts_.max_sessions)
    return absl::ResourceExhaustedError(cat("the server has ", sessions_.size(), " open sessions, its limit (",
                                            opts_.max_sessions, ", --max-sessions); close one first"));
  ++o.used.sessions;
  std::string id = random_id();
  Session s;
  s.tenant = owner.tenant;
  s.devices = std::move(devices);
  s.idle_timeout = std::min(idle_timeout > absl::ZeroDuration() ? idle_timeout : opts_.idle_timeout, opts_.max_idle_timeout);
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

absl::StatusOr<std::vector<std::string>> SessionManager::use_device(const std::string& session, const std::string& device,
                                                                  const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  std::vector<std::string> devices = (*s)->devices;
  if (device.empty()) return devices;
  auto it = std::find(devices.begin(), devices.end(), device);
  if (it == devices.end()) {
    (*s)->devices.push_back(device);
    devices.insert(devices.begin(), device);
  } else {
    std::rotate(devices.begin(), it, it + 1);
  }
  return devices;
}

absl::Status SessionManager::touch(const std::string& session, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  return find(session, tenant).status();
}

absl::Status SessionManager::check_bytes_locked(const Session& ss, const Owner& o, uint64_t bytes,
                                                std::string_view what) const {
  // Each sum is of values already checked to fit, so none of them wraps.
  auto held = [](uint64_t buffers, uint64_t reserved) {
    return reserved == 0 ? cat(buffers, " bytes held") : cat(buffers, " bytes held + ", reserved, " reserved by runs");
  };
  if (bytes > opts_.max_bytes || ss.bytes + ss.reserved > opts_.max_bytes - bytes)
    return absl::ResourceExhaustedError(cat("session byte quota: ", held(ss.bytes, ss.reserved), " + ", bytes, " ", what,
                                            " > limit ", opts_.max_bytes, " (--session-bytes)"));
  if (o.max_bytes != 0 && (bytes > o.max_bytes || o.used.bytes + o.reserved > o.max_bytes - bytes))
    return absl::ResourceExhaustedError(cat("tenant '", ss.tenant, "' byte quota: ", held(o.used.bytes, o.reserved), " + ",
                                            bytes, " ", what, " > limit ", o.max_bytes));
  return absl::OkStatus();
}

SessionManager::Reservation& SessionManager::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    release();
    m_ = o.m_;
    session_ = std::move(o.session_);
    tenant_ = std::move(o.tenant_);
    bytes_ = o.bytes_;
    o.m_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void SessionManager::Reservation::release() {
  if (!m_) return;
  std::lock_guard<std::mutex> l(m_->mu_);
  if (auto it = m_->sessions_.find(session_); it != m_->sessions_.end() && it->second.tenant == tenant_) {
    Session& s = it->second;
    s.reserved -= std::min(s.reserved, bytes_);
    if (s.runs > 0) --s.runs;
    s.last_used = absl::Now();  // the run just ended: idle from now
  }
  if (auto it = m_->owners_.find(tenant_); it != m_->owners_.end()) it->second.reserved -= std::min(it->second.reserved, bytes_);
  m_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<SessionManager::Reservation> SessionManager::reserve(const std::string& session, uint64_t bytes,
                                                                    std::string_view what, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  Session& ss = **s;
  Owner& o = owners_[ss.tenant];
  if (absl::Status st = check_bytes_locked(ss, o, bytes, what); !st.ok()) return st;
  ss.reserved += bytes;
  ++ss.runs;
  o.reserved += bytes;
  Reservation r;
  r.m_ = this;
  r.session_ = session;
  r.tenant_ = ss.tenant;
  r.bytes_ = bytes;
  return r;
}

absl::StatusOr<std::string> SessionManager::add_buffer(const std::string& session, BufferInfo info,
                                                       const std::string& tenant, Reservation* from) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  Session& ss = **s;
  if (ss.buffers.size() >= opts_.max_buffers)
    return absl::ResourceExhaustedError(cat("session buffer count: limit ", opts_.max_buffers, " reached (--session-buffers)"));
  Owner& o = owners_[ss.tenant];
  // Bytes a reservation of this session already holds move over; the rest is checked.
  uint64_t taken = 0;
  if (from && from->m_ == this && from->session_ == session) taken = std::min({from->bytes_, info.bytes, ss.reserved});
  if (absl::Status st = check_bytes_locked(ss, o, info.bytes - taken, "requested"); !st.ok()) return st;
  if (taken > 0) {
    from->bytes_ -= taken;
    ss.reserved -= taken;
    o.reserved -= std::min(o.reserved, taken);
  }
  o.used.bytes += info.bytes;
  ++o.used.buffers;
  info.id = random_id();
  ss.bytes += info.bytes;
  std::string id = info.id;
  ss.buffers.emplace(id, std::move(info));
  return id;
}

absl::StatusOr<BufferInfo*> SessionManager::find_buffer(const std::string& session, const std::string& buffer_id,
                                                        const std::string& tenant, Session** owner) {
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  auto it = (*s)->buffers.find(buffer_id);
  if (it == (*s)->buffers.end())
    return absl::NotFoundError(cat("buffer '", buffer_id.substr(0, 64), "' does not exist in this session"));
  if (owner) *owner = *s;
  return &it->second;
}

absl::StatusOr<BufferInfo> SessionManager::buffer(const std::string& session, const std::string& buffer_id,
                                                  const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  ASSIGN_OR_RETURN(BufferInfo * b, find_buffer(session, buffer_id, tenant));
  return *b;
}

absl::StatusOr<std::string> SessionManager::add_model(const std::string& session, std::shared_ptr<const HeldModel> model,
                                                     uint64_t bytes, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  Session& ss = **s;
  if (ss.models.size() >= opts_.max_buffers)
    return absl::ResourceExhaustedError(cat("session model count: limit ", opts_.max_buffers, " reached (--session-buffers)"));
  Owner& o = owners_[ss.tenant];
  RETURN_IF_ERROR(check_bytes_locked(ss, o, bytes, "for the model's graph"));
  // Given back with the session's bytes when it closes (release_locked).
  o.used.bytes += bytes;
  ss.bytes += bytes;
  std::string id = random_id();
  ss.models.emplace(id, std::move(model));
  return id;
}

absl::StatusOr<std::shared_ptr<const HeldModel>> SessionManager::model(const std::string& session, const std::string& model_id,
                                                                       const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  auto it = (*s)->models.find(model_id);
  if (it == (*s)->models.end())
    return absl::NotFoundError(cat("model '", model_id.substr(0, 64), "' does not exist in this session"));
  return it->second;
}

absl::StatusOr<BufferInfo> SessionManager::replace_buffer(const std::string& session, const std::string& buffer_id,
                                                          const BufferInfo& now, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  ASSIGN_OR_RETURN(BufferInfo * b, find_buffer(session, buffer_id, tenant));
  BufferInfo old = *b;
  b->worker_buffer = now.worker_buffer;
  b->worker_id = now.worker_id;
  b->worker_generation = now.worker_generation;
  return old;
}

absl::Status SessionManager::hold_graph(const std::string& session, const std::string& digest,
                                        std::shared_ptr<const DecodedGraph> g, uint64_t bytes, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  Session& ss = **s;
  auto drop = [&](std::vector<Session::HeldGraph>::iterator it) {
    ss.bytes -= it->bytes;
    release_locked(ss.tenant, 0, it->bytes, false);
    ss.graphs.erase(it);
  };
  auto same = std::find_if(ss.graphs.begin(), ss.graphs.end(), [&](const Session::HeldGraph& h) { return h.digest == digest; });
  if (same != ss.graphs.end()) drop(same);
  while (ss.graphs.size() >= kMaxHeldGraphs) drop(ss.graphs.begin());
  Owner& o = owners_[ss.tenant];
  RETURN_IF_ERROR(check_bytes_locked(ss, o, bytes, "for the graph it holds"));
  // Given back when it is displaced, or with the session's bytes when it closes.
  o.used.bytes += bytes;
  ss.bytes += bytes;
  ss.graphs.push_back({digest, std::move(g), bytes});
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const DecodedGraph>> SessionManager::held_graph(const std::string& session,
                                                                               const std::string& digest,
                                                                               const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto s = find(session, tenant);
  if (!s.ok()) return s.status();
  for (const Session::HeldGraph& h : (*s)->graphs)
    if (h.digest == digest) return h.graph;
  return absl::NotFoundError(cat("this session holds no graph of digest '", digest.substr(0, 64),
                                 "' (a Run with hold_graph sends it)"));
}

absl::StatusOr<BufferInfo> SessionManager::remove_buffer(const std::string& session, const std::string& buffer_id,
                                                         const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  Session* s = nullptr;
  ASSIGN_OR_RETURN(BufferInfo * found, find_buffer(session, buffer_id, tenant, &s));
  BufferInfo b = std::move(*found);
  s->bytes -= b.bytes;
  s->buffers.erase(buffer_id);
  release_locked(s->tenant, 1, b.bytes, false);
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
    if (it->second.runs > 0 || now - it->second.last_used < it->second.idle_timeout) {
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
