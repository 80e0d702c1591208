#include "tests/hosts/wire_core.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

WireOptions Options(absl::Duration delay, double loss = 0.0, uint64_t seed = 1,
                    size_t queue_limit = 100000) {
  WireOptions options;
  options.delay = delay;
  options.loss = loss;
  options.seed = seed;
  options.queue_limit = queue_limit;
  return options;
}

TEST(WireCore, Packet_ComesOutOfTheOtherEndAfterTheDelay) {
  WireCore wire(Options(absl::Milliseconds(50)));
  ASSERT_TRUE(wire.Offer(kT0, WireCore::kA, "to b"));
  ASSERT_TRUE(wire.Offer(kT0 + absl::Milliseconds(10), WireCore::kB, "to a"));
  EXPECT_EQ(wire.NextDue(), kT0 + absl::Milliseconds(50));
  EXPECT_TRUE(wire.TakeDue(kT0 + absl::Milliseconds(49)).empty());
  std::vector<WireCore::Delivery> out = wire.TakeDue(kT0 + absl::Milliseconds(50));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to, WireCore::kB);
  EXPECT_EQ(out[0].packet, "to b");
  EXPECT_EQ(wire.NextDue(), kT0 + absl::Milliseconds(60));
  out = wire.TakeDue(kT0 + absl::Seconds(1));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to, WireCore::kA);
  EXPECT_EQ(out[0].packet, "to a");
  EXPECT_EQ(wire.NextDue(), std::nullopt);
  EXPECT_EQ(wire.delivered(), 2u);
}

TEST(WireCore, Packets_LeaveInTheOrderTheyCame) {
  WireCore wire(Options(absl::Milliseconds(5)));
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(wire.Offer(kT0 + absl::Microseconds(i), WireCore::kA, std::to_string(i)));
  }
  std::vector<WireCore::Delivery> out = wire.TakeDue(kT0 + absl::Seconds(1));
  ASSERT_EQ(out.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(out[i].packet, std::to_string(i));
}

TEST(WireCore, Loss_DropsAboutThatFractionAndASeedReplaysThem) {
  const WireOptions options = Options(absl::ZeroDuration(), 0.05, 7);
  WireCore first(options), again(options), other(Options(absl::ZeroDuration(), 0.05, 8));
  constexpr int kPackets = 20000;
  std::vector<bool> kept_first, kept_other;
  for (int i = 0; i < kPackets; ++i) {
    kept_first.push_back(first.Offer(kT0, WireCore::kA, "p"));
    EXPECT_EQ(again.Offer(kT0, WireCore::kA, "p"), kept_first.back()) << "packet " << i;
    kept_other.push_back(other.Offer(kT0, WireCore::kA, "p"));
  }
  // 5 % of 20,000 is 1,000; the binomial's standard deviation is about 31.
  EXPECT_GT(first.dropped(), 850u);
  EXPECT_LT(first.dropped(), 1150u);
  EXPECT_NE(kept_first, kept_other);
  EXPECT_EQ(first.TakeDue(kT0).size(), kPackets - first.dropped());
}

TEST(WireCore, NoLoss_KeepsEveryPacket_FullLoss_NoneOfThem) {
  WireCore keep(Options(absl::ZeroDuration())), lose(Options(absl::ZeroDuration(), 1.0));
  for (int i = 0; i < 1000; ++i) {
    EXPECT_TRUE(keep.Offer(kT0, WireCore::kB, "p"));
    EXPECT_FALSE(lose.Offer(kT0, WireCore::kB, "p"));
  }
  EXPECT_EQ(keep.dropped(), 0u);
  EXPECT_EQ(lose.NextDue(), std::nullopt);
}

TEST(WireCore, FullQueue_DropsWhatComesNext) {
  WireCore wire(Options(absl::Seconds(1), 0.0, 1, 2));
  EXPECT_TRUE(wire.Offer(kT0, WireCore::kA, "1"));
  EXPECT_TRUE(wire.Offer(kT0, WireCore::kA, "2"));
  EXPECT_FALSE(wire.Offer(kT0, WireCore::kA, "3"));
  EXPECT_TRUE(wire.Offer(kT0, WireCore::kB, "the other direction has its own queue"));
  EXPECT_EQ(wire.dropped(), 1u);
}

TEST(WireCore, BadOptions_AreRejectedByName) {
  EXPECT_NE(ValidateWireOptions(Options(absl::Milliseconds(-1))).message().find("delay"),
            std::string::npos);
  EXPECT_NE(ValidateWireOptions(Options(absl::ZeroDuration(), 1.5)).message().find("loss"), std::string::npos);
  EXPECT_NE(ValidateWireOptions(Options(absl::ZeroDuration(), 0.0, 1, 0)).message().find("queue_limit"),
            std::string::npos);
  EXPECT_TRUE(ValidateWireOptions(Options(absl::Milliseconds(50), 0.05)).ok());
}

}  // namespace
}  // namespace tessera
