#include "server/auth.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "compiler/ir/digest.h"
#include "compiler/support/strings.h"

namespace uop::server {
namespace {

bool valid_name(std::string_view s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

bool is_hex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::vector<std::string> words(std::string_view line) {
  std::vector<std::string> out;
  std::istringstream in{std::string(line)};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoull(s);
  return true;
}

bool parse_rate(const std::string& s, double* out) {
  if (s.empty() || s.find_first_not_of("0123456789.") != std::string::npos) return false;
  try {
    size_t used = 0;
    *out = std::stod(s, &used);
    return used == s.size() && std::isfinite(*out) && *out >= 0;
  } catch (...) {
    return false;
  }
}

}  // namespace

Tenant::Tenant(std::string name, TenantQuota quota, bool private_cache)
    : name_(std::move(name)), quota_(quota), private_cache_(private_cache) {
  bucket_ = quota_.burst;
}

TenantQuota Tenant::quota() const {
  std::lock_guard<std::mutex> l(mu_);
  return quota_;
}

std::string Tenant::cache_namespace() const {
  std::lock_guard<std::mutex> l(mu_);
  return private_cache_ ? cat("tenant/", name_) : std::string();
}

bool Tenant::private_cache() const {
  std::lock_guard<std::mutex> l(mu_);
  return private_cache_;
}

void Tenant::update(const TenantQuota& quota, bool private_cache) {
  std::lock_guard<std::mutex> l(mu_);
  bool was_limited = quota_.requests_per_second > 0;
  quota_ = quota;
  private_cache_ = private_cache;
  if (was_limited) {
    bucket_ = std::min(bucket_, quota_.burst);
  } else {
    bucket_ = quota_.burst;
    refilled_ = absl::InfinitePast();
  }
}

absl::Status Tenant::admit_request(absl::Time now) {
  ++requests_;
  std::lock_guard<std::mutex> l(mu_);
  if (quota_.requests_per_second <= 0) return absl::OkStatus();
  if (refilled_ != absl::InfinitePast() && now > refilled_)
    bucket_ = std::min(quota_.burst, bucket_ + absl::ToDoubleSeconds(now - refilled_) * quota_.requests_per_second);
  refilled_ = now;
  if (bucket_ >= 1) {
    bucket_ -= 1;
    return absl::OkStatus();
  }
  ++rejections_["rps"];
  return absl::ResourceExhaustedError(cat("tenant '", name_, "': request rate limit of ", quota_.requests_per_second,
                                          " requests per second (burst ", quota_.burst, ") reached; retry later"));
}

absl::StatusOr<Tenant::CompileSlot> Tenant::begin_compile() {
  uint64_t limit = quota().max_compiles;
  uint64_t now = ++compiles_;
  if (limit != 0 && now > limit) {
    --compiles_;
    count_rejection("compiles");
    return absl::ResourceExhaustedError(cat("tenant '", name_, "': concurrent compile limit of ", limit,
                                            " reached; retry when one of its compiles has finished"));
  }
  return CompileSlot(this);
}

void Tenant::count_rejection(std::string_view limit) {
  std::lock_guard<std::mutex> l(mu_);
  ++rejections_[std::string(limit)];
}

std::map<std::string, uint64_t> Tenant::rejections() const {
  std::lock_guard<std::mutex> l(mu_);
  return rejections_;
}

std::unique_ptr<Tenants> Tenants::anonymous() {
  std::unique_ptr<Tenants> t(new Tenants());
  t->tenants_.push_back(std::make_unique<Tenant>(kAnonymousTenant, TenantQuota{}, false));
  return t;
}

absl::StatusOr<std::unique_ptr<Tenants>> Tenants::parse(std::string_view text, std::string_view source) {
  std::unique_ptr<Tenants> t(new Tenants());
  t->enabled_ = true;
  absl::flat_hash_map<std::string, int> names;
  int lineno = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string> w = words(line);
    if (w.empty()) continue;
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(cat(source, ":", lineno, ": ", why));
    };
    if (w.size() < 2) return bad("a tenant line is NAME TOKEN [bytes=N] [sessions=N] [compiles=N] [rps=R] [burst=N] [cache=shared|private]");
    if (!valid_name(w[0])) return bad(cat("tenant name '", w[0].substr(0, 64), "' is not [A-Za-z0-9_.-]+ (at most 64)"));
    if (!names.emplace(w[0], lineno).second) return bad(cat("tenant '", w[0], "' is listed twice (first on line ", names[w[0]], ")"));
    std::string hash;
    if (w[1].rfind("sha256:", 0) == 0) {
      hash = w[1].substr(7);
      if (!is_hex64(hash)) return bad("a sha256: token is 64 lowercase hex digits");
    } else {
      hash = sha256(w[1]).hex();
    }
    TenantQuota q;
    bool private_cache = false;
    bool burst_set = false;
    for (size_t i = 2; i < w.size(); ++i) {
      auto eq = w[i].find('=');
      std::string key = w[i].substr(0, eq), value = eq == std::string::npos ? "" : w[i].substr(eq + 1);
      bool ok = true;
      if (key == "bytes") ok = parse_u64(value, &q.max_bytes);
      else if (key == "sessions") ok = parse_u64(value, &q.max_sessions);
      else if (key == "compiles") ok = parse_u64(value, &q.max_compiles);
      else if (key == "rps") ok = parse_rate(value, &q.requests_per_second);
      else if (key == "burst") ok = burst_set = parse_rate(value, &q.burst);
      else if (key == "cache") {
        ok = value == "shared" || value == "private";
        private_cache = value == "private";
      } else {
        return bad(cat("unknown setting '", key, "' (bytes, sessions, compiles, rps, burst, cache)"));
      }
      if (!ok) return bad(cat("bad value for ", key, ": '", value, "'"));
    }
    if (!burst_set) q.burst = std::max(1.0, q.requests_per_second);
    auto tenant = std::make_unique<Tenant>(w[0], q, private_cache);
    if (!t->by_token_hash_.emplace(hash, tenant.get()).second) return bad(cat("tenant '", w[0], "' has the token of another tenant"));
    t->tenants_.push_back(std::move(tenant));
  }
  if (t->tenants_.empty()) return absl::InvalidArgumentError(cat(source, ": no tenants (every request would be refused)"));
  return t;
}

absl::StatusOr<std::unique_ptr<Tenants>> Tenants::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(cat("tokens file ", path, ": cannot open it"));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

absl::StatusOr<Tenant*> Tenants::authenticate(const std::vector<std::string_view>& authorization) {
  if (!enabled_) return tenants_.front().get();  // never reloaded: no lock needed
  constexpr std::string_view kBearer = "Bearer ";
  for (std::string_view v : authorization) {
    if (v.size() <= kBearer.size() || v.substr(0, kBearer.size()) != kBearer) continue;
    std::string hash = sha256(v.substr(kBearer.size())).hex();
    std::shared_lock<std::shared_mutex> l(mu_);
    auto it = by_token_hash_.find(hash);
    if (it != by_token_hash_.end()) return it->second;
  }
  ++auth_failures_;
  return absl::UnauthenticatedError(authorization.empty()
                                        ? "this server needs a bearer token (authorization: Bearer <token>; uop --token or $UOPD_TOKEN)"
                                        : "the bearer token is not one this server knows");
}

absl::StatusOr<Tenant*> Tenants::admit(const std::vector<std::string_view>& authorization, absl::Time now) {
  auto t = authenticate(authorization);
  if (!t.ok()) return t.status();
  if (absl::Status s = (*t)->admit_request(now); !s.ok()) return s;
  return *t;
}

absl::StatusOr<std::string> Tenants::adopt(std::unique_ptr<Tenants> fresh) {
  if (!enabled_) {
    ++reloads_failed_;
    return absl::FailedPreconditionError("no tokens file: there is nothing to reload (tenants are off)");
  }
  if (!fresh || !fresh->enabled_) {
    ++reloads_failed_;
    return absl::FailedPreconditionError("a reload needs a tokens file's tenants, not the anonymous tenant");
  }
  std::vector<std::string> added, removed, changed;
  std::unique_lock<std::shared_mutex> l(mu_);
  // The objects of the names that stay (or come back) are kept: their usage carries over.
  absl::flat_hash_map<std::string, std::unique_ptr<Tenant>> old;
  for (auto& t : tenants_) old.emplace(t->name(), std::move(t));
  absl::flat_hash_map<std::string, std::unique_ptr<Tenant>> gone;
  for (auto& t : retired_) gone.emplace(t->name(), std::move(t));
  // The old token of each tenant, to tell a changed token.
  absl::flat_hash_map<const Tenant*, std::vector<std::string>> old_hashes;
  for (auto& [hash, t] : by_token_hash_) old_hashes[t].push_back(hash);
  absl::flat_hash_map<const Tenant*, Tenant*> now_of;  // fresh -> kept
  std::vector<std::unique_ptr<Tenant>> next;
  for (auto& f : fresh->tenants_) {
    std::unique_ptr<Tenant> keep;
    if (auto it = old.find(f->name()); it != old.end()) {
      keep = std::move(it->second);
      old.erase(it);
      TenantQuota a = keep->quota(), b = f->quota();
      bool same = a.max_bytes == b.max_bytes && a.max_sessions == b.max_sessions && a.max_compiles == b.max_compiles &&
                  a.requests_per_second == b.requests_per_second && a.burst == b.burst &&
                  keep->private_cache() == f->private_cache();
      std::vector<std::string> hashes_before = old_hashes[keep.get()], hashes_after;
      for (auto& [hash, t] : fresh->by_token_hash_)
        if (t == f.get()) hashes_after.push_back(hash);
      if (!same || hashes_before != hashes_after) changed.push_back(f->name());
      keep->update(b, f->private_cache());
    } else if (auto it = gone.find(f->name()); it != gone.end()) {  // back again
      keep = std::move(it->second);
      gone.erase(it);
      keep->update(f->quota(), f->private_cache());
      added.push_back(f->name());
    } else {
      keep = std::move(f);
      added.push_back(keep->name());
    }
    now_of[f ? f.get() : keep.get()] = keep.get();
    next.push_back(std::move(keep));
  }
  absl::flat_hash_map<std::string, Tenant*> hashes;
  for (auto& [hash, t] : fresh->by_token_hash_) hashes.emplace(hash, now_of.at(t));
  retired_.clear();
  for (auto& [name, t] : gone) retired_.push_back(std::move(t));
  for (auto& [name, t] : old) {
    removed.push_back(name);
    retired_.push_back(std::move(t));
  }
  tenants_ = std::move(next);
  by_token_hash_ = std::move(hashes);
  size_t n = tenants_.size();
  l.unlock();
  ++reloads_ok_;
  std::sort(removed.begin(), removed.end());
  std::string summary = cat(n, " tenant", n == 1 ? "" : "s");
  if (!added.empty()) summary = cat(summary, "; added ", join(added, ", "));
  if (!removed.empty()) summary = cat(summary, "; removed ", join(removed, ", "));
  if (!changed.empty()) summary = cat(summary, "; changed ", join(changed, ", "));
  if (added.empty() && removed.empty() && changed.empty()) summary = cat(summary, "; nothing changed");
  return summary;
}

absl::StatusOr<std::string> Tenants::reload(const std::string& path) {
  auto fresh = load(path);
  if (!fresh.ok()) {
    ++reloads_failed_;
    return fresh.status();
  }
  return adopt(std::move(*fresh));
}

std::vector<Tenant*> Tenants::all() const {
  std::shared_lock<std::shared_mutex> l(mu_);
  std::vector<Tenant*> out;
  for (auto& t : tenants_) out.push_back(t.get());
  return out;
}

}  // namespace uop::server
