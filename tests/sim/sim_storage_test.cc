#include "tests/sim/sim_storage.h"

#include <cerrno>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

void Write(SimStorage& s, const std::string& path, const std::string& data) {
  absl::StatusOr<std::unique_ptr<WritableFile>> f = s.OpenForWrite(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->WriteAt(0, data.data(), data.size()).ok());
  ASSERT_TRUE((*f)->Close().ok());
}

TEST(SimStorage, NamespaceBehavesLikePosix) {
  SimStorage s;
  ASSERT_TRUE(s.CreateDirs("/root/job/step-1.tmp-a").ok());
  Write(s, "/root/job/step-1.tmp-a/data", "abc");
  EXPECT_THAT(*s.ListDir("/root/job"), ElementsAre("step-1.tmp-a"));
  EXPECT_EQ(*s.FileSize("/root/job/step-1.tmp-a/data"), 3u);
  // A directory renamed over an empty one moves its contents; over a non-empty one fails.
  ASSERT_TRUE(s.CreateDirs("/root/job/step-1").ok());
  ASSERT_TRUE(s.Rename("/root/job/step-1.tmp-a", "/root/job/step-1").ok());
  EXPECT_THAT(*s.ListDir("/root/job"), ElementsAre("step-1"));
  EXPECT_EQ(*s.Contents("/root/job/step-1/data"), "abc");
  ASSERT_TRUE(s.CreateDirs("/root/job/x/y").ok());
  EXPECT_TRUE(absl::IsAlreadyExists(s.Rename("/root/job/x", "/root/job/step-1")));
  // Errors as PosixStorage maps them.
  EXPECT_TRUE(absl::IsNotFound(s.ListDir("/nope").status()));
  EXPECT_TRUE(absl::IsNotFound(s.OpenForWrite("/nope/f").status()));
  EXPECT_TRUE(absl::IsOutOfRange([&] {
    auto f = s.OpenForRead("/root/job/step-1/data");
    char buf[8];
    return (*f)->ReadAt(0, buf, 8);
  }()));
  // RemoveTree is recursive and idempotent.
  ASSERT_TRUE(s.RemoveTree("/root/job").ok());
  ASSERT_TRUE(s.RemoveTree("/root/job").ok());
  EXPECT_THAT(*s.ListDir("/root"), IsEmpty());
}

TEST(SimStorage, FaultAfterRename_TookEffectButFails) {
  SimStorage s;
  ASSERT_TRUE(s.CreateDirs("/a").ok());
  s.set_fault_hook([](StorageOp op, const std::string&) {
    return op == StorageOp::kRename ? StorageFault{EIO, /*after=*/true} : StorageFault{};
  });
  absl::Status renamed = s.Rename("/a", "/b");
  EXPECT_EQ(renamed.code(), absl::StatusCode::kDataLoss) << renamed;
  EXPECT_TRUE(s.IsDir("/b"));
  EXPECT_FALSE(s.IsDir("/a"));
}

TEST(SimStorage, FaultBefore_NothingHappens) {
  SimStorage s;
  s.set_fault_hook([](StorageOp op, const std::string&) {
    return op == StorageOp::kCreateDirs ? StorageFault{ENOSPC, false} : StorageFault{};
  });
  EXPECT_EQ(s.CreateDirs("/a/b").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(s.IsDir("/a"));
}

}  // namespace
}  // namespace tessera::sim
