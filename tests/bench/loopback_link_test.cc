#include "tests/bench/loopback_link.h"

#include <string>
#include <vector>

#include "common/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// Every stream's part of the source, and only it, arrives in the same part of the destination.
class LoopbackLinkTest : public ::testing::TestWithParam<bool> {};

TEST_P(LoopbackLinkTest, EveryStreamDeliversItsPartWhole) {
  constexpr int kStreams = 3;
  constexpr uint64_t kPerStream = (uint64_t{3} << 20) + 17;  // more than one checked piece
  std::string src(kStreams * kPerStream, '\0');
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + i / 4099);
  std::string dst(src.size(), '\x7f');
  LoopbackTransfer transfer;
  transfer.streams = kStreams;
  transfer.bytes_per_stream = kPerStream;
  transfer.src = src.data();
  transfer.dst = dst.data();
  transfer.check = GetParam();
  absl::StatusOr<LoopbackResult> took = TimeLoopbackTransfer(transfer);
  ASSERT_TRUE(took.ok()) << took.status();
  EXPECT_GT(took->elapsed, absl::ZeroDuration());
  EXPECT_TRUE(dst == src);
  // Checking receivers hashed exactly what their stream carried; others hashed nothing.
  std::vector<uint64_t> expected;
  if (GetParam()) {
    for (int i = 0; i < kStreams; ++i)
      expected.push_back(Xxh3(src.data() + i * kPerStream, kPerStream));
  }
  EXPECT_EQ(took->xxh3, expected);
}

INSTANTIATE_TEST_SUITE_P(PlainAndChecked, LoopbackLinkTest, ::testing::Bool());

TEST(LoopbackLink, EndsAtItsTimeoutWithDeadlineExceeded) {
  std::string src(1 << 20, 'x'), dst(src.size(), '\0');
  LoopbackTransfer transfer;
  transfer.streams = 2;
  transfer.bytes_per_stream = src.size() / 2;
  transfer.src = src.data();
  transfer.dst = dst.data();
  // No connection can start: every stream fails at once, and the call returns, not hangs.
  EXPECT_EQ(TimeLoopbackTransfer(transfer, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(LoopbackLink, RejectsNoStreamsAndMissingBuffers) {
  LoopbackTransfer none;
  none.streams = 0;
  EXPECT_EQ(TimeLoopbackTransfer(none).status().code(), absl::StatusCode::kInvalidArgument);
  LoopbackTransfer no_buffers;
  no_buffers.bytes_per_stream = 1;
  absl::Status status = TimeLoopbackTransfer(no_buffers).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("no source or destination"));
}

}  // namespace
}  // namespace tessera
