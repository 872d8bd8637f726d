// The secret check runs as gRPC's auth metadata processor, in the transport before the
// call reaches any handler, so a refused call never runs a line of service code. gRPC's
// C++ API attaches processors to TLS credentials only; for plaintext listeners
// PlaintextCredentials does what InsecureServerCredentials does through gRPC's C API,
// with the processor attached there. On the client, an interceptor adds the secret to
// every call of a channel (call credentials would be dropped on a plaintext channel).
#include "transport/cluster_auth.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <array>
#include <cstring>
#include <map>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/strings/str_format.h"
#include "compiler/support/strings.h"

namespace uop::cluster_auth {
namespace {

using Digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;

Digest digest(std::string_view bytes) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), d.data());
  return d;
}

// Compares digests, never the secrets themselves: equal-length inputs to a constant-time
// comparison whatever the caller sent, so neither the bytes nor the length leak by timing.
class SecretProcessor final : public grpc::AuthMetadataProcessor {
 public:
  SecretProcessor(std::string_view secret, std::vector<std::string> open_methods)
      : want_(digest(secret)), open_(std::move(open_methods)) {}

  bool IsBlocking() const override { return false; }  // a hash and a compare: run it inline

  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata* consumed,
                       OutputMetadata*) override {
    auto path = md.find(":path");
    std::string method = path == md.end() ? std::string() : std::string(path->second.data(), path->second.size());
    for (const std::string& m : open_) if (m == method) return grpc::Status::OK;
    auto [first, last] = md.equal_range(grpc::string_ref(kSecretHeader.data(), kSecretHeader.size()));
    if (first == last)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          cat(method, ": an internal uopd service; the call carries no cluster secret (",
                              kSecretHeader, "; uopd and uop-worker --cluster-secret-file)"));
    if (std::next(first) != last)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, cat(method, ": more than one ", kSecretHeader));
    Digest got = digest(std::string_view(first->second.data(), first->second.size()));
    if (CRYPTO_memcmp(got.data(), want_.data(), got.size()) != 0)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          cat(method, ": the call's cluster secret is not this server's"));
    // Handlers never see it.
    consumed->emplace(std::string(kSecretHeader), std::string(first->second.data(), first->second.size()));
    return grpc::Status::OK;
  }

 private:
  const Digest want_;
  const std::vector<std::string> open_;
};

// InsecureServerCredentials with an auth metadata processor: gRPC's core runs processors
// on any credentials, its C++ wrapper only on secure ones.
class PlaintextCredentials final : public grpc::ServerCredentials {
 public:
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>& p) override { processor_ = p; }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = grpc_insecure_server_credentials_create();
    if (processor_) {
      // The state outlives this object: the core keeps the credentials while it listens
      // and calls destroy when it lets them go.
      auto* state = new std::shared_ptr<grpc::AuthMetadataProcessor>(processor_);
      grpc_server_credentials_set_auth_metadata_processor(
          creds, {&process, [](void* s) { delete static_cast<std::shared_ptr<grpc::AuthMetadataProcessor>*>(s); }, state});
    }
    int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);
    return port;
  }

  static grpc::string_ref ref(const grpc_slice& s) {
    return grpc::string_ref(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)), GRPC_SLICE_LENGTH(s));
  }

  static void process(void* state, grpc_auth_context*, const grpc_metadata* md, size_t n,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    auto& processor = *static_cast<std::shared_ptr<grpc::AuthMetadataProcessor>*>(state);
    grpc::AuthMetadataProcessor::InputMetadata in;
    for (size_t i = 0; i < n; ++i) in.emplace(ref(md[i].key), ref(md[i].value));
    grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
    grpc::Status st = processor->Process(in, nullptr, &consumed, &response);
    std::vector<grpc_metadata> out;
    for (const auto& [k, v] : consumed) {
      grpc_metadata m{};
      m.key = grpc_slice_from_static_buffer(k.data(), k.size());
      m.value = grpc_slice_from_static_buffer(v.data(), v.size());
      out.push_back(m);
    }
    // `done` copies what it needs before it returns.
    done(user_data, out.data(), out.size(), nullptr, 0, static_cast<grpc_status_code>(st.error_code()),
         st.ok() ? nullptr : st.error_message().c_str());
  }

  std::shared_ptr<grpc::AuthMetadataProcessor> processor_;
};

class SecretInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit SecretInterceptor(std::shared_ptr<const std::string> secret) : secret_(std::move(secret)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA))
      m->GetSendInitialMetadata()->emplace(std::string(kSecretHeader), *secret_);
    m->Proceed();
  }

 private:
  std::shared_ptr<const std::string> secret_;
};

class SecretInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SecretInterceptorFactory(std::shared_ptr<const std::string> secret) : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new SecretInterceptor(secret_);
  }

 private:
  std::shared_ptr<const std::string> secret_;
};

}  // namespace

absl::StatusOr<std::string> read_secret_file(const std::string& path) {
  // Non-blocking: a FIFO put where the file should be must not hang the start.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return absl::NotFoundError(cat("secret file ", path, ": cannot open it: ", strerrordesc_np(errno)));
  struct stat st {};
  std::string out;
  absl::Status bad;
  if (fstat(fd, &st) != 0) {
    bad = absl::FailedPreconditionError(cat("secret file ", path, ": cannot stat it: ", strerrordesc_np(errno)));
  } else if (!S_ISREG(st.st_mode)) {
    bad = absl::FailedPreconditionError(cat("secret file ", path, ": not a regular file"));
  } else if ((st.st_mode & (S_IRWXO | S_IWGRP | S_IXGRP)) != 0 || ((st.st_mode & S_IRGRP) != 0 && st.st_uid != 0)) {
    bad = absl::FailedPreconditionError(
        cat("secret file ", path, ": mode ", absl::StrFormat("%04o", st.st_mode & 07777),
            " lets others read or change it; make it readable by its owner only (chmod 600), or by a group "
            "only when root owns it (a mounted secret)"));
  } else if (st.st_size > static_cast<off_t>(kMaxSecretBytes) + 1) {
    bad = absl::InvalidArgumentError(cat("secret file ", path, ": more than ", kMaxSecretBytes, " bytes"));
  } else {
    char buf[kMaxSecretBytes + 2];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf - out.size())) != 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        bad = absl::FailedPreconditionError(cat("secret file ", path, ": cannot read it: ", strerrordesc_np(errno)));
        break;
      }
      out.append(buf, static_cast<size_t>(n));
      if (out.size() > kMaxSecretBytes + 1) break;
    }
  }
  close(fd);
  if (!bad.ok()) return bad;
  if (!out.empty() && out.back() == '\n') out.pop_back();
  if (!out.empty() && out.back() == '\r') out.pop_back();
  if (out.size() < kMinSecretBytes || out.size() > kMaxSecretBytes)
    return absl::InvalidArgumentError(cat("secret file ", path, ": a secret has ", kMinSecretBytes, " to ",
                                          kMaxSecretBytes, " bytes (e.g. openssl rand -hex 32), this one ",
                                          out.size()));
  return out;
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    else if (errno != EINTR) abort();  // the kernel's CSPRNG failing is no state to serve in
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : raw) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::shared_ptr<grpc::ServerCredentials> Gate::credentials() const {
  std::shared_ptr<grpc::ServerCredentials> creds = tls ? tls : std::make_shared<PlaintextCredentials>();
  if (!secret.empty()) creds->SetAuthMetadataProcessor(std::make_shared<SecretProcessor>(secret, open_methods));
  return creds;
}

Dialer Dialer::with_secret(std::string other) const {
  Dialer d = *this;
  d.secret = std::move(other);
  return d;
}

std::shared_ptr<grpc::Channel> Dialer::channel(const std::string& address, grpc::ChannelArguments args) const {
  if (tls && !tls_server_name.empty()) args.SetSslTargetNameOverride(tls_server_name);
  std::shared_ptr<grpc::ChannelCredentials> creds = tls ? tls : grpc::InsecureChannelCredentials();
  if (secret.empty()) return grpc::CreateCustomChannel(address, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<SecretInterceptorFactory>(std::make_shared<const std::string>(secret)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args, std::move(interceptors));
}

}  // namespace uop::cluster_auth
