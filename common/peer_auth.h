// What proves that a connection to an agent's ports comes from the same job (issue 51;
// docs/design/security-and-limits.md "Peer and bulk ports"; decision 0042).
//
// The coordinator derives one secret per job from a key it keeps in its state
// (JobPeerSecret) and hands it to each agent of the job in its registration reply; an agent
// hands it to its trainer over the trainer's unix socket (its user's alone) with a fetch. Peers
// prove they hold it with HMAC-SHA256 (OpenSSL's), never by sending it: on the bulk port by a
// challenge–response over both sides' nonces (common/bulk_handshake.h), on the Peer gRPC port
// by a fresh proof per call (common/peer_call_proof.h). A secret of another job proves nothing
// here, so another job's agent is refused like a stranger.
//
// PeerKeyring holds an agent's credential: empty until the agent registers (then every proof
// fails and every peer is refused), replaced if a coordinator that lost its state hands out
// another. Thread-safety: the functions are pure; PeerKeyring is thread-safe.
#ifndef TESSERA_COMMON_PEER_AUTH_H_
#define TESSERA_COMMON_PEER_AUTH_H_

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

inline constexpr size_t kPeerSecretBytes = 32;  // a job's secret, and the coordinator's key
inline constexpr size_t kPeerNonceBytes = 32;   // each side's fresh nonce
inline constexpr size_t kPeerMacBytes = 32;     // HMAC-SHA256

// A job and its secret: what an agent (or its trainer) proves membership with. An empty
// secret proves nothing.
struct PeerCredential {
  std::string job_id;
  std::string secret;
};

// `n` bytes from OpenSSL's CSPRNG (RAND_bytes). Errors: Internal if it fails (no entropy).
absl::StatusOr<std::string> RandomBytes(size_t n);

// HMAC-SHA256 under `key` over `parts`, each preceded by its length (u32 little-endian), so
// that no two different lists of parts hash alike. kPeerMacBytes bytes; empty if OpenSSL fails
// (it cannot allocate), which SameMac matches with nothing.
std::string PeerMac(absl::string_view key, std::initializer_list<absl::string_view> parts);

// Whether two MACs are equal and kPeerMacBytes long, in time independent of their bytes
// (CRYPTO_memcmp).
bool SameMac(absl::string_view a, absl::string_view b);

// The secret of job `job_id` under the coordinator's key `coordinator_key`: the same for every
// agent of the job and after a restart of the coordinator (which keeps its key), different for
// every job.
std::string JobPeerSecret(absl::string_view coordinator_key, absl::string_view job_id);

class PeerKeyring {
 public:
  explicit PeerKeyring(std::string job_id) : job_id_(std::move(job_id)) {}

  // Replaces the secret (the registration reply's; empty removes it).
  void Set(std::string secret) ABSL_LOCKS_EXCLUDED(mu_);

  // The job and its secret as set last (empty before the first Set).
  PeerCredential Get() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string job_id_;
  mutable absl::Mutex mu_;
  std::string secret_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_PEER_AUTH_H_
