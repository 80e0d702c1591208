#include "client/cli/format_util.h"

#include <cstdint>
#include <limits>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tessera {
namespace cli {
namespace {

TEST(FormatBytes, Units_OneDecimalAboveKiB) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3ull << 30), "3.0 GiB");
  EXPECT_EQ(FormatBytes((5ull << 40) + (1ull << 39)), "5.5 TiB");
  EXPECT_EQ(FormatBytes(std::numeric_limits<uint64_t>::max()), "16.0 EiB");
}

TEST(FormatBytes, JustBelowNextUnit_RoundsIntoIt) {
  // 1048575 B is 1023.999 KiB: "1024.0 KiB" would be odd.
  EXPECT_EQ(FormatBytes((1ull << 20) - 1), "1.0 MiB");
}

TEST(HumanDuration, EachRange) {
  EXPECT_EQ(HumanDuration(absl::ZeroDuration()), "0s");
  EXPECT_EQ(HumanDuration(absl::Microseconds(850)), "850us");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(12)), "12ms");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(1250)), "1.2s");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(59999)), "59.9s");
  EXPECT_EQ(HumanDuration(absl::Seconds(125)), "2m05s");
  EXPECT_EQ(HumanDuration(absl::Minutes(187)), "3h07m");
  EXPECT_EQ(HumanDuration(absl::Milliseconds(-1500)), "-1.5s");
}

TEST(FormatUnixMs, Utc_ZeroIsUnset) {
  EXPECT_EQ(FormatUnixMs(0), "-");
  EXPECT_EQ(FormatUnixMs(1700000000123), "2023-11-14 22:13:20Z");
}

TEST(FormatPercent, RoundsDown_ZeroTotal) {
  EXPECT_EQ(FormatPercent(0, 0), "0%");
  EXPECT_EQ(FormatPercent(52, 100), "52%");
  EXPECT_EQ(FormatPercent(999, 1000), "99%");
  EXPECT_EQ(FormatPercent(1000, 1000), "100%");
  EXPECT_EQ(FormatPercent(2000, 1000), "100%");
  // No overflow in done * 100.
  const uint64_t big = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(FormatPercent(big / 2, big), "49%");
}

TEST(ProgressBar, FillsInProportion) {
  EXPECT_EQ(ProgressBar(0, 0, 4), "[----]");
  EXPECT_EQ(ProgressBar(1, 2, 4), "[##--]");
  EXPECT_EQ(ProgressBar(99, 100, 10), "[#########-]");
  EXPECT_EQ(ProgressBar(100, 100, 10), "[##########]");
  EXPECT_EQ(ProgressBar(5, 10, 0), "[-]") << "width is at least 1";
}

TEST(FormatShape, ZeroDAndND) {
  EXPECT_EQ(FormatShape({}), "[]");
  EXPECT_EQ(FormatShape({8, 12}), "[8, 12]");
}

TEST(EnumNames, PrefixStripped_UnspecifiedDash) {
  EXPECT_EQ(StateName(v1::SESSION_STATE_PERSISTING), "PERSISTING");
  EXPECT_EQ(StateName(v1::SESSION_STATE_UNSPECIFIED), "-");
  EXPECT_EQ(StateName(static_cast<v1::SessionState>(99)), "99");
  EXPECT_EQ(KindName(v1::SHARD_KIND_OPTIMIZER), "optimizer");
  EXPECT_EQ(KindName(v1::SHARD_KIND_UNSPECIFIED), "-");
}

}  // namespace
}  // namespace cli
}  // namespace tessera
