// PeerTransport: moves DP optimizer slices between agents for a gather (DESIGN.md "Gathering
// optimizer state across DP").
//
// Distributed optimizers give each DP rank a flat element range of a box's optimizer state.
// Before commit one DP *leader* per box receives every other rank's range and writes the whole
// box. Each agent's staging already holds its own range at the right place; the leader's
// staging has a slot for the whole box, and a slice from a peer lands at
// `slot + begin * elem_size` (the caller computes `dest`). The transport only moves bytes:
// it knows nothing of dtypes, plans or files (STYLE.md 7).
//
// One PeerTransport per agent, shared by every session. During a session's GATHER phase each
// agent calls Exchange() once with what it sends and what it receives; a rank may be the
// leader of some boxes and a sender for others. Slices may arrive before their leader calls
// Exchange(): implementations hold them back (never drop them) until it does.
//
// Implementations: GrpcPeerTransport (streams between agents, any host), NcclPeerTransport
// (GPU to GPU, when a GPU is present), LoopbackPeerTransport (in-process, for tests).
//
// Thread-safety: implementations are safe for concurrent use; Exchange() calls for different
// sessions run concurrently and never mix.
#ifndef TESSERA_AGENT_PEER_PEER_TRANSPORT_H_
#define TESSERA_AGENT_PEER_PEER_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/box.h"

namespace tessera {

// A slice this agent sends to the leader of its box. A slice is identified on the wire by
// (session, key, box, from_rank, begin); `end` and `nbytes` are checked against the leader's
// expectation.
struct SliceSend {
  std::string key;             // tensor key of the box (manifest.proto)
  Box box;                     // the box the slice belongs to
  int64_t begin = 0;           // element range [begin, end) of the box, row-major
  int64_t end = 0;
  const void* data = nullptr;  // the staged slice; read-only, valid until Exchange() returns
  size_t nbytes = 0;           // bytes at `data` (may be 0: an empty slice is not sent)
  uint32_t leader_rank = 0;    // the rank that writes the box
};

// A slice this agent (a leader) receives from a peer.
struct SliceRecv {
  std::string key;
  Box box;
  uint32_t from_rank = 0;
  int64_t begin = 0;
  int64_t end = 0;
  void* dest = nullptr;  // where the slice's bytes go; nothing outside [dest, dest + nbytes)
                         // is ever written; valid until Exchange() returns
  size_t nbytes = 0;     // expected size; 0 means nothing is sent (complete at once)
};

class PeerTransport {
 public:
  virtual ~PeerTransport() = default;

  // Runs this agent's part of `session_id`'s gather: sends every slice of `sends` to its
  // leader and receives every slice of `recvs` into its dest. Registers `recvs` before sending
  // anything, so peers whose Exchange() started earlier are served. Blocks until each send is
  // acknowledged (its bytes are in the leader's staging) and each recv has landed, or until the
  // first error; on return nothing references `data` or `dest` any more. A failed Exchange is
  // final for the session on this agent (report the gather failed; the save restarts).
  // Errors: InvalidArgument if `sends`/`recvs` are malformed (null pointer with nbytes > 0,
  // begin > end, a duplicate recv, self as peer), if a leader rejects a slice (nobody expects
  // it, or its size or range differs from the expected one), or if an expected slice arrives
  // with the wrong size or range; Unavailable if a peer is unreachable; DeadlineExceeded if
  // `deadline` passes first; Aborted if the session was cancelled (here or at the leader) or
  // the leader stopped receiving it; FailedPrecondition if the session already ran (or is running)
  // here, or the transport cannot run at all (e.g. NCCL without a GPU).
  virtual absl::Status Exchange(const std::string& session_id, absl::Span<const SliceSend> sends,
                                absl::Span<const SliceRecv> recvs, absl::Time deadline) = 0;

  // Cancels `session_id` on this agent: a running Exchange() returns Aborted promptly, a later
  // one fails at once with Aborted, and peers' slices for it are answered with Aborted. Safe to
  // call for an unknown or finished session. Errors: none.
  virtual void CancelSession(const std::string& session_id) = 0;
};

// Checks the shape of one Exchange() call: non-null pointers where nbytes > 0, 0 <= begin <=
// end, no send to or recv from `self_rank`, no two recvs with the same identity.
// Errors: InvalidArgument naming the offending slice.
absl::Status ValidateExchange(uint32_t self_rank, absl::Span<const SliceSend> sends,
                              absl::Span<const SliceRecv> recvs);

// "key@[0:4, 0:8][10,20) rank 3": for error messages.
std::string DescribeSlice(const std::string& key, const Box& box, int64_t begin, int64_t end,
                          uint32_t rank);

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_PEER_TRANSPORT_H_
