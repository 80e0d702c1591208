// S3 names and URLs: `s3://bucket/prefix` locations, the bucket-name rules, object keys, and
// the HTTP URL of one request for a path-style or virtual-hosted endpoint.
//
// Encoding. libcurl's SigV4 signer (7.88) signs the URL's path and query exactly as written, so
// the URL built here must already be in SigV4 canonical form: every byte except the unreserved
// set A-Z a-z 0-9 - . _ ~ percent-encoded with upper-case hex, '/' kept in the object key's
// path, query parameters sorted by name, each written `name=value` (an empty value too). A key
// is encoded byte by byte from its UTF-8, so "a b+c=é" becomes "a%20b%2Bc%3D%C3%A9".
//
// Pure functions, no I/O; thread-safe.
#ifndef TESSERA_STORAGE_S3_S3_URL_H_
#define TESSERA_STORAGE_S3_S3_URL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::s3 {

// A bucket and a key prefix inside it, from `s3://bucket/prefix`.
struct S3Location {
  std::string bucket;
  // "" (the whole bucket) or a prefix ending in '/', with no leading '/', no empty, "." or ".."
  // segment: "s3://b/ckpt//run1" and "s3://b/ckpt/run1/" both give "ckpt/run1/".
  std::string prefix;

  // "s3://bucket/prefix".
  std::string ToString() const;
};

// Parses `s3://bucket[/prefix]` and normalises the prefix (see S3Location::prefix).
// Errors: InvalidArgument naming the URL and the rule broken (not s3://, a bad bucket name, a
// "." or ".." segment, a control character, a prefix longer than a key may be).
absl::StatusOr<S3Location> ParseS3Url(absl::string_view url);

// Checks Amazon S3's rules for general-purpose bucket names, which MinIO, Ceph RGW and
// SeaweedFS share: 3 to 63 characters of a-z, 0-9, '.' and '-'; starts and ends with a letter
// or digit; no ".."; not an IPv4 address; none of the prefixes and suffixes AWS reserves
// ("xn--", "sthree-", "-s3alias", "--ol-s3", ...). GCS names with '_' are refused: they are not
// valid host names, so they cannot be addressed virtual-hosted.
// Errors: InvalidArgument naming the bucket and the rule.
absl::Status ValidateBucketName(absl::string_view bucket);

// Checks an object key: 1 to 1024 bytes, no NUL. (S3 takes any other UTF-8; this client
// encodes it.) Errors: InvalidArgument.
absl::Status ValidateObjectKey(absl::string_view key);

// "s3://bucket/key": how messages name an object (never the HTTP URL).
std::string S3ObjectUrl(absl::string_view bucket, absl::string_view key);

// SigV4 URI encoding (see the header comment). With `keep_slash`, '/' stays as is (paths).
std::string UriEncode(absl::string_view s, bool keep_slash);

// The inverse of S3's `encoding-type=url` key encoding in list replies: %XX is decoded and '+'
// is a space (S3 encodes a '+' in a key as %2B). Errors: InvalidArgument on a bad %-escape.
absl::StatusOr<std::string> UrlDecodeKey(absl::string_view s);

// How a request names its bucket.
enum class AddressingStyle {
  kPath,           // https://endpoint/bucket/key: MinIO, SeaweedFS, Ceph RGW, any IP endpoint.
  kVirtualHosted,  // https://bucket.endpoint/key: AWS's default. Path-style all the same for
                   // a bucket with a '.' (it would break the TLS wildcard certificate) and for
                   // an endpoint that is an IP address.
};

// An S3 endpoint: "http(s)://host[:port][/base-path]".
struct Endpoint {
  std::string scheme;     // "http" or "https"
  std::string authority;  // "host" or "host:port"; IPv6 literals keep their brackets
  std::string base_path;  // "" or "/path" without a trailing '/' (an endpoint behind a proxy)

  bool is_ip_literal() const;
};

// Parses an endpoint URL. Errors: InvalidArgument for a scheme other than http/https, an empty
// host, a query or fragment, or user info ("user:pass@" is refused, and never echoed, so
// credentials cannot leak into messages this way).
absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url);

// Query parameters of a request, in any order: (name, value), both unencoded.
using QueryParams = std::vector<std::pair<std::string, std::string>>;

// The URL of a request on `bucket` (and `key`, if not empty) at `endpoint`, with `query` in
// canonical form (see the header comment). Bucket-level requests end in '/' path-style
// ("/bucket/") and are "/" virtual-hosted. Precondition: the bucket passed
// ValidateBucketName.
std::string BuildRequestUrl(const Endpoint& endpoint, AddressingStyle style,
                            absl::string_view bucket, absl::string_view key,
                            const QueryParams& query = {});

// The query string alone ("a=1&b=x%2Fy"), sorted and encoded as BuildRequestUrl writes it.
std::string CanonicalQuery(QueryParams query);

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_S3_URL_H_
