// The bulk port's handshake (proto/tessera/v1/peer.proto "Bulk transfers"; decision 0042),
// its pure half: the proofs each side computes and the decoders of what arrives, with no
// socket (common/bulk_wire.h drives it over one).
//
//   holder ──BulkChallenge{Ns}──────────────────────────────► peer
//   holder ◄─BulkHello{Np, request, Pp}───────────────────── peer   Pp = BulkClientProof
//   holder: OpenBulkHello: Pp checked, then the request parsed; a bad Pp: UNAUTHENTICATED,
//           before any memory is reserved or any byte of a copy sent
//   holder ──BulkStatus{code, nbytes, Ph}───────────────────► peer  Ph = BulkServerProof
//   peer: CheckBulkServerProof before it sends or takes a byte of a copy
//
// Both proofs are HMAC-SHA256 under the job's secret over both nonces and the job, each with
// its own label (so one side's proof is never the other's); the peer's also covers the request.
// A recorded hello replayed on a new connection fails: the holder's nonce is new. A peer of
// another job computes its proof under another secret and fails alike.
//
// Thread-safety: pure functions.
#ifndef TESSERA_COMMON_BULK_HANDSHAKE_H_
#define TESSERA_COMMON_BULK_HANDSHAKE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/peer_auth.h"
#include "tessera/v1/peer.pb.h"

namespace tessera {

// The peer's proof: it holds `credential`'s secret, on the connection whose nonces are
// `holder_nonce` and `peer_nonce`, for `request` (a serialized BulkRequest).
std::string BulkClientProof(const PeerCredential& credential, absl::string_view holder_nonce,
                            absl::string_view peer_nonce, absl::string_view request);

// The holder's proof, likewise (over no request).
std::string BulkServerProof(const PeerCredential& credential, absl::string_view holder_nonce,
                            absl::string_view peer_nonce);

// Decodes a BulkChallenge frame's body. Errors: InvalidArgument if it does not parse or its
// nonce is not kPeerNonceBytes long.
absl::StatusOr<v1::BulkChallenge> DecodeBulkChallenge(absl::string_view body);

// Decodes a BulkHello frame's body. Errors: InvalidArgument if it does not parse, or its nonce
// is not kPeerNonceBytes or its proof not kPeerMacBytes long.
absl::StatusOr<v1::BulkHello> DecodeBulkHello(absl::string_view body);

// The request of `hello`, sent on the connection whose holder nonce is `holder_nonce`, once its
// proof shows a peer of `credential`'s job. Errors: Unauthenticated if `credential` has no
// secret yet (the agent has not registered) or the proof does not match (no secret, another
// job's, a replayed or forged hello); InvalidArgument if the request does not parse, or has
// neither a read nor a put.
absl::StatusOr<v1::BulkRequest> OpenBulkHello(const PeerCredential& credential,
                                              absl::string_view holder_nonce,
                                              const v1::BulkHello& hello);

// Whether `status` (the holder's first answer) proves the holder is of `credential`'s job.
// Errors: Unauthenticated naming `address` if not.
absl::Status CheckBulkServerProof(const PeerCredential& credential,
                                  absl::string_view holder_nonce, absl::string_view peer_nonce,
                                  const v1::BulkStatus& status, absl::string_view address);

}  // namespace tessera

#endif  // TESSERA_COMMON_BULK_HANDSHAKE_H_
