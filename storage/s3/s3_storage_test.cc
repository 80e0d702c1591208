// S3Storage against a real SeaweedFS (one server for the binary, a fresh bucket per test).
#include "storage/s3/s3_storage.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/s3/testing/seaweedfs.h"

namespace tessera {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

class S3StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<s3::testing::SeaweedFs*> shared = s3::testing::SharedSeaweedFs();
    ASSERT_TRUE(shared.ok()) << shared.status();
    s3::testing::SeaweedFs* server = *shared;
    client_ = std::shared_ptr<s3::S3Client>(server->NewClient());
    absl::StatusOr<std::string> bucket = server->NewBucket();
    ASSERT_TRUE(bucket.ok()) << bucket.status();
    bucket_ = *bucket;
    root_ = absl::StrCat("s3://", bucket_, "/ckpt");
    S3StorageOptions options;
    options.part_size = 5 * kMiB;  // S3's least, so a few MiB make several parts
    options.parts_in_flight = 3;
    options.read_piece = 3 * kMiB;
    options.reads_in_flight = 4;
    absl::StatusOr<std::unique_ptr<S3Storage>> storage = S3Storage::Create(client_, options);
    ASSERT_TRUE(storage.ok()) << storage.status();
    storage_ = *std::move(storage);
  }

  static std::string Bytes(size_t n, uint32_t seed) {
    std::string s(n, '\0');
    std::mt19937 gen(seed);
    for (char& c : s) c = static_cast<char>(gen());
    return s;
  }

  absl::StatusOr<std::string> ReadAll(const std::string& path, size_t size) {
    absl::StatusOr<std::unique_ptr<ReadableFile>> file = storage_->OpenForRead(path);
    if (!file.ok()) return file.status();
    std::string out(size, '\0');
    absl::Status read = (*file)->ReadAt(0, out.data(), size);
    if (!read.ok()) return read;
    return out;
  }

  std::shared_ptr<s3::S3Client> client_;
  std::string bucket_;
  std::string root_;
  std::unique_ptr<S3Storage> storage_;
};

TEST_F(S3StorageTest, WriteInParts_OutOfOrderFromSeveralThreads_ReadBackWhole) {
  // 23 MiB + 1: four full 5 MiB parts and a partial one, written in 1 MiB + 7 pieces whose
  // order is shuffled across four threads, so parts fill out of order and in pieces.
  const std::string bytes = Bytes(23 * kMiB + 1, 1);
  const std::string path = root_ + "/step-1.tmp-s/data-00000.safetensors";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = storage_->OpenForWrite(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const uint64_t piece = kMiB + 7;
  std::vector<uint64_t> offsets;
  for (uint64_t at = 0; at < bytes.size(); at += piece) offsets.push_back(at);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937(7));
  std::vector<std::thread> writers;
  std::vector<absl::Status> results(4);
  for (size_t t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (size_t i = t; i < offsets.size(); i += 4) {
        const uint64_t n = std::min<uint64_t>(piece, bytes.size() - offsets[i]);
        absl::Status s = (*file)->WriteAt(offsets[i], bytes.data() + offsets[i], n);
        if (!s.ok() && results[t].ok()) results[t] = s;
      }
    });
  }
  for (std::thread& w : writers) w.join();
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  // Not there before Sync: an object appears whole or not at all.
  EXPECT_EQ(storage_->FileSize(path).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  absl::StatusOr<uint64_t> size = storage_->FileSize(path);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, bytes.size());
  absl::StatusOr<std::string> read = ReadAll(path, bytes.size());  // 8 pieces, 4 at once
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == bytes);
}

TEST_F(S3StorageTest, SmallFile_OnePutAtClose) {
  const std::string path = root_ + "/small";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = storage_->OpenForWrite(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(3, "defg", 4).ok());
  ASSERT_TRUE((*file)->WriteAt(0, "abc", 3).ok());
  ASSERT_TRUE((*file)->Close().ok());  // as close(2): there, synced or not
  absl::StatusOr<std::string> read = ReadAll(path, 7);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "abcdefg");
  absl::StatusOr<std::vector<s3::MultipartUpload>> uploads =
      client_->ListMultipartUploads(bucket_, "");
  ASSERT_TRUE(uploads.ok());
  EXPECT_TRUE(uploads->empty());
}

TEST_F(S3StorageTest, AbandonedWithoutClose_NothingAppearsAndTheUploadIsAborted) {
  const std::string path = root_ + "/abandoned";
  const std::string bytes = Bytes(12 * kMiB, 2);  // two full parts uploaded, one open
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = storage_->OpenForWrite(path);
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->WriteAt(0, bytes.data(), bytes.size()).ok());
    // A writer that gives up drops the file: no Sync, no Close.
  }
  EXPECT_EQ(storage_->FileSize(path).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<s3::MultipartUpload>> uploads =
      client_->ListMultipartUploads(bucket_, "");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  EXPECT_TRUE(uploads->empty());
}

TEST_F(S3StorageTest, Gap_SyncFailsAndNothingAppears) {
  const std::string path = root_ + "/gap";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = storage_->OpenForWrite(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, "0123456789", 10).ok());
  ASSERT_TRUE((*file)->WriteAt(20, "0123456789", 10).ok());
  absl::Status synced = (*file)->Sync();
  EXPECT_EQ(synced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(synced.message(), HasSubstr("a gap"));
  EXPECT_EQ((*file)->Close().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(storage_->FileSize(path).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3StorageTest, PutFile_CreateOnly_ExactlyOneOfRacingWritersWins) {
  EXPECT_EQ(storage_->publication(root_), Publication::kCreateManifest);
  const std::string path = root_ + "/step-5/manifest.pb";
  constexpr int kWriters = 6;
  std::vector<absl::Status> results(kWriters);
  absl::Notification go;
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      go.WaitForNotification();
      results[w] = storage_->PutFile(path, absl::StrCat("writer ", w), PutMode::kCreateOnly);
    });
  }
  go.Notify();
  for (std::thread& t : writers) t.join();
  int won = -1, refused = 0;
  for (int w = 0; w < kWriters; ++w) {
    if (results[w].ok()) {
      EXPECT_EQ(won, -1) << "two writers created " << path;
      won = w;
    } else if (absl::IsAlreadyExists(results[w])) {
      ++refused;
    } else {
      ADD_FAILURE() << results[w];
    }
  }
  ASSERT_NE(won, -1);
  EXPECT_EQ(refused, kWriters - 1);
  absl::StatusOr<std::string> read = ReadFileToString(*storage_, path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, absl::StrCat("writer ", won));
  // kReplace overwrites.
  ASSERT_TRUE(storage_->PutFile(path, "replaced", PutMode::kReplace).ok());
  EXPECT_EQ(*ReadFileToString(*storage_, path), "replaced");
}

TEST_F(S3StorageTest, ListDir_ObjectsAndSubdirectoriesSorted_EmptyIsNotFound) {
  for (const char* name : {"job/step-2/manifest.pb", "job/step-1.tmp-a/data", "job/b", "job2/x"}) {
    ASSERT_TRUE(storage_->PutFile(absl::StrCat(root_, "/", name), "x", PutMode::kReplace).ok());
  }
  absl::StatusOr<std::vector<std::string>> names = storage_->ListDir(root_ + "/job");
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("b", "step-1.tmp-a", "step-2"));
  EXPECT_EQ(storage_->ListDir(root_ + "/nothing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3StorageTest, RemoveTree_EverythingUnderAndIncompleteUploads_NotASiblingSharingItsName) {
  for (const char* name : {"a/x", "a/b/y", "ab/z"}) {
    ASSERT_TRUE(storage_->PutFile(absl::StrCat(root_, "/", name), "x", PutMode::kReplace).ok());
  }
  // A writer that died mid-upload left an incomplete upload under a/.
  absl::StatusOr<std::string> upload = client_->CreateMultipartUpload(bucket_, "ckpt/a/big");
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE(client_->UploadPart(bucket_, "ckpt/a/big", *upload, 1, Bytes(5 * kMiB, 3)).ok());
  absl::StatusOr<std::vector<s3::MultipartUpload>> uploads =
      client_->ListMultipartUploads(bucket_, "ckpt/a/");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  ASSERT_EQ(uploads->size(), 1u);

  ASSERT_TRUE(storage_->RemoveTree(root_ + "/a").ok());
  // No object is left under a/ (ListDir may still name a/b for a while: SeaweedFS removes
  // the empty folders of its filer in the background, where S3 has none).
  absl::StatusOr<s3::ListObjectsResult> left = client_->ListObjects(bucket_, "ckpt/a/");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->objects.empty());
  EXPECT_EQ(storage_->FileSize(root_ + "/a/x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(storage_->FileSize(root_ + "/ab/z").ok());
  uploads = client_->ListMultipartUploads(bucket_, "ckpt/a/");
  ASSERT_TRUE(uploads.ok());
  EXPECT_TRUE(uploads->empty());
  // Idempotent, as on a file system.
  EXPECT_TRUE(storage_->RemoveTree(root_ + "/a").ok());
}

TEST_F(S3StorageTest, Errors_RenameUnimplemented_ReadPastEndOutOfRange_BadPathInvalid) {
  EXPECT_EQ(storage_->Rename(root_ + "/a", root_ + "/b").code(),
            absl::StatusCode::kUnimplemented);
  ASSERT_TRUE(storage_->PutFile(root_ + "/f", "abc", PutMode::kReplace).ok());
  absl::StatusOr<std::unique_ptr<ReadableFile>> file = storage_->OpenForRead(root_ + "/f");
  ASSERT_TRUE(file.ok());
  char buf[8];
  EXPECT_EQ((*file)->ReadAt(1, buf, 5).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(storage_->OpenForRead(root_ + "/missing").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(storage_->FileSize("s3://Not_A_Bucket/x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
