// Authentication of uopd's internal traffic: the Registry and Rendezvous services on the
// scheduler's internal listener, and the Worker service on every worker. None of it is
// for clients, so none of it is reachable with a client's credentials; every call proves
// itself with one or both of
//  - a shared secret, sent as call metadata (kSecretHeader) on every call and compared in
//    constant time by the server before any handler runs: the cluster secret
//    (--cluster-secret-file) between a scheduler and the workers started elsewhere, or
//    the random secret uopd hands each embedded worker at start; and
//  - mutual TLS: the peer's certificate must chain to the cluster's CA (transport/tls.h).
// A secret over plaintext proves the caller to the server only, and anyone who can watch
// the traffic learns it; where the network between scheduler and workers is not trusted,
// use mutual TLS (alone or with the secret), which authenticates both ends and hides it.
//
// Gate is the server side: the credentials a listener is built with, refusing calls
// without the secret UNAUTHENTICATED (a message that names what is missing, never the
// secret). Dialer is the client side: a channel that presents the secret on every call.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace uop::cluster_auth {

// The metadata key the secret travels under (binary: a secret file may hold any bytes).
inline constexpr std::string_view kSecretHeader = "uopd-internal-secret-bin";
// A secret file holds at least this many bytes (a trailing newline aside).
inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;

// The secret in `path`: its bytes without one trailing newline. FAILED_PRECONDITION
// naming the file when it is not a regular file or others can read or write it (group
// read is allowed only for a file owned by root, how Kubernetes and Docker mount
// secrets), INVALID_ARGUMENT when it is shorter than kMinSecretBytes or longer than
// kMaxSecretBytes, NOT_FOUND when it cannot be opened. No message carries the contents.
absl::StatusOr<std::string> read_secret_file(const std::string& path);

// `bytes` bytes from the OS's CSPRNG (getrandom), as hex digits.
std::string random_hex(size_t bytes);
// A secret made here: 256 bits, as 64 hex digits.
inline std::string random_secret() { return random_hex(32); }

// The server side of an internal listener.
struct Gate {
  // TLS server credentials (transport/tls.h; with client certificates required for mutual
  // TLS); null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> tls;
  // Required of every call but those to `open_methods`; empty: none.
  std::string secret;
  // Full method names ("/grpc.health.v1.Health/Check") that need no secret.
  std::vector<std::string> open_methods;

  bool authenticates() const { return tls != nullptr || !secret.empty(); }
  // The credentials to listen with. Each call builds new ones (gRPC keeps what a
  // listener needs for as long as it serves).
  std::shared_ptr<grpc::ServerCredentials> credentials() const;
};

// The client side: how to reach an internal service.
struct Dialer {
  // TLS channel credentials (with this side's certificate for mutual TLS); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> tls;
  // The name expected in the server's certificate instead of the host dialled; empty: the host.
  std::string tls_server_name;
  // Presented on every call; empty: none.
  std::string secret;

  // The same, presenting `other` as the secret.
  Dialer with_secret(std::string other) const;
  // A channel to `address` with `args` (TLS name override added when set).
  std::shared_ptr<grpc::Channel> channel(const std::string& address, grpc::ChannelArguments args = {}) const;
};

}  // namespace uop::cluster_auth
