// FetchVerified: the trainer reads a memory copy held on another node straight into its
// tensors, checking every block as it arrives (DESIGN.md "Memory tier": fetched by the
// trainer).
//
// A node that replaced a lost one restores its ranks from their buddies' memory. Staged by
// the agent, those bytes would cross three times on the receiving node — into a new load
// region (shared memory made and faulted in for the load: on the 2-core VM ~270 ms per
// 256 MiB before a byte arrives), then out of it into the tensors — and the region costs its
// page faults twice, in the agent and in the trainer. Read here, they cross once: the kernel
// copies each piece into a small buffer that stays in this core's cache, the piece is copied
// into the tensors that want it and hashed right after (client/verified_copy.h
// CopyAndCheckBlock). The agent only locates the blocks (LoadResponse.fetch).
//
// Thread-safety: a pure function over caller memory; the destinations must not overlap.
#ifndef TESSERA_CLIENT_PEER_FETCH_H_
#define TESSERA_CLIENT_PEER_FETCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/verified_copy.h"
#include "common/checksum.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Connections a load's fetch uses at once, as the agent's own reads of a copy
// (agent/peer_memory.h kMemoryCopyReadStreams: agent/peer_memory_benchmark.cc measured four
// new connections near the loopback limit on the 2-core VM).
inline constexpr int kFetchStreams = 4;

// How long a fetch may take at most, as an agent's reads of a copy (agent_main.cc
// kMemoryCopyTimeout), whatever the load's own timeout: a holder that stops sending must not
// hold the trainer longer than the agent would.
inline constexpr absl::Duration kFetchTimeout = absl::Minutes(2);

// Reads the bytes of memory copy `copy` (of job `job`) that `blocks` cover from its holder's
// bulk port (copy.bulk_address(); proto/tessera/v1/peer.proto "Bulk transfers"), copying into
// every slot its bytes (slot offsets and block offsets are from the copy's first byte) and
// checking every block against its XXH3. `blocks` and `slots` follow VerifiedCopy's rule,
// against a region of copy.nbytes() bytes. The blocks are split into up to `max_streams`
// consecutive runs of about equal bytes, each read over its own connection (one per run of
// contiguous blocks) on its own thread. A block that does not match is listed in
// `mismatched` and the destinations it overlaps hold unverified bytes.
// Errors: InvalidArgument naming the block or slot that breaks the rule, before anything is
// read; else the first connection's (common/bulk_wire.h OpenBulkRead, and DataLoss if the
// holder closes early; DeadlineExceeded past `deadline`) — the destinations then hold
// unspecified bytes.
absl::StatusOr<VerifiedCopyResult> FetchVerified(const std::string& job, const v1::MemoryCopy& copy,
                                                 absl::Span<const SlotCopy> slots,
                                                 absl::Span<const BlockCheck> blocks,
                                                 int max_streams, absl::Time deadline);

}  // namespace tessera

#endif  // TESSERA_CLIENT_PEER_FETCH_H_
