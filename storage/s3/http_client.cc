#include "storage/s3/http_client.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tessera::s3 {
namespace {

// An error body is for a message; its start says what went wrong.
constexpr size_t kMaxErrorBody = 64 << 10;
// The most reserved for a 2xx body held in memory (XML replies, small objects) before its
// bytes arrive.
constexpr uint64_t kMaxBodyReserve = 64 << 20;
constexpr absl::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string Digest(const EVP_MD* md, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), out, &size, md, nullptr) != 1) return "";
  return std::string(reinterpret_cast<const char*>(out), size);
}

// The state of one transfer, shared with libcurl's callbacks.
struct Transfer {
  const HttpRequest* request;
  HttpResponse* response;
  size_t read_pos = 0;
};

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  absl::string_view line = absl::StripAsciiWhitespace(absl::string_view(data, n));
  HttpResponse& r = *t->response;
  if (absl::StartsWith(line, "HTTP/")) {
    // A new status line (after "100 Continue", or the only one): forget earlier headers.
    const size_t space = line.find(' ');
    int status = 0;
    if (space != absl::string_view::npos && absl::SimpleAtoi(line.substr(space + 1, 3), &status)) {
      r.status = status;
    }
    r.etag.clear();
    r.content_length.reset();
    r.request_id.clear();
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return n;
  const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
  absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  if (name == "etag") {
    r.etag = std::string(value);
  } else if (name == "content-length") {
    uint64_t length;
    if (absl::SimpleAtoi(value, &length)) r.content_length = length;
  } else if (name == "x-amz-request-id") {
    r.request_id = std::string(value);
  }
  return n;
}

size_t OnWrite(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  HttpResponse& r = *t->response;
  const bool success = r.status >= 200 && r.status < 300;
  if (success && t->request->out != nullptr) {
    if (n > t->request->out_size - r.out_bytes) {
      r.out_overflow = true;
      return 0;  // libcurl aborts the transfer with CURLE_WRITE_ERROR
    }
    std::memcpy(t->request->out + r.out_bytes, data, n);
    r.out_bytes += n;
    return n;
  }
  if (!success) {
    r.body.append(data, std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, r.body.size())));
    return n;
  }
  // Content-Length is the server's claim: reserved up to kMaxBodyReserve, the rest grown as
  // bytes arrive.
  if (r.body.empty() && r.content_length.has_value()) {
    r.body.reserve(std::min<uint64_t>(*r.content_length, kMaxBodyReserve));
  }
  r.body.append(data, n);
  return n;
}

size_t OnRead(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const absl::string_view body = t->request->body;
  const size_t n = std::min(size * count, body.size() - t->read_pos);
  std::memcpy(buffer, body.data() + t->read_pos, n);
  t->read_pos += n;
  return n;
}

// libcurl rewinds the body when it resends on a fresh connection (a reused one had closed).
int OnSeek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->request->body.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->read_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

}  // namespace

std::string Sha256Hex(absl::string_view data) {
  return absl::BytesToHexString(Digest(EVP_sha256(), data));
}

std::string Md5Base64(absl::string_view data) {
  return absl::Base64Escape(Digest(EVP_md5(), data));
}

struct HttpClient::Share {
  CURLSH* handle = nullptr;
  absl::Mutex mu[CURL_LOCK_DATA_LAST];

  static void Lock(CURL*, curl_lock_data data, curl_lock_access,
                   void* user) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    static_cast<Share*>(user)->mu[data].Lock();
  }
  static void Unlock(CURL*, curl_lock_data data, void* user) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    static_cast<Share*>(user)->mu[data].Unlock();
  }
};

HttpClient::HttpClient(const S3ClientOptions& options, Credentials credentials)
    : options_(options),
      credentials_(std::move(credentials)),
      sigv4_(absl::StrCat("aws:amz:", options.region, ":s3")),
      share_(std::make_unique<Share>()) {
  static std::once_flag global_init;
  std::call_once(global_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  share_->handle = curl_share_init();
  if (share_->handle != nullptr) {
    curl_share_setopt(share_->handle, CURLSHOPT_LOCKFUNC, &Share::Lock);
    curl_share_setopt(share_->handle, CURLSHOPT_UNLOCKFUNC, &Share::Unlock);
    curl_share_setopt(share_->handle, CURLSHOPT_USERDATA, share_.get());
    curl_share_setopt(share_->handle, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(share_->handle, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  }
}

HttpClient::~HttpClient() {
  {
    absl::MutexLock lock(&pool_mu_);
    for (CURL* handle : idle_) curl_easy_cleanup(handle);
    idle_.clear();
  }
  // After every easy handle that used it.
  if (share_->handle != nullptr) curl_share_cleanup(share_->handle);
}

CURL* HttpClient::AcquireHandle() {
  {
    absl::MutexLock lock(&pool_mu_);
    if (!idle_.empty()) {
      CURL* handle = idle_.back();
      idle_.pop_back();
      return handle;
    }
  }
  return curl_easy_init();
}

void HttpClient::ReleaseHandle(CURL* handle) {
  // Reset drops the options (pointers into the finished call) but keeps the connection cache.
  curl_easy_reset(handle);
  {
    absl::MutexLock lock(&pool_mu_);
    if (idle_.size() < static_cast<size_t>(std::max(options_.max_idle_connections, 0))) {
      idle_.push_back(handle);
      return;
    }
  }
  curl_easy_cleanup(handle);
}

HttpResponse HttpClient::Perform(const HttpRequest& request) {
  HttpResponse response;
  CURL* h = AcquireHandle();
  if (h == nullptr) {
    response.curl_code = CURLE_FAILED_INIT;
    response.curl_error = "curl_easy_init failed";
    return response;
  }
  Transfer transfer{&request, &response};
  char error[CURL_ERROR_SIZE] = {0};

  struct curl_slist* headers = nullptr;
  auto add_header = [&headers](const std::string& header) {
    headers = curl_slist_append(headers, header.c_str());
  };
  std::string payload_hash = "UNSIGNED-PAYLOAD";
  if (request.body.empty()) {
    payload_hash = std::string(kEmptySha256);
  } else if (request.sign_body) {
    payload_hash = Sha256Hex(request.body);
  }
  add_header(absl::StrCat("x-amz-content-sha256: ", payload_hash));
  if (!credentials_.session_token().empty()) {
    add_header(absl::StrCat("x-amz-security-token: ", credentials_.session_token()));
  }
  for (const std::string& header : request.headers) add_header(header);

  curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // keys may hold "./" or "../"
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_AWS_SIGV4);
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(h, CURLOPT_USERNAME, credentials_.access_key_id().c_str());
  curl_easy_setopt(h, CURLOPT_PASSWORD, credentials_.secret_access_key().c_str());
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT,
                   static_cast<long>(std::max<int64_t>(options_.stall_min_bytes_per_second, 1)));
  curl_easy_setopt(
      h, CURLOPT_LOW_SPEED_TIME,
      static_cast<long>(std::max<int64_t>(absl::ToInt64Seconds(options_.stall_timeout), 1)));
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, options_.verify_tls ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, options_.verify_tls ? 2L : 0L);
  if (!options_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options_.ca_file.c_str());
  if (share_->handle != nullptr) curl_easy_setopt(h, CURLOPT_SHARE, share_->handle);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "tessera-s3/1");
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &transfer);

  if (request.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(h, CURLOPT_READFUNCTION, &OnRead);
    curl_easy_setopt(h, CURLOPT_READDATA, &transfer);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &OnSeek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &transfer);
  } else if (request.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.body.empty() ? "" : request.body.data());
  } else if (request.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }

  const CURLcode code = curl_easy_perform(h);
  if (code != CURLE_OK) {
    response.curl_code = code;
    response.curl_error = credentials_.Redact(error[0] != '\0' ? error : curl_easy_strerror(code));
    // A response whose body overflowed the caller's buffer did arrive; keep its status.
    if (!response.out_overflow) response.status = 0;
  }
  curl_slist_free_all(headers);
  ReleaseHandle(h);
  return response;
}

}  // namespace tessera::s3
