// The PeerMemory service and its client calls (proto/tessera/v1/peer.proto; DESIGN.md
// "Memory tier"): agents copy committed data files held in memory between each other.
//
// PeerMemoryService serves, on the agent's Peer port, PutMemoryCopy (a sender's resident copy,
// received into the BuddyStore) and ReadMemoryCopy (this agent's own resident copy, or one it
// holds as a buddy). Both are callback reactors (STYLE.md 8): no thread waits on a peer, and
// a peer that stops taking or sending chunks is cut off after a stall limit
// (common/stalled_calls.h), so that what its call holds — the copy's memory, the room reserved
// for a put — is let go.
//
// SendMemoryCopy and ReadMemoryCopy are the client side: blocking calls for the agent's
// background replication and for loads. A read moves the bytes with one copy on the receiving
// side and none on the sending side, over several connections at once (DESIGN.md "Memory
// tier": restoring from a buddy).
//
// Thread-safety: the service is thread-safe; the functions may run concurrently.
#ifndef TESSERA_AGENT_PEER_MEMORY_H_
#define TESSERA_AGENT_PEER_MEMORY_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/buddy_store.h"
#include "agent/memory_tier.h"
#include "common/bulk_wire.h"
#include "common/peer_auth.h"
#include "common/peer_call_proof.h"
#include "common/stalled_calls.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/peer.grpc.pb.h"

namespace tessera {

// Data bytes per MemoryCopyChunk: under gRPC's default 4 MiB message limit with room for the
// header, so neither side needs a larger limit configured.
inline constexpr uint64_t kMemoryCopyChunkBytes = uint64_t{1} << 20;

// How long a peer may leave a memory copy's transfer without moving a byte, on either port (this
// service, agent/memory_bulk.h): a reader that takes nothing for kPeerReadStall is cut off;
// a put none of whose bytes arrive for kPeerPutStall is dropped, its room given back — longer
// than a sender's own stall limit (agent_main: 2 minutes) plus its pauses while its trainer
// saves (SendMemoryCopy's before_chunk).
inline constexpr absl::Duration kPeerReadStall = absl::Minutes(2);
inline constexpr absl::Duration kPeerPutStall = absl::Minutes(5);

struct PeerMemoryServiceOptions {
  // A ReadMemoryCopy whose reader took no chunk for this long is cancelled. Default: 2 minutes.
  absl::Duration read_stall = kPeerReadStall;
  // A PutMemoryCopy none of whose chunks arrived for this long is cancelled, its room given
  // back. Default: 5 minutes.
  absl::Duration put_stall = kPeerPutStall;
  // The job's credential, which every call must prove (common/peer_call_proof.h) before it
  // reads, reserves or sends anything; must outlive the service. Default: null — calls not
  // checked, for tests of the service alone; an agent always sets it.
  const PeerKeyring* keyring = nullptr;
};

class PeerMemoryService final
    : public v1::PeerMemory::WithCallbackMethod_PutMemoryCopy<
          v1::PeerMemory::WithRawCallbackMethod_ReadMemoryCopy<v1::PeerMemory::Service>> {
 public:
  // `tier` and `store` must outlive the service; `job_id` is this agent's job.
  PeerMemoryService(std::string job_id, const MemoryTier* tier, BuddyStore* store,
                    PeerMemoryServiceOptions options = {})
      : job_id_(std::move(job_id)),
        tier_(tier),
        store_(store),
        options_(options),
        gate_(options.keyring != nullptr ? std::make_unique<PeerCallGate>(options.keyring)
                                         : nullptr),
        stalls_(std::min(options.read_stall, options.put_stall) / 4) {}

  grpc::ServerReadReactor<v1::MemoryCopyChunk>* PutMemoryCopy(
      grpc::CallbackServerContext* context, v1::PutMemoryCopyResponse* response) override;
  // Raw: the request is a ReadMemoryCopyRequest, each response a MemoryCopyChunk whose data is
  // an external slice over the memory holding the copy (agent/peer/chunk_codec.h).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadMemoryCopy(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;

  // True once no read or put is being served (each until its reactor is done), false if that
  // did not happen within `timeout`.
  bool AwaitIdle(absl::Duration timeout) const { return stalls_.AwaitNoneWatched(timeout); }

 private:
  const std::string job_id_;
  const MemoryTier* const tier_;
  BuddyStore* const store_;
  // OK if the call proves it is of the job (or calls are not checked); else why not, logged.
  absl::Status Admit(const grpc::CallbackServerContext& context, const char* method);

  const PeerMemoryServiceOptions options_;
  const std::unique_ptr<PeerCallGate> gate_;  // null: calls not checked
  StalledCallCanceller stalls_;  // the gRPC server, destroyed first, ends every call it watches
};

// Streams copy.nbytes() bytes at `data` over `channel` as the buddy copy `copy` of
// `credential`'s job, the call proving the job's secret.
// Stops between chunks once `*cancel` (if given) is true. `before_chunk` (if given) runs
// before each chunk is sent: it may block, e.g. while a trainer's save copy runs.
// Errors: the receiver's (PutMemoryCopy: InvalidArgument, ResourceExhausted,
// FailedPrecondition, Unauthenticated; Cancelled if it cut the put off, nothing having arrived for its
// put_stall); Cancelled after `cancel`; Unavailable / DeadlineExceeded (`timeout`).
absl::Status SendMemoryCopy(const std::shared_ptr<grpc::Channel>& channel,
                            const PeerCredential& credential,
                            const v1::MemoryCopy& copy, const char* data, absl::Duration timeout,
                            const std::atomic<bool>* cancel = nullptr,
                            const std::function<void()>& before_chunk = nullptr);

// `streams` channels to the agent at `address`, each on its own connection, for one
// ReadMemoryCopy. Each receives with a fixed 16 MiB flow-control window instead of gRPC's
// bandwidth-delay probing, which starts every new connection at 64 KiB: 1.5x the bytes per
// second of a read of 256 MiB over four new connections (tests/bench/peer_memory_benchmark.cc).
std::vector<std::shared_ptr<grpc::Channel>> MemoryCopyChannels(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    int streams = kMemoryCopyReadStreams);

// The bytes a ReadMemoryCopyRequest asks for, in the memory of a copy this agent holds: bytes
// [begin, end) at `data`, kept alive by `hold` (the copy may be dropped or replaced meanwhile).
struct RequestedBytes {
  const char* data = nullptr;  // the copy's first byte
  uint64_t begin = 0;
  uint64_t end = 0;
  std::shared_ptr<const void> hold;
};

// What `request` asks of an agent of job `job_id` whose own resident copies are in `tier` and
// whose buddy copies are in `store`: its own copy of the file, else one it holds as a buddy.
// The one lookup behind both ways of reading (ReadMemoryCopy, agent/memory_bulk.h).
// Errors: FailedPrecondition if the request's job is not `job_id`; NotFound if it holds no
// copy of that file of (step, session_id); OutOfRange if the range does not lie within it.
absl::StatusOr<RequestedBytes> FindRequestedBytes(const std::string& job_id, const MemoryTier& tier,
                                                  const BuddyStore& store,
                                                  const v1::ReadMemoryCopyRequest& request);

// Room in `store` (that of an agent of job `job_id`) for `copy`, put by an agent of job `job`
// as its buddy copy: the one rule behind both ways of putting (PutMemoryCopy,
// agent/memory_bulk.h). Keep or Abandon (copy.writer_rank) ends the reservation.
// Errors: FailedPrecondition if the jobs differ; BuddyStore::Reserve's (ResourceExhausted).
absl::StatusOr<std::shared_ptr<MemoryBuffer>> ReserveBuddyCopy(const std::string& job_id,
                                                               BuddyStore& store,
                                                               const std::string& job,
                                                               const v1::MemoryCopy& copy);

// How a read of a copy of `nbytes` bytes is split over at most `streams` connections:
// consecutive [begin, end) parts of whole kMemoryCopyChunkBytes chunks, none empty unless the
// copy is (then one part), covering [0, nbytes) in order.
std::vector<std::pair<uint64_t, uint64_t>> ReadParts(uint64_t nbytes, int streams);

// Reads the whole copy `copy` of a checkpoint of `credential`'s job into `dest` (copy.nbytes()
// bytes, which the caller bounds), from the agent at the other end of `channels` (each call
// proving the job's secret): one stream per channel, each
// over its own consecutive part of the copy (whole chunks; a copy of fewer chunks uses fewer
// streams), so channels on separate connections read in parallel. Each chunk's data is copied
// once, from gRPC's receive buffers to `dest`. On error `dest` holds unspecified bytes.
// The first stream that fails ends the others at once.
// Errors (the first failed stream's): Unauthenticated if the agent refused the proof;
// NotFound if the agent no longer holds it;
// FailedPrecondition if it serves another job; OutOfRange if it holds fewer bytes than
// copy.nbytes(); DataLoss if it sent other than the requested bytes in order; Cancelled if it
// cut the read off (no chunk taken for its read_stall); Unavailable / DeadlineExceeded;
// InvalidArgument if `channels` is empty.
absl::Status ReadMemoryCopy(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                            const PeerCredential& credential, const v1::MemoryCopy& copy,
                            char* dest, absl::Duration timeout);

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_MEMORY_H_
