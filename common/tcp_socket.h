// Blocking TCP sockets with deadlines: the few calls a plain data connection needs (the memory
// tier's bulk reads, agent/memory_bulk.h), each bounded in time so that a peer that dies or
// stops reading or writing ends the call with an error instead of blocking it.
//
// Errors name the operation and the address: Unavailable for a peer that cannot be reached or
// that reset the connection; DeadlineExceeded once the deadline passed; DataLoss for a
// connection closed before the bytes expected; InvalidArgument for an address that does not
// parse or resolve.
//
// Thread-safety: a TcpSocket is used by one thread at a time, except Shutdown(), which any
// thread may call to wake a blocked call (it then fails).
#ifndef TESSERA_COMMON_TCP_SOCKET_H_
#define TESSERA_COMMON_TCP_SOCKET_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera {

// "host:port" or "[v6 literal]:port" split into host (brackets removed) and port.
// Errors: InvalidArgument if there is no ':' or no port.
absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(absl::string_view address);

// "[fd00::1]" -> "fd00::1"; any other host unchanged.
std::string UnbracketHost(absl::string_view host);

// The inverse: "host:port", an IPv6 literal host bracketed ("[fd00::5]:7000").
std::string JoinHostPort(absl::string_view host, absl::string_view port);

// When a send or receive gives up: at `deadline`, or once no byte has moved for `stall` — so a
// transfer of any size on a slow link goes on while it moves, and one whose peer stopped ends
// at most two stall limits after the last byte (a call that moved some bytes returns them
// when its window ends, and the next window starts then). An absl::Time converts to a
// deadline alone.
struct TimeLimit {
  TimeLimit(absl::Time deadline) : deadline(deadline) {}  // NOLINT(runtime/explicit)
  TimeLimit(absl::Time deadline, absl::Duration stall) : deadline(deadline), stall(stall) {}
  // A stall limit alone.
  static TimeLimit Stall(absl::Duration stall) { return {absl::InfiniteFuture(), stall}; }

  // When a step that begins now (a wait for bytes, a connect, a request and its answer) must
  // end: the deadline, or the stall limit from now if sooner.
  absl::Time StepDeadline() const {
    return stall == absl::InfiniteDuration() ? deadline
                                             : std::min(deadline, absl::Now() + stall);
  }

  absl::Time deadline;
  absl::Duration stall = absl::InfiniteDuration();
};

// What one connection attempt to an address found by a deadline: a listener (the connection
// was made, then closed at once), nobody listening on a host that answered (it refused the
// connection: ECONNREFUSED), or neither — a timeout, an unreachable host or network, a name
// that does not resolve — which says nothing about the listener.
enum class PortProbe { kListening, kRefused, kUnknown };
// One attempt to each of `addresses` (its first resolved address), all at once: returns by
// `deadline` whatever the network does, the results in order.
std::vector<PortProbe> ProbePorts(const std::vector<std::string>& addresses, absl::Time deadline);

class TcpSocket {
 public:
  TcpSocket() = default;
  explicit TcpSocket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  TcpSocket(TcpSocket&& other) noexcept { *this = std::move(other); }
  TcpSocket& operator=(TcpSocket&& other) noexcept;
  TcpSocket(const TcpSocket&) = delete;
  TcpSocket& operator=(const TcpSocket&) = delete;
  ~TcpSocket() { Close(); }

  // Connects to `address` ("host:port"), trying each address the host resolves to.
  static absl::StatusOr<TcpSocket> Connect(absl::string_view address, absl::Time deadline);

  // A listening socket bound to `address` (port 0: a free one); port() says which.
  static absl::StatusOr<TcpSocket> Listen(absl::string_view address, int backlog);

  // The next connection (peer() names it). Fails once Shutdown() was called.
  absl::StatusOr<TcpSocket> Accept() const;

  // Sends all `n` bytes at `data`. Does not raise SIGPIPE. DeadlineExceeded past `limit`.
  absl::Status SendAll(const char* data, size_t n, TimeLimit limit) const;

  // Receives exactly `n` bytes into `dest`. DataLoss if the peer closes first, naming how
  // many bytes had arrived; DeadlineExceeded past `limit`.
  absl::Status RecvAll(char* dest, size_t n, TimeLimit limit) const;

  // Receives between 1 and `n` bytes into `dest`: what has arrived, waiting only until
  // something has; returns how many. DataLoss if the peer closes first; InvalidArgument if `n`
  // is 0; DeadlineExceeded past `limit`.
  absl::StatusOr<size_t> RecvSome(char* dest, size_t n, TimeLimit limit) const;

  // Wakes and fails any call blocked on this socket, now and later; the descriptor stays open
  // until Close() or destruction.
  void Shutdown() const;
  void Close();

  int port() const;
  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }

 private:
  int fd_ = -1;
  std::string peer_;  // for error messages
};

}  // namespace tessera

#endif  // TESSERA_COMMON_TCP_SOCKET_H_
