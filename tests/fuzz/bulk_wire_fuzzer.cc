// Fuzzes the bulk port's wire (common/bulk_wire.h) as both of its ends decode it: frames of a
// u32 length and a body, the length checked before the body is allocated. A holder's side reads
// the peer's BulkHello (common/bulk_handshake.h: DecodeBulkHello, then OpenBulkHello, which
// checks its proof under the job's secret before it parses the request) and, for a put whose
// hello is proved, reserves room for the copy whose size the sender claims in a real
// BuddyStore (agent/memory_bulk.cc ServePut); each body is also parsed as the BulkRequest a
// proved hello carries, so a put reaches the reservation without a proof (a peer of the job
// sending nonsense). A reader's side reads the holder's BulkChallenge (DecodeBulkChallenge) and
// a BulkStatus, whose proof it checks as it does the first (CheckBulkServerProof). The
// credential and both nonces are fixed (fuzz_peer_credential.h), so the seeds' proofs hold.
// Contract checked: no crash, undefined behaviour or allocation beyond the frame limit and the
// store's budget, whatever the sender claims; a hello opens only with a proof the fixed
// credential made (the seeds' or one mutated back to it).
//
// Input: frames as they arrive on the socket (a frame cut short ends the input).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/buddy_store.h"
#include "common/bulk_handshake.h"
#include "common/bulk_wire.h"
#include "tessera/v1/peer.pb.h"
#include "tests/fuzz/fuzz_peer_credential.h"

namespace {

constexpr uint64_t kBudgetBytes = 1 << 20;

// The connection's fixed credential and nonces, made once (the secret is an HMAC).
struct Connection {
  tessera::PeerCredential credential = tessera::fuzz::Credential();
  std::string holder_nonce = tessera::fuzz::HolderNonce();
  std::string peer_nonce = tessera::fuzz::PeerNonce();
};

const Connection& TheConnection() {
  static const Connection* const connection = new Connection();
  return *connection;
}

// ReserveBuddyCopy (agent/peer_memory.h) less its check of the job's name.
void ReservePut(tessera::BuddyStore& store, const tessera::v1::BulkRequest& request) {
  if (!request.has_put()) return;
  absl::StatusOr<std::shared_ptr<tessera::MemoryBuffer>> room =
      store.Reserve(request.put().copy());
  if (room.ok()) store.Keep(request.put().copy(), *std::move(room));
}

// The holder's side of the handshake: the hello as it arrived, under the fixed credential.
void OpenHello(tessera::BuddyStore& store, absl::string_view body) {
  absl::StatusOr<tessera::v1::BulkHello> hello = tessera::DecodeBulkHello(body);
  if (!hello.ok()) return;
  const Connection& c = TheConnection();
  absl::StatusOr<tessera::v1::BulkRequest> request =
      tessera::OpenBulkHello(c.credential, c.holder_nonce, *hello);
  if (!request.ok()) return;
  // Opened: the proof must be the one the credential makes for exactly these bytes.
  if (hello->proof() !=
      tessera::BulkClientProof(c.credential, c.holder_nonce, hello->nonce(), hello->request())) {
    std::abort();
  }
  ReservePut(store, *request);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::BuddyStore store(kBudgetBytes);
  while (size >= 4) {
    absl::StatusOr<uint32_t> n = tessera::DecodeBulkFrameLength(data, "frame", "fuzz");
    if (!n.ok() || *n > size - 4) return 0;
    const absl::string_view body(reinterpret_cast<const char*>(data) + 4, *n);
    data += 4 + *n;
    size -= 4 + *n;

    OpenHello(store, body);
    tessera::v1::BulkRequest request;
    if (tessera::DecodeBulkFrameBody(body, &request, "fuzz").ok()) ReservePut(store, request);
    tessera::DecodeBulkChallenge(body).status().IgnoreError();
    tessera::v1::BulkStatus status;
    if (tessera::DecodeBulkFrameBody(body, &status, "fuzz").ok()) {
      tessera::BulkStatusResult(status, "fuzz").status().IgnoreError();
      const Connection& c = TheConnection();
      tessera::CheckBulkServerProof(c.credential, c.holder_nonce, c.peer_nonce, status, "fuzz")
          .IgnoreError();
    }
  }
  return 0;
}
