#include "agent/range_reserver.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "agent/gated_reserve.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(RangeReserverTest, ChunksInOrder_WaitForReturnsOnceItsRangeIsReserved) {
  GatedReserve gate;
  {
    RangeReserver reserver(250, 100, [&](uint64_t o, uint64_t n) { return gate(o, n); });
    gate.Allow(1);
    EXPECT_TRUE(reserver.WaitFor(100).ok());  // the first chunk alone
    EXPECT_EQ(reserver.reserved(), 100u);
    gate.Allow(2);
    EXPECT_TRUE(reserver.WaitFor(1000).ok());  // capped at the total
    EXPECT_EQ(reserver.reserved(), 250u);
    EXPECT_TRUE(reserver.WaitFor(0).ok());
  }
  const std::vector<std::pair<uint64_t, uint64_t>> want = {{0, 100}, {100, 100}, {200, 50}};
  EXPECT_EQ(gate.calls(), want);
}

TEST(RangeReserverTest, Failure_EndsTheReservation_OnlyWritersPastItFail) {
  GatedReserve gate;
  {
    RangeReserver reserver(300, 100, [&](uint64_t o, uint64_t n) { return gate(o, n); });
    gate.Allow(1);
    gate.Allow(1, absl::ResourceExhaustedError("/dev/shm is full"));
    absl::Status past = reserver.WaitFor(150);
    EXPECT_EQ(past.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(past.message(), "/dev/shm is full");
    EXPECT_TRUE(reserver.WaitFor(100).ok()) << "reserved before the failure";
    EXPECT_EQ(reserver.reserved(), 100u);
  }
  EXPECT_EQ(gate.calls().size(), 2u) << "nothing reserved after a failure";
}

TEST(RangeReserverTest, DestroyedWhileAChunkWaits_JoinsWithoutReservingTheRest) {
  GatedReserve gate;
  {
    RangeReserver reserver(1000, 100, [&](uint64_t o, uint64_t n) { return gate(o, n); });
    gate.Allow(1);
    ASSERT_TRUE(reserver.WaitFor(100).ok());
    gate.Close();  // the chunk in progress (or the next) returns; the destructor joins
  }
  EXPECT_LE(gate.calls().size(), 2u);
}

TEST(RangeReserverTest, NothingToReserve_ReadyAtOnce) {
  RangeReserver reserver(0, 100, [](uint64_t, uint64_t) {
    ADD_FAILURE() << "nothing to reserve";
    return absl::OkStatus();
  });
  EXPECT_TRUE(reserver.WaitFor(0).ok());
  EXPECT_TRUE(reserver.WaitFor(10).ok());
}

}  // namespace
}  // namespace tessera
