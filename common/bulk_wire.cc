#include "common/bulk_wire.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bulk_handshake.h"

namespace tessera {

std::string EncodeBulkFrame(const google::protobuf::MessageLite& message) {
  const std::string body = message.SerializeAsString();
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string frame = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 24)};
  frame += body;
  return frame;
}

absl::Status SendBulkFrame(const TcpSocket& socket, const google::protobuf::MessageLite& message,
                           absl::Time deadline) {
  const std::string frame = EncodeBulkFrame(message);
  return socket.SendAll(frame.data(), frame.size(), deadline);
}

absl::StatusOr<uint32_t> DecodeBulkFrameLength(const unsigned char prefix[4],
                                               absl::string_view type, absl::string_view peer) {
  const uint32_t n = prefix[0] | prefix[1] << 8 | prefix[2] << 16 | uint32_t{prefix[3]} << 24;
  if (n > kMaxBulkFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", type, " of ", n, " bytes from ", peer,
                                                   " (at most ", kMaxBulkFrameBytes, ")"));
  }
  return n;
}

absl::Status DecodeBulkFrameBody(absl::string_view body, google::protobuf::MessageLite* message,
                                 absl::string_view peer) {
  if (!message->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message->GetTypeName(), " from ", peer));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RecvBulkBody(const TcpSocket& socket, absl::string_view what,
                                         absl::Time deadline) {
  unsigned char length[4];
  if (absl::Status got = socket.RecvAll(reinterpret_cast<char*>(length), 4, deadline); !got.ok()) {
    return got;
  }
  absl::StatusOr<uint32_t> n = DecodeBulkFrameLength(length, what, socket.peer());
  if (!n.ok()) return n.status();
  std::string body(*n, '\0');
  if (absl::Status got = socket.RecvAll(body.data(), *n, deadline); !got.ok()) return got;
  return body;
}

absl::Status RecvBulkFrame(const TcpSocket& socket, google::protobuf::MessageLite* message,
                           absl::Time deadline) {
  absl::StatusOr<std::string> body = RecvBulkBody(socket, message->GetTypeName(), deadline);
  if (!body.ok()) return body.status();
  return DecodeBulkFrameBody(*body, message, socket.peer());
}

absl::Status SendBulkStatus(const TcpSocket& socket, const absl::Status& status, uint64_t nbytes,
                            absl::Time deadline, absl::string_view proof) {
  v1::BulkStatus message;
  message.set_code(static_cast<int>(status.code()));
  message.set_message(std::string(status.message()));
  message.set_nbytes(nbytes);
  message.set_proof(std::string(proof));
  return SendBulkFrame(socket, message, deadline);
}

absl::StatusOr<uint64_t> BulkStatusResult(const v1::BulkStatus& status,
                                          const std::string& address) {
  if (status.code() == 0) return status.nbytes();
  const bool known = status.code() > 0 && status.code() <= static_cast<int>(
                                                               absl::StatusCode::kUnauthenticated);
  return absl::Status(known ? static_cast<absl::StatusCode>(status.code())
                            : absl::StatusCode::kUnknown,
                      absl::StrCat(status.message(), " (bulk port ", address, ")"));
}

absl::StatusOr<uint64_t> RecvBulkStatus(const TcpSocket& socket, const std::string& address,
                                        absl::Time deadline) {
  v1::BulkStatus status;
  if (absl::Status got = RecvBulkFrame(socket, &status, deadline); !got.ok()) return got;
  return BulkStatusResult(status, address);
}

absl::StatusOr<BulkSession> SendBulkHello(const TcpSocket& socket, const PeerCredential& credential,
                                          const v1::BulkRequest& request, absl::Time deadline) {
  absl::StatusOr<std::string> body = RecvBulkBody(socket, "BulkChallenge", deadline);
  if (!body.ok()) return body.status();
  absl::StatusOr<v1::BulkChallenge> challenge = DecodeBulkChallenge(*body);
  if (!challenge.ok()) return challenge.status();
  absl::StatusOr<std::string> nonce = RandomBytes(kPeerNonceBytes);
  if (!nonce.ok()) return nonce.status();
  BulkSession session{credential, std::move(*challenge->mutable_nonce()), *std::move(nonce)};
  v1::BulkHello hello;
  hello.set_nonce(session.peer_nonce);
  hello.set_request(request.SerializeAsString());
  hello.set_proof(
      BulkClientProof(credential, session.holder_nonce, session.peer_nonce, hello.request()));
  if (absl::Status sent = SendBulkFrame(socket, hello, deadline); !sent.ok()) return sent;
  return session;
}

absl::StatusOr<uint64_t> RecvFirstBulkStatus(const TcpSocket& socket, const std::string& address,
                                             const BulkSession& session, absl::Time deadline) {
  v1::BulkStatus status;
  if (absl::Status got = RecvBulkFrame(socket, &status, deadline); !got.ok()) return got;
  if (status.code() != 0) return BulkStatusResult(status, address).status();
  if (absl::Status proved = CheckBulkServerProof(session.credential, session.holder_nonce,
                                                 session.peer_nonce, status, address);
      !proved.ok()) {
    return proved;
  }
  return status.nbytes();
}

absl::StatusOr<AcceptedBulkPeer> AcceptBulkPeer(const TcpSocket& socket,
                                                const PeerCredential& credential,
                                                absl::Time deadline) {
  absl::StatusOr<std::string> nonce = RandomBytes(kPeerNonceBytes);
  if (!nonce.ok()) return nonce.status();
  v1::BulkChallenge challenge;
  challenge.set_nonce(*nonce);
  if (absl::Status sent = SendBulkFrame(socket, challenge, deadline); !sent.ok()) return sent;
  absl::StatusOr<std::string> body = RecvBulkBody(socket, "BulkHello", deadline);
  if (!body.ok()) return body.status();
  absl::StatusOr<v1::BulkHello> hello = DecodeBulkHello(*body);
  absl::StatusOr<v1::BulkRequest> request =
      hello.ok() ? OpenBulkHello(credential, *nonce, *hello) : hello.status();
  if (!request.ok()) return request.status();
  return AcceptedBulkPeer{*std::move(request), BulkServerProof(credential, *nonce, hello->nonce())};
}

v1::ReadMemoryCopyRequest MemoryCopyReadRequest(const std::string& job, const v1::MemoryCopy& copy,
                                                uint64_t begin, uint64_t end) {
  v1::ReadMemoryCopyRequest request;
  request.set_job_id(job);
  request.set_step(copy.step());
  request.set_session_id(copy.session_id());
  request.set_file(copy.file());
  request.set_offset(begin);
  request.set_length(end - begin);
  return request;
}

absl::Status RequestBulkRead(const TcpSocket& socket, const std::string& address,
                             const PeerCredential& credential, const v1::MemoryCopy& copy,
                             uint64_t begin, uint64_t end, absl::Time deadline) {
  v1::BulkRequest request;
  *request.mutable_read() = MemoryCopyReadRequest(credential.job_id, copy, begin, end);
  absl::StatusOr<BulkSession> session = SendBulkHello(socket, credential, request, deadline);
  if (!session.ok()) return session.status();
  absl::StatusOr<uint64_t> offered = RecvFirstBulkStatus(socket, address, *session, deadline);
  if (!offered.ok()) return offered.status();
  if (*offered != end - begin) {
    return absl::DataLossError(
        absl::StrCat(address, " offers ", *offered, " bytes of the memory copy of ", copy.file(),
                     " where bytes [", begin, ", ", end, ") were asked for"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
