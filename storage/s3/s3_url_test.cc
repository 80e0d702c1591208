#include "storage/s3/s3_url.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera::s3 {
namespace {

TEST(ParseS3Url, BucketOnly_EmptyPrefix) {
  absl::StatusOr<S3Location> location = ParseS3Url("s3://ckpt-bucket");
  ASSERT_TRUE(location.ok()) << location.status();
  EXPECT_EQ(location->bucket, "ckpt-bucket");
  EXPECT_EQ(location->prefix, "");
  EXPECT_EQ(location->ToString(), "s3://ckpt-bucket/");
}

TEST(ParseS3Url, Prefix_NormalisedToOneTrailingSlash) {
  for (const char* url : {"s3://b-1/ckpt/run1", "s3://b-1/ckpt/run1/", "s3://b-1//ckpt//run1//"}) {
    absl::StatusOr<S3Location> location = ParseS3Url(url);
    ASSERT_TRUE(location.ok()) << url << ": " << location.status();
    EXPECT_EQ(location->prefix, "ckpt/run1/") << url;
  }
}

TEST(ParseS3Url, SlashOnly_EmptyPrefix) {
  absl::StatusOr<S3Location> location = ParseS3Url("s3://b-1/");
  ASSERT_TRUE(location.ok()) << location.status();
  EXPECT_EQ(location->prefix, "");
}

TEST(ParseS3Url, OtherScheme_Rejected) {
  absl::StatusOr<S3Location> location = ParseS3Url("gs://bucket/x");
  EXPECT_EQ(location.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(location.status().message().find("s3://"), std::string::npos);
}

TEST(ParseS3Url, DotSegment_Rejected) {
  EXPECT_EQ(ParseS3Url("s3://bucket/a/../b").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseS3Url("s3://bucket/./b").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseS3Url, ControlCharacter_Rejected) {
  EXPECT_EQ(ParseS3Url("s3://bucket/a\nb").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseS3Url, BadBucket_MessageNamesTheRule) {
  absl::StatusOr<S3Location> location = ParseS3Url("s3://My_Bucket/x");
  EXPECT_EQ(location.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(location.status().message().find("lower-case"), std::string::npos);
}

TEST(ValidateBucketName, ValidNames_Accepted) {
  for (const std::string& name : {std::string("abc"), std::string("my-bucket.v2"),
                                  std::string("0bucket9"), std::string(63, 'a')}) {
    EXPECT_TRUE(ValidateBucketName(name).ok()) << name;
  }
}

TEST(ValidateBucketName, EachRule_Rejected) {
  for (const char* name :
       {"ab", "UPPER", "under_score", "-start", "end-", "two..dots", "192.168.1.1", "xn--abc",
        "sthree-x", "bucket-s3alias", "bucket--ol-s3", "has space"}) {
    EXPECT_EQ(ValidateBucketName(name).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_EQ(ValidateBucketName(std::string(64, 'a')).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateObjectKey, EmptyTooLongOrNul_Rejected) {
  EXPECT_EQ(ValidateObjectKey("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateObjectKey(std::string(1025, 'k')).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateObjectKey(std::string("a\0b", 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateObjectKey(std::string(1024, 'k')).ok());
}

TEST(UriEncode, UnreservedKept_OthersPercentEncodedUpperHex) {
  EXPECT_EQ(UriEncode("AZaz09-._~", false), "AZaz09-._~");
  EXPECT_EQ(UriEncode("a b+c=d&e", false), "a%20b%2Bc%3Dd%26e");
  EXPECT_EQ(UriEncode("*!'()", false), "%2A%21%27%28%29");
}

TEST(UriEncode, Slash_KeptOnlyInPaths) {
  EXPECT_EQ(UriEncode("a/b", true), "a/b");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
}

TEST(UriEncode, Unicode_EncodedByUtf8Byte) {
  // "é" is C3 A9; "🙂" is F0 9F 99 82.
  EXPECT_EQ(UriEncode("caf\xc3\xa9/\xf0\x9f\x99\x82", true), "caf%C3%A9/%F0%9F%99%82");
}

TEST(UrlDecodeKey, PlusIsSpace_PercentDecoded) {
  absl::StatusOr<std::string> key = UrlDecodeKey("a+b%2Bc%3D%C3%A9%2F");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, "a b+c=\xc3\xa9/");
}

TEST(UrlDecodeKey, BadEscape_Rejected) {
  EXPECT_EQ(UrlDecodeKey("a%2").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UrlDecodeKey("a%zz").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseEndpoint, HttpsWithPortAndPath) {
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint("https://S3.Example.com:9000/proxy/");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_EQ(endpoint->scheme, "https");
  EXPECT_EQ(endpoint->authority, "s3.example.com:9000");
  EXPECT_EQ(endpoint->base_path, "/proxy");
  EXPECT_FALSE(endpoint->is_ip_literal());
}

TEST(ParseEndpoint, IpLiterals_Recognised) {
  EXPECT_TRUE(ParseEndpoint("http://127.0.0.1:8333")->is_ip_literal());
  EXPECT_TRUE(ParseEndpoint("http://[::1]:8333")->is_ip_literal());
}

TEST(ParseEndpoint, BadEndpoints_Rejected) {
  for (const char* url : {"ftp://host", "http://", "http://:80", "http://host/?q=1",
                          "http://host/#f", "s3.amazonaws.com"}) {
    EXPECT_EQ(ParseEndpoint(url).status().code(), absl::StatusCode::kInvalidArgument) << url;
  }
}

TEST(ParseEndpoint, UserInfo_RejectedWithoutEchoingIt) {
  absl::StatusOr<Endpoint> endpoint = ParseEndpoint("https://AKIDEXAMPLE:s3cr3t@s3.example.com");
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(endpoint.status().message().find("s3cr3t"), std::string::npos);
  EXPECT_EQ(endpoint.status().message().find("AKIDEXAMPLE"), std::string::npos);
}

TEST(CanonicalQuery, SortedByEncodedName_EmptyValuesKeepEquals) {
  EXPECT_EQ(CanonicalQuery({{"uploadId", "x/y=z"}, {"partNumber", "3"}}),
            "partNumber=3&uploadId=x%2Fy%3Dz");
  EXPECT_EQ(CanonicalQuery({{"uploads", ""}, {"prefix", "a b"}}), "prefix=a%20b&uploads=");
}

TEST(BuildRequestUrl, PathStyle_BucketInPathKeyEncoded) {
  const Endpoint endpoint = *ParseEndpoint("http://127.0.0.1:8333");
  EXPECT_EQ(BuildRequestUrl(endpoint, AddressingStyle::kPath, "b-1", "dir/a b+c=\xc3\xa9"),
            "http://127.0.0.1:8333/b-1/dir/a%20b%2Bc%3D%C3%A9");
}

TEST(BuildRequestUrl, BucketLevel_EndsWithSlashAndQuery) {
  const Endpoint endpoint = *ParseEndpoint("http://127.0.0.1:8333");
  EXPECT_EQ(BuildRequestUrl(endpoint, AddressingStyle::kPath, "b-1", "",
                            {{"list-type", "2"}, {"delimiter", "/"}}),
            "http://127.0.0.1:8333/b-1/?delimiter=%2F&list-type=2");
}

TEST(BuildRequestUrl, VirtualHosted_BucketInHost) {
  const Endpoint endpoint = *ParseEndpoint("https://s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(BuildRequestUrl(endpoint, AddressingStyle::kVirtualHosted, "ckpt", "x/y"),
            "https://ckpt.s3.eu-west-1.amazonaws.com/x/y");
}

TEST(BuildRequestUrl, VirtualHostedDottedBucket_FallsBackToPathStyle) {
  const Endpoint endpoint = *ParseEndpoint("https://s3.amazonaws.com");
  EXPECT_EQ(BuildRequestUrl(endpoint, AddressingStyle::kVirtualHosted, "my.bucket", "k"),
            "https://s3.amazonaws.com/my.bucket/k");
}

TEST(BuildRequestUrl, VirtualHostedIpEndpoint_FallsBackToPathStyle) {
  const Endpoint endpoint = *ParseEndpoint("http://10.0.0.1:9000");
  EXPECT_EQ(BuildRequestUrl(endpoint, AddressingStyle::kVirtualHosted, "b-1", "k"),
            "http://10.0.0.1:9000/b-1/k");
}

TEST(BuildRequestUrl, KeyWithDotSegments_KeptVerbatim) {
  const Endpoint endpoint = *ParseEndpoint("http://127.0.0.1:1");
  EXPECT_EQ(BuildRequestUrl(endpoint, AddressingStyle::kPath, "b-1", "a/../b/./c"),
            "http://127.0.0.1:1/b-1/a/../b/./c");
}

TEST(S3ObjectUrl, BucketAndKey) { EXPECT_EQ(S3ObjectUrl("b", "k/x"), "s3://b/k/x"); }

}  // namespace
}  // namespace tessera::s3
