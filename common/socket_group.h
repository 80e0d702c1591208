// SocketGroup: the connections of one transfer split over several, of which the first error
// ends them all. The error is kept and every connection still registered is shut down at once,
// so that no part waits out its deadline on a peer another part already found dead or wrong
// (client/peer_fetch.h FetchVerified, agent/memory_bulk.h ReadMemoryCopyBulk, the loopback
// baseline tests/bench/loopback_link.h).
//
//   SocketGroup group;
//   RunOnThreads(parts, [&](size_t i) {
//     absl::StatusOr<TcpSocket> socket = Open(i);
//     if (!socket.ok()) return group.Fail(socket.status());
//     group.Run(*socket, [&] { return Read(*socket, i); });
//   });
//   return group.first_error();
//
// Thread-safety: thread-safe. A registered socket must stay alive until it is unregistered
// (Run does both).
#ifndef TESSERA_COMMON_SOCKET_GROUP_H_
#define TESSERA_COMMON_SOCKET_GROUP_H_

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/tcp_socket.h"

namespace tessera {

class SocketGroup {
 public:
  // Registers `socket`: a later Fail shuts it down. False, registering nothing, if the group
  // has already failed.
  bool Open(const TcpSocket& socket);
  // Unregisters `socket` (registered by Open).
  void Close(const TcpSocket& socket);

  // Keeps `error` if it is the first, and then shuts down every registered socket. An OK
  // `error` is ignored.
  void Fail(absl::Status error);

  // Runs body() (returning absl::Status) with `socket` registered, and fails the group with
  // what it returns; runs nothing if the group has already failed.
  template <typename Body>
  void Run(const TcpSocket& socket, const Body& body) {
    if (!Open(socket)) return;
    absl::Status status = body();
    Close(socket);
    Fail(std::move(status));
  }

  bool failed() const;
  // OK until the first Fail with an error; then that error.
  absl::Status first_error() const;

 private:
  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::vector<const TcpSocket*> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_SOCKET_GROUP_H_
