// S3Client against a real SeaweedFS (storage/s3/testing/seaweedfs.h): one server for the whole
// binary, a fresh bucket for each test.
#include "storage/s3/s3_client.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "storage/s3/testing/seaweedfs.h"
#include "tessera/v1/types.pb.h"

namespace tessera::s3 {
namespace {

using ::tessera::s3::testing::SeaweedFs;
using ::tessera::s3::testing::SharedSeaweedFs;

constexpr size_t kMiB = 1 << 20;

// `size` bytes that differ with `seed` and position.
std::string Bytes(size_t size, int seed) {
  std::string out(size, '\0');
  uint32_t x = 2463534242u + seed;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    out[i] = static_cast<char>(x);
  }
  return out;
}

std::vector<std::string> Keys(const ListObjectsResult& result) {
  std::vector<std::string> keys;
  for (const ObjectInfo& object : result.objects) keys.push_back(object.key);
  return keys;
}

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<SeaweedFs*> server = SharedSeaweedFs();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    client_ = server_->NewClient();
    ASSERT_NE(client_, nullptr);
    absl::StatusOr<std::string> bucket = server_->NewBucket();
    ASSERT_TRUE(bucket.ok()) << bucket.status();
    bucket_ = *bucket;
  }

  SeaweedFs* server_ = nullptr;
  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};


TEST_F(S3ClientTest, PutThenGet_SameBytes) {
  const std::string data = Bytes(100000, 1);
  ASSERT_TRUE(client_->PutObject(bucket_, "run1/a.bin", data).ok());
  absl::StatusOr<std::string> got = client_->GetObject(bucket_, "run1/a.bin");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
}

TEST_F(S3ClientTest, EmptyObject_RoundTrips) {
  ASSERT_TRUE(client_->PutObject(bucket_, "empty", "").ok());
  absl::StatusOr<uint64_t> size = client_->HeadObject(bucket_, "empty");
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 0u);
}

TEST_F(S3ClientTest, UnicodeAndSpaceKey_RoundTripsAndLists) {
  const std::string key = "dir one/a b+c=d&e %41 \xc3\xa9\xf0\x9f\x99\x82~!*'().bin";
  ASSERT_TRUE(client_->PutObject(bucket_, key, "payload").ok());
  absl::StatusOr<std::string> got = client_->GetObject(bucket_, key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "payload");
  absl::StatusOr<ListObjectsResult> listed = client_->ListObjects(bucket_, "dir one/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(Keys(*listed), std::vector<std::string>{key});
}

TEST_F(S3ClientTest, GetObjectRange_ExactBytesAtOffset) {
  const std::string data = Bytes(3 * kMiB, 2);
  ASSERT_TRUE(client_->PutObject(bucket_, "big", data).ok());
  std::string out(4096, '\0');
  ASSERT_TRUE(client_->GetObjectRange(bucket_, "big", kMiB + 7, out.data(), out.size()).ok());
  EXPECT_TRUE(out == data.substr(kMiB + 7, 4096));
}

TEST_F(S3ClientTest, GetObjectRange_PastTheEnd_OutOfRange) {
  ASSERT_TRUE(client_->PutObject(bucket_, "small", "0123456789").ok());
  std::string out(8, '\0');
  const absl::Status status = client_->GetObjectRange(bucket_, "small", 6, out.data(), out.size());
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
}

TEST_F(S3ClientTest, GetObjectRange_StartPastTheEnd_OutOfRange) {
  ASSERT_TRUE(client_->PutObject(bucket_, "small", "0123456789").ok());
  std::string out(4, '\0');
  const absl::Status status = client_->GetObjectRange(bucket_, "small", 20, out.data(), out.size());
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
}

TEST_F(S3ClientTest, HeadObject_Size) {
  ASSERT_TRUE(client_->PutObject(bucket_, "k", Bytes(12345, 3)).ok());
  absl::StatusOr<uint64_t> size = client_->HeadObject(bucket_, "k");
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 12345u);
}

TEST_F(S3ClientTest, MissingKey_NotFoundWithS3PathPayload) {
  absl::StatusOr<std::string> got = client_->GetObject(bucket_, "nope");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("NoSuchKey"), std::string::npos) << got.status();
  std::optional<v1::ErrorDetail> detail = GetErrorDetail(got.status());
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->code(), v1::ERROR_CODE_IO_ERROR);
  EXPECT_EQ(detail->path(), absl::StrCat("s3://", bucket_, "/nope"));
}

TEST_F(S3ClientTest, HeadMissingKey_NotFound) {
  EXPECT_EQ(client_->HeadObject(bucket_, "nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3ClientTest, MissingBucket_NotFoundNamingTheBucket) {
  absl::StatusOr<std::string> got = client_->GetObject("no-such-bucket-here", "k");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find("bucket no-such-bucket-here does not exist"),
            std::string::npos)
      << got.status();
}

TEST_F(S3ClientTest, ListObjects_FollowsPagesAndDelimiter) {
  S3ClientOptions options = server_->ClientOptions();
  options.list_page_size = 2;
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options, server_->admin());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<std::string> keys = {"p/a", "p/b", "p/c", "p/d/1", "p/d/2", "q/x"};
  for (const std::string& key : keys) ASSERT_TRUE((*client)->PutObject(bucket_, key, key).ok());

  absl::StatusOr<ListObjectsResult> all = (*client)->ListObjects(bucket_, "p/");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(Keys(*all), (std::vector<std::string>{"p/a", "p/b", "p/c", "p/d/1", "p/d/2"}));

  absl::StatusOr<ListObjectsResult> top = (*client)->ListObjects(bucket_, "p/", "/");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(Keys(*top), (std::vector<std::string>{"p/a", "p/b", "p/c"}));
  EXPECT_EQ(top->common_prefixes, std::vector<std::string>{"p/d/"});
}

TEST_F(S3ClientTest, ListObjects_SpecialCharactersInKeysAndCommonPrefixes) {
  ASSERT_TRUE(client_->PutObject(bucket_, "s/a+b c%/x", "v").ok());
  ASSERT_TRUE(client_->PutObject(bucket_, "s/a+b c%.bin", "v").ok());
  absl::StatusOr<ListObjectsResult> listed = client_->ListObjects(bucket_, "s/", "/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(Keys(*listed), std::vector<std::string>{"s/a+b c%.bin"});
  EXPECT_EQ(listed->common_prefixes, std::vector<std::string>{"s/a+b c%/"});
}

TEST_F(S3ClientTest, DeleteObject_GoneAndMissingKeyIsOk) {
  ASSERT_TRUE(client_->PutObject(bucket_, "k", "v").ok());
  ASSERT_TRUE(client_->DeleteObject(bucket_, "k").ok());
  EXPECT_EQ(client_->HeadObject(bucket_, "k").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client_->DeleteObject(bucket_, "k").ok());
}

TEST_F(S3ClientTest, DeleteObjects_InBatches_AllGone) {
  S3ClientOptions options = server_->ClientOptions();
  options.delete_batch_size = 2;
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options, server_->admin());
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<std::string> keys;
  for (int i = 0; i < 5; ++i) {
    keys.push_back(absl::StrCat("batch/k ", i, "&<x>"));
    ASSERT_TRUE((*client)->PutObject(bucket_, keys.back(), "v").ok());
  }
  keys.push_back("batch/never-existed");
  absl::StatusOr<std::vector<DeleteFailure>> failures = (*client)->DeleteObjects(bucket_, keys);
  ASSERT_TRUE(failures.ok()) << failures.status();
  EXPECT_TRUE(failures->empty());
  absl::StatusOr<ListObjectsResult> left = (*client)->ListObjects(bucket_, "batch/");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->objects.empty());
}

TEST_F(S3ClientTest, MultipartUpload_PartsOutOfOrder_CompleteJoinsInPartOrder) {
  const std::vector<std::string> parts = {Bytes(5 * kMiB, 10), Bytes(5 * kMiB, 11),
                                          Bytes(1000, 12)};
  absl::StatusOr<std::string> id = client_->CreateMultipartUpload(bucket_, "mp/obj");
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<CompletedPart> completed;
  for (int number : {3, 1, 2}) {
    absl::StatusOr<std::string> etag =
        client_->UploadPart(bucket_, "mp/obj", *id, number, parts[number - 1]);
    ASSERT_TRUE(etag.ok()) << etag.status();
    completed.push_back({number, *etag});
  }
  absl::StatusOr<std::string> etag =
      client_->CompleteMultipartUpload(bucket_, "mp/obj", *id, completed);
  ASSERT_TRUE(etag.ok()) << etag.status();
  absl::StatusOr<std::string> got = client_->GetObject(bucket_, "mp/obj");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == parts[0] + parts[1] + parts[2]);
}

TEST_F(S3ClientTest, ListMultipartUploads_AllPagesUnderPrefixOnly) {
  S3ClientOptions options = server_->ClientOptions();
  options.list_page_size = 1;
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options, server_->admin());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::string> a = (*client)->CreateMultipartUpload(bucket_, "up/a");
  absl::StatusOr<std::string> b = (*client)->CreateMultipartUpload(bucket_, "up/b c+d");
  absl::StatusOr<std::string> other = (*client)->CreateMultipartUpload(bucket_, "elsewhere/x");
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  absl::StatusOr<std::vector<MultipartUpload>> uploads =
      (*client)->ListMultipartUploads(bucket_, "up/");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  std::vector<std::pair<std::string, std::string>> got;
  for (const MultipartUpload& u : *uploads) got.emplace_back(u.key, u.upload_id);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got,
            (std::vector<std::pair<std::string, std::string>>{{"up/a", *a}, {"up/b c+d", *b}}));
}

TEST_F(S3ClientTest, AbortMultipartUpload_NoLongerListed) {
  absl::StatusOr<std::string> id = client_->CreateMultipartUpload(bucket_, "ab/obj");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(client_->UploadPart(bucket_, "ab/obj", *id, 1, "part").ok());
  ASSERT_TRUE(client_->AbortMultipartUpload(bucket_, "ab/obj", *id).ok());
  absl::StatusOr<std::vector<MultipartUpload>> uploads =
      client_->ListMultipartUploads(bucket_, "ab/");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  EXPECT_TRUE(uploads->empty());
}

TEST_F(S3ClientTest, CompleteAbortedUpload_Aborted) {
  absl::StatusOr<std::string> id = client_->CreateMultipartUpload(bucket_, "ab/obj");
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::string> etag = client_->UploadPart(bucket_, "ab/obj", *id, 1, "part");
  ASSERT_TRUE(etag.ok()) << etag.status();
  ASSERT_TRUE(client_->AbortMultipartUpload(bucket_, "ab/obj", *id).ok());
  absl::StatusOr<std::string> done =
      client_->CompleteMultipartUpload(bucket_, "ab/obj", *id, {{1, *etag}});
  EXPECT_EQ(done.status().code(), absl::StatusCode::kAborted) << done.status();
}

TEST_F(S3ClientTest, PutIfAbsent_SecondPutRefusedWithAlreadyExists) {
  ASSERT_TRUE(client_->PutObject(bucket_, "commit", "first", PutCondition::kIfAbsent).ok());
  const absl::Status second =
      client_->PutObject(bucket_, "commit", "second", PutCondition::kIfAbsent);
  EXPECT_EQ(second.code(), absl::StatusCode::kAlreadyExists) << second;
  EXPECT_EQ(client_->GetObject(bucket_, "commit").value_or(""), "first");
}

TEST_F(S3ClientTest, PutIfAbsent_TwoRacingThreads_ExactlyOneWins) {
  // Several rounds, each a fresh key, so the two requests really overlap at least sometimes.
  for (int round = 0; round < 8; ++round) {
    const std::string key = absl::StrCat("race/", round);
    absl::Notification go;
    absl::Status results[2];
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        go.WaitForNotification();
        results[t] =
            client_->PutObject(bucket_, key, absl::StrCat("writer ", t), PutCondition::kIfAbsent);
      });
    }
    go.Notify();
    for (std::thread& thread : threads) thread.join();
    const int winners = results[0].ok() + results[1].ok();
    ASSERT_EQ(winners, 1) << "round " << round << ": " << results[0] << " / " << results[1];
    const int winner = results[0].ok() ? 0 : 1;
    EXPECT_EQ(results[1 - winner].code(), absl::StatusCode::kAlreadyExists) << results[1 - winner];
    EXPECT_EQ(client_->GetObject(bucket_, key).value_or(""), absl::StrCat("writer ", winner));
  }
}

TEST_F(S3ClientTest, WrongSecret_PermissionDeniedWithoutCredentialsInMessage) {
  const Credentials wrong(server_->admin().access_key_id(), "not-the-secret-Qx7Vb2Nm9Lk4");
  std::unique_ptr<S3Client> client = server_->NewClient(wrong);
  ASSERT_NE(client, nullptr);
  const absl::Status status = client->PutObject(bucket_, "k", "v");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  const std::string message(status.message());
  EXPECT_EQ(message.find(wrong.secret_access_key()), std::string::npos) << message;
  EXPECT_EQ(message.find(wrong.access_key_id()), std::string::npos) << message;
  EXPECT_EQ(message.find(server_->admin().secret_access_key()), std::string::npos) << message;
}

TEST_F(S3ClientTest, IdentityWithoutRights_PermissionDenied) {
  ASSERT_TRUE(client_->PutObject(bucket_, "k", "v").ok());
  std::unique_ptr<S3Client> stranger = server_->NewClient(server_->stranger());
  ASSERT_NE(stranger, nullptr);
  absl::StatusOr<std::string> got = stranger->GetObject(bucket_, "k");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
  EXPECT_EQ(got.status().message().find(server_->stranger().access_key_id()), std::string::npos);
}

TEST_F(S3ClientTest, NothingListening_UnavailableAfterRetries) {
  // A port that was free a moment ago: connections are refused.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  S3ClientOptions options = server_->ClientOptions();
  options.endpoint = absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port));
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(1);
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options, server_->admin());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::string> got = (*client)->GetObject(bucket_, "k");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(got.status().message().find("3 attempts"), std::string::npos) << got.status();
}

}  // namespace
}  // namespace tessera::s3
