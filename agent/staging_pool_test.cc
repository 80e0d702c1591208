#include "agent/staging_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/cuda_host.h"
#include "shm/mapped_region.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// Job ids unique per test process so parallel test runs never share shm names.
std::string TestJob(const std::string& suffix) {
  return "stagingtest" + std::to_string(getpid()) + "-" + suffix;
}

std::unique_ptr<StagingPool> MakePool(const std::string& job, uint64_t incarnation,
                                      uint64_t budget = 64 * kMiB) {
  StagingPoolOptions options;
  options.job_id = job;
  options.rank = 3;
  options.incarnation = incarnation;
  options.budget_bytes = budget;
  absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

TEST(StagingPool, Acquire_PageAlignedNamedRegions) {
  const std::string job = TestJob("names");
  auto pool = MakePool(job, 0xdeadbeef);
  absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({10000, 0, 4096});
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_EQ(slots->size(), 3u);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < slots->size(); ++i) {
    const StagingSlot& slot = (*slots)[i];
    EXPECT_EQ(reinterpret_cast<uintptr_t>(slot.data) % page, 0u);
    EXPECT_EQ(slot.capacity % page, 0u);
    EXPECT_GE(slot.capacity, std::max<uint64_t>(slot.size, page));
    EXPECT_EQ(slot.name, "/tessera-" + job + "-r3-00000000deadbeef-" + std::to_string(i));
    EXPECT_THAT(slot.name, MatchesRegex("/tessera-.*-r3-00000000deadbeef-[0-9]+"));
    EXPECT_EQ(slot.pinned, GpuAvailable());
    memset(slot.data, 0xab, slot.capacity);  // the whole capacity is writable
  }
  EXPECT_EQ((*slots)[0].size, 10000u);
  EXPECT_EQ(pool->mapped_bytes(),
            (*slots)[0].capacity + (*slots)[1].capacity + (*slots)[2].capacity);
}

// Issue 51: a staging region holds the trainer's model and optimizer state; it is its user's
// alone (0600) whatever the umask, which only ever removes permissions.
TEST(StagingPool, Acquire_RegionsAreTheirUsersAlone) {
  const mode_t umask_before = umask(0);  // the most permissive umask: only the mode asked for
  auto pool = MakePool(TestJob("mode"), 0x600);
  absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({4096, 4096});
  umask(umask_before);
  ASSERT_TRUE(slots.ok()) << slots.status();
  for (const StagingSlot& slot : *slots) {
    struct stat st;
    ASSERT_EQ(stat(("/dev/shm" + slot.name).c_str(), &st), 0) << slot.name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << slot.name;
  }
}

// Bytes of `slot`'s shared-memory object that the file system holds.
uint64_t AllocatedBytes(const StagingSlot& slot) {
  const int fd = shm_open(slot.name.c_str(), O_RDONLY, 0);
  struct stat st;
  const bool ok = fd >= 0 && fstat(fd, &st) == 0;
  if (fd >= 0) close(fd);
  return ok ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

TEST(StagingPool, AcquireReservedByCaller_NothingAllocatedUntilReserveBytes) {
  StagingPoolOptions options;
  options.job_id = TestJob("bycaller");
  options.budget_bytes = 64 * kMiB;
  options = LoadPoolOptions(options);
  absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<std::vector<StagingSlot>> slots =
      (*pool)->Acquire({4 * kMiB}, StagingPool::Reservation::kByCaller);
  ASSERT_TRUE(slots.ok()) << slots.status();
  const StagingSlot& slot = (*slots)[0];
  EXPECT_EQ(AllocatedBytes(slot), 0u);
  ASSERT_TRUE(StagingPool::ReserveBytes(slot, kMiB, 2 * kMiB).ok());
  EXPECT_EQ(AllocatedBytes(slot), 2 * kMiB);
  ASSERT_TRUE(StagingPool::ReserveBytes(slot, 0, slot.capacity).ok());
  EXPECT_EQ(AllocatedBytes(slot), slot.capacity);

  // A plain Acquire reserves at once, as before.
  absl::StatusOr<std::vector<StagingSlot>> now = (*pool)->Acquire({8 * kMiB});
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(AllocatedBytes((*now)[0]), (*now)[0].capacity);

  StagingSlot gone = slot;
  gone.name = "/" + TestJob("no-such-region");
  EXPECT_EQ(StagingPool::ReserveBytes(gone, 0, kMiB).code(), absl::StatusCode::kNotFound);
}

TEST(StagingPool, RegionOfAReservingCaller_ReusedByAPlainAcquire_ReservedWhole) {
  StagingPoolOptions options;
  options.job_id = TestJob("bycaller-reuse");
  options.budget_bytes = 64 * kMiB;
  options = LoadPoolOptions(options);
  absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<std::vector<StagingSlot>> by_caller =
      (*pool)->Acquire({4 * kMiB}, StagingPool::Reservation::kByCaller);
  ASSERT_TRUE(by_caller.ok()) << by_caller.status();
  ASSERT_TRUE(StagingPool::ReserveBytes((*by_caller)[0], 0, kMiB).ok());  // a part only
  ASSERT_EQ(AllocatedBytes((*by_caller)[0]), kMiB);

  absl::StatusOr<std::vector<StagingSlot>> plain = (*pool)->Acquire({4 * kMiB});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)[0].name, (*by_caller)[0].name);  // the same region, reused
  EXPECT_EQ(AllocatedBytes((*plain)[0]), (*plain)[0].capacity);
}

TEST(StagingPool, SecondMapping_SeesSameBytesBothWays) {
  auto pool = MakePool(TestJob("map"), 1);
  absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({64 * kKiB});
  ASSERT_TRUE(slots.ok());
  const StagingSlot& slot = (*slots)[0];
  absl::StatusOr<std::unique_ptr<MappedStaging>> mapped = MapStaging(slot.name, slot.size);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_NE((*mapped)->data(), slot.data);
  EXPECT_EQ((*mapped)->size(), slot.size);
  auto* theirs = static_cast<uint8_t*>((*mapped)->data());
  auto* ours = static_cast<uint8_t*>(slot.data);
  for (uint64_t i = 0; i < slot.size; ++i) theirs[i] = static_cast<uint8_t>(i * 13);
  for (uint64_t i = 0; i < slot.size; i += 997) ASSERT_EQ(ours[i], static_cast<uint8_t>(i * 13));
  ours[5] = 0x42;
  EXPECT_EQ(theirs[5], 0x42);
  // size 0 maps the whole region.
  absl::StatusOr<std::unique_ptr<MappedStaging>> whole = MapStaging(slot.name, 0);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*whole)->size(), slot.capacity);
}

TEST(StagingPool, Acquire_ReusesRegionThatFits_GrowsIntoNewName) {
  auto pool = MakePool(TestJob("reuse"), 2);
  absl::StatusOr<std::vector<StagingSlot>> first = pool->Acquire({1 * kMiB, 256 * kKiB});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(pool->regions_created(), 2u);
  static_cast<char*>((*first)[0].data)[123] = 'x';

  // A smaller save reuses both regions, bytes and all.
  absl::StatusOr<std::vector<StagingSlot>> second = pool->Acquire({512 * kKiB, 256 * kKiB});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(pool->regions_created(), 2u);
  EXPECT_EQ((*second)[0].name, (*first)[0].name);
  EXPECT_EQ((*second)[0].data, (*first)[0].data);
  EXPECT_EQ((*second)[0].size, 512 * kKiB);
  EXPECT_EQ((*second)[0].capacity, 1 * kMiB);
  EXPECT_EQ(static_cast<char*>((*second)[0].data)[123], 'x');

  // Slot 1 grows: new region under a new name; the old name is gone.
  const std::string old_name = (*first)[1].name;
  absl::StatusOr<std::vector<StagingSlot>> third = pool->Acquire({1 * kMiB, 2 * kMiB});
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(pool->regions_created(), 3u);
  EXPECT_EQ((*third)[0].name, (*first)[0].name);
  EXPECT_NE((*third)[1].name, old_name);
  EXPECT_EQ(pool->mapped_bytes(), 3 * kMiB);
  EXPECT_EQ(MapStaging(old_name, 0).status().code(), absl::StatusCode::kNotFound);

  // Fewer slots release the rest.
  absl::StatusOr<std::vector<StagingSlot>> fourth = pool->Acquire({kMiB});
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(pool->mapped_bytes(), 1 * kMiB);
  EXPECT_EQ(MapStaging((*third)[1].name, 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(StagingPool, Acquire_OverBudget_AdmissionDeniedPoolUnchanged) {
  auto pool = MakePool(TestJob("budget"), 3, /*budget=*/1 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> ok = pool->Acquire({512 * kKiB});
  ASSERT_TRUE(ok.ok());

  absl::StatusOr<std::vector<StagingSlot>> big = pool->Acquire({2 * kMiB});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(GetErrorCode(big.status()), v1::ERROR_CODE_ADMISSION_DENIED);
  EXPECT_THAT(big.status().message(), HasSubstr("budget"));

  // Two slots that fit alone but not together.
  absl::StatusOr<std::vector<StagingSlot>> two = pool->Acquire({512 * kKiB, 600 * kKiB});
  EXPECT_EQ(GetErrorCode(two.status()), v1::ERROR_CODE_ADMISSION_DENIED);

  // Refusals left the existing region in place.
  EXPECT_EQ(pool->mapped_bytes(), 512 * kKiB);
  EXPECT_EQ(pool->regions_created(), 1u);
  EXPECT_TRUE(MapStaging((*ok)[0].name, 0).ok());

  // Exactly the budget is admitted.
  EXPECT_TRUE(pool->Acquire({512 * kKiB, 512 * kKiB}).ok());
  EXPECT_EQ(pool->mapped_bytes(), 1 * kMiB);
}

TEST(StagingPool, Retain_SavesAlternateBetweenTwoSets_ResidentBytesKept) {
  auto pool = MakePool(TestJob("retain"), 4);
  absl::StatusOr<std::vector<StagingSlot>> a = pool->Acquire({kMiB});
  ASSERT_TRUE(a.ok());
  memset((*a)[0].data, 'a', kMiB);
  std::vector<ResidentRegion> resident = pool->Retain((*a)[0].acquisition);
  ASSERT_EQ(resident.size(), 1u);
  EXPECT_EQ(resident[0].name, (*a)[0].name);
  EXPECT_EQ(resident[0].data, (*a)[0].data);
  EXPECT_EQ(pool->resident_bytes(), kMiB);

  // The next save stages elsewhere; the resident bytes stay.
  absl::StatusOr<std::vector<StagingSlot>> b = pool->Acquire({kMiB});
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)[0].name, (*a)[0].name);
  memset((*b)[0].data, 'b', kMiB);
  EXPECT_EQ(resident[0].data[kMiB - 1], 'a');
  EXPECT_EQ(pool->mapped_bytes(), 2 * kMiB);

  // Its commit makes it resident; the save after it reuses the first set: two regions ever.
  std::vector<ResidentRegion> next = pool->Retain((*b)[0].acquisition);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].name, (*b)[0].name);
  absl::StatusOr<std::vector<StagingSlot>> c = pool->Acquire({kMiB});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].name, (*a)[0].name);
  EXPECT_EQ(pool->regions_created(), 2u);
  // a's copy stopped being resident at b's Retain: its holds expired, though its region lives
  // on as this save's (a load asking for it now gets nothing and reads the disk).
  EXPECT_TRUE(resident[0].hold.expired());
  EXPECT_EQ(next[0].data[0], 'b');

  // A region a load still holds is not handed to a save: a new one is made.
  std::shared_ptr<const void> reading = next[0].hold.lock();  // a load of b's step, in flight
  ASSERT_NE(reading, nullptr);
  ASSERT_EQ(pool->Retain((*c)[0].acquisition).size(), 1u);  // c (= a's region) resident
  absl::StatusOr<std::vector<StagingSlot>> d = pool->Acquire({kMiB});
  ASSERT_TRUE(d.ok());
  EXPECT_NE((*d)[0].name, (*b)[0].name);
  EXPECT_EQ(pool->regions_created(), 3u);
  memset((*d)[0].data, 'd', kMiB);  // the save writes its staging
  EXPECT_EQ(next[0].data[0], 'b');  // untouched under the reader
  reading.reset();
  EXPECT_TRUE(next[0].hold.expired());  // b's copy ended with its last reader
}

TEST(StagingPool, Prepare_NextSetMadeAheadBesideTheResidentOne_NeverDropsIt) {
  auto pool = MakePool(TestJob("prepare"), 7, /*budget=*/3 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> a = pool->Acquire({kMiB});
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(pool->Retain((*a)[0].acquisition).size(), 1u);
  EXPECT_TRUE(pool->Prepare({kMiB}));
  EXPECT_EQ(pool->regions_created(), 2u);
  EXPECT_EQ(pool->mapped_bytes(), 2 * kMiB);
  // The next save finds it ready: no region is created on its time.
  absl::StatusOr<std::vector<StagingSlot>> b = pool->Acquire({kMiB});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool->regions_created(), 2u);
  EXPECT_NE((*b)[0].name, (*a)[0].name);
  // The next set exists (a's region) but is too small: it is never replaced here (a save may
  // be staging in it); the save that needs more makes its own.
  ASSERT_EQ(pool->Retain((*b)[0].acquisition).size(), 1u);
  EXPECT_FALSE(pool->Prepare({2 * kMiB}));
  EXPECT_EQ(pool->regions_created(), 2u);
  EXPECT_EQ(pool->mapped_bytes(), 2 * kMiB);
}

TEST(StagingPool, Prepare_NoRoomBesideTheResidentSet_NothingMadeNothingDropped) {
  auto pool = MakePool(TestJob("prepfull"), 8, /*budget=*/3 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> a = pool->Acquire({kMiB});
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(pool->Retain((*a)[0].acquisition).size(), 1u);
  EXPECT_FALSE(pool->Prepare({2 * kMiB + 1}));
  EXPECT_EQ(pool->regions_created(), 1u);
  EXPECT_EQ(pool->resident_bytes(), kMiB);
  EXPECT_EQ(pool->resident_evictions(), 0u);
}

TEST(StagingPool, Reserve_BothSetsMadeAhead_NoSaveCreatesARegion) {
  auto pool = MakePool(TestJob("reserve"), 9, /*budget=*/8 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> reserved = pool->Reserve(kMiB - 100, 2);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  ASSERT_EQ(reserved->size(), 2u);
  EXPECT_NE((*reserved)[0].name, (*reserved)[1].name);
  EXPECT_EQ((*reserved)[0].capacity, kMiB);
  EXPECT_EQ(pool->regions_created(), 2u);
  EXPECT_EQ(pool->mapped_bytes(), 2 * kMiB);
  EXPECT_EQ(pool->resident_bytes(), 0u);  // the spare set holds no checkpoint

  // Saves alternate between the two reserved regions; none is created on a save's time.
  const std::string names[] = {(*reserved)[0].name, (*reserved)[1].name};
  for (int save = 0; save < 4; ++save) {
    absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({kMiB - 4096});
    ASSERT_TRUE(slots.ok()) << slots.status();
    EXPECT_EQ((*slots)[0].name, names[save % 2]) << "save " << save;
    ASSERT_EQ(pool->Retain((*slots)[0].acquisition).size(), 1u);
  }
  EXPECT_EQ(pool->regions_created(), 2u);

  // Reserving again makes nothing: both sets exist (one resident).
  absl::StatusOr<std::vector<StagingSlot>> again = pool->Reserve(kMiB, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->size(), 2u);
  EXPECT_EQ(pool->regions_created(), 2u);
}

TEST(StagingPool, Reserve_NeverReplacesARegion_AdmittedAgainstTheBudget) {
  auto pool = MakePool(TestJob("reserve2"), 10, /*budget=*/4 * kMiB);
  EXPECT_EQ(pool->Reserve(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Reserve(kMiB, 3).status().code(), absl::StatusCode::kInvalidArgument);
  // Over the budget: refused, nothing made.
  absl::Status over = pool->Reserve(5 * kMiB, 1).status();
  EXPECT_EQ(GetErrorCode(over), v1::ERROR_CODE_ADMISSION_DENIED);
  EXPECT_THAT(over.message(), HasSubstr("host-RAM budget of rank 3"));
  EXPECT_EQ(pool->regions_created(), 0u);

  // A save stages in a 1 MiB region: a larger reservation leaves it where it is (the save's
  // slot pointers stay valid) and makes only the spare set.
  absl::StatusOr<std::vector<StagingSlot>> save = pool->Acquire({kMiB});
  ASSERT_TRUE(save.ok());
  absl::StatusOr<std::vector<StagingSlot>> reserved = pool->Reserve(2 * kMiB, 2);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  ASSERT_EQ(reserved->size(), 2u);
  EXPECT_EQ((*reserved)[0].name, (*save)[0].name);
  EXPECT_EQ((*reserved)[0].data, (*save)[0].data);
  EXPECT_EQ((*reserved)[1].capacity, 2 * kMiB);
  EXPECT_EQ(pool->mapped_bytes(), 3 * kMiB);
}

TEST(StagingPool, Reserve_SpareOnlyWhereItFits_NeverBesideOrInsteadOfAResidentSet) {
  auto pool = MakePool(TestJob("reserve3"), 12, /*budget=*/3 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> reserved = pool->Reserve(2 * kMiB, 2);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(reserved->size(), 1u);  // a second 2 MiB set does not fit in 3 MiB
  EXPECT_EQ(pool->mapped_bytes(), 2 * kMiB);

  // A committed save resident, the next set empty and no room for it: refused, resident kept.
  absl::StatusOr<std::vector<StagingSlot>> save = pool->Acquire({2 * kMiB});
  ASSERT_TRUE(save.ok());
  ASSERT_EQ(pool->Retain((*save)[0].acquisition).size(), 1u);
  EXPECT_EQ(GetErrorCode(pool->Reserve(2 * kMiB, 2).status()), v1::ERROR_CODE_ADMISSION_DENIED);
  EXPECT_EQ(pool->resident_bytes(), 2 * kMiB);
  EXPECT_EQ(pool->resident_evictions(), 0u);
}

TEST(StagingPool, Acquire_OutgrowsTheReservation_SpareDroppedNextSetPreparedAtTheNewSize) {
  auto pool = MakePool(TestJob("outgrow"), 13, /*budget=*/16 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> reserved = pool->Reserve(kMiB, 2);
  ASSERT_TRUE(reserved.ok());
  // A DP leader's save also receives its peers' slices: larger than reserved.
  absl::StatusOr<std::vector<StagingSlot>> first = pool->Acquire({2 * kMiB});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(pool->mapped_bytes(), 2 * kMiB);  // neither 1 MiB reserved region is kept
  ASSERT_EQ(pool->Retain((*first)[0].acquisition).size(), 1u);
  // After its commit the next set is made at the save's size, off the trainer's time...
  EXPECT_TRUE(pool->Prepare({2 * kMiB}));
  const uint64_t created = pool->regions_created();
  // ...so the second save creates nothing.
  absl::StatusOr<std::vector<StagingSlot>> second = pool->Acquire({2 * kMiB});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(pool->regions_created(), created);
  EXPECT_NE((*second)[0].name, (*first)[0].name);
}

TEST(StagingPool, Acquire_NoRoomBesideTheSpareSet_DropsItBeforeAnythingElse) {
  auto pool = MakePool(TestJob("spare"), 11, /*budget=*/2 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> reserved = pool->Reserve(kMiB, 2);
  ASSERT_TRUE(reserved.ok());
  // The first save outgrew the reservation (a DP leader's peers' slices): it needs a larger
  // region, which fits only without the spare set.
  absl::StatusOr<std::vector<StagingSlot>> save = pool->Acquire({kMiB + kMiB / 2});
  ASSERT_TRUE(save.ok()) << save.status();
  EXPECT_NE((*save)[0].name, (*reserved)[0].name);
  EXPECT_EQ(pool->mapped_bytes(), kMiB + kMiB / 2);
  EXPECT_EQ(MapStaging((*reserved)[1].name, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool->resident_evictions(), 0u);
}

TEST(StagingPool, Retain_AfterALaterAcquireOrRelease_Refused) {
  auto pool = MakePool(TestJob("retainlate"), 5);
  absl::StatusOr<std::vector<StagingSlot>> first = pool->Acquire({kMiB});
  ASSERT_TRUE(first.ok());
  absl::StatusOr<std::vector<StagingSlot>> second = pool->Acquire({kMiB});
  ASSERT_TRUE(second.ok());
  // The same region, handed out again: its bytes are the second save's.
  EXPECT_EQ((*second)[0].name, (*first)[0].name);
  EXPECT_TRUE(pool->Retain((*first)[0].acquisition).empty());
  EXPECT_EQ(pool->resident_bytes(), 0u);

  pool->ReleaseAll();
  EXPECT_TRUE(pool->Retain((*second)[0].acquisition).empty());
  EXPECT_EQ(pool->mapped_bytes(), 0u);
}

TEST(StagingPool, Acquire_NoRoomBesideTheResidentSet_DropsIt) {
  auto pool = MakePool(TestJob("evict"), 6, /*budget=*/1 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> a = pool->Acquire({512 * kKiB});
  ASSERT_TRUE(a.ok());
  std::vector<ResidentRegion> resident = pool->Retain((*a)[0].acquisition);
  ASSERT_EQ(resident.size(), 1u);

  // Fits beside it: kept.
  absl::StatusOr<std::vector<StagingSlot>> b = pool->Acquire({512 * kKiB});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool->resident_evictions(), 0u);
  EXPECT_FALSE(resident[0].hold.expired());

  // Does not: the resident set goes, the save is admitted.
  memset((*a)[0].data, 'r', 512 * kKiB);
  std::shared_ptr<const void> reading = resident[0].hold.lock();  // a load in flight
  absl::StatusOr<std::vector<StagingSlot>> big = pool->Acquire({768 * kKiB});
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(pool->resident_evictions(), 1u);
  EXPECT_EQ(pool->resident_bytes(), 0u);
  EXPECT_EQ(pool->mapped_bytes(), 768 * kKiB);
  // The load still reads the dropped region; when it ends, the region is unlinked and freed.
  EXPECT_EQ(resident[0].data[512 * kKiB - 1], 'r');
  reading.reset();
  EXPECT_TRUE(resident[0].hold.expired());
  EXPECT_EQ(MapStaging(resident[0].name, 0).status().code(), absl::StatusCode::kNotFound);

  // A save larger than the budget is still refused.
  EXPECT_EQ(GetErrorCode(pool->Acquire({2 * kMiB}).status()), v1::ERROR_CODE_ADMISSION_DENIED);
}

// A budget of one set: each save drops the resident set, and stages in its region (the
// trainer mapped and pinned it already) rather than in a new one, unless a load reads it.
TEST(StagingPool, Acquire_OneSetFits_DroppedResidentRegionReusedUnlessALoadReadsIt) {
  auto pool = MakePool(TestJob("oneset"), 11, /*budget=*/1 * kMiB);
  absl::StatusOr<std::vector<StagingSlot>> first = pool->Acquire({768 * kKiB});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string name = (*first)[0].name;
  std::vector<ResidentRegion> resident = pool->Retain((*first)[0].acquisition);
  ASSERT_EQ(resident.size(), 1u);

  for (int save = 1; save <= 3; ++save) {
    absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({768 * kKiB});
    ASSERT_TRUE(slots.ok()) << slots.status();
    EXPECT_EQ((*slots)[0].name, name) << "save " << save;
    EXPECT_EQ(pool->resident_evictions(), static_cast<uint64_t>(save));
    EXPECT_EQ(pool->mapped_bytes(), 768 * kKiB);
    // The copy is gone for its readers (the memory tier sees it dropped), though the region
    // lives on as this save's.
    EXPECT_TRUE(resident[0].hold.expired()) << "save " << save;
    EXPECT_EQ(pool->resident_bytes(), 0u);
    resident = pool->Retain((*slots)[0].acquisition);
    ASSERT_EQ(resident.size(), 1u);
    EXPECT_FALSE(resident[0].hold.expired());
  }
  EXPECT_EQ(pool->regions_created(), 1u);

  // A load reads the resident region: the save stages in a new region, never under it.
  absl::StatusOr<std::vector<StagingSlot>> held = pool->Acquire({768 * kKiB});
  ASSERT_TRUE(held.ok());
  resident = pool->Retain((*held)[0].acquisition);
  ASSERT_EQ(resident.size(), 1u);
  std::shared_ptr<const void> reading = resident[0].hold.lock();
  absl::StatusOr<std::vector<StagingSlot>> next = pool->Acquire({768 * kKiB});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE((*next)[0].name, resident[0].name);
  EXPECT_EQ(pool->regions_created(), 2u);
}

TEST(StagingPool, Create_BudgetBelowOnePage_Rejected) {
  StagingPoolOptions options;
  options.budget_bytes = 100;
  EXPECT_EQ(StagingPool::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.budget_bytes = 0;  // no default here: the agent resolves it (memory_budgets.h)
  EXPECT_EQ(StagingPool::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StagingPool, Incarnations_NamesUniqueAndCoexist) {
  const std::string job = TestJob("inc");
  auto old_life = MakePool(job, 0x1111);
  auto new_life = MakePool(job, 0x2222);
  absl::StatusOr<std::vector<StagingSlot>> a = old_life->Acquire({4096, 4096});
  absl::StatusOr<std::vector<StagingSlot>> b = new_life->Acquire({4096, 4096});
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok()) << b.status();
  for (const StagingSlot& x : *a) {
    for (const StagingSlot& y : *b) EXPECT_NE(x.name, y.name);
  }
  static_cast<char*>((*a)[0].data)[0] = 'o';
  static_cast<char*>((*b)[0].data)[0] = 'n';
  EXPECT_EQ(static_cast<char*>((*a)[0].data)[0], 'o');
}

TEST(StagingPool, Destruction_UnlinksRegions) {
  std::string name;
  {
    auto pool = MakePool(TestJob("dtor"), 4);
    absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({8192});
    ASSERT_TRUE(slots.ok());
    name = (*slots)[0].name;
    EXPECT_TRUE(MapStaging(name, 8192).ok());
  }
  absl::StatusOr<std::unique_ptr<MappedStaging>> mapped = MapStaging(name, 8192);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetErrorCode(mapped.status()), v1::ERROR_CODE_IO_ERROR);
  EXPECT_THAT(mapped.status().message(), HasSubstr(name));
}

TEST(StagingPool, ReleaseAll_UnmapsEverything) {
  auto pool = MakePool(TestJob("release"), 5);
  absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({8192, 8192});
  ASSERT_TRUE(slots.ok());
  pool->ReleaseAll();
  EXPECT_EQ(pool->mapped_bytes(), 0u);
  EXPECT_EQ(MapStaging((*slots)[1].name, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(pool->Acquire({8192}).ok());
  EXPECT_EQ(pool->regions_created(), 3u);
}

TEST(StagingPool, MappingHeldByTrainer_SurvivesAgentRelease) {
  auto pool = MakePool(TestJob("survive"), 6);
  absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({4096});
  ASSERT_TRUE(slots.ok());
  absl::StatusOr<std::unique_ptr<MappedStaging>> mapped = MapStaging((*slots)[0].name, 4096);
  ASSERT_TRUE(mapped.ok());
  pool->ReleaseAll();
  static_cast<char*>((*mapped)->data())[4095] = 'z';  // still mapped: no crash
  EXPECT_EQ(static_cast<char*>((*mapped)->data())[4095], 'z');
}

TEST(StagingPool, ForkedChild_MapsByNameAndWrites_ParentSees) {
  auto pool = MakePool(TestJob("fork"), 8);
  absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({256 * kKiB});
  ASSERT_TRUE(slots.ok());
  const StagingSlot slot = (*slots)[0];
  memset(slot.data, 0, slot.size);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child stands in for the trainer: a separate process that knows only the name.
    absl::StatusOr<std::unique_ptr<MappedStaging>> mapped = MapStaging(slot.name, slot.size);
    if (!mapped.ok()) _exit(2);
    auto* p = static_cast<uint8_t*>((*mapped)->data());
    for (uint64_t i = 0; i < slot.size; ++i) p[i] = static_cast<uint8_t>((i * 31) ^ 0x5a);
    mapped->reset();
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);
  const auto* p = static_cast<const uint8_t*>(slot.data);
  for (uint64_t i = 0; i < slot.size; ++i) {
    ASSERT_EQ(p[i], static_cast<uint8_t>((i * 31) ^ 0x5a)) << "byte " << i;
  }
}

TEST(StagingPool, RemoveStaleRegions_RemovesOtherIncarnationsOnly) {
  const std::string job = TestJob("stale");
  // A region leaked by a crashed previous incarnation (created by hand: a pool would unlink).
  const std::string leaked = "/tessera-" + job + "-r3-0000000000000009-0";
  int fd = shm_open(leaked.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  // And a load region of that incarnation (agent_main's load pool, LoadPoolOptions).
  const std::string leaked_load = "/tessera-" + job + "-r3-0000000000000009-load0";
  fd = shm_open(leaked_load.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  // Another rank's region and a same-prefix non-region object must survive.
  const std::string other_rank = "/tessera-" + job + "-r4-0000000000000009-0";
  const std::string odd = "/tessera-" + job + "-r3-notaregion";
  for (const std::string& name : {other_rank, odd}) {
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 4096), 0);
    close(fd);
  }
  auto pool = MakePool(job, 10);
  absl::StatusOr<std::vector<StagingSlot>> slots = pool->Acquire({4096});
  ASSERT_TRUE(slots.ok());

  absl::StatusOr<int> removed = StagingPool::RemoveStaleRegions(job, 3, 10);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_EQ(MapStaging(leaked, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MapStaging(leaked_load, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MapStaging((*slots)[0].name, 0).ok());
  EXPECT_TRUE(MapStaging(other_rank, 0).ok());
  EXPECT_TRUE(MapStaging(odd, 0).ok());
  shm_unlink(other_rank.c_str());
  shm_unlink(odd.c_str());
}

// Region names keep the first 64 characters of the job id (ids may have 128): the load
// pool's names must differ from the save pool's by more than the job id.
TEST(LoadPoolOptionsTest, LongJobId_LoadRegionsNamedApartFromSaveRegions) {
  const std::string job = TestJob("long") + std::string(90, 'x');
  std::unique_ptr<StagingPool> save = MakePool(job, 5);
  ASSERT_NE(save, nullptr);
  StagingPoolOptions options;
  options.job_id = job;
  options.rank = 3;
  options.incarnation = 5;
  options.budget_bytes = 64 * kMiB;
  absl::StatusOr<std::unique_ptr<StagingPool>> load =
      StagingPool::Create(LoadPoolOptions(options));
  ASSERT_TRUE(load.ok()) << load.status();
  absl::StatusOr<std::vector<StagingSlot>> saved = save->Acquire({4096});
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<std::vector<StagingSlot>> loaded = (*load)->Acquire({4096});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_NE((*saved)[0].name, (*loaded)[0].name);
}

TEST(LoadPoolOptionsTest, NamedApartNeverPinnedNotPopulated_TheRestKept) {
  StagingPoolOptions save;
  save.job_id = "job";
  save.rank = 3;
  save.incarnation = 7;
  save.budget_bytes = uint64_t{1} << 30;
  save.pin = true;
  save.populate = true;
  const StagingPoolOptions load = LoadPoolOptions(save);
  EXPECT_EQ(load.job_id, "job");
  EXPECT_EQ(load.kind, StagingPoolOptions::Kind::kLoad);
  EXPECT_FALSE(load.pin);
  EXPECT_FALSE(load.populate);
  EXPECT_TRUE(load.reserve);
  EXPECT_EQ(load.rank, 3u);
  EXPECT_EQ(load.incarnation, 7u);
  EXPECT_EQ(load.budget_bytes, uint64_t{1} << 30);
}

}  // namespace
}  // namespace tessera
