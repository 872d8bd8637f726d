#include "transport/tls.h"

#include <fstream>
#include <sstream>

#include "compiler/support/strings.h"
#include "grpcpp/grpcpp.h"

namespace uop::tls {
absl::StatusOr<std::string> read_pem(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(cat(what, " ", path, ": cannot open it"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos)
    return absl::InvalidArgumentError(cat(what, " ", path, ": not a PEM file (no -----BEGIN line)"));
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_credentials(const TlsFiles& f, bool require_client_cert) {
  if (f.cert.empty() || f.key.empty()) return absl::InvalidArgumentError("TLS needs both a certificate and its key");
  auto cert = read_pem(f.cert, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = read_pem(f.key, "TLS key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions o(require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                          : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (require_client_cert) {
    if (f.ca.empty()) return absl::InvalidArgumentError("mutual TLS needs a CA to check client certificates against");
    auto ca = read_pem(f.ca, "TLS CA");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *ca;
  }
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel_credentials(const TlsFiles& f) {
  grpc::SslCredentialsOptions o;
  if (!f.ca.empty()) {
    auto ca = read_pem(f.ca, "TLS CA");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *ca;
  }
  if (f.cert.empty() != f.key.empty()) return absl::InvalidArgumentError("a client certificate needs its key, and a key its certificate");
  if (!f.cert.empty()) {
    auto cert = read_pem(f.cert, "TLS certificate");
    if (!cert.ok()) return cert.status();
    auto key = read_pem(f.key, "TLS key");
    if (!key.ok()) return key.status();
    o.pem_cert_chain = *cert;
    o.pem_private_key = *key;
  }
  return grpc::SslCredentials(o);
}

}  // namespace uop::tls
