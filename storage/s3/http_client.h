// One signed HTTP exchange with an S3 endpoint over libcurl: the I/O edge of the S3 client.
// No retries and no S3 semantics here (s3_client.cc has those); this file sends one request
// and reports what came back.
//
// Signing: libcurl's SigV4 signer (CURLOPT_AWS_SIGV4 "aws:amz:<region>:s3"), with the access
// key id and secret as CURLOPT_USERNAME / CURLOPT_PASSWORD. libcurl 7.88 signs the path and
// query as written (s3_url.h builds them canonical) and every header set here; it does not add
// x-amz-content-sha256, which S3 requires, so Perform sets it: the SHA-256 of a small body the
// caller marks as signed (XML), else UNSIGNED-PAYLOAD (object data: hashing gigabytes twice
// buys nothing over TLS and the checkpoint format's own checksums). Verbose output stays off,
// so libcurl never prints the Authorization header or the user name.
//
// Connections: idle libcurl handles are pooled; each keeps its keep-alive connection, so
// requests do not reconnect needlessly. All handles share one DNS cache and one TLS-session
// cache (a curl share handle, a mutex per cache).
//
// Bodies: a request body is read from the caller's memory by CURLOPT_READFUNCTION (PUT) or
// CURLOPT_POSTFIELDS (POST), never copied; a 2xx response body goes into the caller's buffer
// when one is given, else into HttpResponse::body.
//
// Lifecycle: an HttpClient outlives every Perform call. Thread-safe: Perform may run on any
// number of threads at once.
#ifndef TESSERA_STORAGE_S3_HTTP_CLIENT_H_
#define TESSERA_STORAGE_S3_HTTP_CLIENT_H_

#include <curl/curl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_options.h"

namespace tessera::s3 {

struct HttpRequest {
  std::string method;  // "GET", "HEAD", "PUT", "POST" or "DELETE"
  std::string url;     // s3_url.h BuildRequestUrl
  // Extra headers, "Name: value"; signed with the rest.
  std::vector<std::string> headers;
  // The body of a PUT or POST, read from the caller's memory during Perform.
  absl::string_view body;
  // Sign the body's SHA-256 (small XML bodies) rather than UNSIGNED-PAYLOAD.
  bool sign_body = false;
  // If set, a 2xx body is written here (at most out_size bytes; more is an overflow).
  char* out = nullptr;
  size_t out_size = 0;
};

struct HttpResponse {
  int curl_code = 0;          // CURLcode; 0 if the exchange completed
  std::string curl_error;     // libcurl's error text (CURLOPT_ERRORBUFFER) if curl_code != 0
  int status = 0;             // HTTP status, 0 if none arrived
  std::string body;           // the body, unless it went to HttpRequest::out (error bodies
                              // are kept to their first 64 KiB)
  size_t out_bytes = 0;       // bytes of a 2xx body written to HttpRequest::out
  bool out_overflow = false;  // the 2xx body was longer than HttpRequest::out_size
  std::string etag;           // the ETag header, quotes included
  std::optional<uint64_t> content_length;  // the Content-Length header
  std::string request_id;                  // x-amz-request-id
};

class HttpClient {
 public:
  // `options` must have passed S3Client's checks.
  HttpClient(const S3ClientOptions& options, Credentials credentials);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends `request` once and returns what came back. Never fails as such: a transport failure
  // is reported in curl_code / curl_error (error text already redacted of credentials).
  HttpResponse Perform(const HttpRequest& request);

  const Credentials& credentials() const { return credentials_; }

 private:
  CURL* AcquireHandle();
  void ReleaseHandle(CURL* handle);

  const S3ClientOptions options_;
  const Credentials credentials_;
  const std::string sigv4_;  // "aws:amz:<region>:s3"

  // The share handle's caches, one mutex per curl_lock_data value it locks.
  struct Share;
  std::unique_ptr<Share> share_;

  absl::Mutex pool_mu_;
  std::vector<CURL*> idle_ ABSL_GUARDED_BY(pool_mu_);
};

// The SHA-256 of `data` in lower-case hex (x-amz-content-sha256).
std::string Sha256Hex(absl::string_view data);

// The MD5 of `data`, base64 (Content-MD5, which DeleteObjects requires).
std::string Md5Base64(absl::string_view data);

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_HTTP_CLIENT_H_
