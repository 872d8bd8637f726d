// DiskTier: file I/O happens outside the lock; the lock guards only the in-memory index
// (sizes and recency), which is why a slow disk read does not stall other lookups.
#include "server/cache/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

namespace uop {
namespace {

// Temp files from a writer that died are removed at startup once they are this old; a
// younger one may belong to another process still writing it.
constexpr int64_t kStaleTempSeconds = 3600;
constexpr std::string_view kTempPrefix = ".tmp.";

absl::Status errno_status(int err, std::string what) {
  std::string msg = cat(what, ": ", std::strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

absl::Status make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return errno_status(errno, cat("disk cache: cannot create directory ", path));
}

// mkdir -p: the cache directory is often several levels below $XDG_CACHE_HOME.
absl::Status make_dirs(const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1))
    if (auto s = make_dir(path.substr(0, pos)); !s.ok() && !absl::IsPermissionDenied(s))
      return s;  // a read-only parent of an existing directory is fine
  return make_dir(path);
}

absl::Status write_all(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, cat("disk cache: cannot write ", path));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Reads to EOF or `limit` bytes, not just `size_hint`, so a file that is longer than its
// stat said still fails verification instead of being cut to a plausible length.
absl::Status read_all(int fd, size_t size_hint, size_t limit, std::string& out, const std::string& path) {
  out.resize(std::min(size_hint + 1, limit));
  size_t got = 0;
  while (got < limit) {
    if (got == out.size()) out.resize(std::min(out.size() * 2, limit));
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, cat("disk cache: cannot read ", path));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return absl::OkStatus();
}

int64_t mtime_ns(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::string_view file_kind(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "something else";
}

bool is_hex2(const char* s) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  return hex(s[0]) && hex(s[1]) && s[2] == '\0';
}

std::string without_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

}  // namespace

DiskTier::DiskTier(std::string dir, int64_t byte_budget, ClusterKey key)
    : DiskTier(std::move(dir), byte_budget, std::move(key), Options{}) {}

DiskTier::DiskTier(std::string dir, int64_t byte_budget, ClusterKey key, Options options)
    : dir_(without_trailing_slashes(std::move(dir))),
      budget_(byte_budget),
      options_(options),
      mac_key_(std::move(key)) {
  std::random_device rd;
  tmp_salt_ = (uint64_t{rd()} << 32) ^ rd();
  open_status_ = make_dirs(dir_);
  scan();
}

std::string DiskTier::path_for(std::string_view key) const {
  return cat(dir_, "/", key.substr(0, 2), "/", key);
}

void DiskTier::scan() {
  DIR* top = ::opendir(dir_.c_str());
  if (top == nullptr) {
    if (open_status_.ok())
      open_status_ = errno_status(errno, cat("disk cache: cannot read directory ", dir_));
    return;
  }
  std::vector<std::tuple<int64_t, std::string, int64_t>> found;  // (mtime, key, size)
  int64_t now = static_cast<int64_t>(::time(nullptr));
  while (dirent* sub = ::readdir(top)) {
    if (!is_hex2(sub->d_name)) continue;
    std::string subdir = cat(dir_, "/", sub->d_name);
    DIR* d = ::opendir(subdir.c_str());
    if (d == nullptr) continue;
    while (dirent* e = ::readdir(d)) {
      std::string_view name = e->d_name;
      std::string path = cat(subdir, "/", name);
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (name.starts_with(kTempPrefix)) {
        if (now - st.st_mtim.tv_sec > kStaleTempSeconds) ::unlink(path.c_str());
        continue;
      }
      // A file whose name is not a key, or is filed under the wrong prefix, is never
      // looked up; leave it alone rather than guess what it is.
      if (!is_cache_key(name) || name.substr(0, 2) != sub->d_name) continue;
      found.emplace_back(mtime_ns(st), std::string(name), static_cast<int64_t>(st.st_size));
    }
    ::closedir(d);
  }
  ::closedir(top);
  std::sort(found.begin(), found.end());
  absl::MutexLock lock(&mu_);
  for (auto& [mtime, key, size] : found) {
    lru_.push_front(Node{key, size});
    index_.emplace(std::move(key), lru_.begin());
    bytes_ += size;
  }
  evict_locked("");  // the budget may have shrunk since the last run
}

absl::StatusOr<std::optional<std::string>> DiskTier::get(std::string_view key_view) {
  if (auto s = check_cache_key(key_view); !s.ok()) return s;
  std::string key(key_view);
  std::string path = path_for(key);
  auto loss = [&](std::string_view what) {
    return absl::DataLossError(cat("corrupt cache entry ", key, " in ", path, ": ", what));
  };
  // Look before opening: what is not a regular file of a sane size is never opened (a
  // device could do something on open, a FIFO would wait for a writer).
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      forget(key);  // evicted or deleted by another process
      return std::optional<std::string>();
    }
    return errno_status(errno, cat("disk cache: cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) return discard(key, path, st, loss(cat("not a regular file but ", file_kind(st.st_mode))));
  if (st.st_size > options_.max_entry_bytes)
    return discard(key, path, st,
                   loss(cat(st.st_size, " bytes, over the ", options_.max_entry_bytes, "-byte cap on an entry")));
  // The path may have been swapped since: O_NOFOLLOW refuses a link, O_NONBLOCK keeps a
  // FIFO from blocking the open, and fstat says what was opened.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      forget(key);
      return std::optional<std::string>();
    }
    if (err == ELOOP && ::lstat(path.c_str(), &st) == 0)
      return discard(key, path, st, loss("not a regular file but a symbolic link"));
    return errno_status(err, cat("disk cache: cannot open ", path));
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > options_.max_entry_bytes) {
    ::close(fd);
    return discard(key, path, st, loss("replaced while being opened by something that is not a valid entry"));
  }
  std::string stored;
  // At most one byte past the cap: a file that grows while being read fails the length
  // check below instead of filling memory.
  absl::Status rs = read_all(fd, static_cast<size_t>(st.st_size), static_cast<size_t>(options_.max_entry_bytes) + 1,
                             stored, path);
  if (!rs.ok()) {
    ::close(fd);
    return rs;
  }
  absl::StatusOr<std::string> payload = cache_entry::decode(mac_key_, key, std::move(stored), path);
  if (!payload.ok()) {
    ::close(fd);
    return discard(key, path, st, payload.status());
  }
  // Record the use in the file too, so the next startup's scan orders entries by last
  // use. Best effort: a read-only directory still serves hits.
  ::futimens(fd, nullptr);
  ::close(fd);
  touch_after_read(key);
  return std::optional<std::string>(*std::move(payload));
}

absl::Status DiskTier::discard(const std::string& key, const std::string& path, const struct stat& st,
                               absl::Status why) {
  forget(key);
  // Remove only what was looked at: if another process has meanwhile renamed a good entry
  // into place, that one stays.
  struct stat now;
  if (::lstat(path.c_str(), &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev) return why;
  if ((S_ISDIR(now.st_mode) ? ::rmdir(path.c_str()) : ::unlink(path.c_str())) != 0)
    return absl::DataLossError(cat(why.message(), " (and it cannot be removed: ", std::strerror(errno), ")"));
  return why;
}

absl::Status DiskTier::remove(std::string_view key_view) {
  if (auto s = check_cache_key(key_view); !s.ok()) return s;
  std::string key(key_view);
  forget(key);
  std::string path = path_for(key);
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return errno_status(errno, cat("disk cache: cannot remove ", path));
}

absl::Status DiskTier::put(std::string_view key_view, std::string_view value) {
  if (auto s = check_cache_key(key_view); !s.ok()) return s;
  std::string key(key_view);
  std::string entry = cache_entry::encode(mac_key_, key, value);
  int64_t size = static_cast<int64_t>(entry.size());
  if (size > budget_ || size > options_.max_entry_bytes)
    return absl::ResourceExhaustedError(cat("disk cache ", dir_, ": entry of ", size, " bytes exceeds ",
                                            size > budget_ ? "the whole budget of " : "the cap on one entry of ",
                                            std::min(budget_, options_.max_entry_bytes), " bytes"));
  std::string subdir = cat(dir_, "/", key.substr(0, 2));
  if (auto s = make_dir(subdir); !s.ok()) {
    // The top directory may be missing (never created, or removed while we run).
    if (!absl::IsNotFound(s)) return s;
    if (auto again = make_dirs(subdir); !again.ok()) return again;
  }
  uint64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = ++tmp_counter_;
  }
  std::string path = cat(subdir, "/", key);
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 4; ++attempt) {
    // O_EXCL: two writers never share a temp file, even across processes.
    tmp = cat(subdir, "/", kTempPrefix, key, ".", ::getpid(), ".", n, ".", tmp_salt_ + attempt);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST)
      return errno_status(errno, cat("disk cache: cannot create ", tmp));
  }
  if (fd < 0) return absl::AlreadyExistsError(cat("disk cache: temp name in use: ", tmp));
  absl::Status ws = write_all(fd, entry, tmp);
  if (ws.ok() && options_.fsync && ::fsync(fd) != 0)
    ws = errno_status(errno, cat("disk cache: cannot fsync ", tmp));
  if (::close(fd) != 0 && ws.ok())
    ws = errno_status(errno, cat("disk cache: cannot write ", tmp));
  if (ws.ok()) {
    // Rename and index update under one lock: an eviction running in between would
    // otherwise unlink the new file while the index goes on counting it.
    absl::MutexLock lock(&mu_);
    if (::rename(tmp.c_str(), path.c_str()) == 0)
      record_locked(key, size);
    else
      ws = errno_status(errno, cat("disk cache: cannot publish ", path));
  }
  if (!ws.ok()) {
    ::unlink(tmp.c_str());
    return ws;
  }
  if (options_.fsync) {
    // Make the rename itself durable.
    int dfd = ::open(subdir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return absl::OkStatus();
}

void DiskTier::touch_after_read(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  // Written by another process (or evicted by this one since we opened it): count it only
  // if it is there now, so the index matches the directory.
  struct stat st;
  if (::lstat(path_for(key).c_str(), &st) == 0 && S_ISREG(st.st_mode))
    record_locked(key, static_cast<int64_t>(st.st_size));
}

void DiskTier::record_locked(const std::string& key, int64_t size) {
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ += size - it->second->size;
    it->second->size = size;
    lru_.splice(lru_.begin(), lru_, it->second);
  } else {
    lru_.push_front(Node{key, size});
    index_.emplace(key, lru_.begin());
    bytes_ += size;
  }
  evict_locked(key);
}

void DiskTier::forget(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return;
  bytes_ -= it->second->size;
  lru_.erase(it->second);
  index_.erase(it);
}

void DiskTier::evict_locked(const std::string& keep) {
  while (bytes_ > budget_ && !lru_.empty()) {
    Node& victim = lru_.back();
    if (victim.key == keep) break;  // the entry just used is the most recent; nothing older
    // ENOENT is fine (another process evicted it); any other failure leaves a file we no
    // longer count, which the next startup's scan finds again.
    ::unlink(path_for(victim.key).c_str());
    bytes_ -= victim.size;
    index_.erase(victim.key);
    lru_.pop_back();
    ++evictions_;
  }
}

int64_t DiskTier::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

size_t DiskTier::entries() const {
  absl::MutexLock lock(&mu_);
  return index_.size();
}

uint64_t DiskTier::evictions() const {
  absl::MutexLock lock(&mu_);
  return evictions_;
}

}  // namespace uop
