// NcclSchedule: how one rank of a gather group moves its slices over NCCL, computed from the
// same Exchange() arguments on every rank without talking to the others.
//
// NCCL matches point-to-point operations per (sender, receiver) pair in issue order, and
// sizes must agree. Every rank therefore orders the slices of each pair canonically (by key,
// box, begin), cuts each slice into pieces of `chunk_bytes`, and runs *rounds* in lockstep:
// in round r it sends its r-th piece to every peer and receives its r-th piece from every
// peer, all fused in one ncclGroupStart/End. Round r on one rank pairs exactly with round r on
// each peer, so no round waits for a later one: no deadlock, whatever the slice sizes.
//
// Before any data moves, each pair exchanges a PairHeader (count, bytes and fingerprint of the
// slices from sender to receiver); a receiver whose expectation differs fails the gather with
// InvalidArgument instead of letting NCCL hang on mismatched sizes.
//
// Thread-safety: value types and a pure function.
#ifndef TESSERA_AGENT_PEER_NCCL_SCHEDULE_H_
#define TESSERA_AGENT_PEER_NCCL_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "agent/peer/peer_transport.h"

namespace tessera {

// What a sender sends to one receiver, summarised. 24 bytes on the wire (host byte order:
// the group runs one binary on one kind of host).
struct PairHeader {
  uint64_t count = 0;        // slices with nbytes > 0
  uint64_t bytes = 0;        // their total size
  uint64_t fingerprint = 0;  // FNV-1a over (key, box, begin, end, nbytes) in canonical order
  bool operator==(const PairHeader& o) const {
    return count == o.count && bytes == o.bytes && fingerprint == o.fingerprint;
  }
  bool operator!=(const PairHeader& o) const { return !(*this == o); }
};

struct NcclOp {
  bool send = false;            // ncclSend (from the send bounce) or ncclRecv (into the recv one)
  int peer = 0;                 // communicator rank
  char* host = nullptr;         // send: source in staging; recv: destination in staging
  uint64_t nbytes = 0;
  uint64_t bounce_offset = 0;   // within this round's send or recv bounce area
};

struct NcclRound {
  std::vector<NcclOp> ops;  // sends and receives of one fused group
};

struct NcclSchedule {
  int self = 0;                           // this rank's communicator rank
  int size = 0;                           // communicator size
  std::vector<PairHeader> send_headers;   // [peer]: what this rank sends to peer
  std::vector<PairHeader> recv_headers;   // [peer]: what this rank expects from peer
  std::vector<NcclRound> rounds;
  uint64_t send_bounce_bytes = 0;         // the largest round's send area
  uint64_t recv_bounce_bytes = 0;         // the largest round's recv area
};

// Offsets in bounce buffers are multiples of this.
inline constexpr uint64_t kNcclBounceAlignment = 256;

// Builds `self_rank`'s schedule in the group whose communicator order is `member_ranks`.
// Empty slices are skipped (as GrpcPeerTransport does). `sends`/`recvs` must be valid
// (ValidateExchange). Errors: InvalidArgument if self_rank, a leader or a sender is not a
// member, a member appears twice, or chunk_bytes is 0.
absl::StatusOr<NcclSchedule> BuildNcclSchedule(uint32_t self_rank,
                                               absl::Span<const uint32_t> member_ranks,
                                               absl::Span<const SliceSend> sends,
                                               absl::Span<const SliceRecv> recvs,
                                               uint64_t chunk_bytes);

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_NCCL_SCHEDULE_H_
