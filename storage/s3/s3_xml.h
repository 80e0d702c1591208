// S3's XML: parsing the replies the client reads and writing the two request bodies it sends.
//
// Parsing uses libxml2 (network access and DTD loading off, entities not substituted): a
// reply that is not well-formed XML, has another root element, or lacks a required element
// is an InvalidArgument error saying which, never a crash. Elements are matched by local name,
// so the namespace S3 puts on them (or its absence, as with some S3-compatible stores) does
// not matter; unknown elements are ignored.
//
// Keys in list replies: a reply whose <EncodingType> is "url" has its keys, common prefixes and
// key markers decoded here (s3_url.h UrlDecodeKey); otherwise they are taken as they are. The
// client asks ListObjectsV2 for `encoding-type=url` (keys may then hold bytes XML 1.0 cannot
// carry), but not ListMultipartUploads: SeaweedFS 4.48 answers that one with
// <EncodingType>url</EncodingType> and keys left unencoded, which decoding would corrupt
// ('+' would become a space).
//
// Pure functions; thread-safe once InitXml() has run (the S3 client calls it).
#ifndef TESSERA_STORAGE_S3_S3_XML_H_
#define TESSERA_STORAGE_S3_S3_XML_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/s3/s3_errors.h"

namespace tessera::s3 {

// Initialises libxml2 for use from several threads (xmlInitParser). Idempotent, thread-safe.
void InitXml();

// One object of a listing.
struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as S3 sent it, quotes included
};

// One page of ListObjectsV2 (<ListBucketResult>).
struct ListObjectsPage {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> common_prefixes;
  bool is_truncated = false;
  std::string next_continuation_token;  // set if is_truncated
};

// One incomplete multipart upload of a listing.
struct MultipartUpload {
  std::string key;
  std::string upload_id;
  std::string initiated;  // ISO 8601, as S3 sent it
};

// One page of ListMultipartUploads (<ListMultipartUploadsResult>).
struct ListUploadsPage {
  std::vector<MultipartUpload> uploads;
  bool is_truncated = false;
  // Where the next page starts, if is_truncated: S3 sets both; SeaweedFS only the upload id.
  std::string next_key_marker;
  std::string next_upload_id_marker;
};

// A part of a multipart upload, as CompleteMultipartUpload names it.
struct CompletedPart {
  int part_number = 0;  // 1..10000
  std::string etag;     // as UploadPart returned it
};

// A key DeleteObjects could not delete.
struct DeleteFailure {
  std::string key;
  std::string code;     // S3's Code ("AccessDenied")
  std::string message;  // S3's Message
};

// <DeleteResult>: the keys deleted (empty in quiet mode) and the failures.
struct DeleteResult {
  std::vector<std::string> deleted;
  std::vector<DeleteFailure> failures;
};

// Errors (all parsers): InvalidArgument if `xml` is not well-formed, its root element is not
// the one named, a required element is missing or a number does not parse.

// <ListBucketResult>. Required: IsTruncated; NextContinuationToken when truncated.
absl::StatusOr<ListObjectsPage> ParseListObjectsV2(absl::string_view xml);

// <ListMultipartUploadsResult>. Required: IsTruncated; Key and UploadId of each Upload;
// NextKeyMarker or NextUploadIdMarker when truncated.
absl::StatusOr<ListUploadsPage> ParseListMultipartUploads(absl::string_view xml);

// <InitiateMultipartUploadResult>: the UploadId (required, not empty).
absl::StatusOr<std::string> ParseInitiateMultipartUpload(absl::string_view xml);

// <CompleteMultipartUploadResult>: the ETag of the whole object (required).
absl::StatusOr<std::string> ParseCompleteMultipartUpload(absl::string_view xml);

// <Error>: Code, Message and RequestId (each may be missing).
absl::StatusOr<S3ErrorReply> ParseError(absl::string_view xml);

// True if the root element of `xml` is <Error>: S3 can answer CompleteMultipartUpload with
// 200 and an error body. False for anything else, malformed XML included.
bool IsErrorReply(absl::string_view xml);

// <DeleteResult>. Required: Key of each Deleted and Error.
absl::StatusOr<DeleteResult> ParseDeleteResult(absl::string_view xml);

// The <CompleteMultipartUpload> body, parts in the order given (S3 wants them ascending).
std::string CompleteMultipartUploadXml(const std::vector<CompletedPart>& parts);

// The <Delete> body for `keys` (at most 1000); quiet: the reply lists failures only.
std::string DeleteObjectsXml(const std::vector<std::string>& keys, bool quiet = true);

// `text` escaped for XML character data or attribute values.
std::string XmlEscape(absl::string_view text);

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_S3_XML_H_
