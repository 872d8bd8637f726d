// TLS for uopd's two kinds of connection, from PEM files given by flags:
//  - the client API: uopd serves TLS with --tls-cert / --tls-key; with --tls-client-ca it
//    also requires client certificates signed by that CA (mutual TLS);
//  - scheduler <-> workers: mutual TLS. Both ends present a certificate and check the
//    other's against a CA (uopd --worker-tls-cert/--worker-tls-key/--worker-tls-ca;
//    uop-worker --tls-cert/--tls-key/--tls-ca). Embedded workers get the scheduler's
//    files, so one certificate valid for both TLS client and server use serves both ends.
// Host names are checked as usual (a worker at 127.0.0.1:port needs IP:127.0.0.1 among
// its certificate's subject alternative names), unless a name to expect is given
// (cluster_auth::Dialer::tls_server_name). What these credentials are used for, and with
// which secret, is transport/cluster_auth.h's business.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace uop::tls {

struct TlsFiles {
  std::string cert;  // PEM certificate chain presented to the peer
  std::string key;   // PEM private key of `cert`
  std::string ca;    // PEM CA bundle the peer's certificate must chain to
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The contents of a PEM file; NOT_FOUND / INVALID_ARGUMENT naming the file (and `what`).
absl::StatusOr<std::string> read_pem(const std::string& path, const std::string& what);

// Server credentials: cert and key are required; with `require_client_cert`, ca is too
// and every client must present a certificate that chains to it.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_credentials(const TlsFiles& f, bool require_client_cert);

// Channel credentials: ca verifies the server (empty: the system roots); cert and key,
// when given, are presented as the client's certificate.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel_credentials(const TlsFiles& f);

}  // namespace uop::tls
