#include "common/bulk_handshake.h"

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

constexpr absl::string_view kClientLabel = "tessera bulk peer v1";
constexpr absl::string_view kServerLabel = "tessera bulk holder v1";

}  // namespace

std::string BulkClientProof(const PeerCredential& credential, absl::string_view holder_nonce,
                            absl::string_view peer_nonce, absl::string_view request) {
  return PeerMac(credential.secret,
                 {kClientLabel, credential.job_id, holder_nonce, peer_nonce, request});
}

std::string BulkServerProof(const PeerCredential& credential, absl::string_view holder_nonce,
                            absl::string_view peer_nonce) {
  return PeerMac(credential.secret, {kServerLabel, credential.job_id, holder_nonce, peer_nonce});
}

absl::StatusOr<v1::BulkChallenge> DecodeBulkChallenge(absl::string_view body) {
  v1::BulkChallenge challenge;
  if (!challenge.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError("malformed BulkChallenge");
  }
  if (challenge.nonce().size() != kPeerNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a BulkChallenge nonce of ",
                                                   challenge.nonce().size(), " bytes (must be ",
                                                   kPeerNonceBytes, ")"));
  }
  return challenge;
}

absl::StatusOr<v1::BulkHello> DecodeBulkHello(absl::string_view body) {
  v1::BulkHello hello;
  if (!hello.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError("malformed BulkHello");
  }
  if (hello.nonce().size() != kPeerNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a BulkHello nonce of ", hello.nonce().size(),
                                                   " bytes (must be ", kPeerNonceBytes, ")"));
  }
  if (hello.proof().size() != kPeerMacBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a BulkHello proof of ", hello.proof().size(),
                                                   " bytes (must be ", kPeerMacBytes, ")"));
  }
  return hello;
}

absl::StatusOr<v1::BulkRequest> OpenBulkHello(const PeerCredential& credential,
                                              absl::string_view holder_nonce,
                                              const v1::BulkHello& hello) {
  if (credential.secret.size() != kPeerSecretBytes) {
    return absl::UnauthenticatedError(
        absl::StrCat("this agent of job ", credential.job_id,
                     " has no peer secret yet (not registered): every peer is refused"));
  }
  if (!SameMac(hello.proof(),
               BulkClientProof(credential, holder_nonce, hello.nonce(), hello.request()))) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the peer did not prove it belongs to job ", credential.job_id,
        " (no secret, another job's, or a replayed or forged handshake): refused"));
  }
  v1::BulkRequest request;
  if (!request.ParseFromString(hello.request())) {
    return absl::InvalidArgumentError("malformed BulkRequest in a BulkHello");
  }
  if (request.kind_case() == v1::BulkRequest::KIND_NOT_SET) {
    return absl::InvalidArgumentError("a BulkRequest with neither a read nor a put");
  }
  return request;
}

absl::Status CheckBulkServerProof(const PeerCredential& credential,
                                  absl::string_view holder_nonce, absl::string_view peer_nonce,
                                  const v1::BulkStatus& status, absl::string_view address) {
  if (credential.secret.size() == kPeerSecretBytes &&
      SameMac(status.proof(), BulkServerProof(credential, holder_nonce, peer_nonce))) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "the bulk port ", address, " did not prove it belongs to job ", credential.job_id,
      ": nothing of a memory copy is sent to or taken from it"));
}

}  // namespace tessera
