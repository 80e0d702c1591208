#include "storage/s3/s3_storage.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/threads.h"
#include "storage/s3/multipart_file.h"
#include "storage/s3/s3_url.h"

namespace tessera {
namespace {

constexpr uint64_t kMinPartSize = uint64_t{5} << 20;  // S3's least part but the last

// A file read by ranged GETs. The size is asked once, when first needed.
class S3ReadableFile : public ReadableFile {
 public:
  S3ReadableFile(s3::S3Client* client, S3ObjectPath object, std::string path,
                 const S3StorageOptions& options)
      : client_(client), object_(std::move(object)), path_(std::move(path)), options_(options) {}

  absl::Status ReadAt(uint64_t offset, void* out, size_t size) override {
    char* dest = static_cast<char*>(out);
    if (size <= options_.read_piece) {
      return client_->GetObjectRange(object_.bucket, object_.key, offset, dest, size);
    }
    const uint64_t pieces = (size + options_.read_piece - 1) / options_.read_piece;
    std::atomic<uint64_t> next{0};
    absl::Mutex mu;
    absl::Status first;
    RunOnThreads(std::min<uint64_t>(pieces, static_cast<uint64_t>(options_.reads_in_flight)),
                 [&](size_t) {
                   for (uint64_t i = next++; i < pieces; i = next++) {
                     const uint64_t at = i * options_.read_piece;
                     const uint64_t n = std::min<uint64_t>(options_.read_piece, size - at);
                     absl::Status got = client_->GetObjectRange(object_.bucket, object_.key,
                                                                offset + at, dest + at, n);
                     if (!got.ok()) {
                       absl::MutexLock lock(&mu);
                       if (first.ok()) first = got;
                       next = pieces;  // the others stop after their piece
                     }
                   }
                 });
    return first;
  }

  absl::StatusOr<uint64_t> Size() override {
    absl::MutexLock lock(&mu_);
    if (!size_.has_value()) {
      absl::StatusOr<uint64_t> size = client_->HeadObject(object_.bucket, object_.key);
      if (!size.ok()) return size.status();
      size_ = *size;
    }
    return *size_;
  }

  const std::string& path() const override { return path_; }

 private:
  s3::S3Client* const client_;
  const S3ObjectPath object_;
  const std::string path_;
  const S3StorageOptions options_;
  absl::Mutex mu_;
  std::optional<uint64_t> size_ ABSL_GUARDED_BY(mu_);
};

// "<key>/" (the bucket's root: "").
std::string DirPrefix(const S3ObjectPath& object) {
  return object.key.empty() ? std::string() : absl::StrCat(object.key, "/");
}

}  // namespace

absl::Status S3StorageOptions::Check() const {
  if (part_size < kMinPartSize) {
    return absl::InvalidArgumentError(absl::StrCat("S3 part_size is ", part_size,
                                                   " bytes; S3 needs at least ", kMinPartSize));
  }
  if (parts_in_flight < 1 || reads_in_flight < 1 || read_piece == 0) {
    return absl::InvalidArgumentError(
        "S3 parts_in_flight, reads_in_flight and read_piece must be positive");
  }
  return absl::OkStatus();
}

bool IsS3Path(absl::string_view path) { return absl::StartsWith(path, "s3://"); }

absl::StatusOr<S3ObjectPath> ParseS3ObjectPath(absl::string_view path) {
  absl::StatusOr<s3::S3Location> location = s3::ParseS3Url(path);
  if (!location.ok()) {
    return IoError(absl::StatusCode::kInvalidArgument, path,
                   std::string(location.status().message()));
  }
  S3ObjectPath object{location->bucket, location->prefix};
  if (!object.key.empty()) object.key.pop_back();  // the prefix's '/'
  return object;
}

absl::StatusOr<std::unique_ptr<S3Storage>> S3Storage::Create(std::shared_ptr<s3::S3Client> client,
                                                             S3StorageOptions options) {
  if (absl::Status ok = options.Check(); !ok.ok()) return ok;
  return std::unique_ptr<S3Storage>(new S3Storage(std::move(client), options));
}

Publication S3Storage::publication(const std::string& /*path*/) const {
  return Publication::kCreateManifest;
}

absl::Status S3Storage::CheckAccess(const std::string& dir) {
  absl::StatusOr<S3ObjectPath> object = ParseS3ObjectPath(dir);
  if (!object.ok()) return object.status();
  return client_->ListObjects(object->bucket, DirPrefix(*object), "/").status();
}

absl::Status S3Storage::PutFile(const std::string& path, absl::string_view data, PutMode mode) {
  absl::StatusOr<S3ObjectPath> object = ParseS3ObjectPath(path);
  if (!object.ok()) return object.status();
  return client_->PutObject(object->bucket, object->key, data,
                            mode == PutMode::kCreateOnly ? s3::PutCondition::kIfAbsent
                                                         : s3::PutCondition::kNone);
}

absl::Status S3Storage::CreateDirs(const std::string& path) {
  return ParseS3ObjectPath(path).status();
}

absl::StatusOr<std::unique_ptr<WritableFile>> S3Storage::OpenForWrite(const std::string& path) {
  absl::StatusOr<S3ObjectPath> object = ParseS3ObjectPath(path);
  if (!object.ok()) return object.status();
  return std::unique_ptr<WritableFile>(
      std::make_unique<MultipartFile>(client_.get(), object->bucket, object->key, path,
                                      options_.part_size, options_.parts_in_flight));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> S3Storage::OpenForRead(const std::string& path) {
  absl::StatusOr<S3ObjectPath> object = ParseS3ObjectPath(path);
  if (!object.ok()) return object.status();
  auto file = std::make_unique<S3ReadableFile>(client_.get(), *object, path, options_);
  // A missing object is NotFound at open, as on a file system.
  if (absl::StatusOr<uint64_t> size = file->Size(); !size.ok()) return size.status();
  return std::unique_ptr<ReadableFile>(std::move(file));
}

absl::Status S3Storage::SyncDir(const std::string& path) {
  return ParseS3ObjectPath(path).status();
}

absl::Status S3Storage::Rename(const std::string& from, const std::string& to) {
  return IoError(absl::StatusCode::kUnimplemented, from,
                 absl::StrCat("cannot rename ", from, " to ", to,
                              ": an object store has no rename (checkpoints are published by "
                              "creating their manifest)"));
}

absl::Status S3Storage::RemoveTree(const std::string& path) {
  absl::StatusOr<S3ObjectPath> object = ParseS3ObjectPath(path);
  if (!object.ok()) return object.status();
  const std::string prefix = DirPrefix(*object);
  absl::StatusOr<s3::ListObjectsResult> listed = client_->ListObjects(object->bucket, prefix);
  if (!listed.ok()) return listed.status();
  std::vector<std::string> keys;
  keys.reserve(listed->objects.size() + 1);
  if (!object->key.empty()) keys.push_back(object->key);
  for (const s3::ObjectInfo& info : listed->objects) keys.push_back(info.key);
  absl::StatusOr<std::vector<s3::DeleteFailure>> failed =
      client_->DeleteObjects(object->bucket, keys);
  if (!failed.ok()) return failed.status();
  if (!failed->empty()) {
    const s3::DeleteFailure& f = failed->front();
    return IoError(absl::StatusCode::kUnavailable, path,
                   absl::StrCat("could not delete ", failed->size(), " objects under ", path,
                                ", the first ", s3::S3ObjectUrl(object->bucket, f.key), ": ",
                                f.code, ": ", f.message));
  }
  // Uploads a writer left incomplete hold parts that cost storage though no reader sees them.
  absl::StatusOr<std::vector<s3::MultipartUpload>> uploads =
      client_->ListMultipartUploads(object->bucket, prefix);
  if (!uploads.ok()) return uploads.status();
  for (const s3::MultipartUpload& upload : *uploads) {
    absl::Status aborted =
        client_->AbortMultipartUpload(object->bucket, upload.key, upload.upload_id);
    if (!aborted.ok() && !absl::IsAborted(aborted)) return aborted;  // Aborted: already gone
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> S3Storage::FileSize(const std::string& path) {
  absl::StatusOr<S3ObjectPath> object = ParseS3ObjectPath(path);
  if (!object.ok()) return object.status();
  return client_->HeadObject(object->bucket, object->key);
}

absl::StatusOr<std::vector<std::string>> S3Storage::ListDir(const std::string& path) {
  absl::StatusOr<S3ObjectPath> object = ParseS3ObjectPath(path);
  if (!object.ok()) return object.status();
  const std::string prefix = DirPrefix(*object);
  absl::StatusOr<s3::ListObjectsResult> listed =
      client_->ListObjects(object->bucket, prefix, "/");
  if (!listed.ok()) return listed.status();
  std::vector<std::string> names;
  names.reserve(listed->objects.size() + listed->common_prefixes.size());
  for (const s3::ObjectInfo& info : listed->objects) {
    if (info.key.size() > prefix.size()) names.push_back(info.key.substr(prefix.size()));
  }
  for (const std::string& sub : listed->common_prefixes) {
    if (sub.size() > prefix.size() + 1) {
      names.push_back(sub.substr(prefix.size(), sub.size() - prefix.size() - 1));
    }
  }
  if (names.empty()) {
    return IoError(absl::StatusCode::kNotFound, path,
                   absl::StrCat("no object under ", path, " (an object store has no empty "
                                "directory)"));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tessera
