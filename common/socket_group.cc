#include "common/socket_group.h"

#include <algorithm>

namespace tessera {

bool SocketGroup::Open(const TcpSocket& socket) {
  absl::MutexLock lock(&mu_);
  if (!first_error_.ok()) return false;
  open_.push_back(&socket);
  return true;
}

void SocketGroup::Close(const TcpSocket& socket) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(open_.begin(), open_.end(), &socket);
  if (it != open_.end()) open_.erase(it);
}

void SocketGroup::Fail(absl::Status error) {
  if (error.ok()) return;
  absl::MutexLock lock(&mu_);
  if (!first_error_.ok()) return;
  first_error_ = std::move(error);
  for (const TcpSocket* socket : open_) socket->Shutdown();
}

bool SocketGroup::failed() const {
  absl::MutexLock lock(&mu_);
  return !first_error_.ok();
}

absl::Status SocketGroup::first_error() const {
  absl::MutexLock lock(&mu_);
  return first_error_;
}

}  // namespace tessera
