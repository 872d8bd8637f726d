// ClusterKey: reading a key file safely, making the embedded default's key once, and the
// HMAC itself (OpenSSL's EVP_MAC).
#include "server/cache/cluster_key.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "compiler/ir/digest.h"
#include "compiler/support/strings.h"

namespace uop {
namespace {

std::string mode_octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// O_NONBLOCK: a FIFO planted at the path must not stall startup. Symbolic links are
// followed for a file given by name (Kubernetes mounts secrets through them); the file
// itself is what is checked. The key uopd made itself (`made_here`) must be that very file,
// owned by this user: never a link someone put in its place.
absl::StatusOr<std::string> read_secret(const std::string& path, std::string_view what,
                                        size_t max_bytes, bool made_here) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (made_here ? O_NOFOLLOW : 0));
  if (fd < 0) {
    std::string msg = cat(what, " ", path, ": ", std::strerror(errno));
    if (errno == ENOENT || errno == ENOTDIR) return absl::NotFoundError(msg);
    if (errno == ELOOP && made_here)
      return absl::FailedPreconditionError(
          cat(what, " ", path, " is a symbolic link, not the file uopd made; remove it"));
    return errno == EACCES ? absl::PermissionDeniedError(msg) : absl::FailedPreconditionError(msg);
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0)
    return absl::FailedPreconditionError(cat(what, " ", path, ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    return absl::FailedPreconditionError(cat(what, " ", path, " is not a regular file"));
  if ((st.st_mode & 077) != 0)
    return absl::FailedPreconditionError(
        cat(what, " ", path, " can be read or written by group or others (mode ",
            mode_octal(st.st_mode), "): it is a secret; chmod 600 it"));
  if (made_here && st.st_uid != ::geteuid())
    return absl::FailedPreconditionError(cat(what, " ", path, " belongs to uid ", st.st_uid,
                                             ", not to this user (uid ", ::geteuid(),
                                             "): whoever made it may know it; remove it"));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return absl::FailedPreconditionError(cat(what, " ", path, " holds ", st.st_size,
                                             " bytes, over the ", max_bytes, " a secret may have"));
  std::string out(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return absl::FailedPreconditionError(cat(what, " ", path, ": ", std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes)
    return absl::FailedPreconditionError(
        cat(what, " ", path, " grew past ", max_bytes, " bytes while being read"));
  out.resize(got);
  return out;
}

absl::StatusOr<ClusterKey> key_from(const std::string& path, bool made_here) {
  auto bytes = read_secret(path, "cache key file", ClusterKey::kMaxBytes, made_here);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() < ClusterKey::kMinBytes)
    return absl::FailedPreconditionError(cat("cache key file ", path, " holds ", bytes->size(),
                                             " bytes; a key needs at least ", ClusterKey::kMinBytes,
                                             " random bytes (head -c 32 /dev/urandom > FILE)"));
  return ClusterKey::from_bytes(*std::move(bytes));
}

absl::Status unavailable(std::string what, int err) {
  return absl::UnavailableError(cat(what, ": ", std::strerror(err)));
}

// Writes a fresh random key to a temp file in `dir` and links it to `path` unless a key
// is there already. OK in both cases: the caller reads whichever key `path` names.
absl::Status make_key(const std::string& dir, const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::UnavailableError(
        cat("cannot create the cache directory ", dir, " for its key: ", ec.message()));
  unsigned char salt[8], key[32];
  if (RAND_bytes(salt, sizeof salt) != 1 || RAND_bytes(key, sizeof key) != 1)
    return absl::InternalError("cache key: the random number generator failed");
  uint64_t s;
  std::memcpy(&s, salt, sizeof s);
  std::string tmp = cat(dir, "/.tmp.", ClusterKey::kFileName, ".", ::getpid(), ".", s);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return unavailable(cat("cannot create a cache key in ", dir), errno);
  bool written =
      ::write(fd, key, sizeof key) == static_cast<ssize_t>(sizeof key) && ::fsync(fd) == 0;
  int err = errno;
  written = ::close(fd) == 0 && written;
  int linked = written ? ::link(tmp.c_str(), path.c_str()) : -1;
  if (written) err = errno;
  ::unlink(tmp.c_str());
  if (!written) return unavailable(cat("cannot write a cache key in ", dir), err);
  if (linked != 0 && err != EEXIST)
    return unavailable(cat("cannot publish the cache key ", path), err);
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);  // the name too, so a power cut does not lose the key the entries need
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> read_secret_file(const std::string& path, std::string_view what,
                                             size_t max_bytes) {
  return read_secret(path, what, max_bytes, /*made_here=*/false);
}

absl::StatusOr<ClusterKey> ClusterKey::from_file(const std::string& path) {
  return key_from(path, /*made_here=*/false);
}

absl::StatusOr<ClusterKey> ClusterKey::in_directory(const std::string& dir) {
  std::string path = cat(dir, "/", kFileName);
  auto existing = key_from(path, /*made_here=*/true);
  // A directory this user may not read is one it cannot use, like one it cannot create.
  if (absl::IsPermissionDenied(existing.status()))
    return absl::UnavailableError(existing.status().message());
  if (!absl::IsNotFound(existing.status())) return existing;
  if (absl::Status made = make_key(dir, path); !made.ok()) return made;
  return key_from(path, /*made_here=*/true);
}

absl::StatusOr<ClusterKey> ClusterKey::from_bytes(std::string bytes) {
  if (bytes.size() < kMinBytes)
    return absl::InvalidArgumentError(
        cat("a cache key needs at least ", kMinBytes, " bytes, got ", bytes.size()));
  return ClusterKey(std::move(bytes));
}

std::array<uint8_t, 32> ClusterKey::mac(std::initializer_list<std::string_view> parts) const {
  // EVP_MAC_fetch is not free; the algorithm object is immutable and shared by threads.
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  std::array<uint8_t, 32> out{};
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(
      hmac ? EVP_MAC_CTX_new(hmac) : nullptr, &EVP_MAC_CTX_free);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  size_t len = 0;
  bool ok = ctx && EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(bytes_.data()),
                                bytes_.size(), params) == 1;
  for (std::string_view p : parts)
    ok = ok &&
         EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1;
  ok = ok && EVP_MAC_final(ctx.get(), out.data(), &len, out.size()) == 1 && len == out.size();
  // Without libcrypto's HMAC nothing can be verified; a MAC of zeros from a failed call
  // would be one everybody could forge. This is a broken installation, not input.
  if (!ok) {
    std::fprintf(stderr, "uopd: fatal: OpenSSL HMAC-SHA256 failed\n");
    std::abort();
  }
  return out;
}

std::string ClusterKey::fingerprint() const {
  return sha256(cat("uopd cache key fingerprint\n", bytes_)).hex().substr(0, 16);
}

}  // namespace uop
