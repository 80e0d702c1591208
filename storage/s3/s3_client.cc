#include "storage/s3/s3_client.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "storage/s3/http_client.h"

namespace tessera::s3 {
namespace {

constexpr int kMaxPageSize = 1000;  // S3's cap for max-keys, max-uploads and Delete
constexpr int kMaxPartNumber = 10000;
constexpr size_t kQuotedReplyBytes = 200;

bool IsSuccess(const HttpResponse& r) { return r.status >= 200 && r.status < 300; }

HttpRequest MakeRequest(std::string method, std::string url, absl::string_view body = {}) {
  HttpRequest request;
  request.method = std::move(method);
  request.url = std::move(url);
  request.body = body;
  return request;
}

// A 2xx reply that does not parse: the store broke the protocol.
template <typename T>
absl::StatusOr<T> Parsed(const CallContext& call, absl::StatusOr<T> parsed) {
  if (parsed.ok()) return parsed;
  return CallError(call, absl::StatusCode::kInternal, parsed.status().message());
}

absl::Status ValidateOptions(const S3ClientOptions& o) {
  if (o.region.empty() || !std::all_of(o.region.begin(), o.region.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '-' || c == '_';
      })) {
    return absl::InvalidArgumentError(absl::StrCat("S3 region \"", absl::CHexEscape(o.region),
                                                   "\" must be letters, digits, '-' or '_'"));
  }
  for (const auto& [name, value] : std::initializer_list<std::pair<const char*, int>>{
           {"list_page_size", o.list_page_size}, {"delete_batch_size", o.delete_batch_size}}) {
    if (value < 1 || value > kMaxPageSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("S3 option ", name, " is ", value, "; must be 1..", kMaxPageSize));
    }
  }
  if (o.retry.max_attempts < 1) {
    return absl::InvalidArgumentError("S3 option retry.max_attempts must be at least 1");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options,
                                                           Credentials credentials) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (options.endpoint.empty()) {
    options.endpoint = absl::StrCat("https://s3.", options.region, ".amazonaws.com");
  }
  ASSIGN_OR_RETURN(Endpoint endpoint, ParseEndpoint(options.endpoint));
  InitXml();
  auto http = std::make_unique<HttpClient>(options, std::move(credentials));
  return std::unique_ptr<S3Client>(
      new S3Client(std::move(options), std::move(endpoint), std::move(http)));
}

S3Client::S3Client(S3ClientOptions options, Endpoint endpoint, std::unique_ptr<HttpClient> http)
    : options_(std::move(options)), endpoint_(std::move(endpoint)), http_(std::move(http)) {}

S3Client::~S3Client() = default;

std::string S3Client::Url(absl::string_view bucket, absl::string_view key,
                          const QueryParams& query) const {
  return BuildRequestUrl(endpoint_, options_.addressing, bucket, key, query);
}

absl::Status S3Client::CheckNames(const CallContext& call, bool has_key) const {
  absl::Status status = ValidateBucketName(call.bucket);
  if (status.ok() && has_key) status = ValidateObjectKey(call.key);
  if (status.ok()) return status;
  return CallError(call, absl::StatusCode::kInvalidArgument, status.message());
}

absl::Status S3Client::ErrorFromResponse(const CallContext& call,
                                         const HttpResponse& response) const {
  S3ErrorReply reply;
  if (!response.body.empty()) {
    absl::StatusOr<S3ErrorReply> parsed = ParseError(response.body);
    if (parsed.ok()) {
      reply = *std::move(parsed);
    } else {
      // A proxy's HTML page, say: its start tells the reader what answered.
      reply.message = absl::StrCat(
          "reply is not S3 error XML: \"",
          absl::CHexEscape(absl::string_view(response.body).substr(0, kQuotedReplyBytes)), "\"");
    }
  }
  if (reply.request_id.empty()) reply.request_id = response.request_id;
  const Credentials& credentials = http_->credentials();
  reply.code = credentials.Redact(reply.code);
  reply.message = credentials.Redact(reply.message);
  return S3ErrorToStatus(call, response.status, reply);
}

absl::StatusOr<HttpResponse> S3Client::Execute(CallContext& call, const HttpRequest& request,
                                               bool error_in_200) {
  thread_local absl::BitGen bitgen;
  const absl::Time start = absl::Now();
  for (int attempt = 1;; ++attempt) {
    HttpResponse response = http_->Perform(request);
    call.attempts = attempt;
    call.elapsed = absl::Now() - start;
    if (response.out_overflow) {
      return CallError(call, absl::StatusCode::kInternal,
                       absl::StrCat("HTTP ", response.status, ": the store sent more than the ",
                                    request.out_size, " bytes asked for"));
    }
    AttemptOutcome outcome;
    bool error_body = false;
    if (response.curl_code != 0) {
      outcome.transport = ClassifyCurlCode(response.curl_code);
    } else if (error_in_200 && response.status == 200 && IsErrorReply(response.body)) {
      error_body = true;
      absl::StatusOr<S3ErrorReply> reply = ParseError(response.body);
      outcome.http_status = EffectiveHttpStatus(200, reply.ok() ? reply->code : "");
    } else {
      outcome.http_status = response.status;
    }
    const RetryDecision decision = DecideRetry(options_.retry, outcome, attempt, call.elapsed,
                                               absl::Uniform(bitgen, 0.0, 1.0));
    if (decision.retry) {
      absl::SleepFor(decision.wait);
      continue;
    }
    if (response.curl_code != 0) {
      return TransportErrorToStatus(call, response.curl_code, response.curl_error);
    }
    if (error_body || !IsSuccess(response)) return ErrorFromResponse(call, response);
    return std::move(response);
  }
}

absl::StatusOr<std::string> S3Client::GetBucketXml(CallContext& call, absl::string_view bucket,
                                                   const QueryParams& query) {
  ASSIGN_OR_RETURN(HttpResponse response,
                   Execute(call, MakeRequest("GET", Url(bucket, "", query))));
  return std::move(response.body);
}

absl::Status S3Client::PutObject(absl::string_view bucket, absl::string_view key,
                                 absl::string_view data, PutCondition condition) {
  CallContext call{"PutObject", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  HttpRequest request = MakeRequest("PUT", Url(bucket, key), data);
  if (condition == PutCondition::kIfAbsent) request.headers.push_back("If-None-Match: *");
  return Execute(call, request).status();
}

absl::StatusOr<std::string> S3Client::GetObject(absl::string_view bucket, absl::string_view key) {
  CallContext call{"GetObject", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call, MakeRequest("GET", Url(bucket, key))));
  return std::move(response.body);
}

absl::Status S3Client::GetObjectRange(absl::string_view bucket, absl::string_view key,
                                      uint64_t offset, void* out, size_t size) {
  CallContext call{"GetObjectRange", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  if (size == 0) return absl::OkStatus();
  HttpRequest request = MakeRequest("GET", Url(bucket, key));
  request.headers.push_back(absl::StrCat("Range: bytes=", offset, "-", offset + size - 1));
  request.out = static_cast<char*>(out);
  request.out_size = size;
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call, request));
  if (response.status == 200 && offset != 0) {
    return CallError(call, absl::StatusCode::kInternal,
                     "the store ignored the Range header (HTTP 200, not 206)");
  }
  if (response.out_bytes != size) {
    return CallError(
        call, absl::StatusCode::kOutOfRange,
        absl::StrCat("the object ends at byte ", offset + response.out_bytes, ", before ",
                     offset + size, " (asked for ", size, " bytes at offset ", offset, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> S3Client::HeadObject(absl::string_view bucket, absl::string_view key) {
  CallContext call{"HeadObject", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call, MakeRequest("HEAD", Url(bucket, key))));
  if (!response.content_length.has_value()) {
    return CallError(call, absl::StatusCode::kInternal, "the reply has no Content-Length");
  }
  return *response.content_length;
}

absl::StatusOr<ListObjectsResult> S3Client::ListObjects(absl::string_view bucket,
                                                        absl::string_view prefix,
                                                        absl::string_view delimiter) {
  CallContext call{"ListObjects", bucket, prefix};
  RETURN_IF_ERROR(CheckNames(call, /*has_key=*/false));
  ListObjectsResult result;
  std::string token;
  while (true) {
    QueryParams query = {{"list-type", "2"},
                         {"encoding-type", "url"},
                         {"max-keys", absl::StrCat(options_.list_page_size)}};
    if (!prefix.empty()) query.emplace_back("prefix", std::string(prefix));
    if (!delimiter.empty()) query.emplace_back("delimiter", std::string(delimiter));
    if (!token.empty()) query.emplace_back("continuation-token", token);
    ASSIGN_OR_RETURN(std::string reply, GetBucketXml(call, bucket, query));
    ASSIGN_OR_RETURN(ListObjectsPage page, Parsed(call, ParseListObjectsV2(reply)));
    for (ObjectInfo& object : page.objects) result.objects.push_back(std::move(object));
    for (std::string& p : page.common_prefixes) result.common_prefixes.push_back(std::move(p));
    if (!page.is_truncated) break;
    if (page.next_continuation_token == token) {
      return CallError(call, absl::StatusCode::kInternal,
                       "the store returned the same continuation token twice");
    }
    token = std::move(page.next_continuation_token);
  }
  return result;
}

absl::Status S3Client::DeleteObject(absl::string_view bucket, absl::string_view key) {
  CallContext call{"DeleteObject", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  return Execute(call, MakeRequest("DELETE", Url(bucket, key))).status();
}

absl::StatusOr<std::vector<DeleteFailure>> S3Client::DeleteObjects(
    absl::string_view bucket, const std::vector<std::string>& keys) {
  std::vector<DeleteFailure> failures;
  for (size_t begin = 0; begin < keys.size(); begin += options_.delete_batch_size) {
    const size_t end = std::min(keys.size(), begin + options_.delete_batch_size);
    const std::vector<std::string> batch(keys.begin() + begin, keys.begin() + end);
    CallContext call{"DeleteObjects", bucket, batch.front()};
    for (const std::string& key : batch) {
      call.key = key;
      RETURN_IF_ERROR(CheckNames(call));
    }
    call.key = batch.front();
    const std::string body = DeleteObjectsXml(batch, /*quiet=*/true);
    HttpRequest request = MakeRequest("POST", Url(bucket, "", {{"delete", ""}}), body);
    request.sign_body = true;
    request.headers = {"Content-Type: application/xml",
                       absl::StrCat("Content-MD5: ", Md5Base64(body))};
    ASSIGN_OR_RETURN(HttpResponse response, Execute(call, request));
    ASSIGN_OR_RETURN(DeleteResult result, Parsed(call, ParseDeleteResult(response.body)));
    for (DeleteFailure& failure : result.failures) {
      // S3 reports a missing key as deleted; a store that reports NoSuchKey means the same.
      if (failure.code == "NoSuchKey") continue;
      failure.message = http_->credentials().Redact(failure.message);
      failures.push_back(std::move(failure));
    }
  }
  return failures;
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(absl::string_view bucket,
                                                            absl::string_view key) {
  CallContext call{"CreateMultipartUpload", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  HttpRequest request = MakeRequest("POST", Url(bucket, key, {{"uploads", ""}}));
  // The initiating request's Content-Type becomes the object's.
  request.headers = {"Content-Type: application/octet-stream"};
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call, request));
  return Parsed(call, ParseInitiateMultipartUpload(response.body));
}

absl::StatusOr<std::string> S3Client::UploadPart(absl::string_view bucket, absl::string_view key,
                                                 absl::string_view upload_id, int part_number,
                                                 absl::string_view data) {
  CallContext call{"UploadPart", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  if (part_number < 1 || part_number > kMaxPartNumber) {
    return CallError(call, absl::StatusCode::kInvalidArgument,
                     absl::StrCat("part number ", part_number, " is not in 1..", kMaxPartNumber));
  }
  const std::string url =
      Url(bucket, key,
          {{"partNumber", absl::StrCat(part_number)}, {"uploadId", std::string(upload_id)}});
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call, MakeRequest("PUT", url, data)));
  if (response.etag.empty()) {
    return CallError(call, absl::StatusCode::kInternal,
                     absl::StrCat("the reply to part ", part_number, " has no ETag"));
  }
  return std::move(response.etag);
}

absl::StatusOr<std::string> S3Client::CompleteMultipartUpload(absl::string_view bucket,
                                                              absl::string_view key,
                                                              absl::string_view upload_id,
                                                              std::vector<CompletedPart> parts) {
  CallContext call{"CompleteMultipartUpload", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  std::sort(parts.begin(), parts.end(), [](const CompletedPart& a, const CompletedPart& b) {
    return a.part_number < b.part_number;
  });
  const std::string body = CompleteMultipartUploadXml(parts);
  HttpRequest request =
      MakeRequest("POST", Url(bucket, key, {{"uploadId", std::string(upload_id)}}), body);
  request.sign_body = true;
  request.headers = {"Content-Type: application/xml"};
  ASSIGN_OR_RETURN(HttpResponse response, Execute(call, request, /*error_in_200=*/true));
  return Parsed(call, ParseCompleteMultipartUpload(response.body));
}

absl::Status S3Client::AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                            absl::string_view upload_id) {
  CallContext call{"AbortMultipartUpload", bucket, key};
  RETURN_IF_ERROR(CheckNames(call));
  return Execute(call,
                 MakeRequest("DELETE", Url(bucket, key, {{"uploadId", std::string(upload_id)}})))
      .status();
}

absl::StatusOr<std::vector<MultipartUpload>> S3Client::ListMultipartUploads(
    absl::string_view bucket, absl::string_view prefix) {
  CallContext call{"ListMultipartUploads", bucket, prefix};
  RETURN_IF_ERROR(CheckNames(call, /*has_key=*/false));
  std::vector<MultipartUpload> uploads;
  std::string key_marker, upload_id_marker;
  while (true) {
    // No encoding-type=url here: SeaweedFS 4.48 echoes it without encoding the keys (s3_xml.h).
    QueryParams query = {{"uploads", ""}, {"max-uploads", absl::StrCat(options_.list_page_size)}};
    if (!prefix.empty()) query.emplace_back("prefix", std::string(prefix));
    if (!key_marker.empty()) query.emplace_back("key-marker", key_marker);
    if (!upload_id_marker.empty()) query.emplace_back("upload-id-marker", upload_id_marker);
    ASSIGN_OR_RETURN(std::string reply, GetBucketXml(call, bucket, query));
    ASSIGN_OR_RETURN(ListUploadsPage page, Parsed(call, ParseListMultipartUploads(reply)));
    for (MultipartUpload& upload : page.uploads) uploads.push_back(std::move(upload));
    if (!page.is_truncated) break;
    if (page.next_key_marker == key_marker && page.next_upload_id_marker == upload_id_marker) {
      return CallError(call, absl::StatusCode::kInternal,
                       "the store returned the same markers twice");
    }
    // S3 continues after (key-marker, upload-id-marker) and ignores an upload-id-marker alone;
    // SeaweedFS gives no NextKeyMarker, continues after the upload-id-marker alone, and takes
    // a key-marker as "this key only". So send what the reply named.
    key_marker = std::move(page.next_key_marker);
    upload_id_marker = std::move(page.next_upload_id_marker);
  }
  return uploads;
}

absl::Status S3Client::CreateBucket(absl::string_view bucket) {
  CallContext call{"CreateBucket", bucket, ""};
  RETURN_IF_ERROR(CheckNames(call, /*has_key=*/false));
  // us-east-1 is the default location; any other region must be named in the body.
  std::string body;
  if (options_.region != "us-east-1") {
    body = absl::StrCat(
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<LocationConstraint>",
        XmlEscape(options_.region), "</LocationConstraint></CreateBucketConfiguration>");
  }
  HttpRequest request = MakeRequest("PUT", Url(bucket, ""), body);
  request.sign_body = true;
  return Execute(call, request).status();
}

}  // namespace tessera::s3
