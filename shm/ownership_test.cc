#include "shm/ownership.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(StagingOwnership, SecondClaimRefusedNamingTheOwnerUntilReleased) {
  // Unique per test process so parallel test runs never share shm names.
  const std::string job = absl::StrCat("stagingtest", getpid(), "-owner");
  absl::StatusOr<std::unique_ptr<StagingOwnership>> first = StagingOwnership::Acquire(job, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  // flock locks belong to the open file description: a second open in this process conflicts
  // exactly as another process's would.
  absl::StatusOr<std::unique_ptr<StagingOwnership>> second = StagingOwnership::Acquire(job, 2);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(absl::StrCat("pid ", getpid())));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("rank 2"));
  // Another rank is independent.
  EXPECT_TRUE(StagingOwnership::Acquire(job, 3).ok());
  first->reset();
  absl::StatusOr<std::unique_ptr<StagingOwnership>> third = StagingOwnership::Acquire(job, 2);
  EXPECT_TRUE(third.ok()) << third.status();
  third->reset();
  // Released claims leave nothing behind in /dev/shm.
  for (int rank : {2, 3}) {
    const std::string path = absl::StrCat("/dev/shm/tessera-", job, "-r", rank, ".owner");
    EXPECT_NE(access(path.c_str(), F_OK), 0) << path;
  }
}

}  // namespace
}  // namespace tessera
