#include "tests/gpu/process_barrier.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera::gpubench {
namespace {

std::string Name(const char* what) { return absl::StrCat("/tessera-barrier-test-", getpid(), what); }

TEST(ProcessBarrier, CreateTwice_AlreadyExists_OpenMissing_NotFound) {
  const std::string name = Name("a");
  ASSERT_TRUE(ProcessBarrier::Create(name, 2).ok());
  EXPECT_EQ(ProcessBarrier::Create(name, 2).code(), absl::StatusCode::kAlreadyExists);
  shm_unlink(name.c_str());
  EXPECT_EQ(ProcessBarrier::Open(name).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ProcessBarrier::Create("nope", 2).code(), absl::StatusCode::kInvalidArgument);
}

// A child process writes a file and then meets the parent at the barrier; once the parent is
// through, the file must be there: the barrier ordered the two processes.
TEST(ProcessBarrier, TwoProcesses_ParentPassesOnlyAfterChildArrived) {
  const std::string name = Name("b");
  ASSERT_TRUE(ProcessBarrier::Create(name, 2).ok());
  char dir[] = "/tmp/tessera-barrier-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string marker = absl::StrCat(dir, "/child-arrived");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    absl::StatusOr<std::unique_ptr<ProcessBarrier>> b = ProcessBarrier::Open(name);
    if (!b.ok()) _exit(3);
    FILE* f = fopen(marker.c_str(), "w");
    if (f == nullptr) _exit(4);
    fclose(f);
    (*b)->Wait();
    _exit(0);
  }
  absl::StatusOr<std::unique_ptr<ProcessBarrier>> b = ProcessBarrier::Open(name);
  ASSERT_TRUE(b.ok()) << b.status();
  (*b)->Wait();
  EXPECT_EQ(access(marker.c_str(), F_OK), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  shm_unlink(name.c_str());
  unlink(marker.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace tessera::gpubench
