#include "tests/bench/loopback_link.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/checksum.h"
#include "common/socket_group.h"
#include "common/status.h"
#include "common/tcp_socket.h"

namespace tessera {
namespace {

// Receives `n` bytes into `dst`; with `xxh3`, hashes each piece right after it arrived (at most
// kReceiveThenHashBytes, as the trainer's fetch does) and sets *xxh3 to the digest of all.
absl::Status Receive(const TcpSocket& socket, char* dst, uint64_t n, uint64_t* xxh3,
                     absl::Time deadline) {
  if (xxh3 == nullptr) return socket.RecvAll(dst, n, deadline);
  StreamingHasher hasher;
  for (uint64_t got = 0; got < n;) {
    ASSIGN_OR_RETURN(
        const size_t k,
        socket.RecvSome(dst + got, std::min(kReceiveThenHashBytes, n - got), deadline));
    hasher.Update(dst + got, k);
    got += k;
  }
  *xxh3 = hasher.Digest();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoopbackResult> TimeLoopbackTransfer(const LoopbackTransfer& transfer,
                                                    absl::Duration timeout) {
  if (transfer.streams < 1) {
    return absl::InvalidArgumentError(absl::StrCat("streams is ", transfer.streams));
  }
  if (transfer.bytes_per_stream > 0 && (transfer.src == nullptr || transfer.dst == nullptr)) {
    return absl::InvalidArgumentError("no source or destination for the bytes");
  }
  ASSIGN_OR_RETURN(const TcpSocket listener, TcpSocket::Listen("127.0.0.1:0", transfer.streams));
  const std::string address = absl::StrCat("127.0.0.1:", listener.port());
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;

  LoopbackResult result;
  if (transfer.check) result.xxh3.resize(transfer.streams);
  SocketGroup
      group;  // the connections, and the listener while it accepts: the first error ends all
  group.Open(listener);
  absl::Mutex mu;
  std::vector<bool> taken(transfer.streams, false);  // streams a connection said it is

  std::vector<std::thread> threads;
  for (int i = 0; i < transfer.streams; ++i) {
    const uint64_t at = static_cast<uint64_t>(i) * transfer.bytes_per_stream;
    threads.emplace_back([&, i, at] {
      absl::StatusOr<TcpSocket> socket = TcpSocket::Connect(address, deadline);
      if (!socket.ok()) return group.Fail(socket.status());
      group.Run(*socket, [&]() -> absl::Status {
        // Connections are accepted in whatever order they arrive: each first says its stream.
        const uint32_t stream = static_cast<uint32_t>(i);
        RETURN_IF_ERROR(
            socket->SendAll(reinterpret_cast<const char*>(&stream), sizeof(stream), deadline));
        return socket->SendAll(transfer.src + at, transfer.bytes_per_stream, deadline);
      });
    });
  }
  for (int i = 0; i < transfer.streams; ++i) {
    absl::StatusOr<TcpSocket> accepted = listener.Accept();
    if (!accepted.ok()) {
      group.Fail(accepted.status());
      break;
    }
    threads.emplace_back([&, socket = std::move(*accepted)]() {
      group.Run(socket, [&]() -> absl::Status {
        uint32_t stream = 0;
        RETURN_IF_ERROR(socket.RecvAll(reinterpret_cast<char*>(&stream), sizeof(stream), deadline));
        {
          absl::MutexLock lock(&mu);
          if (stream >= taken.size() || taken[stream]) {
            return absl::DataLossError(
                absl::StrCat("a connection said it is stream ", stream, " of ", taken.size(),
                             stream < taken.size() ? ", which another connection is" : ""));
          }
          taken[stream] = true;
        }
        const uint64_t at = uint64_t{stream} * transfer.bytes_per_stream;
        return Receive(socket, transfer.dst + at, transfer.bytes_per_stream,
                       transfer.check ? &result.xxh3[stream] : nullptr, deadline);
      });
    });
  }
  group.Close(listener);
  for (std::thread& t : threads) t.join();
  result.elapsed = absl::Now() - start;
  RETURN_IF_ERROR(group.first_error());
  return result;
}

}  // namespace tessera
