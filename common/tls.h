// gRPC credentials from PEM files: TLS for the coordinator's port, optionally mutual TLS
// (clients must present a certificate signed by `client_ca`), and the matching client side.
// Empty paths mean plaintext, for loopback and tests.
//
// Thread-safety: free functions.
#ifndef TESSERA_COMMON_TLS_H_
#define TESSERA_COMMON_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace tessera {

struct TlsFiles {
  std::string cert;  // PEM certificate chain of this side
  std::string key;   // PEM private key of this side
  std::string ca;    // PEM roots: the server's CA (client side) / clients' CA for mTLS (server)
};

// Server side: insecure if cert and key are empty; TLS with both; mTLS if `ca` is also set.
// Errors: InvalidArgument if only one of cert/key is given, or `ca` without them;
// NotFound / PermissionDenied naming a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

// Client side: insecure if all are empty; TLS verifying the server with `ca` (system roots if
// empty); with cert and key, presents a client certificate (mTLS).
// Errors: as MakeServerCredentials.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files);

}  // namespace tessera

#endif  // TESSERA_COMMON_TLS_H_
