// The wire of an agent's bulk port (proto/tessera/v1/peer.proto "Bulk transfers"): framed
// messages over a TcpSocket, the handshake that opens every connection (its pure half:
// common/bulk_handshake.h), and the reader's side of a read. Shared by the agent, which serves
// the port and reads from other agents' ports (agent/memory_bulk.h), and by the trainer's
// client, which reads a lost node's copy from its holder itself (client/peer_fetch.h).
//
// Every call is bounded by `deadline`. Thread-safety: pure functions over the caller's socket.
#ifndef TESSERA_COMMON_BULK_WIRE_H_
#define TESSERA_COMMON_BULK_WIRE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/peer_auth.h"
#include "common/tcp_socket.h"
#include "google/protobuf/message_lite.h"
#include "tessera/v1/peer.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// How every reader of a memory copy reads it — an agent reading another's copy (over this port
// or PeerMemory.ReadMemoryCopy: agent/memory_bulk.h, agent/peer_memory.h) and a trainer fetching
// a lost node's copy itself (client/peer_fetch.h) alike, so the two sides cannot drift:
// - kMemoryCopyReadStreams connections at once: on two cores, four new connections read
//   256 MiB at 1.8x the bytes per second of one (tests/bench/peer_memory_benchmark.cc);
// - a read gives up once no byte arrived for kMemoryCopyReadStall: a limit on each wait, not on
//   the whole read, which the reader's own deadline bounds.
inline constexpr int kMemoryCopyReadStreams = 4;
inline constexpr absl::Duration kMemoryCopyReadStall = absl::Minutes(2);

// The largest message either side accepts.
inline constexpr uint32_t kMaxBulkFrameBytes = 64 << 10;

// Sends `message` as u32 length (little-endian), then its bytes.
absl::Status SendBulkFrame(const TcpSocket& socket, const google::protobuf::MessageLite& message,
                           absl::Time deadline);

// Receives one framed message into `message`.
// Errors: InvalidArgument for a frame above kMaxBulkFrameBytes or one that does not parse;
// the socket's (DataLoss if the peer closed, Unavailable, DeadlineExceeded).
absl::Status RecvBulkFrame(const TcpSocket& socket, google::protobuf::MessageLite* message,
                           absl::Time deadline);

// The bytes SendBulkFrame sends for `message`.
std::string EncodeBulkFrame(const google::protobuf::MessageLite& message);

// The decoding half of RecvBulkFrame, pure (no socket), so that it can be tested and fuzzed
// alone (tests/fuzz). `peer` names the sender in errors.
//
// The body length of a frame from its 4-byte prefix (u32 little-endian), checked before the
// body is allocated. Errors: InvalidArgument naming `type` and `peer` for a length above
// kMaxBulkFrameBytes.
absl::StatusOr<uint32_t> DecodeBulkFrameLength(const unsigned char prefix[4],
                                               absl::string_view type, absl::string_view peer);
// Parses a frame's body into `message`. Errors: InvalidArgument if it does not parse.
absl::Status DecodeBulkFrameBody(absl::string_view body, google::protobuf::MessageLite* message,
                                 absl::string_view peer);
// What a received BulkStatus says: its nbytes, or its error naming `address`. A code that is
// not an absl::StatusCode becomes Unknown (the peer's words kept).
absl::StatusOr<uint64_t> BulkStatusResult(const v1::BulkStatus& status,
                                          const std::string& address);

// Receives one frame's body, at most kMaxBulkFrameBytes (`what` names it in errors).
// Errors: as RecvBulkFrame's, but for parsing.
absl::StatusOr<std::string> RecvBulkBody(const TcpSocket& socket, absl::string_view what,
                                         absl::Time deadline);

// Sends a BulkStatus: `status` (its code and message), `nbytes` and `proof` (the holder's
// first status on a connection: BulkServerProof).
absl::Status SendBulkStatus(const TcpSocket& socket, const absl::Status& status, uint64_t nbytes,
                            absl::Time deadline, absl::string_view proof = {});

// Receives the peer's BulkStatus: its nbytes, or its error, naming `address`.
absl::StatusOr<uint64_t> RecvBulkStatus(const TcpSocket& socket, const std::string& address,
                                        absl::Time deadline);

// A connection to a holder's (or buddy's) bulk port once the peer sent its hello.
struct BulkSession {
  PeerCredential credential;
  std::string holder_nonce;
  std::string peer_nonce;
};

// The peer's side of the handshake: receives the holder's BulkChallenge and sends a BulkHello
// carrying `request` and the proof of `credential`. The holder's answer to it is then read with
// RecvFirstBulkStatus. Errors: InvalidArgument for a malformed challenge; Internal if no nonce
// can be drawn; the socket's.
absl::StatusOr<BulkSession> SendBulkHello(const TcpSocket& socket, const PeerCredential& credential,
                                          const v1::BulkRequest& request, absl::Time deadline);

// The holder's first BulkStatus on `session`'s connection: its nbytes once its proof shows the
// holder is of the session's job; its error if it refused. Errors: the holder's (e.g.
// Unauthenticated if it refused this peer's proof); Unauthenticated if a holder that accepted
// did not prove itself; as RecvBulkStatus's.
absl::StatusOr<uint64_t> RecvFirstBulkStatus(const TcpSocket& socket, const std::string& address,
                                             const BulkSession& session, absl::Time deadline);

// The holder's side of the handshake: sends a BulkChallenge and receives the peer's BulkHello.
// Returns the request once the peer proved it is of `credential`'s job, with the nonces for
// the holder's own proof (BulkServerProof) on its first status. The caller answers a peer that
// fails with the error (SendBulkStatus, no proof) and looks at nothing it sent.
// Errors: OpenBulkHello's (Unauthenticated, InvalidArgument); RecvBulkBody's.
struct AcceptedBulkPeer {
  v1::BulkRequest request;
  std::string proof;  // the holder's, for its first BulkStatus
};
absl::StatusOr<AcceptedBulkPeer> AcceptBulkPeer(const TcpSocket& socket,
                                                const PeerCredential& credential,
                                                absl::Time deadline);

// The ReadMemoryCopyRequest for bytes [begin, end) of `copy` of job `job` (over the bulk port
// or PeerMemory.ReadMemoryCopy).
v1::ReadMemoryCopyRequest MemoryCopyReadRequest(const std::string& job, const v1::MemoryCopy& copy,
                                                uint64_t begin, uint64_t end);

// Asks the bulk port at `address`, over `socket` (connected to it), for bytes [begin, end) of
// `copy` of `credential`'s job, proving it belongs to the job (SendBulkHello): on success the socket delivers exactly end - begin bytes of the copy,
// in order (RecvAll). A caller that splits one transfer over several connections registers
// each with its SocketGroup before asking, so that a holder that never answers is ended by
// another part's error too. Errors: the holder's (as PeerMemory.ReadMemoryCopy's: NotFound,
// FailedPrecondition, OutOfRange; Unauthenticated if it refused the proof); Unauthenticated if
// the holder did not prove itself; DataLoss if it offers another byte count; RecvBulkFrame's
// (InvalidArgument for a malformed answer; the socket's: DataLoss if the holder closed,
// Unavailable, DeadlineExceeded).
absl::Status RequestBulkRead(const TcpSocket& socket, const std::string& address,
                             const PeerCredential& credential, const v1::MemoryCopy& copy,
                             uint64_t begin, uint64_t end, absl::Time deadline);

}  // namespace tessera

#endif  // TESSERA_COMMON_BULK_WIRE_H_
