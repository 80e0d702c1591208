#include "agent/memory_bulk.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bulk_wire.h"
#include "common/log.h"
#include "common/socket_group.h"
#include "common/status.h"
#include "common/threads.h"
#include "grpcpp/grpcpp.h"

namespace tessera {

absl::StatusOr<std::string> MemoryBulkListenAddress(const std::string& flag,
                                                    const std::string& peer_listen) {
  if (!flag.empty()) return flag;
  absl::StatusOr<std::pair<std::string, std::string>> host_port = SplitHostPort(peer_listen);
  if (!host_port.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_listen: ", host_port.status().message()));
  }
  return JoinHostPort(host_port->first, "0");
}

absl::StatusOr<std::unique_ptr<MemoryBulkServer>> MemoryBulkServer::Start(
    const PeerKeyring* keyring, const MemoryTier* tier, BuddyStore* store,
    MemoryBulkServerOptions options) {
  absl::StatusOr<TcpSocket> listener = TcpSocket::Listen(options.listen_address, 128);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<MemoryBulkServer>(new MemoryBulkServer(
      keyring, tier, store, std::move(options), *std::move(listener)));
}

MemoryBulkServer::MemoryBulkServer(const PeerKeyring* keyring, const MemoryTier* tier,
                                   BuddyStore* store, MemoryBulkServerOptions options,
                                   TcpSocket listener)
    : keyring_(keyring),
      job_id_(keyring->Get().job_id),
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
  // A peer that fails the handshake is answered its error and nothing more.
  absl::StatusOr<AcceptedBulkPeer> peer =
      AcceptBulkPeer(socket, keyring_->Get(), absl::Now() + options_.request_timeout);
  if (!peer.ok()) {
    LogWarning("memory bulk port: refused ", socket.peer(), ": ", peer.status().ToString());
    SendBulkStatus(socket, peer.status(), 0, absl::Now() + options_.send_timeout).IgnoreError();
  } else if (peer->request.has_read()) {
    ServeRead(socket, peer->request.read(), peer->proof);
  } else {
    ServePut(socket, peer->request.put(), peer->proof);
  }
  absl::MutexLock lock(&mu_);
  connection->socket.Close();
  connection->done = true;
  --active_;
}

void MemoryBulkServer::ServeRead(const TcpSocket& socket,
                                 const v1::ReadMemoryCopyRequest& request,
                                 const std::string& proof) const {
  absl::StatusOr<RequestedBytes> found = FindRequestedBytes(job_id_, *tier_, *store_, request);
  absl::Status sent = SendBulkStatus(socket, found.status(),
                                     found.ok() ? found->end - found->begin : 0,
                                     absl::Now() + options_.send_timeout, proof);
  if (sent.ok() && found.ok()) {
    sent = socket.SendAll(found->data + found->begin, found->end - found->begin,
                          TimeLimit::Stall(options_.send_timeout));
  }
  if (!sent.ok()) LogWarning("memory bulk read for ", socket.peer(), ": ", sent.ToString());
}

void MemoryBulkServer::ServePut(const TcpSocket& socket, const v1::BulkPut& put,
                                const std::string& proof) {
  absl::StatusOr<std::shared_ptr<MemoryBuffer>> room =
      ReserveBuddyCopy(job_id_, *store_, put.job_id(), put.copy());
  absl::Status status = SendBulkStatus(socket, room.status(), room.ok() ? (*room)->size() : 0,
                                       absl::Now() + options_.put_timeout, proof);
  if (!room.ok()) return;
  if (status.ok()) {
    status = socket.RecvAll((*room)->data(), (*room)->size(),
                            TimeLimit::Stall(options_.put_timeout));
  }
  if (status.ok()) {
    // Logged before the copy is kept, and so before any heartbeat can state it.
    LogInfo("kept the memory copy of ", put.copy().file(), " of step ", put.copy().step(),
            " from rank ", put.copy().writer_rank(), " (", put.copy().nbytes(),
            " bytes over the bulk port)");
    store_->Keep(put.copy(), *std::move(room));
    status = SendBulkStatus(socket, absl::OkStatus(), put.copy().nbytes(),
                            absl::Now() + options_.put_timeout);
    if (!status.ok()) LogWarning("memory bulk put from ", socket.peer(), ": ", status.ToString());
    return;
  }
  // The sender gave way to a newer save (BuddyReplicator::GiveWay), went away or stalled.
  store_->Abandon(room->get());
  LogInfo("memory copy of ", put.copy().file(), " of step ", put.copy().step(), " from rank ",
          put.copy().writer_rank(), " not kept: ", status.ToString());
}

absl::Status ReadMemoryCopyBulk(const std::string& address, const PeerCredential& credential,
                                const v1::MemoryCopy& copy, char* dest, absl::Duration stall,
                                int streams) {
  const TimeLimit limit = TimeLimit::Stall(stall);
  const std::vector<std::pair<uint64_t, uint64_t>> parts = ReadParts(copy.nbytes(), streams);
  SocketGroup group;
  RunOnThreads(parts.size(), [&](size_t i) {
    const auto [begin, end] = parts[i];
    absl::StatusOr<TcpSocket> socket = TcpSocket::Connect(address, limit.StepDeadline());
    if (!socket.ok()) return group.Fail(socket.status());
    group.Run(*socket, [&] {
      RETURN_IF_ERROR(
          RequestBulkRead(*socket, address, credential, copy, begin, end, limit.StepDeadline()));
      return socket->RecvAll(dest + begin, end - begin, limit);
    });
  });
  return group.first_error();
}

absl::Status SendMemoryCopyBulk(const std::string& address, const PeerCredential& credential,
                                const v1::MemoryCopy& copy, const char* data,
                                absl::Duration stall, const std::atomic<bool>* cancel,
                                const std::function<void()>& before_chunk) {
  const TimeLimit limit = TimeLimit::Stall(stall);
  v1::BulkRequest request;
  request.mutable_put()->set_job_id(credential.job_id);
  *request.mutable_put()->mutable_copy() = copy;
  absl::StatusOr<TcpSocket> socket = TcpSocket::Connect(address, limit.StepDeadline());
  if (!socket.ok()) return socket.status();
  absl::StatusOr<BulkSession> session =
      SendBulkHello(*socket, credential, request, limit.StepDeadline());
  if (!session.ok()) return session.status();
  // No byte of the copy goes to a buddy that did not prove it belongs to the job.
  if (absl::StatusOr<uint64_t> room =
          RecvFirstBulkStatus(*socket, address, *session, limit.StepDeadline());
      !room.ok()) {
    return room.status();
  }
  for (uint64_t offset = 0; offset < copy.nbytes();) {
    if (before_chunk) before_chunk();
    if (cancel != nullptr && cancel->load()) {
      return absl::CancelledError(
          absl::StrCat("the memory copy of ", copy.file(), " to ", address, " was given up"));
    }
    const uint64_t n = std::min(kMemoryCopyChunkBytes, copy.nbytes() - offset);
    // The stall limit counts from here: a before_chunk wait (a trainer's save) is not a stall.
    if (absl::Status sent = socket->SendAll(data + offset, n, limit); !sent.ok()) return sent;
    offset += n;
  }
  return RecvBulkStatus(*socket, address, limit.StepDeadline()).status();
}

absl::Status ReadMemoryCopyFromHolder(const PeerCredential& credential,
                                      const v1::MemoryCopy& copy, char* dest,
                                      absl::Duration timeout) {
  // Over the bulk port `timeout` bounds each wait for bytes; over gRPC, the whole read.
  if (!copy.bulk_address().empty()) {
    return ReadMemoryCopyBulk(copy.bulk_address(), credential, copy, dest, timeout);
  }
  return ReadMemoryCopy(MemoryCopyChannels(copy.peer_address(), grpc::InsecureChannelCredentials()),
                        credential, copy, dest, timeout);
}

absl::Status SendMemoryCopyToBuddy(const PeerCredential& credential, const v1::MemoryBuddy& buddy,
                                   const v1::MemoryCopy& copy, const char* data,
                                   absl::Duration timeout, const std::atomic<bool>* cancel,
                                   const std::function<void()>& before_chunk) {
  // Over the bulk port `timeout` bounds each wait for bytes; over gRPC, the whole put.
  if (!buddy.bulk_address().empty()) {
    return SendMemoryCopyBulk(buddy.bulk_address(), credential, copy, data, timeout, cancel,
                              before_chunk);
  }
  return SendMemoryCopy(
      grpc::CreateChannel(buddy.peer_address(), grpc::InsecureChannelCredentials()), credential,
      copy, data, timeout, cancel, before_chunk);
}

}  // namespace tessera
