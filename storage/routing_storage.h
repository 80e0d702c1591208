// RoutingStorage: one Storage for every path a process meets — "s3://..." paths to an object
// store, every other path to the file system — so that the code above it (the shard writer,
// the committer, the readers) never asks which kind a checkpoint lives on; only
// publication(path) tells the committer how to publish.
//
// The object store is made on the first s3:// path, not before: a process that never meets
// one needs no S3 credentials. If making it fails (no credentials, a bad endpoint), that
// call fails with the reason and the next s3:// call tries again.
//
// Rename routes by `from`; a rename between the two kinds is InvalidArgument.
//
// Thread-safety: thread-safe. The file system storage must outlive this one.
#ifndef TESSERA_STORAGE_ROUTING_STORAGE_H_
#define TESSERA_STORAGE_ROUTING_STORAGE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/storage.h"

namespace tessera {

class RoutingStorage : public Storage {
 public:
  // Makes the object store's Storage; called on the first s3:// path, again after a failure.
  using ObjectStoreFactory = std::function<absl::StatusOr<std::unique_ptr<Storage>>()>;

  RoutingStorage(Storage* file_system, ObjectStoreFactory object_store);

  Publication publication(const std::string& path) const override;
  absl::Status CheckAccess(const std::string& dir) override;
  absl::Status PutFile(const std::string& path, absl::string_view data, PutMode mode) override;
  absl::Status CreateDirs(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RemoveTree(const std::string& path) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;

 private:
  // The storage of `path`. Errors: the object store's factory's, naming `path`.
  absl::StatusOr<Storage*> For(const std::string& path) const;
  // fn(the storage of `path`), or For's error.
  template <typename Fn>
  auto Route(const std::string& path, Fn fn) const -> decltype(fn(std::declval<Storage&>())) {
    absl::StatusOr<Storage*> storage = For(path);
    if (!storage.ok()) return storage.status();
    return fn(**storage);
  }

  Storage* const file_system_;
  const ObjectStoreFactory make_object_store_;
  mutable absl::Mutex mu_;
  mutable std::unique_ptr<Storage> object_store_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_STORAGE_ROUTING_STORAGE_H_
