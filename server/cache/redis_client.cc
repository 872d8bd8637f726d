// RedisConnection / RedisConnector: a non-blocking socket driven by poll() against one
// deadline per step, with OpenSSL on top when TLS is on.
#include "server/cache/redis_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>

#include "compiler/support/strings.h"

namespace uop {
namespace {

constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kMaxLine = 64 << 10;   // a status, error or length line
constexpr int64_t kMaxArray = 1 << 16;  // elements of one array reply
constexpr int kMaxDepth = 4;            // nested arrays

// OpenSSL writes to the socket with write(), and writing to a connection the server has
// closed raises SIGPIPE, whose default action kills the process. Block it on this thread
// while TLS I/O runs and swallow one that it raised. (Plain sockets use MSG_NOSIGNAL.)
class SigpipeGuard {
 public:
  explicit SigpipeGuard(bool active) : active_(active) {
    if (!active_) return;
    sigset_t pipe = pipe_set();
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeGuard() {
    if (!active_) return;
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
  bool active_;
  sigset_t old_;
  bool was_pending_ = false;
};

// OpenSSL's error queue as text (and emptied).
std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += out.empty() ? buf : cat("; ", buf);
  }
  return out.empty() ? "unknown TLS error" : out;
}

bool is_ip_literal(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

// Milliseconds left, rounded up so that poll() never spins on a sub-millisecond rest.
int remaining_ms(RedisDeadline deadline) {
  auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

absl::Status wait_fd(int fd, short events, RedisDeadline deadline) {
  for (;;) {
    int ms = remaining_ms(deadline);
    if (ms <= 0) return absl::DeadlineExceededError("timed out");
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(cat("poll: ", std::strerror(errno)));
    if (n > 0) return absl::OkStatus();  // ready, or an error the next I/O call reports
  }
}

absl::Status protocol_error(std::string_view what) {
  return absl::UnavailableError(cat("protocol error: ", what));
}

bool parse_int(std::string_view s, int64_t* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

}  // namespace

std::string RedisEndpoint::address() const { return cat(host, ":", port); }

RedisConnection::~RedisConnection() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ::close(fd_);
}

absl::Status RedisConnection::wait(short events, RedisDeadline deadline) {
  return wait_fd(fd_, events, deadline);
}

absl::Status RedisConnection::write_all(std::string_view data, RedisDeadline deadline) {
  while (!data.empty()) {
    if (ssl_ != nullptr) {
      ERR_clear_error();
      int n =
          SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), INT_MAX)));
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      int e = SSL_get_error(ssl_, n);
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
        return absl::UnavailableError(cat("TLS write: ", ssl_errors()));
      if (absl::Status s = wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline); !s.ok())
        return s;
      continue;
    }
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n >= 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return absl::UnavailableError(cat("write: ", std::strerror(errno)));
    if (absl::Status s = wait(POLLOUT, deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::fill(RedisDeadline deadline) {
  if (pos_ == in_.size()) {
    // After a large reply, give its buffer back rather than hold it for the connection's life.
    if (in_.capacity() > 4 * kReadChunk) std::string().swap(in_);
    in_.clear();
    pos_ = 0;
  } else if (pos_ > kReadChunk) {
    in_.erase(0, pos_);
    pos_ = 0;
  }
  size_t old = in_.size();
  in_.resize(old + kReadChunk);
  for (;;) {
    if (ssl_ != nullptr) {
      ERR_clear_error();
      int n = SSL_read(ssl_, in_.data() + old, static_cast<int>(kReadChunk));
      if (n > 0) {
        in_.resize(old + static_cast<size_t>(n));
        return absl::OkStatus();
      }
      int e = SSL_get_error(ssl_, n);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        if (absl::Status s = wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline); !s.ok()) {
          in_.resize(old);
          return s;
        }
        continue;
      }
      in_.resize(old);
      if (e == SSL_ERROR_ZERO_RETURN)
        return absl::UnavailableError("connection closed by the server");
      return absl::UnavailableError(cat("TLS read: ", ssl_errors()));
    }
    ssize_t n = ::recv(fd_, in_.data() + old, kReadChunk, 0);
    if (n > 0) {
      in_.resize(old + static_cast<size_t>(n));
      return absl::OkStatus();
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = wait(POLLIN, deadline); !s.ok()) {
        in_.resize(old);
        return s;
      }
      continue;
    }
    in_.resize(old);
    return absl::UnavailableError(n == 0 ? "connection closed by the server"
                                         : cat("read: ", std::strerror(errno)));
  }
}

absl::StatusOr<std::string> RedisConnection::read_line(RedisDeadline deadline) {
  size_t scanned = 0;  // bytes past pos_ known to hold no CRLF (fill() may move pos_)
  for (;;) {
    size_t eol = in_.find("\r\n", pos_ + scanned);
    if (eol != std::string::npos) {
      std::string line = in_.substr(pos_, eol - pos_);
      pos_ = eol + 2;
      return line;
    }
    if (in_.size() - pos_ > kMaxLine) return protocol_error("a reply line longer than 64 KiB");
    scanned = std::max<size_t>(in_.size() - pos_, 1) - 1;  // a "\r" may end the buffer
    if (absl::Status s = fill(deadline); !s.ok()) return s;
  }
}

absl::StatusOr<RedisReply> RedisConnection::read_reply(RedisDeadline deadline, int depth) {
  absl::StatusOr<std::string> line = read_line(deadline);
  if (!line.ok()) return line.status();
  if (line->empty()) return protocol_error("an empty reply line");
  std::string_view rest = std::string_view(*line).substr(1);
  RedisReply r;
  int64_t n = 0;
  switch ((*line)[0]) {
    case '+':
      r.type = RedisReply::Type::Status;
      r.str = rest;
      return r;
    case '-':
      r.type = RedisReply::Type::Error;
      r.str = rest;
      return r;
    case ':':
      if (!parse_int(rest, &r.integer))
        return protocol_error(cat("a bad integer reply '", rest.substr(0, 32), "'"));
      r.type = RedisReply::Type::Integer;
      return r;
    case '$': {
      if (!parse_int(rest, &n) || n < -1)
        return protocol_error(cat("a bad string length '", rest.substr(0, 32), "'"));
      if (n == -1) return r;  // nil
      if (static_cast<uint64_t>(n) > max_reply_bytes_)
        return protocol_error(
            cat("a string reply of ", n, " bytes, over the ", max_reply_bytes_, "-byte cap"));
      r.type = RedisReply::Type::Bulk;
      size_t len = static_cast<size_t>(n);
      while (in_.size() - pos_ < len + 2)
        if (absl::Status s = fill(deadline); !s.ok()) return s;
      if (in_.compare(pos_ + len, 2, "\r\n") != 0)
        return protocol_error("a string reply not ended by CRLF");
      r.str = in_.substr(pos_, len);
      pos_ += len + 2;
      return r;
    }
    case '*': {
      if (!parse_int(rest, &n) || n < -1 || n > kMaxArray || depth >= kMaxDepth)
        return protocol_error(
            cat("an array reply of '", rest.substr(0, 32), "' elements at depth ", depth));
      if (n == -1) return r;
      r.type = RedisReply::Type::Array;
      for (int64_t i = 0; i < n; ++i) {
        absl::StatusOr<RedisReply> e = read_reply(deadline, depth + 1);
        if (!e.ok()) return e.status();
        r.elements.push_back(*std::move(e));
      }
      return r;
    }
    default:
      return protocol_error(cat("a reply starting with byte ",
                                static_cast<int>(static_cast<unsigned char>((*line)[0]))));
  }
}

absl::StatusOr<RedisReply> RedisConnection::command(const std::vector<std::string_view>& args,
                                                    RedisDeadline deadline) {
  SigpipeGuard guard(ssl_ != nullptr);
  if (pos_ != in_.size()) return protocol_error("bytes from the server that answer no command");
  // Small arguments are gathered into one write; a large one (an entry) is written from
  // where it lies rather than copied.
  std::string head = cat("*", args.size(), "\r\n");
  for (std::string_view a : args) {
    head += cat("$", a.size(), "\r\n");
    if (a.size() > kReadChunk) {
      if (absl::Status s = write_all(head, deadline); !s.ok()) return s;
      if (absl::Status s = write_all(a, deadline); !s.ok()) return s;
      head.clear();
    } else {
      head.append(a);
    }
    head += "\r\n";
  }
  if (absl::Status s = write_all(head, deadline); !s.ok()) return s;
  return read_reply(deadline, 0);
}

absl::Status RedisConnection::handshake(RedisDeadline deadline) {
  SigpipeGuard guard(true);
  for (;;) {
    ERR_clear_error();
    int r = SSL_connect(ssl_);
    if (r == 1) return absl::OkStatus();
    int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      if (absl::Status s = wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline); !s.ok())
        return absl::Status(s.code(), cat("TLS handshake: ", s.message()));
      continue;
    }
    long verify = SSL_get_verify_result(ssl_);
    std::string why =
        verify != X509_V_OK
            ? cat("the server's certificate is refused: ", X509_verify_cert_error_string(verify))
            : (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0
                   ? std::string("connection closed (is it a TLS port?)")
                   : ssl_errors());
    return absl::UnavailableError(cat("TLS handshake: ", why));
  }
}

absl::StatusOr<RedisConnector> RedisConnector::create(RedisEndpoint endpoint) {
  if (endpoint.host.empty()) return absl::InvalidArgumentError("redis: no host");
  if (endpoint.port <= 0 || endpoint.port > 65535)
    return absl::InvalidArgumentError(cat("redis: bad port ", endpoint.port));
  if (!endpoint.user.empty() && endpoint.password.empty())
    return absl::InvalidArgumentError("redis: an ACL user needs a password");
  const RedisEndpoint::Tls& t = endpoint.tls;
  if (!t.enabled &&
      !(t.ca_file.empty() && t.cert_file.empty() && t.key_file.empty() && t.server_name.empty()))
    return absl::InvalidArgumentError(
        "redis: TLS files or a server name given without TLS turned on");
  if (t.cert_file.empty() != t.key_file.empty())
    return absl::InvalidArgumentError(
        "redis: a TLS client certificate needs both its certificate and its key");
  RedisConnector c;
  if (t.enabled) {
    ERR_clear_error();
    std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
    if (!ctx) return absl::InternalError(cat("redis TLS: ", ssl_errors()));
    SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_mode(ctx.get(),
                     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    int loaded = t.ca_file.empty()
                     ? SSL_CTX_set_default_verify_paths(ctx.get())
                     : SSL_CTX_load_verify_locations(ctx.get(), t.ca_file.c_str(), nullptr);
    if (loaded != 1)
      return absl::FailedPreconditionError(cat("redis TLS: cannot load the CA ",
                                               t.ca_file.empty() ? "(system)" : t.ca_file, ": ",
                                               ssl_errors()));
    if (!t.cert_file.empty()) {
      if (SSL_CTX_use_certificate_chain_file(ctx.get(), t.cert_file.c_str()) != 1)
        return absl::FailedPreconditionError(
            cat("redis TLS: cannot load the certificate ", t.cert_file, ": ", ssl_errors()));
      if (SSL_CTX_use_PrivateKey_file(ctx.get(), t.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
        return absl::FailedPreconditionError(
            cat("redis TLS: cannot load the key ", t.key_file, ": ", ssl_errors()));
      if (SSL_CTX_check_private_key(ctx.get()) != 1)
        return absl::FailedPreconditionError(cat("redis TLS: the key ", t.key_file,
                                                 " does not match the certificate ", t.cert_file));
    }
    c.tls_ = std::move(ctx);
  }
  c.endpoint_ = std::move(endpoint);
  return c;
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnector::connect(
    RedisDeadline deadline) const {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(endpoint_.host.c_str(), std::to_string(endpoint_.port).c_str(), &hints,
                             &found);
      rc != 0)
    return absl::UnavailableError(cat("cannot resolve ", endpoint_.host, ": ", gai_strerror(rc)));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addrs(found, &::freeaddrinfo);
  int fd = -1;
  absl::Status last = absl::UnavailableError("connect: no address");
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = absl::UnavailableError(cat("socket: ", std::strerror(errno)));
      continue;
    }
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      if (absl::Status s = wait_fd(fd, POLLOUT, deadline); !s.ok()) {
        ::close(fd);
        return absl::Status(s.code(), cat("connect: ", s.message()));
      }
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err != 0) {
      last = absl::UnavailableError(cat("connect: ", std::strerror(err)));
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) return last;
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);  // notices a peer that vanished
  std::unique_ptr<RedisConnection> conn(
      new RedisConnection(fd, nullptr, endpoint_.max_reply_bytes));
  if (tls_) {
    conn->ssl_ = SSL_new(tls_.get());
    if (conn->ssl_ == nullptr || SSL_set_fd(conn->ssl_, fd) != 1)
      return absl::InternalError(cat("TLS: ", ssl_errors()));
    const std::string& name =
        endpoint_.tls.server_name.empty() ? endpoint_.host : endpoint_.tls.server_name;
    bool named = is_ip_literal(name)
                     ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(conn->ssl_), name.c_str()) == 1
                     : SSL_set_tlsext_host_name(conn->ssl_, name.c_str()) == 1 &&
                           SSL_set1_host(conn->ssl_, name.c_str()) == 1;
    if (!named)
      return absl::InvalidArgumentError(
          cat("TLS: cannot check the server name '", name, "': ", ssl_errors()));
    if (absl::Status s = conn->handshake(deadline); !s.ok()) return s;
  }
  if (!endpoint_.password.empty()) {
    std::vector<std::string_view> auth = {"AUTH"};
    if (!endpoint_.user.empty()) auth.push_back(endpoint_.user);
    auth.push_back(endpoint_.password);
    absl::StatusOr<RedisReply> r = conn->command(auth, deadline);
    if (!r.ok()) return absl::Status(r.status().code(), cat("AUTH: ", r.status().message()));
    if (r->type == RedisReply::Type::Error)
      return absl::PermissionDeniedError(cat(
          "AUTH", endpoint_.user.empty() ? "" : cat(" as ", endpoint_.user), " refused: ", r->str));
  }
  return conn;
}

}  // namespace uop
