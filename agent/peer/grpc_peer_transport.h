// GrpcPeerTransport: PeerTransport over gRPC streams between agents (the CPU path, and the
// fallback wherever NCCL is not available).
//
// Receiving: the transport serves tessera.v1.Peer on its own port. PushSlices is a callback
// reactor (STYLE.md 8) on the raw byte-buffer form of the method: each chunk's data is copied
// once, straight from gRPC's receive buffers into the destination registered by Exchange()
// (SliceInbox); a stream whose session is not expected yet is parked without being read (the
// sender stalls in flow control) and resumed by the Exchange() that expects it. No reactor
// thread ever waits for another agent.
//
// Sending: Exchange() opens one PushSlices stream per leader and writes each slice as chunks
// of `chunk_bytes` data. Each chunk's data is handed to gRPC as an external slice pointing
// into the caller's staging: no copy in user space (the kernel copies it into the socket).
// Exchange() returns only after gRPC released every such reference, so staging may be reused
// at once.
//
// Lifecycle: Create() starts the server; the destructor shuts it down (in-flight streams end
// with CANCELLED/UNAVAILABLE at their senders). Destroy the transport only after every
// Exchange() has returned.
//
// Thread-safety: thread-safe; Exchange() calls for different sessions run concurrently.
#ifndef TESSERA_AGENT_PEER_GRPC_PEER_TRANSPORT_H_
#define TESSERA_AGENT_PEER_GRPC_PEER_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/peer/peer_transport.h"
#include "agent/peer/slice_inbox.h"
#include "common/peer_auth.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "tessera/v1/peer.grpc.pb.h"

namespace tessera {

// Maps a peer's rank to its "host:port" for a session (in production: the session's
// GatherCommand.peer_addresses). Errors are returned by Exchange() as they are.
using PeerResolver =
    std::function<absl::StatusOr<std::string>(const std::string& session_id, uint32_t rank)>;

// A resolver over a fixed map. Errors: NotFound for a rank not in `addresses`.
PeerResolver StaticPeerResolver(std::map<uint32_t, std::string> addresses);

// The "host:port" other agents dial to reach a Peer service that listens on `listen_address`
// ("host:port", "[v6]:port") and is bound to `port`. The host is `peer_host` if given; else
// the listen host when it is one specific address (an agent bound to 10.0.0.5 only is reachable
// only there); else `hostname` (a wildcard listen: 0.0.0.0, ::, *, or no host). An IPv6
// literal is bracketed ("[fd00::5]:7000"), so the result always parses as host:port.
std::string AdvertisedPeerAddress(const std::string& peer_host,
                                  const std::string& listen_address, int port,
                                  const std::string& hostname);

struct GrpcPeerTransportOptions {
  // This agent's rank: the from_rank of everything it sends. Default: 0.
  uint32_t rank = 0;

  // Where the Peer service listens; port 0 picks a free port (see port()).
  // Default: "0.0.0.0:0".
  std::string listen_address = "0.0.0.0:0";

  // Resolves leaders' addresses. Required.
  PeerResolver resolve_peer;

  // Data bytes per PushSlices message. Default: 4 MiB.
  uint64_t chunk_bytes = uint64_t{4} << 20;

  // Largest message the server accepts (gRPC's own default is 4 MiB, too small for a 4 MiB
  // chunk plus its header). Must be at least chunk_bytes + 64 KiB, and at least the
  // chunk_bytes of every agent sending here. Default: 8 MiB.
  int max_receive_message_bytes = 8 << 20;

  // Credentials of the server and of outgoing channels. Default: insecure (nullptr).
  std::shared_ptr<grpc::ServerCredentials> server_credentials;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;

  // The job's credential: every call this transport serves must prove it (common/
  // peer_call_proof.h), every call it makes carries its proof; also for `extra_services`, each of
  // which checks its own calls. Must outlive the transport. Default: null — neither proved nor
  // checked, for tests of the transport alone; an agent always sets it.
  const PeerKeyring* keyring = nullptr;

  // The receiving side's bookkeeping (ended sessions remembered; a parked-chunk hook).
  SliceInboxOptions inbox;

  // More services for the same server and port (the memory tier's PeerMemory); each must
  // outlive the transport. Default: none.
  std::vector<grpc::Service*> extra_services;
};

class GrpcPeerTransport : public PeerTransport {
 public:
  // Starts the Peer server. Errors: InvalidArgument for bad options (no resolver, chunk_bytes
  // 0 or too large for max_receive_message_bytes); Unavailable if it cannot listen.
  static absl::StatusOr<std::unique_ptr<GrpcPeerTransport>> Create(
      GrpcPeerTransportOptions options);

  ~GrpcPeerTransport() override;

  GrpcPeerTransport(const GrpcPeerTransport&) = delete;
  GrpcPeerTransport& operator=(const GrpcPeerTransport&) = delete;

  // See PeerTransport. Slices with nbytes 0 are not sent. Errors: as PeerTransport, plus the
  // resolver's errors; a leader's rejection comes back with its code (InvalidArgument,
  // FailedPrecondition, Aborted, ResourceExhausted).
  absl::Status Exchange(const std::string& session_id, absl::Span<const SliceSend> sends,
                        absl::Span<const SliceRecv> recvs, absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);

  void CancelSession(const std::string& session_id) override ABSL_LOCKS_EXCLUDED(mu_);

  // The port the server listens on.
  int port() const { return port_; }

 private:
  class Service;
  class PushReactor;
  class PushStream;
  class SendGroup;

  explicit GrpcPeerTransport(GrpcPeerTransportOptions options);

  const GrpcPeerTransportOptions options_;
  // Declared before the server: reactors use it until the server has shut down.
  SliceInbox inbox_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  absl::Mutex mu_;
  // The send groups of running Exchange() calls, by session, for CancelSession().
  std::multimap<std::string, SendGroup*> sending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_GRPC_PEER_TRANSPORT_H_
