// MappedStaging against regions made here by hand, as an agent makes them: this package knows
// no pool (agent/staging_pool_test.cc maps a pool's own regions).
#include "shm/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// A region of `bytes`, created and mapped read-write as the agent's pool does; unmapped and
// unlinked on destruction. Named per test process so parallel runs never share a name.
class AgentRegion {
 public:
  AgentRegion(const std::string& suffix, uint64_t bytes)
      : name_("/shmtest" + std::to_string(getpid()) + "-" + suffix), bytes_(bytes) {
    const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return;
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (data != MAP_FAILED) data_ = static_cast<char*>(data);
    }
    close(fd);
  }
  ~AgentRegion() {
    if (data_ != nullptr) munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  AgentRegion(const AgentRegion&) = delete;
  AgentRegion& operator=(const AgentRegion&) = delete;

  const std::string& name() const { return name_; }
  char* data() const { return data_; }  // null if the region could not be made

 private:
  const std::string name_;
  const uint64_t bytes_;
  char* data_ = nullptr;
};

TEST(MappedStaging, ReadOnlyUnpopulatedMapping_SeesTheBytesAndRefusesWrites) {
  AgentRegion region("ro", 3 * 4096);
  ASSERT_NE(region.data(), nullptr) << region.name();
  char* agent_side = region.data();
  for (int i = 0; i < 3 * 4096; ++i) agent_side[i] = static_cast<char>(i * 7);
  MapStagingOptions options;
  options.read_only = true;
  options.populate = false;
  absl::StatusOr<std::unique_ptr<MappedStaging>> mapped =
      MappedStaging::Map(region.name(), 3 * 4096, options);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const char* reader = static_cast<const char*>((*mapped)->data());
  for (int i = 0; i < 3 * 4096; ++i) ASSERT_EQ(reader[i], static_cast<char>(i * 7)) << i;
  // The mapping really is read-only: a write faults (checked in a child process).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    static_cast<volatile char*>((*mapped)->data())[0] = 1;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << "status " << status;
}

TEST(MapStaging, BadNameOrTooSmall_Errors) {
  EXPECT_EQ(MapStaging("no-slash", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MapStaging("/tessera-does-not-exist-at-all", 1).status().code(),
            absl::StatusCode::kNotFound);
  AgentRegion region("small", 4096);
  ASSERT_NE(region.data(), nullptr) << region.name();
  absl::StatusOr<std::unique_ptr<MappedStaging>> mapped = MapStaging(region.name(), 4096 + 1);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tessera
