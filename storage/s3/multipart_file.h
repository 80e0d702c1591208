// MultipartFile: a WritableFile (storage/storage.h) that becomes one S3 object, written in parts.
//
// WriteAt copies its bytes into buffers of `part_size`, one per part of the object (part n
// holds bytes [(n-1) * part_size, n * part_size)); a buffer whose every byte was written is
// handed to the file's uploaders — up to `parts_in_flight` threads the file starts as needed —
// which send it as part n of a multipart upload begun with the first full part. WriteAt waits
// while parts_in_flight full buffers are not uploaded yet (back-pressure: memory stays at most
// parts_in_flight + 2 buffers for a writer that writes in order). Sync uploads the last, partial
// part and completes the upload; a file smaller than one part never starts one and is a single
// PutObject at Sync. Until Sync returns OK the object does not exist. Close completes the file
// as Sync does (a file system's file is there after close(2), synced or not); a file destroyed
// without Close — a writer that gave up — is abandoned: its upload is aborted, nothing appears.
//
//   OPEN ─WriteAt*─► OPEN ─Sync or Close─► COMPLETE ─Close─► CLOSED
//     │ a failed upload or write: FAILED (every later call returns that error; Close then
//     │ aborts the upload)
//     └─destroyed without Close─► the upload is aborted
//
// Errors (WriteAt, Sync): the S3 client's; InvalidArgument for a write past the 10,000th part,
// or one that writes a part's bytes again (overlaps are caught where they overfill a part or
// touch one already sent); FailedPrecondition from Sync if some byte before the end was never
// written (a gap), or from any call after Close.
//
// Thread-safety: WriteAt from several threads for disjoint ranges; Sync and Close not
// concurrently with other calls (storage.h).
#ifndef TESSERA_STORAGE_S3_MULTIPART_FILE_H_
#define TESSERA_STORAGE_S3_MULTIPART_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "storage/s3/s3_client.h"
#include "storage/storage.h"

namespace tessera {

class MultipartFile : public WritableFile {
 public:
  // The most parts an S3 object may have.
  static constexpr int kMaxParts = 10000;

  // `client` must outlive the file. `path` is "s3://bucket/key", for messages.
  MultipartFile(s3::S3Client* client, std::string bucket, std::string key, std::string path,
                uint64_t part_size, int parts_in_flight);
  ~MultipartFile() override;  // abandons the file unless it was closed

  absl::Status WriteAt(uint64_t offset, const void* data, size_t size) override;
  absl::Status Sync() override;
  absl::Status Close() override;
  const std::string& path() const override { return path_; }

 private:
  struct Part {
    std::unique_ptr<char[]> bytes;
    uint64_t filled = 0;  // bytes written into it
  };

  // The upload id, starting the upload on first use. Called by uploaders.
  absl::StatusOr<std::string> UploadId();
  // Sends part `number` (1-based) from `bytes`, records its ETag or the first error.
  void Upload(int number, std::unique_ptr<char[]> bytes, uint64_t size);
  // An uploader thread: uploads queued parts until none is left.
  void RunUploader();
  // Queues a full part and starts an uploader if fewer than parts_in_flight run.
  void QueueLocked(int number, std::unique_ptr<char[]> bytes, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the uploaders, dropping the queue, and aborts the upload if one was started.
  void Abort();
  // Stops the uploaders once the queue is empty (`discard`: at once, dropping it) and joins them.
  void StopUploaders(bool discard);
  absl::Status FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  s3::S3Client* const client_;
  const std::string bucket_;
  const std::string key_;
  const std::string path_;
  const uint64_t part_size_;
  const int parts_in_flight_;

  absl::Mutex mu_;
  std::map<int, Part> open_parts_ ABSL_GUARDED_BY(mu_);  // being filled, by part number
  struct Queued {
    int number;
    std::unique_ptr<char[]> bytes;
    uint64_t size;
  };
  std::vector<Queued> queue_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;   // queued or uploading
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // uploaders return once the queue is empty
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> etags_ ABSL_GUARDED_BY(mu_);  // parts uploaded
  std::map<int, bool> sent_ ABSL_GUARDED_BY(mu_);           // parts queued or uploaded
  uint64_t end_ ABSL_GUARDED_BY(mu_) = 0;  // one past the last byte written
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;  // bytes written in all
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex upload_id_mu_;
  std::string upload_id_ ABSL_GUARDED_BY(upload_id_mu_);
};

}  // namespace tessera

#endif  // TESSERA_STORAGE_S3_MULTIPART_FILE_H_
