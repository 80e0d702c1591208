#include "tests/bench/loopback_link.h"

#include <string>

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
  absl::StatusOr<absl::Duration> took = TimeLoopbackTransfer(transfer);
  ASSERT_TRUE(took.ok()) << took.status();
  EXPECT_GT(*took, absl::ZeroDuration());
  EXPECT_TRUE(dst == src);
}

INSTANTIATE_TEST_SUITE_P(PlainAndChecked, LoopbackLinkTest, ::testing::Bool());

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
