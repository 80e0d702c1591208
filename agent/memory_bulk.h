// Bulk transfers of memory copies over plain TCP (proto/tessera/v1/peer.proto "Bulk
// transfers"; DESIGN.md "Memory tier").
//
// MemoryBulkServer serves the agent's bulk port. Each connection carries one transfer: a read
// of a copy the agent holds (FindRequestedBytes, the lookup PeerMemory.ReadMemoryCopy uses),
// sent from the memory that holds it; or a put of another agent's copy, which it keeps as that
// agent's memory buddy (BuddyStore, as PeerMemory.PutMemoryCopy), received straight into the
// buffer that keeps it. ReadMemoryCopyBulk reads a whole copy over several connections at
// once, each receiving straight into its part of the destination; SendMemoryCopyBulk puts one.
// On either side the kernel's copy is the only one. Over gRPC the receiver copies every byte
// once more out of gRPC's buffers (and a put copies it twice more on the sending side);
// tests/bench/peer_memory_benchmark.cc measures both against plain sockets.
//
// Every connection opens with the handshake of common/bulk_handshake.h: a peer that does not
// prove it belongs to the job (no secret, another job's, a replayed or forged handshake) is
// answered UNAUTHENTICATED before its request is looked at — no byte of a copy is sent and no
// memory reserved for it — and a peer sends or takes no byte of a copy before the holder proved
// itself likewise.
//
// Never hangs on a peer: a transfer ends once no byte has moved for its stall limit (the
// caller's, or the server's for a peer that stops sending or taking bytes) — a limit on each
// wait, not on the whole, so a copy of any size on a slow link completes while it moves;
// connecting and each request and answer are bounded by the same limit from their start; a
// server being destroyed wakes and ends its connections.
//
// Thread-safety: the server is thread-safe; the functions may run concurrently.
#ifndef TESSERA_AGENT_MEMORY_BULK_H_
#define TESSERA_AGENT_MEMORY_BULK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/buddy_store.h"
#include "agent/memory_tier.h"
#include "agent/peer_memory.h"
#include "common/peer_auth.h"
#include "common/tcp_socket.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/peer.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

struct MemoryBulkServerOptions {
  // host:port to listen on; port 0 picks a free one (MemoryBulkServer::port()).
  std::string listen_address = "0.0.0.0:0";
  // Connections served at once; further ones wait in the listen backlog until one ends (their
  // peers' deadlines bound the wait).
  int max_connections = 64;
  // A connection whose request has not arrived after this long is closed.
  absl::Duration request_timeout = absl::Seconds(10);
  // A reader that has taken no byte for this long is dropped (as PeerMemory's reads: agent/
  // peer_memory.h kPeerReadStall). Default: 2 minutes.
  absl::Duration send_timeout = kPeerReadStall;
  // A put none of whose bytes arrived for this long is dropped, its room given back
  // (kPeerPutStall: longer than a sender's stall limit plus its pauses while its trainer saves,
  // SendMemoryCopyBulk's before_chunk). Default: 5 minutes.
  absl::Duration put_timeout = kPeerPutStall;
};

// Where an agent listens for bulk transfers: `flag` (--memory_bulk_listen) if not empty, else
// the host of `peer_listen` (--peer_listen) with a free port.
// Errors: InvalidArgument naming --peer_listen if it is not host:port.
absl::StatusOr<std::string> MemoryBulkListenAddress(const std::string& flag,
                                                    const std::string& peer_listen);

class MemoryBulkServer {
 public:
  // Serves the copies of the job of `keyring` in `tier` (the agent's own) and `store` (held as
  // a buddy), and keeps the copies other agents put in `store`, to peers that prove the job's
  // secret as `keyring` holds it when they connect (none before it is set); all three must
  // outlive the server.
  // Errors: InvalidArgument / Unavailable if it cannot listen on options.listen_address.
  static absl::StatusOr<std::unique_ptr<MemoryBulkServer>> Start(
      const PeerKeyring* keyring, const MemoryTier* tier, BuddyStore* store,
      MemoryBulkServerOptions options = {});

  // Stops accepting, ends the connections being served (their peers get an error; a put not
  // yet whole is not kept) and joins every thread.
  ~MemoryBulkServer();

  MemoryBulkServer(const MemoryBulkServer&) = delete;
  MemoryBulkServer& operator=(const MemoryBulkServer&) = delete;

  int port() const { return port_; }

 private:
  struct Connection {
    TcpSocket socket;
    std::thread thread;
    bool done = false;
  };

  MemoryBulkServer(const PeerKeyring* keyring, const MemoryTier* tier, BuddyStore* store,
                   MemoryBulkServerOptions options, TcpSocket listener);
  void AcceptLoop();
  void Serve(Connection* connection);
  // `proof`: the holder's, for its first BulkStatus (AcceptBulkPeer).
  void ServeRead(const TcpSocket& socket, const v1::ReadMemoryCopyRequest& request,
                 const std::string& proof) const;
  void ServePut(const TcpSocket& socket, const v1::BulkPut& put, const std::string& proof);

  const PeerKeyring* const keyring_;
  const std::string job_id_;
  const MemoryTier* const tier_;
  BuddyStore* const store_;
  const MemoryBulkServerOptions options_;
  TcpSocket listener_;
  const int port_;
  std::thread acceptor_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);  // stable addresses
  int active_ ABSL_GUARDED_BY(mu_) = 0;                     // connections not done
};

// Reads the whole copy `copy` of a checkpoint of `credential`'s job into `dest` (copy.nbytes() bytes, which the
// caller bounds) from the bulk port at `address`, over up to `streams` connections at once,
// each over its own consecutive part (ReadParts). On error `dest` holds unspecified bytes.
// Errors (the first failed part's, which ends the other parts at once: common/socket_group.h):
// the holder's, as PeerMemory.ReadMemoryCopy's (NotFound, FailedPrecondition, OutOfRange;
// Unauthenticated if it refused the proof); Unauthenticated if it did not prove itself;
// DataLoss if it sent another size or closed early; Unavailable if it cannot be reached or
// reset the connection; DeadlineExceeded once no byte arrived for `stall` (however long the
// whole takes); InvalidArgument for an address that does not parse.
absl::Status ReadMemoryCopyBulk(const std::string& address, const PeerCredential& credential,
                                const v1::MemoryCopy& copy, char* dest, absl::Duration stall,
                                int streams = kMemoryCopyReadStreams);

// Puts copy.nbytes() bytes at `data` to the bulk port at `address` as the buddy copy `copy`
// (writer_rank set) of `credential`'s job, in kMemoryCopyChunkBytes pieces: before each,
// `before_chunk` (if given) runs — it may block, e.g. while a trainer's save copy runs — and
// the put stops once `*cancel` (if given) is true. Returns once the receiver keeps the copy.
// `stall` bounds each wait for bytes to move (not before_chunk's).
// Errors: the receiver's, as PeerMemory.PutMemoryCopy's (ResourceExhausted,
// FailedPrecondition; Unauthenticated if it refused the proof); Unauthenticated if it did not
// prove itself (then no byte of the copy was sent); Cancelled after `cancel` (the receiver keeps nothing); as
// ReadMemoryCopyBulk's for the connection.
absl::Status SendMemoryCopyBulk(const std::string& address, const PeerCredential& credential,
                                const v1::MemoryCopy& copy, const char* data,
                                absl::Duration stall, const std::atomic<bool>* cancel = nullptr,
                                const std::function<void()>& before_chunk = nullptr);

// Reads `copy` from the agent holding it: over its bulk port when it has one
// (copy.bulk_address; `timeout` is then its stall limit), else over PeerMemory.ReadMemoryCopy
// at copy.peer_address (`timeout` bounds the whole read). Errors: as the path taken.
absl::Status ReadMemoryCopyFromHolder(const PeerCredential& credential, const v1::MemoryCopy& copy,
                                      char* dest, absl::Duration timeout);

// Sends `copy` to `buddy`: over its bulk port when it has one (buddy.bulk_address; `timeout`
// is then its stall limit), else over PeerMemory.PutMemoryCopy at buddy.peer_address
// (`timeout` bounds the whole put). Arguments and errors: as SendMemoryCopyBulk and
// SendMemoryCopy.
absl::Status SendMemoryCopyToBuddy(const PeerCredential& credential, const v1::MemoryBuddy& buddy,
                                   const v1::MemoryCopy& copy, const char* data,
                                   absl::Duration timeout, const std::atomic<bool>* cancel,
                                   const std::function<void()>& before_chunk);

}  // namespace tessera

#endif  // TESSERA_AGENT_MEMORY_BULK_H_
