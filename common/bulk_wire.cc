#include "common/bulk_wire.h"

#include <utility>

#include "absl/strings/str_cat.h"

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

absl::Status RecvBulkFrame(const TcpSocket& socket, google::protobuf::MessageLite* message,
                           absl::Time deadline) {
  unsigned char length[4];
  if (absl::Status got = socket.RecvAll(reinterpret_cast<char*>(length), 4, deadline); !got.ok()) {
    return got;
  }
  absl::StatusOr<uint32_t> n = DecodeBulkFrameLength(length, message->GetTypeName(), socket.peer());
  if (!n.ok()) return n.status();
  std::string body(*n, '\0');
  if (absl::Status got = socket.RecvAll(body.data(), *n, deadline); !got.ok()) return got;
  return DecodeBulkFrameBody(body, message, socket.peer());
}

absl::Status SendBulkStatus(const TcpSocket& socket, const absl::Status& status, uint64_t nbytes,
                            absl::Time deadline) {
  v1::BulkStatus message;
  message.set_code(static_cast<int>(status.code()));
  message.set_message(std::string(status.message()));
  message.set_nbytes(nbytes);
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
                             const std::string& job, const v1::MemoryCopy& copy, uint64_t begin,
                             uint64_t end, absl::Time deadline) {
  v1::BulkRequest request;
  *request.mutable_read() = MemoryCopyReadRequest(job, copy, begin, end);
  if (absl::Status sent = SendBulkFrame(socket, request, deadline); !sent.ok()) return sent;
  absl::StatusOr<uint64_t> offered = RecvBulkStatus(socket, address, deadline);
  if (!offered.ok()) return offered.status();
  if (*offered != end - begin) {
    return absl::DataLossError(
        absl::StrCat(address, " offers ", *offered, " bytes of the memory copy of ", copy.file(),
                     " where bytes [", begin, ", ", end, ") were asked for"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
