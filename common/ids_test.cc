#include "common/ids.h"

#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

TEST(NewIncarnation, NonZeroAndDiffering) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    uint64_t v = NewIncarnation();
    EXPECT_NE(v, 0u);
    seen.insert(v);
  }
  // 1000 draws of 64 random bits: a collision means the source is not random.
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(NewSessionId, Format) {
  std::string id = NewSessionId(1000);
  ASSERT_TRUE(absl::StartsWith(id, "s1000-")) << id;
  std::string hex = id.substr(6);
  ASSERT_EQ(hex.size(), 16u) << id;
  for (char c : hex) {
    EXPECT_TRUE(absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f')) << id;
  }
}

TEST(NewSessionId, ZeroStepAndLargeStep) {
  EXPECT_TRUE(absl::StartsWith(NewSessionId(0), "s0-"));
  std::string big = NewSessionId(std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(absl::StartsWith(big, "s9223372036854775807-")) << big;
  EXPECT_EQ(big.size(), std::string("s9223372036854775807-").size() + 16);
}

TEST(NewSessionId, DiffersPerCall) {
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) ids.insert(NewSessionId(5));
  EXPECT_EQ(ids.size(), 100u);
}

TEST(NewSessionId, UsableInTmpDirName) {
  std::string tmp = TmpDirName(5, NewSessionId(5));
  EXPECT_TRUE(IsTmpDirName(tmp)) << tmp;
  EXPECT_FALSE(ParseStepDirName(tmp).has_value());
}

TEST(StepDirName, ZeroPaddedToNineDigits) {
  EXPECT_EQ(StepDirName(0), "step-000000000");
  EXPECT_EQ(StepDirName(1000), "step-000001000");
  EXPECT_EQ(StepDirName(999999999), "step-999999999");
  EXPECT_EQ(StepDirName(1000000000), "step-1000000000");
  EXPECT_EQ(StepDirName(std::numeric_limits<int64_t>::max()), "step-9223372036854775807");
}

TEST(StepDirName, SortsByStepWithinNineDigits) {
  EXPECT_LT(StepDirName(9), StepDirName(10));
  EXPECT_LT(StepDirName(99999), StepDirName(100000));
}

TEST(ParseStepDirName, RoundTrip) {
  for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{999999999},
                       int64_t{1000000000}, std::numeric_limits<int64_t>::max()}) {
    std::optional<int64_t> parsed = ParseStepDirName(StepDirName(step));
    ASSERT_TRUE(parsed.has_value()) << step;
    EXPECT_EQ(*parsed, step);
  }
}

TEST(ParseStepDirName, Junk_Rejected) {
  for (const char* name :
       {"", "step-", "step", "steps-000000001", "Step-000000001", "step-00000000a",
        "step--00000001", "step-+00000001", "step- 00000001", "step-000000001 ",
        "step-000000001/", "step-000000001.tmp-s1-0123456789abcdef", "step-0x10",
        "step-99999999999999999999", "xstep-000000001", "tmp", "latest", ".step-000000001"}) {
    EXPECT_FALSE(ParseStepDirName(name).has_value()) << '"' << name << '"';
  }
}

TEST(ParseStepDirName, NonCanonicalSpellings_Rejected) {
  // Another spelling of a step would be a second directory for it.
  for (const char* name : {"step-1", "step-00000001", "step-0000000001", "step-01000000000",
                           "step-0"}) {
    EXPECT_FALSE(ParseStepDirName(name).has_value()) << '"' << name << '"';
  }
  EXPECT_FALSE(IsTmpDirName("step-1.tmp-s1-0123456789abcdef"));
}

TEST(TmpDirName, Format) {
  EXPECT_EQ(TmpDirName(1000, "s1000-00000000deadbeef"),
            "step-000001000.tmp-s1000-00000000deadbeef");
}

TEST(IsTmpDirName, AcceptsTmpNames) {
  EXPECT_TRUE(IsTmpDirName(TmpDirName(0, "x")));
  EXPECT_TRUE(IsTmpDirName(TmpDirName(123456789012, "s1-abc")));
  EXPECT_TRUE(IsTmpDirName("step-000000007.tmp-anything"));
}

TEST(IsTmpDirName, RejectsOtherNames) {
  for (const char* name :
       {"", "step-000000007", "step-000000007.tmp-", "step-000000007.tmp", ".tmp-x",
        "step-.tmp-x", "step-abc.tmp-x", "stepx000000007.tmp-x", "foo.tmp-x",
        "step-000000007.TMP-x", "step-000000007-tmp-x"}) {
    EXPECT_FALSE(IsTmpDirName(name)) << '"' << name << '"';
  }
}

TEST(IsValidJobId, Accepts) {
  for (const char* id : {"a", "llama3-70b", "job_1.2", "A-Z_a.z-0", "0", "-leading-dash",
                         "trailing.", "x..y"}) {
    EXPECT_TRUE(IsValidJobId(id)) << '"' << id << '"';
  }
  EXPECT_TRUE(IsValidJobId(std::string(128, 'j')));
}

TEST(IsValidJobId, Rejects) {
  for (const char* id : {"", ".", "..", ".hidden", "a/b", "../x", "a b", "a\tb", "job:1",
                         "job@1", "job#1", "é", "a\\b", "a*"}) {
    EXPECT_FALSE(IsValidJobId(id)) << '"' << id << '"';
  }
  EXPECT_FALSE(IsValidJobId(std::string(129, 'j')));
  EXPECT_FALSE(IsValidJobId(std::string("ab\0cd", 5)));
}

TEST(CheckStorageRoot, TheAgentsOwnRoot_Accepted) {
  EXPECT_TRUE(CheckStorageRoot("/ckpt", "/ckpt").ok());
  EXPECT_TRUE(CheckStorageRoot("/ckpt/", "/ckpt").ok());
  EXPECT_TRUE(CheckStorageRoot("/ckpt", "/ckpt//").ok());
  EXPECT_TRUE(CheckStorageRoot("s3://bucket/ckpt", "s3://bucket/ckpt/").ok());
  // No root of its own: the agent takes the coordinator's.
  EXPECT_TRUE(CheckStorageRoot("", "/anything").ok());
}

TEST(CheckStorageRoot, ARootOutsideTheAgentsOwn_PermissionDeniedNamingBoth) {
  for (const char* received : {"/ckpt/../etc", "/etc", "/ckpt/job", "ckpt", "/ckpt/.", "/",
                               "", "s3://bucket/ckpt"}) {
    const absl::Status s = CheckStorageRoot("/ckpt", received);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << '"' << received << '"';
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("\"", received, "\"")));
    EXPECT_THAT(s.message(), HasSubstr("\"/ckpt\" (--storage_root)"));
  }
}

}  // namespace
}  // namespace tessera
