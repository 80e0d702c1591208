// S3Client: the object-store operations Tessera's checkpoint storage needs, against any
// S3-compatible store (AWS S3, GCS's XML API, Ceph RGW, MinIO, SeaweedFS).
//
// Every call is one logical operation: it builds the request (s3_url.h), sends it through
// libcurl with SigV4 signing (http_client.h), retries 5xx, 429 and transport failures with
// backoff (retry.h), and maps a failure to a status by the table of s3_errors.h; list calls
// follow S3's pagination to the end. Objects are named by bucket and key, keys as they are
// (the client encodes them).
//
// Errors: each call lists its own below; beyond those, every call can fail with
// PermissionDenied (credentials or policy), NotFound naming the bucket if it does not exist,
// Unavailable (the store was unreachable or kept failing through the retries),
// FailedPrecondition (TLS verification, wrong region or endpoint) and Internal (a reply that
// breaks the protocol). Messages name the operation and s3://bucket/key and never hold a
// credential (s3_errors.h).
//
// Lifecycle: create with S3Client::Create; the client must outlive its calls.
// Thread-safety: all methods may be called from any number of threads at once; connections
// are pooled and reused between calls (http_client.h).
#ifndef TESSERA_STORAGE_S3_S3_CLIENT_H_
#define TESSERA_STORAGE_S3_S3_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_errors.h"
#include "storage/s3/s3_options.h"
#include "storage/s3/s3_url.h"
#include "storage/s3/s3_xml.h"

namespace tessera::s3 {

class HttpClient;
struct HttpRequest;
struct HttpResponse;

// What a listing returns: every object under the prefix (in key order) and, with a delimiter,
// the common prefixes ("directories") one level down.
struct ListObjectsResult {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> common_prefixes;
};

// PutObject's condition.
enum class PutCondition {
  kNone,      // create or overwrite
  kIfAbsent,  // If-None-Match: * — only create; AlreadyExists if the key exists
};

class S3Client {
 public:
  // Errors: InvalidArgument for an endpoint that does not parse (s3_url.h ParseEndpoint), an
  // empty region, or a page or batch size outside 1..1000.
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options,
                                                          Credentials credentials);
  ~S3Client();

  // Writes `data` as the whole object `key`.
  // kIfAbsent: atomically, only if `key` does not exist; exactly one of several racing
  // writers succeeds. Errors: AlreadyExists (HTTP 412) if it exists — including, after a
  // retried attempt, when an earlier attempt of this same call created it (the caller can
  // compare contents); Aborted (409) if the store saw a concurrent conditional write and asks
  // to try again; Unimplemented (501) if the store has no conditional writes.
  absl::Status PutObject(absl::string_view bucket, absl::string_view key, absl::string_view data,
                         PutCondition condition = PutCondition::kNone);

  // The whole object. Errors: NotFound if `key` does not exist.
  absl::StatusOr<std::string> GetObject(absl::string_view bucket, absl::string_view key);

  // Reads exactly `size` bytes at `offset` into `out` (a ranged GET). Errors: NotFound;
  // OutOfRange if the object ends before offset + size (HTTP 416, or a shorter reply);
  // Internal if the store sent more than asked. `size` 0 reads nothing and checks nothing.
  absl::Status GetObjectRange(absl::string_view bucket, absl::string_view key, uint64_t offset,
                              void* out, size_t size);

  // The object's size in bytes. Errors: NotFound (for a missing key or bucket alike: HEAD
  // replies carry no error code).
  absl::StatusOr<uint64_t> HeadObject(absl::string_view bucket, absl::string_view key);

  // Every object whose key starts with `prefix`, all pages. With a `delimiter` ("/"), keys
  // holding it after the prefix are rolled up into common_prefixes instead.
  // Errors: only the common ones.
  absl::StatusOr<ListObjectsResult> ListObjects(absl::string_view bucket, absl::string_view prefix,
                                                absl::string_view delimiter = "");

  // Deletes `key`. OK if it does not exist (S3's semantics). Errors: only the common ones.
  absl::Status DeleteObject(absl::string_view bucket, absl::string_view key);

  // Deletes `keys` in batches of delete_batch_size (one request each). Returns the keys the
  // store refused, with its Code and Message (empty: all deleted; missing keys count as
  // deleted). Errors: a request that failed as a whole stops the batches (keys of later
  // batches were not tried).
  absl::StatusOr<std::vector<DeleteFailure>> DeleteObjects(absl::string_view bucket,
                                                           const std::vector<std::string>& keys);

  // Starts a multipart upload of `key`; returns its upload id.
  absl::StatusOr<std::string> CreateMultipartUpload(absl::string_view bucket,
                                                    absl::string_view key);

  // Uploads part `part_number` (1..10000) of the upload; returns its ETag for
  // CompleteMultipartUpload. Parts may be uploaded in any order and in parallel; every part
  // but the last must be at least 5 MiB. Errors: InvalidArgument for a part number out of
  // range; Aborted if the upload no longer exists (NoSuchUpload); Internal if the reply has no
  // ETag.
  absl::StatusOr<std::string> UploadPart(absl::string_view bucket, absl::string_view key,
                                         absl::string_view upload_id, int part_number,
                                         absl::string_view data);

  // Makes the object from `parts` (sorted here by part number). Returns the object's ETag.
  // Errors: InvalidArgument (InvalidPart, InvalidPartOrder, EntityTooSmall: a part but the
  // last under 5 MiB); Aborted if the upload no longer exists — also when a retried attempt
  // follows one that completed it; a 200 reply with an <Error> body is an error like any
  // other, mapped by its Code (InternalError -> Unavailable after the retries).
  absl::StatusOr<std::string> CompleteMultipartUpload(absl::string_view bucket,
                                                      absl::string_view key,
                                                      absl::string_view upload_id,
                                                      std::vector<CompletedPart> parts);

  // Abandons the upload and frees its parts. Errors: Aborted if it no longer exists.
  absl::Status AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                    absl::string_view upload_id);

  // The incomplete multipart uploads of keys starting with `prefix`, all pages, in the store's
  // order (S3: by key; SeaweedFS: by upload id).
  absl::StatusOr<std::vector<MultipartUpload>> ListMultipartUploads(absl::string_view bucket,
                                                                    absl::string_view prefix);

  // Creates `bucket` (for tests and tools; checkpoints expect their bucket to exist).
  // Errors: AlreadyExists if it exists.
  absl::Status CreateBucket(absl::string_view bucket);

  const S3ClientOptions& options() const { return options_; }

 private:
  S3Client(S3ClientOptions options, Endpoint endpoint, std::unique_ptr<HttpClient> http);

  // Sends `request` with retries (retry.h). Returns the 2xx response of the last attempt, or
  // the status of the failure (s3_errors.h). `error_in_200`: a 200 whose body is an <Error>
  // is a failure (CompleteMultipartUpload), retried like the status its Code stands for.
  absl::StatusOr<HttpResponse> Execute(CallContext& call, const HttpRequest& request,
                                       bool error_in_200 = false);

  // The body of a 2xx reply to GET on the bucket with `query` (the listings).
  absl::StatusOr<std::string> GetBucketXml(CallContext& call, absl::string_view bucket,
                                           const QueryParams& query);

  std::string Url(absl::string_view bucket, absl::string_view key,
                  const QueryParams& query = {}) const;

  // The status for a non-2xx (or 200 <Error>) `response`.
  absl::Status ErrorFromResponse(const CallContext& call, const HttpResponse& response) const;

  // InvalidArgument unless call.bucket (and call.key, with has_key) are valid names.
  absl::Status CheckNames(const CallContext& call, bool has_key = true) const;

  const S3ClientOptions options_;
  const Endpoint endpoint_;
  const std::unique_ptr<HttpClient> http_;
};

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_S3_CLIENT_H_
