// Fuzzes the proof a call on an agent's Peer gRPC port carries in its metadata
// (common/peer_call_proof.h, kPeerProofMetadata): DecodePeerCallProof, then PeerCallGate::Check
// as the receiving agent runs it before the call does anything, with a fixed clock and a
// keyring holding the fixed job's secret (fuzz_peer_credential.h, so the seeds' proofs hold).
// Contract checked: no crash or undefined behaviour whatever the value (its time, its hex, its
// length); a value decodes only if it is what the encoder writes for what it decodes to (one
// proof, one value); the gate answers OK or Unauthenticated, nothing else; it admits a value
// only if it decodes, and never the same value twice (the second is a replay).
//
// Input: the metadata value, as the gRPC server hands it over.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/peer_auth.h"
#include "common/peer_call_proof.h"
#include "tests/fuzz/fuzz_peer_credential.h"

namespace {

const tessera::PeerKeyring& TheKeyring() {
  static const tessera::PeerKeyring* const keyring = [] {
    auto* k = new tessera::PeerKeyring("job");
    k->Set(tessera::fuzz::Credential().secret);
    return k;
  }();
  return *keyring;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string value(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<tessera::PeerCallProof> proof = tessera::DecodePeerCallProof(value);
  const bool decodes = proof.ok();
  // One proof, one value: what decodes is exactly what the encoder writes for it.
  if (decodes && tessera::EncodePeerCallProof(*proof) != value) std::abort();
  tessera::PeerCallGate gate(&TheKeyring(), [] { return tessera::fuzz::Now(); });
  const absl::Status first = gate.Check(&value, tessera::kPutMemoryCopyMethod);
  const absl::Status second = gate.Check(&value, tessera::kPutMemoryCopyMethod);
  for (const absl::Status& s : {first, second}) {
    if (!s.ok() && s.code() != absl::StatusCode::kUnauthenticated) std::abort();
  }
  if ((first.ok() && !decodes) || second.ok()) std::abort();
  return 0;
}
