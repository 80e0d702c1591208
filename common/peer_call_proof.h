// What proves a call on an agent's Peer gRPC port (Peer, PeerMemory, CommandRelay) comes from an
// agent of the same job (issue 51; decision 0042): each call carries, in its metadata
// (kPeerProofMetadata), a proof made for it alone —
//     v1.<unix ms>.<nonce, hex>.<HMAC-SHA256 under the job's secret over the method, the
//     time, the nonce and the job, hex>
// — which the receiving agent's PeerCallGate checks before the call does anything: no byte of a
// copy is read, no room reserved, no command handled for a call that fails. A replayed proof
// fails (its nonce was seen: the gate remembers nonces for as long as their time is
// acceptable), as does a proof older or newer than kPeerCallSkew (so the nodes' clocks must
// agree within it: NTP), one made for another method, one under no secret or another job's.
//
// Why per call, not per connection: gRPC hands call credentials only to secure channels and
// has no hook into an insecure connection's setup; a per-call proof needs neither TLS nor
// anything from the operator, and costs two HMACs over a few dozen bytes per call (these calls
// are few: one stream per leader per save, one relay per PIN, a few per restore).
//
// Thread-safety: the functions are pure; PeerCallGate is thread-safe.
#ifndef TESSERA_COMMON_PEER_CALL_PROOF_H_
#define TESSERA_COMMON_PEER_CALL_PROOF_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/peer_auth.h"
#include "grpcpp/grpcpp.h"

namespace tessera {

inline constexpr char kPeerProofMetadata[] = "tessera-peer-proof";
// How far a proof's time may be from the receiver's clock.
inline constexpr absl::Duration kPeerCallSkew = absl::Minutes(5);

// The methods, as both sides name them in a proof.
inline constexpr char kPushSlicesMethod[] = "/tessera.v1.Peer/PushSlices";
inline constexpr char kPutMemoryCopyMethod[] = "/tessera.v1.PeerMemory/PutMemoryCopy";
inline constexpr char kReadMemoryCopyMethod[] = "/tessera.v1.PeerMemory/ReadMemoryCopy";
inline constexpr char kRelayMethod[] = "/tessera.v1.CommandRelay/Relay";

struct PeerCallProof {
  int64_t unix_ms = 0;
  std::string nonce;  // kPeerNonceBytes
  std::string mac;    // kPeerMacBytes
};

// The proof of `credential` for a call of `method` made at `now` with `nonce`.
PeerCallProof MakePeerCallProof(const PeerCredential& credential, absl::string_view method,
                                absl::Time now, std::string nonce);

// The metadata value of `proof`, and back. DecodePeerCallProof is pure (a fuzz target's entry)
// and takes only what EncodePeerCallProof writes (so at most 153 bytes: the time in decimal as
// StrCat writes an int64, the nonce and mac in lowercase hex). Errors: InvalidArgument naming
// what is wrong (the version, a field's form or length).
std::string EncodePeerCallProof(const PeerCallProof& proof);
absl::StatusOr<PeerCallProof> DecodePeerCallProof(absl::string_view value);

// Adds `credential`'s proof for `method` to a call's metadata. A credential without a secret
// adds none (the receiver refuses the call). Errors: Internal if no nonce can be drawn.
absl::Status ProvePeerCall(grpc::ClientContext* context, const PeerCredential& credential,
                           absl::string_view method);

class PeerCallGate {
 public:
  // Checks proofs against the credential `keyring` holds when each call arrives (none before it
  // is set: every call is refused); `now` is the clock (tests pass their own). `keyring` must
  // outlive the gate.
  explicit PeerCallGate(const PeerKeyring* keyring,
                        std::function<absl::Time()> now = [] { return absl::Now(); })
      : keyring_(keyring), now_(std::move(now)) {}

  // Whether the call of `method` whose metadata is in `context` proves it comes from an agent
  // of this job; its nonce is then remembered. Errors: Unauthenticated naming why (no proof,
  // a malformed one, no secret here yet, outside kPeerCallSkew, a replay, a proof that does not
  // match: forged, for another method, or another job's).
  absl::Status Admit(const grpc::ServerContextBase& context, absl::string_view method)
      ABSL_LOCKS_EXCLUDED(mu_);

  // As Admit, for the metadata value `value` (null: none).
  absl::Status Check(const std::string* value, absl::string_view method) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const PeerKeyring* const keyring_;
  const std::function<absl::Time()> now_;
  absl::Mutex mu_;
  // Nonces of admitted calls by the time after which their proof is too old anyway.
  std::multimap<absl::Time, std::string> expiring_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_PEER_CALL_PROOF_H_
