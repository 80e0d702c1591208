#include "common/bulk_wire.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status SendBulkFrame(const TcpSocket& socket, const google::protobuf::MessageLite& message,
                           absl::Time deadline) {
  const std::string body = message.SerializeAsString();
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string frame = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 24)};
  frame += body;
  return socket.SendAll(frame.data(), frame.size(), deadline);
}

absl::Status RecvBulkFrame(const TcpSocket& socket, google::protobuf::MessageLite* message,
                           absl::Time deadline) {
  unsigned char length[4];
  if (absl::Status got = socket.RecvAll(reinterpret_cast<char*>(length), 4, deadline); !got.ok()) {
    return got;
  }
  const uint32_t n = length[0] | length[1] << 8 | length[2] << 16 | uint32_t{length[3]} << 24;
  if (n > kMaxBulkFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", message->GetTypeName(), " of ", n,
                                                   " bytes from ", socket.peer(), " (at most ",
                                                   kMaxBulkFrameBytes, ")"));
  }
  std::string body(n, '\0');
  if (absl::Status got = socket.RecvAll(body.data(), n, deadline); !got.ok()) return got;
  if (!message->ParseFromString(body)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message->GetTypeName(), " from ", socket.peer()));
  }
  return absl::OkStatus();
}

absl::Status SendBulkStatus(const TcpSocket& socket, const absl::Status& status, uint64_t nbytes,
                            absl::Time deadline) {
  v1::BulkStatus message;
  message.set_code(static_cast<int>(status.code()));
  message.set_message(std::string(status.message()));
  message.set_nbytes(nbytes);
  return SendBulkFrame(socket, message, deadline);
}

absl::StatusOr<uint64_t> RecvBulkStatus(const TcpSocket& socket, const std::string& address,
                                        absl::Time deadline) {
  v1::BulkStatus status;
  if (absl::Status got = RecvBulkFrame(socket, &status, deadline); !got.ok()) return got;
  if (status.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(status.code()),
                        absl::StrCat(status.message(), " (bulk port ", address, ")"));
  }
  return status.nbytes();
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
