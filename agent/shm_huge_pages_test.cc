#include "agent/shm_huge_pages.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr char kNever[] = "always within_size advise [never] deny force\n";

TEST(ShmHugePages, TheMountOptionDecides_TheLastMountOfThePointCounts) {
  const char* mounts =
      "proc /proc proc rw,nosuid 0 0\n"
      "tmpfs /dev/shm tmpfs rw,relatime,size=24684092k 0 0\n"
      "tmpfs /dev/shm tmpfs rw,relatime,size=24684092k,huge=within_size 0 0\n";
  ShmHugePages on = ShmHugePagesFrom(mounts, kNever);
  EXPECT_TRUE(on.on);
  EXPECT_EQ(on.why, "/dev/shm is mounted with huge=within_size");

  ShmHugePages off = ShmHugePagesFrom("tmpfs /dev/shm tmpfs rw,relatime 0 0\n", kNever);
  EXPECT_FALSE(off.on);
  EXPECT_EQ(off.why, "/dev/shm is mounted with huge=never");
  EXPECT_TRUE(ShmHugePagesFrom("tmpfs /dev/shm tmpfs rw,huge=always 0 0", kNever).on);
  // advise needs madvise(MADV_HUGEPAGE), which staging does not do.
  EXPECT_FALSE(ShmHugePagesFrom("tmpfs /dev/shm tmpfs rw,huge=advise 0 0", kNever).on);
}

TEST(ShmHugePages, ShmemEnabledDenyOrForce_OverridesEveryMount) {
  const char* huge_mount = "tmpfs /dev/shm tmpfs rw,huge=within_size 0 0\n";
  ShmHugePages denied =
      ShmHugePagesFrom(huge_mount, "always within_size advise never [deny] force");
  EXPECT_FALSE(denied.on);
  EXPECT_EQ(denied.why, "transparent_hugepage/shmem_enabled is deny");
  EXPECT_TRUE(ShmHugePagesFrom("tmpfs /dev/shm tmpfs rw 0 0\n",
                               "always within_size advise never deny [force]")
                  .on);
  // Unreadable sysfs: the mount decides.
  EXPECT_TRUE(ShmHugePagesFrom(huge_mount, "").on);
}

TEST(ShmHugePages, NotMounted_Off) {
  ShmHugePages none = ShmHugePagesFrom("proc /proc proc rw 0 0\n", kNever);
  EXPECT_FALSE(none.on);
  EXPECT_EQ(none.why, "/dev/shm is not a mount point");
}

}  // namespace
}  // namespace tessera
