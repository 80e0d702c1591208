#include "agent/populate.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// Pages of [data, data + size) that are resident and mapped in this process (mincore).
size_t ResidentPages(void* data, size_t size) {
  std::vector<unsigned char> vec((size + Page() - 1) / Page());
  if (mincore(data, size, vec.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

// A shared mapping of a fresh memfd of `size` bytes, no page touched.
struct SharedMapping {
  explicit SharedMapping(size_t n) : size(n) {
    fd = memfd_create("populate_test", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(size)) == 0) {
      data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
  }
  ~SharedMapping() {
    if (data != MAP_FAILED) munmap(data, size);
    if (fd >= 0) close(fd);
  }
  size_t size;
  int fd = -1;
  void* data = MAP_FAILED;
};

TEST(PopulateForWriteTest, EveryPageResidentAfterward_OddSizeManyThreads) {
  const size_t size = 37 * Page() + 100;  // not a multiple of the page, nor of the threads
  SharedMapping m(size);
  ASSERT_NE(m.data, MAP_FAILED);
  ASSERT_EQ(ResidentPages(m.data, size), 0u);
  absl::Status status = PopulateForWrite(m.data, size, 5);
  if (absl::IsUnimplemented(status)) GTEST_SKIP() << "kernel before 5.14: " << status;
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(ResidentPages(m.data, size), 38u);
  // The file itself holds them: what a reservation is for.
  struct stat st;
  ASSERT_EQ(fstat(m.fd, &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 38 * Page());
}

TEST(PopulateForWriteTest, MoreThreadsThanPages_OnePerPage) {
  SharedMapping m(2 * Page());
  ASSERT_NE(m.data, MAP_FAILED);
  absl::Status status = PopulateForWrite(m.data, 2 * Page(), 8);
  if (absl::IsUnimplemented(status)) GTEST_SKIP() << "kernel before 5.14: " << status;
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(ResidentPages(m.data, 2 * Page()), 2u);
}

TEST(PopulateForWriteTest, BadArguments_InvalidArgument) {
  SharedMapping m(Page());
  ASSERT_NE(m.data, MAP_FAILED);
  EXPECT_EQ(PopulateForWrite(nullptr, Page(), 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PopulateForWrite(static_cast<char*>(m.data) + 8, 64, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PopulateForWrite(m.data, Page(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PopulateForWrite(m.data, 0, 1).ok());
}

TEST(PopulateForWriteTest, PagesPastTheFilesEnd_ResourceExhaustedNotSigbus) {
  // A write past the end of the file raises SIGBUS, as a write into a full tmpfs does.
  SharedMapping m(Page());
  ASSERT_NE(m.data, MAP_FAILED);
  void* wide = mmap(nullptr, 4 * Page(), PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
  ASSERT_NE(wide, MAP_FAILED);
  absl::Status status = PopulateForWrite(wide, 4 * Page(), 2);
  munmap(wide, 4 * Page());
  if (absl::IsUnimplemented(status)) GTEST_SKIP() << "kernel before 5.14: " << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
}

TEST(ReserveThreadsTest, ShareOfTheNodeBetweenOneAndEight) {
  EXPECT_EQ(ReserveThreads(2, 1), 2);
  EXPECT_EQ(ReserveThreads(16, 4), 4);
  EXPECT_EQ(ReserveThreads(16, 2), 8);
  EXPECT_EQ(ReserveThreads(64, 1), kMaxReserveThreads);
  EXPECT_EQ(ReserveThreads(2, 4), 1);
  EXPECT_EQ(ReserveThreads(0, 0), 1);
}

}  // namespace
}  // namespace tessera
