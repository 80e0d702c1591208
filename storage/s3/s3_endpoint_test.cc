// How the S3 client reaches a store, against a real SeaweedFS serving HTTP and HTTPS with the
// test-only certificate of testdata/tls (make_certs.sh: signed by its own CA for "localhost" and
// "vhost.localhost", not for 127.0.0.1):
//   - TLS is verified by default: against the CA named by ca_file it works; against the
//     system's store, or for a host name the certificate does not hold, the request is refused
//     with FailedPrecondition naming the certificate, and never retried;
//   - verify_tls = false accepts the server as it is (a test store only);
//   - virtual-hosted requests (<bucket>.localhost: libcurl resolves every *.localhost to the
//     loopback address) reach the same bucket as path-style ones, over HTTP and HTTPS, and
//     really go to <bucket>.localhost (a bucket the certificate does not name fails its check).
#include <climits>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/testing/seaweedfs.h"

namespace tessera::s3 {
namespace {

using ::tessera::s3::testing::SeaweedFs;
using ::tessera::s3::testing::SeaweedFsOptions;

constexpr char kVirtualBucket[] = "vhost";  // the certificate holds vhost.localhost

std::string Absolute(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? resolved : path;
}

class S3EndpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SeaweedFsOptions options;
    options.domain_name = "localhost";
    options.tls_cert_file = Absolute("storage/s3/testdata/tls/server.pem");
    options.tls_key_file = Absolute("storage/s3/testdata/tls/server.key");
    absl::StatusOr<std::unique_ptr<SeaweedFs>> server = SeaweedFs::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    ASSERT_FALSE(server_->https_endpoint().empty());
    std::unique_ptr<S3Client> path_client = server_->NewClient();
    ASSERT_NE(path_client, nullptr);
    ASSERT_TRUE(path_client->CreateBucket(kVirtualBucket).ok());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  // The fixture's options (path-style, HTTP) with `endpoint`.
  static S3ClientOptions Options(const std::string& endpoint) {
    S3ClientOptions options = server_->ClientOptions();
    options.endpoint = endpoint;
    return options;
  }
  static std::unique_ptr<S3Client> Client(const S3ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<S3Client>> client =
        S3Client::Create(options, server_->admin());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
  // "http://localhost:<port>" of the HTTP endpoint "http://127.0.0.1:<port>".
  static std::string HttpByName() {
    const std::string& endpoint = server_->endpoint();
    return absl::StrCat("http://localhost", endpoint.substr(endpoint.rfind(':')));
  }
  // Writes `key` through `client` and reads it back through a path-style HTTP client: the
  // same bucket, the same bytes.
  static void ExpectRoundTrip(S3Client& client, const std::string& key) {
    const std::string data = absl::StrCat("bytes of ", key);
    ASSERT_TRUE(client.PutObject(kVirtualBucket, key, data).ok());
    absl::StatusOr<std::string> back = client.GetObject(kVirtualBucket, key);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, data);
    absl::StatusOr<std::string> seen = server_->NewClient()->GetObject(kVirtualBucket, key);
    ASSERT_TRUE(seen.ok()) << seen.status();
    EXPECT_EQ(*seen, data);
  }

  static SeaweedFs* server_;
};
SeaweedFs* S3EndpointTest::server_ = nullptr;

TEST_F(S3EndpointTest, Https_CaFileNamesTheServersCa_RoundTrips) {
  S3ClientOptions options = Options(server_->https_endpoint());
  options.ca_file = "storage/s3/testdata/tls/ca.pem";
  std::unique_ptr<S3Client> client = Client(options);
  ASSERT_NE(client, nullptr);
  ExpectRoundTrip(*client, "tls/ca-file");
}

TEST_F(S3EndpointTest, Https_SystemStoreByDefault_RefusesTheServerNamingTheCertificate) {
  std::unique_ptr<S3Client> client = Client(Options(server_->https_endpoint()));
  ASSERT_NE(client, nullptr);
  absl::Status put = client->PutObject(kVirtualBucket, "tls/untrusted", "x");
  EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition) << put;
  EXPECT_TRUE(absl::StrContains(put.message(), "certificate")) << put;
  EXPECT_TRUE(absl::StrContains(put.message(), "1 attempt")) << put;  // never retried
  EXPECT_EQ(server_->NewClient()->HeadObject(kVirtualBucket, "tls/untrusted").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(S3EndpointTest, Https_HostNameNotInTheCertificate_Refused) {
  const std::string& https = server_->https_endpoint();
  S3ClientOptions options =
      Options(absl::StrCat("https://127.0.0.1", https.substr(https.rfind(':'))));
  options.ca_file = "storage/s3/testdata/tls/ca.pem";
  std::unique_ptr<S3Client> client = Client(options);
  ASSERT_NE(client, nullptr);
  absl::Status put = client->PutObject(kVirtualBucket, "tls/wrong-name", "x");
  EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition) << put;
  EXPECT_TRUE(absl::StrContains(put.message(), "127.0.0.1")) << put;
}

TEST_F(S3EndpointTest, Https_VerificationOff_AcceptsTheServer) {
  S3ClientOptions options = Options(server_->https_endpoint());
  options.verify_tls = false;
  std::unique_ptr<S3Client> client = Client(options);
  ASSERT_NE(client, nullptr);
  ExpectRoundTrip(*client, "tls/unverified");
}

TEST_F(S3EndpointTest, VirtualHosted_Http_ReachesTheSameBucket) {
  S3ClientOptions options = Options(HttpByName());
  options.addressing = AddressingStyle::kVirtualHosted;
  std::unique_ptr<S3Client> client = Client(options);
  ASSERT_NE(client, nullptr);
  ExpectRoundTrip(*client, "virtual/http");
  absl::StatusOr<ListObjectsResult> listed = client->ListObjects(kVirtualBucket, "virtual/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->objects.size(), 1u);
  EXPECT_EQ(listed->objects[0].key, "virtual/http");
}

TEST_F(S3EndpointTest, VirtualHosted_HttpsVerified_ReachesTheSameBucket) {
  S3ClientOptions options = Options(server_->https_endpoint());
  options.addressing = AddressingStyle::kVirtualHosted;
  options.ca_file = "storage/s3/testdata/tls/ca.pem";
  std::unique_ptr<S3Client> client = Client(options);
  ASSERT_NE(client, nullptr);
  ExpectRoundTrip(*client, "virtual/https");
  // The request went to <bucket>.localhost: for a bucket the certificate does not name, the
  // host-name check fails, naming that host.
  ASSERT_TRUE(server_->NewClient()->CreateBucket("other").ok());
  absl::Status put = client->PutObject("other", "virtual/https", "x");
  EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition) << put;
  EXPECT_TRUE(absl::StrContains(put.message(), "other.localhost")) << put;
}

}  // namespace
}  // namespace tessera::s3
