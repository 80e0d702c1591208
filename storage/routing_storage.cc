#include "storage/routing_storage.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

bool IsObjectPath(absl::string_view path) { return absl::StartsWith(path, "s3://"); }

}  // namespace

RoutingStorage::RoutingStorage(Storage* file_system, ObjectStoreFactory object_store)
    : file_system_(file_system), make_object_store_(std::move(object_store)) {}

absl::StatusOr<Storage*> RoutingStorage::For(const std::string& path) const {
  if (!IsObjectPath(path)) return file_system_;
  absl::MutexLock lock(&mu_);
  if (object_store_ == nullptr) {
    absl::StatusOr<std::unique_ptr<Storage>> made =
        make_object_store_ ? make_object_store_()
                           : absl::FailedPreconditionError("this process has no object store");
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrCat("cannot reach ", path, ": ", made.status().message()));
    }
    object_store_ = *std::move(made);
  }
  return object_store_.get();
}

Publication RoutingStorage::publication(const std::string& path) const {
  return IsObjectPath(path) ? Publication::kCreateManifest
                            : file_system_->publication(path);
}

absl::Status RoutingStorage::CheckAccess(const std::string& dir) {
  return Route(dir, [&](Storage& s) { return s.CheckAccess(dir); });
}

absl::Status RoutingStorage::PutFile(const std::string& path, absl::string_view data,
                                     PutMode mode) {
  return Route(path, [&](Storage& s) { return s.PutFile(path, data, mode); });
}

absl::Status RoutingStorage::CreateDirs(const std::string& path) {
  return Route(path, [&](Storage& s) { return s.CreateDirs(path); });
}

absl::StatusOr<std::unique_ptr<WritableFile>> RoutingStorage::OpenForWrite(
    const std::string& path) {
  return Route(path, [&](Storage& s) { return s.OpenForWrite(path); });
}

absl::StatusOr<std::unique_ptr<ReadableFile>> RoutingStorage::OpenForRead(
    const std::string& path) {
  return Route(path, [&](Storage& s) { return s.OpenForRead(path); });
}

absl::Status RoutingStorage::SyncDir(const std::string& path) {
  return Route(path, [&](Storage& s) { return s.SyncDir(path); });
}

absl::Status RoutingStorage::Rename(const std::string& from, const std::string& to) {
  if (IsObjectPath(from) != IsObjectPath(to)) {
    return IoError(absl::StatusCode::kInvalidArgument, from,
                   absl::StrCat("cannot rename ", from, " to ", to,
                                ": one is an object store's, the other the file system's"));
  }
  return Route(from, [&](Storage& s) { return s.Rename(from, to); });
}

absl::Status RoutingStorage::RemoveTree(const std::string& path) {
  return Route(path, [&](Storage& s) { return s.RemoveTree(path); });
}

absl::StatusOr<uint64_t> RoutingStorage::FileSize(const std::string& path) {
  return Route(path, [&](Storage& s) { return s.FileSize(path); });
}

absl::StatusOr<std::vector<std::string>> RoutingStorage::ListDir(const std::string& path) {
  return Route(path, [&](Storage& s) { return s.ListDir(path); });
}

}  // namespace tessera
