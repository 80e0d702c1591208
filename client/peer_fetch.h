// FetchVerified: the trainer reads a memory copy held on another node straight into its
// tensors, checking every block as it arrives (DESIGN.md "Memory tier": fetched by the
// trainer).
//
// A node that replaced a lost one restores its ranks from their buddies' memory. Staged by
// the agent, those bytes would cross three times on the receiving node — into a new load
// region (shared memory made and faulted in for the load: on the 2-core VM ~270 ms per
// 256 MiB before a byte arrives), then out of it into the tensors — and the region costs its
// page faults twice, in the agent and in the trainer. Read here, they cross once: each
// receive takes what has arrived (up to 1 MiB) straight into the tensor that holds its first
// byte, up to that tensor's end (padding between tensors goes into a buffer and is dropped),
// and the piece is hashed right after, from the core's cache (client/verified_copy.h
// CopyAndCheckBlock). The agent only locates the blocks (LoadResponse.fetch).
//
// Thread-safety: FetchVerified may run concurrently with itself; it starts and joins its own
// threads, one per connection. The destinations must not overlap.
#ifndef TESSERA_CLIENT_PEER_FETCH_H_
#define TESSERA_CLIENT_PEER_FETCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/verified_copy.h"
#include "common/checksum.h"
#include "common/peer_auth.h"
#include "common/tcp_socket.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Reads the bytes of memory copy `copy` (of `credential`'s job, whose secret the holder is
// shown: common/bulk_handshake.h) that `blocks` cover from its holder's
// bulk port (copy.bulk_address(); proto/tessera/v1/peer.proto "Bulk transfers"), copying into
// every slot its bytes (slot offsets and block offsets are from the copy's first byte) and
// checking every block against its XXH3. `blocks` and `slots` follow VerifiedCopy's rule,
// against a region of copy.nbytes() bytes. The blocks are split into up to `max_streams`
// consecutive shares of about equal bytes, each read on its own thread over one connection
// per run of blocks at most 64 KiB apart (the bytes between them are received and dropped).
// A block that does not match is listed in `mismatched` and the destinations it overlaps
// hold unverified bytes.
// Errors: InvalidArgument naming the block or slot that breaks the rule, before anything is
// read; else the first error any connection met, which ends the others at once
// (TcpSocket::Connect's or common/bulk_wire.h RequestBulkRead's; DataLoss if the holder closes
// early; DeadlineExceeded past `limit`: its deadline, or its stall limit with no byte arriving
// for that long, each connect and request counted from its start) — the destinations then
// hold unspecified bytes.
absl::StatusOr<VerifiedCopyResult> FetchVerified(const PeerCredential& credential,
                                                 const v1::MemoryCopy& copy,
                                                 absl::Span<const SlotCopy> slots,
                                                 absl::Span<const BlockCheck> blocks,
                                                 int max_streams, TimeLimit limit);

}  // namespace tessera

#endif  // TESSERA_CLIENT_PEER_FETCH_H_
