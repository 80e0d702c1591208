// Bulk reads of memory copies over plain TCP (proto/tessera/v1/peer.proto "Bulk reads";
// DESIGN.md "Memory tier": restoring from a buddy).
//
// MemoryBulkServer serves the agent's bulk port: each connection carries one read of a copy
// the agent holds (FindRequestedBytes, the lookup PeerMemory.ReadMemoryCopy uses), sent from
// the memory that holds it. ReadMemoryCopyBulk reads a whole copy over several connections at
// once, each receiving straight into its part of the destination: the kernel's copy is the
// only one on the receiving side. PeerMemory.ReadMemoryCopy copies every byte once more, from
// gRPC's receive buffers; agent/peer_memory_benchmark.cc measures both against plain sockets.
//
// Never hangs on a peer: every call is bounded by a deadline (the reader's) or a timeout (the
// server's, for a reader that stops sending its request or taking bytes); a server being
// destroyed wakes and ends its connections.
//
// Thread-safety: the server is thread-safe; ReadMemoryCopyBulk may run concurrently.
#ifndef TESSERA_AGENT_MEMORY_BULK_H_
#define TESSERA_AGENT_MEMORY_BULK_H_

#include <cstdint>
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
#include "common/tcp_socket.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

struct MemoryBulkServerOptions {
  // host:port to listen on; port 0 picks a free one (MemoryBulkServer::port()).
  std::string listen_address = "0.0.0.0:0";
  // Connections served at once; further ones wait in the listen backlog until one ends (their
  // readers' deadlines bound the wait).
  int max_connections = 64;
  // A connection whose request has not arrived after this long is closed.
  absl::Duration request_timeout = absl::Seconds(10);
  // A reader that has not taken the copy's bytes after this long is dropped.
  absl::Duration send_timeout = absl::Minutes(2);
};

// Where an agent listens for bulk reads: `flag` (--memory_bulk_listen) if not empty, else the
// host of `peer_listen` (--peer_listen) with a free port.
// Errors: InvalidArgument naming --peer_listen if it is not host:port.
absl::StatusOr<std::string> MemoryBulkListenAddress(const std::string& flag,
                                                    const std::string& peer_listen);

class MemoryBulkServer {
 public:
  // Serves the copies of job `job_id` in `tier` (the agent's own) and `store` (held as a
  // buddy); both must outlive the server.
  // Errors: InvalidArgument / Unavailable if it cannot listen on options.listen_address.
  static absl::StatusOr<std::unique_ptr<MemoryBulkServer>> Start(
      std::string job_id, const MemoryTier* tier, const BuddyStore* store,
      MemoryBulkServerOptions options = {});

  // Stops accepting, ends the connections being served (their readers get an error) and
  // joins every thread.
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

  MemoryBulkServer(std::string job_id, const MemoryTier* tier, const BuddyStore* store,
                   MemoryBulkServerOptions options, TcpSocket listener);
  void AcceptLoop();
  void Serve(Connection* connection);
  // The status and bytes a request asks for; Answer sends them.
  absl::StatusOr<RequestedBytes> Lookup(const TcpSocket& socket) const;
  void Answer(const TcpSocket& socket, const absl::StatusOr<RequestedBytes>& found) const;

  const std::string job_id_;
  const MemoryTier* const tier_;
  const BuddyStore* const store_;
  const MemoryBulkServerOptions options_;
  TcpSocket listener_;
  const int port_;
  std::thread acceptor_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);  // stable addresses
  int active_ ABSL_GUARDED_BY(mu_) = 0;                     // connections not done
};

// Reads the whole copy `copy` of checkpoint `job` into `dest` (copy.nbytes() bytes, which the
// caller bounds) from the bulk port at `address`, over up to `streams` connections at once,
// each over its own consecutive part (ReadParts). On error `dest` holds unspecified bytes.
// Errors (the first failed part's): the holder's, as PeerMemory.ReadMemoryCopy's (NotFound,
// FailedPrecondition, OutOfRange); DataLoss if it sent another size or closed early;
// Unavailable if it cannot be reached or reset the connection; DeadlineExceeded past
// `timeout`; InvalidArgument for an address that does not parse.
absl::Status ReadMemoryCopyBulk(const std::string& address, const std::string& job,
                                const v1::MemoryCopy& copy, char* dest, absl::Duration timeout,
                                int streams = kMemoryCopyReadStreams);

// Reads `copy` from the agent holding it: over its bulk port when it has one
// (copy.bulk_address), else over PeerMemory.ReadMemoryCopy at copy.peer_address. Errors: as
// the path taken.
absl::Status ReadMemoryCopyFromHolder(const std::string& job, const v1::MemoryCopy& copy,
                                      char* dest, absl::Duration timeout);

}  // namespace tessera

#endif  // TESSERA_AGENT_MEMORY_BULK_H_
