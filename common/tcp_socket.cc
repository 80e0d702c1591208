#include "common/tcp_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera {
namespace {

// One blocking send or receive moves at most this much, so the deadline is checked between.
constexpr size_t kMaxPerCall = size_t{64} << 20;

absl::Status SocketError(int err, absl::string_view op, absl::string_view peer) {
  const std::string message = absl::StrCat(op, " ", peer, ": ", strerror(err));
  switch (err) {
    case EAGAIN:
    case EINPROGRESS:  // a blocking connect that ran past SO_SNDTIMEO
      return absl::DeadlineExceededError(absl::StrCat(message, " (deadline passed)"));
    case EINVAL:
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// Makes the socket's next blocking calls give up at `deadline`; DeadlineExceeded if it passed.
absl::Status TimeOutAt(int fd, absl::Time deadline, absl::string_view op, absl::string_view peer) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(absl::StrCat(op, " ", peer, ": deadline passed"));
  }
  // A zero timeval means "never": at least one microsecond. An infinite one is "never" too.
  const timeval tv = left == absl::InfiniteDuration()
                         ? timeval{0, 0}
                         : absl::ToTimeval(std::max(left, absl::Microseconds(1)));
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return SocketError(errno, "setsockopt", peer);
  }
  return absl::OkStatus();
}

// One send or receive call under `limit`: the socket's timeout is set to whichever comes
// first, the deadline or `limit.stall` from now. A call that moves some bytes before its
// timeout returns them (SO_SNDTIMEO / SO_RCVTIMEO), so the next call's window starts afresh;
// one that moves none fails EAGAIN, which Stalled() names.
class CallWindow {
 public:
  CallWindow(const TimeLimit& limit) : limit_(limit) {}  // NOLINT(runtime/explicit)

  absl::Status Open(int fd, absl::string_view op, absl::string_view peer) {
    const absl::Time due = limit_.StepDeadline();
    stall_bound_ = due < limit_.deadline;
    return TimeOutAt(fd, due, op, peer);
  }

  // The error of a call that failed with `err`.
  absl::Status Error(int err, absl::string_view op, absl::string_view peer) const {
    if ((err == EAGAIN || err == EWOULDBLOCK) && stall_bound_) {
      return absl::DeadlineExceededError(absl::StrCat(op, " ", peer, ": no byte moved for ",
                                                      absl::FormatDuration(limit_.stall)));
    }
    return SocketError(err, op, peer);
  }

 private:
  const TimeLimit limit_;
  bool stall_bound_ = false;
};

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfoList> Resolve(absl::string_view address, bool passive) {
  absl::StatusOr<std::pair<std::string, std::string>> host_port = SplitHostPort(address);
  if (!host_port.ok()) return host_port.status();
  const auto& [host, port] = *host_port;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const bool wildcard = host.empty() || host == "*";
  addrinfo* list = nullptr;
  const int rc = getaddrinfo(wildcard ? nullptr : host.c_str(), port.c_str(), &hints, &list);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  return AddrInfoList(list);
}

// A socket for the first address `address` resolves to on which `use` succeeds; else the last
// failure. A DeadlineExceeded from `use` ends the search.
absl::StatusOr<TcpSocket> OnFirstAddress(
    absl::string_view address, bool passive,
    const std::function<absl::Status(int fd, const addrinfo& a)>& use) {
  absl::StatusOr<AddrInfoList> list = Resolve(address, passive);
  if (!list.ok()) return list.status();
  absl::Status last = absl::UnavailableError(absl::StrCat(address, ": no address"));
  for (const addrinfo* a = list->get(); a != nullptr; a = a->ai_next) {
    TcpSocket socket(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol),
                     std::string(address));
    if (!socket.valid()) {
      last = SocketError(errno, "socket for", address);
      continue;
    }
    last = use(socket.fd(), *a);
    if (last.ok()) return socket;
    if (absl::IsDeadlineExceeded(last)) break;
  }
  return last;
}

}  // namespace

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" is not host:port"));
  }
  return std::make_pair(UnbracketHost(address.substr(0, colon)),
                        std::string(address.substr(colon + 1)));
}

std::string UnbracketHost(absl::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

std::string JoinHostPort(absl::string_view host, absl::string_view port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

TcpSocket& TcpSocket::operator=(TcpSocket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    peer_ = std::move(other.peer_);
  }
  return *this;
}

absl::StatusOr<TcpSocket> TcpSocket::Connect(absl::string_view address, absl::Time deadline) {
  return OnFirstAddress(address, /*passive=*/false, [&](int fd, const addrinfo& a) {
    RETURN_IF_ERROR(TimeOutAt(fd, deadline, "connect", address));
    if (::connect(fd, a.ai_addr, a.ai_addrlen) != 0) return SocketError(errno, "connect", address);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return absl::OkStatus();
  });
}

std::vector<PortProbe> ProbePorts(const std::vector<std::string>& addresses,
                                  absl::Time deadline) {
  std::vector<PortProbe> found(addresses.size(), PortProbe::kUnknown);
  std::vector<TcpSocket> sockets(addresses.size());
  std::vector<pollfd> pending;
  std::vector<size_t> index;  // pending[i] probes addresses[index[i]]
  for (size_t i = 0; i < addresses.size(); ++i) {
    absl::StatusOr<AddrInfoList> list = Resolve(addresses[i], /*passive=*/false);
    if (!list.ok() || list->get() == nullptr) continue;  // unknown
    const addrinfo& a = *list->get();
    TcpSocket socket(::socket(a.ai_family, a.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                              a.ai_protocol),
                     addresses[i]);
    if (!socket.valid()) continue;
    if (::connect(socket.fd(), a.ai_addr, a.ai_addrlen) == 0) {
      found[i] = PortProbe::kListening;
      continue;
    }
    if (errno == ECONNREFUSED) {
      found[i] = PortProbe::kRefused;
      continue;
    }
    if (errno != EINPROGRESS) continue;
    pending.push_back(pollfd{socket.fd(), POLLOUT, 0});
    index.push_back(i);
    sockets[i] = std::move(socket);
  }
  while (!pending.empty()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    const int ready = ::poll(pending.data(), pending.size(),
                             static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    for (size_t p = pending.size(); p-- > 0;) {
      if (pending[p].revents == 0) continue;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(pending[p].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      found[index[p]] = err == 0              ? PortProbe::kListening
                        : err == ECONNREFUSED ? PortProbe::kRefused
                                              : PortProbe::kUnknown;
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(p));
      index.erase(index.begin() + static_cast<std::ptrdiff_t>(p));
    }
  }
  return found;  // the sockets close here
}

absl::StatusOr<TcpSocket> TcpSocket::Listen(absl::string_view address, int backlog) {
  return OnFirstAddress(address, /*passive=*/true, [&](int fd, const addrinfo& a) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a.ai_addr, a.ai_addrlen) != 0) return SocketError(errno, "bind", address);
    if (::listen(fd, backlog) != 0) return SocketError(errno, "listen", address);
    return absl::OkStatus();
  });
}

absl::StatusOr<TcpSocket> TcpSocket::Accept() const {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
      char host[NI_MAXHOST] = "?";
      char port[NI_MAXSERV] = "?";
      getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV);
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return TcpSocket(fd, absl::StrCat(host, ":", port));
    }
    // A connection that went away before it was accepted is not the listener's failure.
    if (errno == EINTR || errno == ECONNABORTED) continue;
    return SocketError(errno, "accept on", peer_);
  }
}

absl::Status TcpSocket::SendAll(const char* data, size_t n, TimeLimit limit) const {
  CallWindow window(limit);
  for (size_t sent = 0; sent < n;) {
    if (absl::Status timed = window.Open(fd_, "send to", peer_); !timed.ok()) return timed;
    const ssize_t k = ::send(fd_, data + sent, std::min(n - sent, kMaxPerCall), MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return window.Error(errno, "send to", peer_);
    }
    sent += static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

absl::Status TcpSocket::RecvAll(char* dest, size_t n, TimeLimit limit) const {
  CallWindow window(limit);
  for (size_t got = 0; got < n;) {
    if (absl::Status timed = window.Open(fd_, "receive from", peer_); !timed.ok()) return timed;
    const ssize_t k = ::recv(fd_, dest + got, std::min(n - got, kMaxPerCall), MSG_WAITALL);
    if (k == 0) {
      return absl::DataLossError(
          absl::StrCat(peer_, " closed the connection after ", got, " of ", n, " bytes"));
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      return window.Error(errno, "receive from", peer_);
    }
    got += static_cast<size_t>(k);
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> TcpSocket::RecvSome(char* dest, size_t n, TimeLimit limit) const {
  if (n == 0) return absl::InvalidArgumentError("RecvSome of 0 bytes");  // recv would say EOF
  CallWindow window(limit);
  for (;;) {
    if (absl::Status timed = window.Open(fd_, "receive from", peer_); !timed.ok()) return timed;
    const ssize_t k = ::recv(fd_, dest, std::min(n, kMaxPerCall), 0);
    if (k == 0) {
      return absl::DataLossError(absl::StrCat(peer_, " closed the connection"));
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      return window.Error(errno, "receive from", peer_);
    }
    return static_cast<size_t>(k);
  }
}

void TcpSocket::Shutdown() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void TcpSocket::Close() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

int TcpSocket::port() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
}

}  // namespace tessera
