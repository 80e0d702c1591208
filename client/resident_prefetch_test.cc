#include "client/resident_prefetch.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A shared-memory object of `bytes` bytes, byte i = i * 7 mod 251, as an agent's region.
class Region {
 public:
  explicit Region(uint64_t bytes) : name_(absl::StrCat("/tessera-prefetchtest-", getpid(), "-",
                                                       next_++)), bytes_(bytes) {
    const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(data, MAP_FAILED);
    auto* p = static_cast<unsigned char*>(data);
    for (uint64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 % 251);
    munmap(data, bytes);
    close(fd);
  }
  ~Region() { shm_unlink(name_.c_str()); }

  const std::string& name() const { return name_; }
  uint64_t bytes() const { return bytes_; }

 private:
  static inline int next_ = 0;
  const std::string name_;
  const uint64_t bytes_;
};

// Resident bytes of this process's mapping that starts at `data` (/proc/self/smaps "Rss"):
// the pages actually mapped in, not those merely in the page cache.
uint64_t MappedBytes(const void* data) {
  std::ifstream smaps("/proc/self/smaps");
  char start[32];
  std::snprintf(start, sizeof(start), "%lx-", reinterpret_cast<unsigned long>(data));
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind(start, 0) == 0) {
      in = true;
    } else if (in && line.rfind("Rss:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      uint64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  ADD_FAILURE() << "no mapping at " << data;
  return 0;
}

ResidentPrefetchOptions Chunks(uint64_t chunk_bytes) {
  ResidentPrefetchOptions options;
  options.chunk_bytes = chunk_bytes;
  return options;
}

// Region's blocks of `block` bytes over [0, bytes), with the XXH3 of their contents.
std::vector<BlockCheck> BlocksOf(const Region& region, uint64_t bytes, uint64_t block) {
  std::vector<unsigned char> contents(bytes);
  for (uint64_t i = 0; i < bytes; ++i) contents[i] = static_cast<unsigned char>(i * 7 % 251);
  std::vector<BlockCheck> blocks;
  for (uint64_t at = 0; at < bytes; at += block) {
    const uint64_t n = std::min(block, bytes - at);
    blocks.push_back(BlockCheck{at, n, Xxh3(contents.data() + at, n)});
  }
  return blocks;
}

bool Matches(const MappedStaging& mapping, uint64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(mapping.data());
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != static_cast<unsigned char>(i * 7 % 251)) return false;
  }
  return true;
}

TEST(ResidentPrefetch, FaultsInTheCheckpointsBytesAndHandsOverTheMapping) {
  Region region(8 * kMiB);
  std::unique_ptr<ResidentPrefetch> prefetch =
      ResidentPrefetch::Start(region.name(), region.bytes(), 6 * kMiB, Chunks(kMiB));
  ASSERT_TRUE(prefetch->Wait(absl::Minutes(1)));
  const ResidentPrefetch::Progress progress = prefetch->progress();
  EXPECT_TRUE(progress.status.ok()) << progress.status;
  EXPECT_EQ(progress.bytes, 6 * kMiB);
  EXPECT_EQ(progress.populated_bytes, 6 * kMiB);

  std::unique_ptr<MappedStaging> mapping = prefetch->Take().mapping;
  ASSERT_NE(mapping, nullptr);
  EXPECT_EQ(mapping->name(), region.name());
  EXPECT_EQ(mapping->size(), region.bytes());
  // The checkpoint's 6 MiB are mapped, not the region's last 2 (the kernel's fault-around
  // maps at most 64 KiB beyond).
  const uint64_t mapped = MappedBytes(mapping->data());
  EXPECT_GE(mapped, 6 * kMiB);
  EXPECT_LE(mapped, 6 * kMiB + 64 * 1024);
  EXPECT_TRUE(Matches(*mapping, region.bytes()));
  EXPECT_EQ(prefetch->Take().mapping, nullptr) << "handed over once";
}

TEST(ResidentPrefetch, TakenAtOnce_StopsAndStillHandsOverAUsableMapping) {
  Region region(32 * kMiB);
  std::unique_ptr<ResidentPrefetch> prefetch =
      ResidentPrefetch::Start(region.name(), region.bytes(), region.bytes(), Chunks(4096));
  std::unique_ptr<MappedStaging> mapping = prefetch->Take().mapping;
  ASSERT_NE(mapping, nullptr);
  const ResidentPrefetch::Progress progress = prefetch->progress();
  EXPECT_TRUE(progress.done) << "Take ends it";
  EXPECT_LE(progress.populated_bytes, region.bytes());
  EXPECT_TRUE(Matches(*mapping, region.bytes())) << "the rest faults in as it is read";
}

TEST(ResidentPrefetch, NotTaken_DestructorStopsAndUnmaps) {
  Region region(32 * kMiB);
  // Destroyed while it may still be mapping or populating, a page per call: it stops, joins
  // its thread and unmaps.
  ResidentPrefetch::Start(region.name(), region.bytes(), region.bytes(), Chunks(4096)).reset();
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    EXPECT_EQ(line.find(region.name()), std::string::npos) << "still mapped: " << line;
  }
}

TEST(ResidentPrefetch, ListedBlocks_ThoseThatMatchHandedOverAsChecked) {
  Region region(8 * kMiB);
  std::vector<BlockCheck> listed = BlocksOf(region, 8 * kMiB, kMiB);
  listed[2].xxh3 ^= 1;  // not what the region holds
  // The checkpoint's bytes are its first 6 MiB: blocks 6 and 7 lie beyond them.
  ResidentPrefetchOptions options;
  options.list_blocks = [listed]() -> absl::StatusOr<std::vector<BlockCheck>> { return listed; };
  std::unique_ptr<ResidentPrefetch> prefetch =
      ResidentPrefetch::Start(region.name(), region.bytes(), 6 * kMiB, options);
  ASSERT_TRUE(prefetch->Wait(absl::Minutes(1)));
  const ResidentPrefetch::Progress progress = prefetch->progress();
  EXPECT_TRUE(progress.check_status.ok()) << progress.check_status;
  EXPECT_EQ(progress.populated_bytes, 6 * kMiB);
  EXPECT_EQ(progress.checked_bytes, 5 * kMiB);
  EXPECT_EQ(progress.mismatched_blocks, 1u);

  ResidentPrefetch::Taken taken = prefetch->Take();
  ASSERT_NE(taken.mapping, nullptr);
  std::vector<uint64_t> offsets;
  for (const BlockCheck& block : taken.checked) {
    offsets.push_back(block.offset / kMiB);
    EXPECT_EQ(block.length, kMiB);
    EXPECT_EQ(block.xxh3, listed[block.offset / kMiB].xxh3);
  }
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 1, 3, 4, 5}));
  EXPECT_TRUE(prefetch->Take().checked.empty()) << "handed over once";
}

TEST(ResidentPrefetch, ListingFails_MappedAndFaultedInNothingChecked) {
  Region region(4 * kMiB);
  ResidentPrefetchOptions options;
  options.list_blocks = []() -> absl::StatusOr<std::vector<BlockCheck>> {
    return absl::UnimplementedError("an agent without ListResidentBlocks");
  };
  std::unique_ptr<ResidentPrefetch> prefetch =
      ResidentPrefetch::Start(region.name(), region.bytes(), region.bytes(), options);
  ASSERT_TRUE(prefetch->Wait(absl::Minutes(1)));
  const ResidentPrefetch::Progress progress = prefetch->progress();
  EXPECT_TRUE(progress.status.ok()) << progress.status;
  EXPECT_EQ(progress.check_status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(progress.populated_bytes, region.bytes());
  EXPECT_EQ(progress.checked_bytes, 0u);
  ResidentPrefetch::Taken taken = prefetch->Take();
  ASSERT_NE(taken.mapping, nullptr);
  EXPECT_TRUE(taken.checked.empty());
  EXPECT_TRUE(Matches(*taken.mapping, region.bytes()));
}

TEST(ResidentPrefetch, RegionGone_EndsWithNotFound) {
  std::unique_ptr<ResidentPrefetch> prefetch =
      ResidentPrefetch::Start("/tessera-prefetchtest-no-such-region", 4 * kMiB, 4 * kMiB);
  ASSERT_TRUE(prefetch->Wait(absl::Minutes(1)));
  const ResidentPrefetch::Progress progress = prefetch->progress();
  EXPECT_EQ(progress.status.code(), absl::StatusCode::kNotFound) << progress.status;
  EXPECT_EQ(progress.populated_bytes, 0u);
  EXPECT_EQ(prefetch->Take().mapping, nullptr);
}

TEST(ResidentPrefetch, MoreBytesThanTheRegion_ClippedToIt) {
  Region region(2 * kMiB);
  std::unique_ptr<ResidentPrefetch> prefetch =
      ResidentPrefetch::Start(region.name(), region.bytes(), 64 * kMiB);
  ASSERT_TRUE(prefetch->Wait(absl::Minutes(1)));
  EXPECT_TRUE(prefetch->progress().status.ok());
  EXPECT_EQ(prefetch->progress().bytes, region.bytes());
  EXPECT_EQ(prefetch->progress().populated_bytes, region.bytes());
}

TEST(PopulateRead, UnalignedRange_MapsThePagesItTouches) {
  Region region(4 * kMiB);
  MapStagingOptions options;
  options.read_only = true;
  options.populate = false;
  absl::StatusOr<std::unique_ptr<MappedStaging>> mapping =
      MappedStaging::Map(region.name(), region.bytes(), options);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  const char* data = static_cast<const char*>((*mapping)->data());
  EXPECT_EQ(MappedBytes(data), 0u);
  ASSERT_TRUE(PopulateRead(data + 100, kMiB).ok());
  // Pages 0..256 (the range ends 100 bytes into page 256), plus fault-around at most.
  const uint64_t mapped = MappedBytes(data);
  EXPECT_GE(mapped, kMiB + 4096);
  EXPECT_LE(mapped, kMiB + 4096 + 64 * 1024);
  EXPECT_TRUE(PopulateRead(data, 0).ok());
}

}  // namespace
}  // namespace tessera
