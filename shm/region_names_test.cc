#include "shm/region_names.h"

#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(StagingRegionName, JobSanitized) {
  EXPECT_EQ(StagingRegionName("a/b c\xff", 3, 1, "", 7), "/tessera-a_b_c_-r3-0000000000000001-7");
}

TEST(StagingRegionName, LoadTagLongJobAndOwner_NamedAsTheContractSays) {
  EXPECT_EQ(StagingRegionName("job", 3, 0xdeadbeef, kLoadRegionTag, 0),
            "/tessera-job-r3-00000000deadbeef-load0");
  // Only the first 64 characters of a job id are kept.
  EXPECT_EQ(StagingRegionPrefix(std::string(64, 'x') + "yz", 0),
            "tessera-" + std::string(64, 'x') + "-r0-");
  EXPECT_EQ(StagingIncarnationPrefix("job", 3, 1), "tessera-job-r3-0000000000000001-");
  EXPECT_EQ(StagingOwnerName("a/b", 2), "/tessera-a_b-r2.owner");
}

TEST(IsStagingRegionRest, OnlyIncarnationDashNumber_SaveOrLoad) {
  EXPECT_TRUE(IsStagingRegionRest("0000000000000009-0"));
  EXPECT_TRUE(IsStagingRegionRest("00000000deadbeef-load12"));
  EXPECT_FALSE(IsStagingRegionRest("notaregion"));
  EXPECT_FALSE(IsStagingRegionRest("0000000000000009-"));
  EXPECT_FALSE(IsStagingRegionRest("0000000000000009-load"));
  EXPECT_FALSE(IsStagingRegionRest("00000000DEADBEEF-0"));  // names are written lower case
  EXPECT_FALSE(IsStagingRegionRest("0000000000000009-1x"));
}

}  // namespace
}  // namespace tessera
