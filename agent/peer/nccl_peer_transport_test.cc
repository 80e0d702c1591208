// The NCCL path needs GPUs: each test skips when the machine lacks what it needs. Two ranks
// of one NCCL communicator cannot share a GPU (NCCL rejects it: "Duplicate GPU detected"), so
// the two-rank gathers need two devices; the single-rank tests (cancellation, deadline) need
// one. Without a GPU only the FailedPrecondition fallback is checked.
#include "agent/peer/nccl_peer_transport.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/peer/gather_fixture_test_util.h"
#include "cuda_runtime_api.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using testing::AllRecvs;
using testing::AllSends;
using testing::DpBox;

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// Stands in for Coordinator.ExchangePeerId: the first member posts a fresh id, the others
// wait for it.
class TestBroker {
 public:
  explicit TestBroker(std::vector<uint32_t> members) : members_(std::move(members)) {}

  NcclGroupBroker ForRank(uint32_t rank) {
    return [this, rank](const std::string& /*session*/, const NcclUniqueIdFactory& new_id,
                        absl::Time deadline) -> absl::StatusOr<NcclGroup> {
      absl::MutexLock lock(&mu_);
      if (rank == members_.front()) {
        absl::StatusOr<std::string> id = new_id();
        if (!id.ok()) return id.status();
        id_ = *id;
      } else if (!mu_.AwaitWithDeadline(
                     absl::Condition(+[](std::string* id) { return !id->empty(); }, &id_),
                     deadline)) {
        return absl::DeadlineExceededError("the group leader did not post an id");
      }
      if (!returned_.HasBeenNotified()) returned_.Notify();  // both ranks get here
      return NcclGroup{id_, members_};
    };
  }

  // Notified once a broker call has returned the group.
  absl::Notification& returned() { return returned_; }

 private:
  const std::vector<uint32_t> members_;
  absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);
  absl::Notification returned_;
};

NcclPeerTransportOptions Options(uint32_t rank, TestBroker& broker) {
  NcclPeerTransportOptions options;
  options.rank = rank;
  options.device = DeviceCount() > 1 ? static_cast<int>(rank) : 0;
  options.broker = broker.ForRank(rank);
  options.chunk_bytes = 1 << 20;  // several rounds for a few MiB
  return options;
}

absl::Time Later() { return absl::Now() + absl::Seconds(120); }

TEST(NcclPeerTransport, NoGpu_Exchange_FailedPrecondition) {
  if (NcclAvailable()) GTEST_SKIP() << "a GPU is present";
  TestBroker broker({0, 1});
  NcclPeerTransport transport(Options(0, broker));
  EXPECT_EQ(transport.Exchange("s", {}, {}, Later()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(NcclPeerTransport, TwoRanks_GatherBothDirections_BoxesExact) {
  if (!NcclAvailable() || DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  TestBroker broker({0, 1});
  NcclPeerTransport t0(Options(0, broker));
  NcclPeerTransport t1(Options(1, broker));
  DpBox a(1, "a", Box{{0, 0}, {1024, 1000}}, 4, {0, 1}, /*leader=*/0);  // ~4 MB
  DpBox b(2, "b", Box{{0}, {700001}}, 2, {0, 1}, /*leader=*/1);
  DpBox c(3, "c", Box{{0}, {1000}}, 4, {0, 1}, /*leader=*/1, /*empty_rank_index=*/0);
  std::vector<DpBox*> boxes = {&a, &b, &c};
  absl::Status s0, s1;
  std::thread r0([&] { s0 = t0.Exchange("s", AllSends(boxes, 0), AllRecvs(boxes, 0), Later()); });
  std::thread r1([&] { s1 = t1.Exchange("s", AllSends(boxes, 1), AllRecvs(boxes, 1), Later()); });
  r0.join();
  r1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_TRUE(a.leader_slot() == a.expected());
  EXPECT_TRUE(b.leader_slot() == b.expected());
  EXPECT_TRUE(c.leader_slot() == c.expected());
}

TEST(NcclPeerTransport, TwoRanks_SizeMismatch_BothInvalidArgumentNothingWritten) {
  if (!NcclAvailable() || DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  TestBroker broker({0, 1});
  NcclPeerTransport t0(Options(0, broker));
  NcclPeerTransport t1(Options(1, broker));
  DpBox box(4, "k", Box{{0}, {100000}}, 4, {0, 1}, /*leader=*/1);
  std::vector<SliceSend> sends = box.Sends(0);
  ASSERT_EQ(sends.size(), 1u);
  sends[0].nbytes -= 4;
  const std::string before = box.leader_slot();
  absl::Status s0, s1;
  std::thread r0([&] { s0 = t0.Exchange("s", sends, {}, Later()); });
  std::thread r1([&] { s1 = t1.Exchange("s", {}, box.Recvs(1), Later()); });
  r0.join();
  r1.join();
  EXPECT_EQ(s0.code(), absl::StatusCode::kInvalidArgument) << s0;
  EXPECT_EQ(s1.code(), absl::StatusCode::kInvalidArgument) << s1;
  EXPECT_TRUE(box.leader_slot() == before);
}

TEST(NcclPeerTransport, Cancel_PeerNeverJoins_AbortedPromptly) {
  if (!NcclAvailable()) GTEST_SKIP() << "needs a GPU";
  TestBroker broker({0, 1});
  NcclPeerTransport t0(Options(0, broker));
  DpBox box(5, "k", Box{{0}, {1000}}, 4, {0, 1}, /*leader=*/0);
  absl::Status status;
  std::thread r0([&] { status = t0.Exchange("s", {}, box.Recvs(0), Later()); });
  broker.returned().WaitForNotification();  // rank 0 is creating the communicator, alone
  const absl::Time start = absl::Now();
  t0.CancelSession("s");
  r0.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

TEST(NcclPeerTransport, Deadline_PeerNeverJoins_DeadlineExceeded) {
  if (!NcclAvailable()) GTEST_SKIP() << "needs a GPU";
  TestBroker broker({0, 1});
  NcclPeerTransport t0(Options(0, broker));
  DpBox box(6, "k", Box{{0}, {1000}}, 4, {0, 1}, /*leader=*/0);
  EXPECT_EQ(t0.Exchange("s", {}, box.Recvs(0), absl::Now() + absl::Seconds(2)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace tessera
