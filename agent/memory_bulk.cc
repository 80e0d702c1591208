#include "agent/memory_bulk.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/peer.pb.h"

namespace tessera {
namespace {

// The largest request or header a side accepts (peer.proto "Bulk reads").
constexpr uint32_t kMaxFrameBytes = 64 << 10;

// A message as u32 length (little-endian) and its bytes.
absl::Status SendFrame(const TcpSocket& socket, const google::protobuf::MessageLite& message,
                       absl::Time deadline) {
  const std::string body = message.SerializeAsString();
  const uint32_t n = static_cast<uint32_t>(body.size());
  std::string frame = {static_cast<char>(n), static_cast<char>(n >> 8),
                       static_cast<char>(n >> 16), static_cast<char>(n >> 24)};
  frame += body;
  return socket.SendAll(frame.data(), frame.size(), deadline);
}

absl::Status RecvFrame(const TcpSocket& socket, google::protobuf::MessageLite* message,
                       absl::Time deadline) {
  unsigned char length[4];
  if (absl::Status got = socket.RecvAll(reinterpret_cast<char*>(length), 4, deadline);
      !got.ok()) {
    return got;
  }
  const uint32_t n = length[0] | length[1] << 8 | length[2] << 16 | uint32_t{length[3]} << 24;
  if (n > kMaxFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", message->GetTypeName(), " of ", n,
                                                   " bytes from ", socket.peer(), " (at most ",
                                                   kMaxFrameBytes, ")"));
  }
  std::string body(n, '\0');
  if (absl::Status got = socket.RecvAll(body.data(), n, deadline); !got.ok()) return got;
  if (!message->ParseFromString(body)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message->GetTypeName(), " from ", socket.peer()));
  }
  return absl::OkStatus();
}

// Bytes [begin, end) of the copy, read from `address` into `dest` (the copy's first byte).
absl::Status ReadPart(const std::string& address, const v1::ReadMemoryCopyRequest& request,
                      char* dest, uint64_t begin, uint64_t end, absl::Time deadline) {
  absl::StatusOr<TcpSocket> socket = TcpSocket::Connect(address, deadline);
  if (!socket.ok()) return socket.status();
  if (absl::Status sent = SendFrame(*socket, request, deadline); !sent.ok()) return sent;
  v1::BulkReadHeader header;
  if (absl::Status got = RecvFrame(*socket, &header, deadline); !got.ok()) return got;
  if (header.code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(header.code()),
                        absl::StrCat(header.message(), " (bulk read from ", address, ")"));
  }
  if (header.nbytes() != end - begin) {
    return absl::DataLossError(absl::StrCat(address, " offers ", header.nbytes(),
                                            " bytes of the memory copy of ", request.file(),
                                            " where bytes [", begin, ", ", end,
                                            ") were asked for"));
  }
  return socket->RecvAll(dest + begin, end - begin, deadline);
}

}  // namespace

absl::StatusOr<std::string> MemoryBulkListenAddress(const std::string& flag,
                                                    const std::string& peer_listen) {
  if (!flag.empty()) return flag;
  absl::StatusOr<std::pair<std::string, std::string>> host_port = SplitHostPort(peer_listen);
  if (!host_port.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_listen: ", host_port.status().message()));
  }
  return JoinHostPort(host_port->first, "0");
}

absl::StatusOr<std::unique_ptr<MemoryBulkServer>> MemoryBulkServer::Start(
    std::string job_id, const MemoryTier* tier, const BuddyStore* store,
    MemoryBulkServerOptions options) {
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen(options.listen_address, 128);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<MemoryBulkServer>(new MemoryBulkServer(
      std::move(job_id), tier, store, std::move(options), *std::move(listener)));
}

MemoryBulkServer::MemoryBulkServer(std::string job_id, const MemoryTier* tier,
                                   const BuddyStore* store, MemoryBulkServerOptions options,
                                   TcpSocket listener)
    : job_id_(std::move(job_id)),
      tier_(tier),
      store_(store),
      options_(std::move(options)),
      listener_(std::move(listener)),
      port_(listener_.port()) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

MemoryBulkServer::~MemoryBulkServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Connection& c : connections_) c.socket.Shutdown();
  }
  listener_.Shutdown();
  acceptor_.join();
  // No connection is added once stopping_. The nodes keep their addresses in `remaining`,
  // where their threads mark them done.
  std::list<Connection> remaining;
  {
    absl::MutexLock lock(&mu_);
    remaining.swap(connections_);
  }
  for (Connection& c : remaining) c.thread.join();
}

void MemoryBulkServer::AcceptLoop() {
  while (true) {
    {
      // At max_connections, further connections wait in the listen backlog.
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || active_ < options_.max_connections;
      };
      mu_.Await(absl::Condition(&room));
      if (stopping_) return;
    }
    absl::StatusOr<TcpSocket> accepted = listener_.Accept();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (!accepted.ok()) {  // e.g. out of descriptors: not a reason to spin
      LogWarning("memory bulk port: ", accepted.status().ToString());
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
      continue;
    }
    // Connections that finished: join their threads.
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->done) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    ++active_;
    Connection& c = connections_.emplace_back();
    c.socket = *std::move(accepted);
    c.thread = std::thread([this, &c] { Serve(&c); });
  }
}

void MemoryBulkServer::Serve(Connection* connection) {
  const TcpSocket& socket = connection->socket;
  Answer(socket, Lookup(socket));
  absl::MutexLock lock(&mu_);
  connection->socket.Close();
  connection->done = true;
  --active_;
}

absl::StatusOr<RequestedBytes> MemoryBulkServer::Lookup(const TcpSocket& socket) const {
  v1::ReadMemoryCopyRequest request;
  if (absl::Status got = RecvFrame(socket, &request, absl::Now() + options_.request_timeout);
      !got.ok()) {
    return got;
  }
  return FindRequestedBytes(job_id_, *tier_, *store_, request);
}

void MemoryBulkServer::Answer(const TcpSocket& socket,
                              const absl::StatusOr<RequestedBytes>& found) const {
  const absl::Time deadline = absl::Now() + options_.send_timeout;
  v1::BulkReadHeader header;
  header.set_code(static_cast<int>(found.status().code()));
  header.set_message(std::string(found.status().message()));
  if (found.ok()) header.set_nbytes(found->end - found->begin);
  absl::Status sent = SendFrame(socket, header, deadline);
  if (sent.ok() && found.ok()) {
    sent = socket.SendAll(found->data + found->begin, found->end - found->begin, deadline);
  }
  if (!sent.ok()) LogWarning("memory bulk read for ", socket.peer(), ": ", sent.ToString());
}

absl::Status ReadMemoryCopyBulk(const std::string& address, const std::string& job,
                                const v1::MemoryCopy& copy, char* dest, absl::Duration timeout,
                                int streams) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::vector<std::pair<uint64_t, uint64_t>> parts = ReadParts(copy.nbytes(), streams);
  std::vector<absl::Status> results(parts.size());
  auto read = [&](size_t i) {
    const auto [begin, end] = parts[i];
    results[i] = ReadPart(address, ReadRequest(job, copy, begin, end), dest, begin, end, deadline);
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < parts.size(); ++i) threads.emplace_back(read, i);
  read(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& result : results) {
    if (!result.ok()) return result;
  }
  return absl::OkStatus();
}

absl::Status ReadMemoryCopyFromHolder(const std::string& job, const v1::MemoryCopy& copy,
                                      char* dest, absl::Duration timeout) {
  if (!copy.bulk_address().empty()) {
    return ReadMemoryCopyBulk(copy.bulk_address(), job, copy, dest, timeout);
  }
  return ReadMemoryCopy(MemoryCopyChannels(copy.peer_address(), grpc::InsecureChannelCredentials()),
                        job, copy, dest, timeout);
}

}  // namespace tessera
