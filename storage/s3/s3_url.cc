#include "storage/s3/s3_url.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera::s3 {
namespace {

constexpr size_t kMaxKeyBytes = 1024;
constexpr absl::string_view kScheme = "s3://";

bool IsUnreserved(unsigned char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

bool HasControlCharacter(absl::string_view s) {
  return std::any_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

bool IsIpv4(absl::string_view s) {
  std::vector<absl::string_view> parts = absl::StrSplit(s, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view p : parts) {
    int v;
    if (p.empty() || p.size() > 3 || !absl::SimpleAtoi(p, &v) || v < 0 || v > 255) return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string S3Location::ToString() const { return absl::StrCat(kScheme, bucket, "/", prefix); }

absl::Status ValidateBucketName(absl::string_view bucket) {
  auto bad = [&](absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid S3 bucket name \"", absl::CHexEscape(bucket), "\": ", rule));
  };
  if (bucket.size() < 3 || bucket.size() > 63) return bad("must be 3 to 63 characters");
  for (char c : bucket) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-')) {
      return bad("only lower-case letters, digits, '.' and '-' are allowed");
    }
  }
  if (!absl::ascii_isalnum(bucket.front()) || !absl::ascii_isalnum(bucket.back())) {
    return bad("must start and end with a letter or digit");
  }
  if (absl::StrContains(bucket, "..")) return bad("must not contain \"..\"");
  if (IsIpv4(bucket)) return bad("must not be an IP address");
  for (absl::string_view prefix : {"xn--", "sthree-", "amzn-s3-demo-"}) {
    if (absl::StartsWith(bucket, prefix))
      return bad(absl::StrCat("prefix ", prefix, " is reserved"));
  }
  for (absl::string_view suffix : {"-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"}) {
    if (absl::EndsWith(bucket, suffix)) return bad(absl::StrCat("suffix ", suffix, " is reserved"));
  }
  return absl::OkStatus();
}

absl::Status ValidateObjectKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("S3 object key is empty");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 object key is ", key.size(), " bytes; at most ", kMaxKeyBytes));
  }
  if (key.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("S3 object key contains a NUL byte");
  }
  return absl::OkStatus();
}

absl::StatusOr<S3Location> ParseS3Url(absl::string_view url) {
  auto bad = [&](absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid S3 URL \"", absl::CHexEscape(url), "\": ", rule));
  };
  if (!absl::StartsWith(url, kScheme)) return bad("must start with s3://");
  absl::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  S3Location location;
  location.bucket = std::string(rest.substr(0, slash));
  absl::Status bucket_ok = ValidateBucketName(location.bucket);
  if (!bucket_ok.ok()) return bad(bucket_ok.message());
  if (slash == absl::string_view::npos) return location;
  absl::string_view path = rest.substr(slash + 1);
  if (HasControlCharacter(path)) return bad("the prefix contains a control character");
  std::vector<absl::string_view> segments;
  for (absl::string_view segment : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (segment == "." || segment == "..") return bad("the prefix has a \".\" or \"..\" segment");
    segments.push_back(segment);
  }
  if (!segments.empty()) location.prefix = absl::StrCat(absl::StrJoin(segments, "/"), "/");
  if (location.prefix.size() > kMaxKeyBytes) {
    return bad(absl::StrCat("the prefix is longer than a key may be (", kMaxKeyBytes, " bytes)"));
  }
  return location;
}

std::string S3ObjectUrl(absl::string_view bucket, absl::string_view key) {
  return absl::StrCat(kScheme, bucket, "/", key);
}

std::string UriEncode(absl::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (IsUnreserved(c) || (keep_slash && c == '/')) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

absl::StatusOr<std::string> UrlDecodeKey(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%') {
      const int hi = i + 2 < s.size() ? HexValue(s[i + 1]) : -1;
      const int lo = i + 2 < s.size() ? HexValue(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad %-escape at byte ", i, " of \"", absl::CHexEscape(s), "\""));
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool Endpoint::is_ip_literal() const {
  if (absl::StartsWith(authority, "[")) return true;
  return IsIpv4(authority.substr(0, authority.rfind(':')));
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url) {
  Endpoint endpoint;
  absl::string_view rest;
  if (absl::StartsWith(url, "https://")) {
    endpoint.scheme = "https";
    rest = url.substr(8);
  } else if (absl::StartsWith(url, "http://")) {
    endpoint.scheme = "http";
    rest = url.substr(7);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("S3 endpoint \"", absl::CHexEscape(url),
                                                   "\" must start with http:// or https://"));
  }
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  if (absl::StrContains(authority, "@")) {
    return absl::InvalidArgumentError(
        "S3 endpoint URL must not carry user info (credentials come from the credentials "
        "source, never from the URL)");
  }
  if (authority.empty() || absl::StartsWith(authority, ":")) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 endpoint \"", absl::CHexEscape(url), "\" has no host"));
  }
  if (absl::StrContains(url, "?") || absl::StrContains(url, "#") || HasControlCharacter(url) ||
      absl::StrContains(url, " ")) {
    return absl::InvalidArgumentError(absl::StrCat("S3 endpoint \"", absl::CHexEscape(url),
                                                   "\" must be scheme://host[:port][/path] only"));
  }
  endpoint.authority = absl::AsciiStrToLower(authority);
  if (slash != absl::string_view::npos) {
    absl::string_view path = rest.substr(slash);
    while (absl::ConsumeSuffix(&path, "/")) {
    }
    endpoint.base_path = std::string(path);
  }
  return endpoint;
}

std::string CanonicalQuery(QueryParams query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) {
    encoded.emplace_back(UriEncode(name, false), UriEncode(value, false));
  }
  std::sort(encoded.begin(), encoded.end());
  return absl::StrJoin(encoded, "&", [](std::string* out, const auto& p) {
    absl::StrAppend(out, p.first, "=", p.second);
  });
}

std::string BuildRequestUrl(const Endpoint& endpoint, AddressingStyle style,
                            absl::string_view bucket, absl::string_view key,
                            const QueryParams& query) {
  const bool virtual_hosted = style == AddressingStyle::kVirtualHosted &&
                              !absl::StrContains(bucket, ".") && !endpoint.is_ip_literal();
  std::string url = absl::StrCat(endpoint.scheme, "://");
  if (virtual_hosted) {
    absl::StrAppend(&url, bucket, ".", endpoint.authority, endpoint.base_path, "/");
  } else {
    absl::StrAppend(&url, endpoint.authority, endpoint.base_path, "/", bucket, "/");
  }
  absl::StrAppend(&url, UriEncode(key, true));
  if (!query.empty()) absl::StrAppend(&url, "?", CanonicalQuery(query));
  return url;
}

}  // namespace tessera::s3
