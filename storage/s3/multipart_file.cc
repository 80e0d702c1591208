#include "storage/s3/multipart_file.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

MultipartFile::MultipartFile(s3::S3Client* client, std::string bucket, std::string key,
                             std::string path, uint64_t part_size, int parts_in_flight)
    : client_(client),
      bucket_(std::move(bucket)),
      key_(std::move(key)),
      path_(std::move(path)),
      part_size_(part_size),
      parts_in_flight_(std::max(parts_in_flight, 1)) {}

MultipartFile::~MultipartFile() {
  bool abandon = false;
  {
    absl::MutexLock lock(&mu_);
    abandon = !closed_;
    if (abandon && error_.ok()) error_ = absl::CancelledError("the file was abandoned");
    closed_ = true;
  }
  if (abandon) Abort();
}

absl::Status MultipartFile::FailLocked(absl::Status status) {
  if (error_.ok()) error_ = status;
  return error_;
}

absl::Status MultipartFile::WriteAt(uint64_t offset, const void* data, size_t size) {
  const char* src = static_cast<const char*>(data);
  absl::MutexLock lock(&mu_);
  if (closed_ || synced_) {
    return IoError(absl::StatusCode::kFailedPrecondition, path_,
                   absl::StrCat("write to ", path_, " after it was ",
                                closed_ ? "closed" : "synced"));
  }
  if (!error_.ok()) return error_;
  if (size == 0) return absl::OkStatus();
  if ((offset + size - 1) / part_size_ >= static_cast<uint64_t>(kMaxParts)) {
    return FailLocked(IoError(
        absl::StatusCode::kInvalidArgument, path_,
        absl::StrCat("write of ", size, " bytes at ", offset, " to ", path_, " goes past ",
                     kMaxParts, " parts of ", part_size_, " bytes, the most an object holds")));
  }
  uint64_t done = 0;
  while (done < size) {
    const uint64_t at = offset + done;
    const int number = static_cast<int>(at / part_size_) + 1;
    const uint64_t in_part = at % part_size_;
    const uint64_t n = std::min<uint64_t>(size - done, part_size_ - in_part);
    Part& part = open_parts_[number];
    if (sent_.count(number) > 0 || part.filled + n > part_size_) {
      return FailLocked(IoError(
          absl::StatusCode::kInvalidArgument, path_,
          absl::StrCat("write at ", at, " of ", path_, " writes bytes of part ", number,
                       " again")));
    }
    if (part.bytes == nullptr) part.bytes.reset(new char[part_size_]);
    memcpy(part.bytes.get() + in_part, src + done, n);
    part.filled += n;
    done += n;
    if (part.filled == part_size_) {
      std::unique_ptr<char[]> bytes = std::move(part.bytes);
      open_parts_.erase(number);
      sent_[number] = true;
      // Back-pressure: at most parts_in_flight full parts wait for an uploader.
      mu_.Await(absl::Condition(
          +[](MultipartFile* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
            return f->pending_ < f->parts_in_flight_ || !f->error_.ok();
          },
          this));
      if (!error_.ok()) return error_;
      QueueLocked(number, std::move(bytes), part_size_);
    }
  }
  end_ = std::max(end_, offset + size);
  written_ += size;
  return absl::OkStatus();
}

void MultipartFile::QueueLocked(int number, std::unique_ptr<char[]> bytes, uint64_t size) {
  sent_[number] = true;
  queue_.push_back(Queued{number, std::move(bytes), size});
  ++pending_;
  if (threads_.size() < static_cast<size_t>(parts_in_flight_) &&
      threads_.size() < static_cast<size_t>(pending_)) {
    threads_.emplace_back([this] { RunUploader(); });
  }
}

void MultipartFile::RunUploader() {
  for (;;) {
    Queued next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](MultipartFile* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu_) {
            return !f->queue_.empty() || f->stopping_;
          },
          this));
      if (queue_.empty()) return;  // stopping
      next = std::move(queue_.front());
      queue_.erase(queue_.begin());
    }
    Upload(next.number, std::move(next.bytes), next.size);
  }
}

absl::StatusOr<std::string> MultipartFile::UploadId() {
  absl::MutexLock lock(&upload_id_mu_);
  if (upload_id_.empty()) {
    absl::StatusOr<std::string> id = client_->CreateMultipartUpload(bucket_, key_);
    if (!id.ok()) return id.status();
    upload_id_ = *std::move(id);
  }
  return upload_id_;
}

void MultipartFile::Upload(int number, std::unique_ptr<char[]> bytes, uint64_t size) {
  absl::StatusOr<std::string> etag;
  {
    bool failed = false;
    {
      absl::MutexLock lock(&mu_);
      failed = !error_.ok();
    }
    if (!failed) {
      absl::StatusOr<std::string> id = UploadId();
      etag = id.ok() ? client_->UploadPart(bucket_, key_, *id, number,
                                           absl::string_view(bytes.get(), size))
                     : id.status();
    } else {
      etag = absl::CancelledError("an earlier part failed");
    }
  }
  absl::MutexLock lock(&mu_);
  if (etag.ok()) {
    etags_[number] = *std::move(etag);
  } else {
    (void)FailLocked(etag.status());
  }
  --pending_;
}

void MultipartFile::StopUploaders(bool discard) {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (discard) {
      pending_ -= static_cast<int>(queue_.size());
      queue_.clear();
    }
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu_);
  stopping_ = false;
}

absl::Status MultipartFile::Sync() {
  std::string single;  // the whole object, if it fits one part and none was sent
  bool put_whole = false;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return IoError(absl::StatusCode::kFailedPrecondition, path_,
                     absl::StrCat("sync of ", path_, " after it was closed"));
    }
    if (synced_) return absl::OkStatus();
    if (!error_.ok()) return error_;
    if (written_ != end_) {
      return FailLocked(IoError(
          absl::StatusCode::kFailedPrecondition, path_,
          absl::StrCat(path_, " was written up to byte ", end_, " but only ", written_,
                       " bytes of it were written: a gap")));
    }
    const int last = end_ == 0 ? 0 : static_cast<int>((end_ - 1) / part_size_) + 1;
    // Every byte before end_ was written once: the open parts are the last one alone.
    if (open_parts_.size() > 1 || (!open_parts_.empty() && open_parts_.begin()->first != last)) {
      return FailLocked(IoError(absl::StatusCode::kFailedPrecondition, path_,
                                absl::StrCat(path_, " has a part that was not written whole")));
    }
    if (sent_.empty()) {
      put_whole = true;
      if (!open_parts_.empty()) single.assign(open_parts_.begin()->second.bytes.get(), end_);
      open_parts_.clear();
    } else if (!open_parts_.empty()) {
      Part part = std::move(open_parts_.begin()->second);
      open_parts_.clear();
      QueueLocked(last, std::move(part.bytes), part.filled);
    }
  }
  if (put_whole) {
    absl::Status put = client_->PutObject(bucket_, key_, single);
    absl::MutexLock lock(&mu_);
    if (!put.ok()) return FailLocked(put);
    synced_ = true;
    return absl::OkStatus();
  }
  StopUploaders(/*discard=*/false);
  std::vector<s3::CompletedPart> parts;
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    for (const auto& [number, etag] : etags_) parts.push_back(s3::CompletedPart{number, etag});
  }
  absl::StatusOr<std::string> id = UploadId();
  absl::Status done = id.status();
  if (done.ok()) {
    done = client_->CompleteMultipartUpload(bucket_, key_, *id, std::move(parts)).status();
  }
  absl::MutexLock lock(&mu_);
  if (!done.ok()) return FailLocked(done);
  synced_ = true;
  return absl::OkStatus();
}

absl::Status MultipartFile::Close() {
  absl::Status completed;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
  }
  completed = Sync();
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  if (!completed.ok()) Abort();
  return completed;
}

void MultipartFile::Abort() {
  StopUploaders(/*discard=*/true);
  std::string id;
  {
    absl::MutexLock lock(&upload_id_mu_);
    id = upload_id_;
  }
  // Nothing of an unsynced file may appear: its upload's parts are freed. A failed abort
  // leaves an incomplete upload, invisible to readers, that retention aborts later.
  if (!id.empty()) (void)client_->AbortMultipartUpload(bucket_, key_, id);
}

}  // namespace tessera
