// The fixed job credential, nonces and clock the authentication fuzzers decode against, shared
// with make_seeds.cc so that its seeds carry proofs these fuzzers accept (a seed that passes
// the proof reaches the code behind it; the fuzzer's mutations then start from there).
#ifndef TESSERA_TESTS_FUZZ_FUZZ_PEER_CREDENTIAL_H_
#define TESSERA_TESTS_FUZZ_FUZZ_PEER_CREDENTIAL_H_

#include <string>

#include "absl/time/time.h"
#include "common/peer_auth.h"

namespace tessera {
namespace fuzz {

// The job's credential: its secret as the coordinator would derive it from a fixed key.
inline PeerCredential Credential() {
  return PeerCredential{"job", JobPeerSecret(std::string(kPeerSecretBytes, 'k'), "job")};
}

// The holder's nonce (its BulkChallenge) and the peer's (its BulkHello) on the fuzzed
// connection.
inline std::string HolderNonce() { return std::string(kPeerNonceBytes, 'h'); }
inline std::string PeerNonce() { return std::string(kPeerNonceBytes, 'p'); }

// The receiving agent's clock.
inline absl::Time Now() { return absl::FromUnixSeconds(1'800'000'000); }

}  // namespace fuzz
}  // namespace tessera

#endif  // TESSERA_TESTS_FUZZ_FUZZ_PEER_CREDENTIAL_H_
