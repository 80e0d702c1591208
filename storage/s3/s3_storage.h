// S3Storage: Storage (storage/storage.h) on an S3-compatible object store, for paths
// "s3://bucket/key".
//
// How each operation maps to the store (a "directory" is the key prefix "<key>/"):
//   OpenForWrite  a file written in parts: WriteAt copies into part buffers of `part_size`;
//                 each full part is uploaded (UploadPart) by up to `parts_in_flight` threads of
//                 the file while the writer goes on; Sync uploads the rest and completes the
//                 multipart upload — the object appears whole then, never in part (Close does
//                 the same, as a file system's file is there after close). A file smaller than
//                 one part is one PutObject. A file destroyed without Close, or whose upload
//                 failed, is abandoned: its upload is aborted and nothing appears. Ranges must
//                 not overlap, and every byte up to the end must be written (a gap fails Sync).
//   OpenForRead   ranged GETs: a read of more than `read_piece` bytes is split into pieces,
//                 `reads_in_flight` of them fetched at once.
//   PutFile       one PutObject; kCreateOnly sends If-None-Match: * (decision 0041).
//   ListDir       ListObjectsV2 of "<key>/" with delimiter '/': objects and sub-prefixes,
//                 sorted; NotFound if there is neither (an object store has no empty directory).
//   RemoveTree    the object <key>, every object under "<key>/" (DeleteObjects), and the
//                 incomplete multipart uploads under "<key>/" (AbortMultipartUpload).
//   FileSize      HeadObject.
//   CreateDirs, SyncDir  nothing to do: OK for any well-formed path.
//   Rename        Unimplemented: checkpoints publish by creating their manifest
//                 (publication() is kCreateManifest).
// Durability: a PUT or a completed upload is durable when the store answers it.
//
// Errors: the S3 client's (storage/s3/s3_errors.h: chosen by who retries, naming the
// operation, s3://bucket/key and the HTTP status); InvalidArgument for a path that is not
// "s3://bucket/key".
//
// Thread-safety: thread-safe; files as storage.h says (a WritableFile takes WriteAt from
// several threads for disjoint ranges). The client must outlive the storage and its files.
#ifndef TESSERA_STORAGE_S3_S3_STORAGE_H_
#define TESSERA_STORAGE_S3_S3_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/s3/s3_client.h"
#include "storage/storage.h"

namespace tessera {

struct S3StorageOptions {
  // Bytes per part of a file's multipart upload (at least 5 MiB, S3's minimum for every part
  // but the last). A file holds at most 10,000 parts: 160 GiB at the default.
  // Default: 16 MiB.
  uint64_t part_size = uint64_t{16} << 20;

  // Parts of one file uploaded at once; the writer waits when this many full parts are not
  // uploaded yet, so a file holds at most parts_in_flight + 2 part buffers. Default: 4.
  int parts_in_flight = 4;

  // A read larger than this is split into ranged GETs of this size. Default: 16 MiB.
  uint64_t read_piece = uint64_t{16} << 20;

  // Ranged GETs of one read fetched at once. Default: 8.
  int reads_in_flight = 8;

  // Errors: InvalidArgument naming the field out of range.
  absl::Status Check() const;
};

// The bucket and key of "s3://bucket/key" (no trailing '/' on the key; "" for the bucket's
// root). Errors: InvalidArgument naming the path (s3_url.h ParseS3Url's rules).
struct S3ObjectPath {
  std::string bucket;
  std::string key;
};
absl::StatusOr<S3ObjectPath> ParseS3ObjectPath(absl::string_view path);

// True for a path an S3Storage serves ("s3://...").
bool IsS3Path(absl::string_view path);

class S3Storage : public Storage {
 public:
  // Errors: InvalidArgument if `options` fail Check.
  static absl::StatusOr<std::unique_ptr<S3Storage>> Create(std::shared_ptr<s3::S3Client> client,
                                                           S3StorageOptions options = {});

  Publication publication(const std::string& path) const override;
  // One listing of `dir`'s prefix (with delimiter: a page at most).
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

  s3::S3Client& client() const { return *client_; }
  const S3StorageOptions& options() const { return options_; }

 private:
  S3Storage(std::shared_ptr<s3::S3Client> client, S3StorageOptions options)
      : client_(std::move(client)), options_(options) {}

  const std::shared_ptr<s3::S3Client> client_;
  const S3StorageOptions options_;
};

}  // namespace tessera

#endif  // TESSERA_STORAGE_S3_S3_STORAGE_H_
