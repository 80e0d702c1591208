// In-process gRPC tests: every rank's transport serves on a free localhost port.
#include "agent/peer/grpc_peer_transport.h"

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/peer/gather_fixture_test_util.h"
#include "common/fake_bulk_holder.h"
#include "common/peer_auth.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using testing::AllRecvs;
using testing::AllSends;
using testing::DpBox;
using testing::OnceNotification;

absl::Time Later() { return absl::Now() + absl::Seconds(60); }

// Transports for ranks 0..n-1 that resolve each other through a shared address book.
class Cluster {
 public:
  // Every rank proves and checks job "job"'s secret, but those in `other_job`, which hold
  // another job's, and those in `no_secret`, which hold none (not registered).
  explicit Cluster(int n, uint64_t chunk_bytes = uint64_t{4} << 20,
                   std::function<void(uint32_t rank, const std::string& session)> on_parked = {},
                   const std::set<int>& other_job = {}, const std::set<int>& no_secret = {}) {
    for (int rank = 0; rank < n; ++rank) {
      keyrings_.push_back(no_secret.count(rank) > 0 ? std::make_unique<PeerKeyring>("job")
                          : TestPeerKeyring(other_job.count(rank) > 0 ? "other-job" : "job"));
      GrpcPeerTransportOptions options;
      options.keyring = keyrings_.back().get();
      options.rank = rank;
      options.listen_address = "127.0.0.1:0";
      options.chunk_bytes = chunk_bytes;
      options.resolve_peer = [this](const std::string& session,
                                    uint32_t peer) -> absl::StatusOr<std::string> {
        absl::MutexLock lock(&mu_);
        return StaticPeerResolver(addresses_)(session, peer);
      };
      if (on_parked) {
        options.inbox.on_parked = [on_parked, rank](const std::string& session) {
          on_parked(rank, session);
        };
      }
      auto transport = GrpcPeerTransport::Create(std::move(options));
      EXPECT_TRUE(transport.ok()) << transport.status();
      {
        absl::MutexLock lock(&mu_);
        addresses_[rank] = absl::StrCat("127.0.0.1:", (*transport)->port());
      }
      transports_.push_back(std::move(*transport));
    }
  }

  GrpcPeerTransport& operator[](int rank) { return *transports_[rank]; }

  void SetAddress(uint32_t rank, std::string address) {
    absl::MutexLock lock(&mu_);
    addresses_[rank] = std::move(address);
  }

 private:
  absl::Mutex mu_;
  std::map<uint32_t, std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<PeerKeyring>> keyrings_;  // outlive the transports
  std::vector<std::unique_ptr<GrpcPeerTransport>> transports_;
};

// Runs Exchange() on every rank of `boxes` concurrently; returns each rank's status.
std::vector<absl::Status> RunAll(Cluster& cluster, int n, const std::string& session,
                                 const std::vector<DpBox*>& boxes) {
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      statuses[rank] = cluster[rank].Exchange(session, AllSends(boxes, rank),
                                              AllRecvs(boxes, rank), Later());
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

TEST(GrpcPeerTransport, Gather_FourRanksUnevenSlices_LeadersAssembleBoxesExactly) {
  constexpr int kRanks = 4;
  Cluster cluster(kRanks, /*chunk_bytes=*/256 << 10);  // slices span many messages
  // Two boxes with different leaders: ranks 1 and 3 both send and receive. One slice empty.
  DpBox exp_avg(1, "layer.0.w/exp_avg", Box{{0, 0}, {1024, 771}}, 4, {0, 1, 2, 3}, /*leader=*/1,
                /*empty_rank_index=*/2);
  DpBox exp_avg_sq(2, "layer.0.w/exp_avg_sq", Box{{1024, 0}, {512, 771}}, 4, {0, 1, 2, 3},
                   /*leader=*/3);
  ASSERT_EQ(exp_avg.slice_bytes(2), 0u);
  std::vector<absl::Status> statuses =
      RunAll(cluster, kRanks, "session-1", {&exp_avg, &exp_avg_sq});
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_TRUE(statuses[rank].ok()) << statuses[rank];
  EXPECT_TRUE(exp_avg.leader_slot() == exp_avg.expected());
  EXPECT_TRUE(exp_avg_sq.leader_slot() == exp_avg_sq.expected());
}

TEST(GrpcPeerTransport, Gather_SliceLargerThanDefaultChunk_Arrives) {
  Cluster cluster(2);  // default options: 4 MiB chunks, 8 MiB messages
  DpBox box(3, "big", Box{{0}, {5 << 20}}, 4, {0, 1}, /*leader=*/1);
  ASSERT_GT(box.slice_bytes(0), uint64_t{4} << 20);
  std::vector<absl::Status> statuses = RunAll(cluster, 2, "s", {&box});
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_TRUE(statuses[1].ok()) << statuses[1];
  EXPECT_TRUE(box.leader_slot() == box.expected());
}

// Issue 51: a sender of another job, or one without the secret, is refused before any chunk
// is read.
TEST(GrpcPeerTransport, Send_FromAnotherJobsAgentOrWithoutTheSecret_UnauthenticatedNothingWritten) {
  for (bool other_job : {true, false}) {
    SCOPED_TRACE(other_job ? "another job's secret" : "no secret");
    Cluster cluster(2, uint64_t{4} << 20, {}, other_job ? std::set<int>{0} : std::set<int>{},
                    other_job ? std::set<int>{} : std::set<int>{0});
    DpBox box(3, "w/exp_avg", Box{{0}, {4096}}, 4, {0, 1}, /*leader=*/1);
    const std::string before = box.leader_slot();
    absl::Status sent = cluster[0].Exchange("s", AllSends({&box}, 0), {}, Later());
    EXPECT_EQ(sent.code(), absl::StatusCode::kUnauthenticated) << sent;
    EXPECT_TRUE(box.leader_slot() == before);
  }
}

TEST(GrpcPeerTransport, Send_LeaderUnreachable_UnavailableBeforeDeadline) {
  Cluster cluster(1);
  int dead_port = 0;
  {
    Cluster gone(1);  // its port is closed when it goes away
    dead_port = gone[0].port();
  }
  cluster.SetAddress(1, absl::StrCat("127.0.0.1:", dead_port));
  std::string data(1000, 'x');
  SliceSend send;
  send.key = "k";
  send.box = Box{{0}, {500}};
  send.begin = 0;
  send.end = 250;
  send.data = data.data();
  send.nbytes = data.size();
  send.leader_rank = 1;
  const absl::Time start = absl::Now();
  const absl::Duration budget = absl::Seconds(30);
  absl::Status status = cluster[0].Exchange("s", {send}, {}, start + budget);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, budget);
}

TEST(GrpcPeerTransport, Cancel_LeaderCancelsSessionWithParkedSender_SenderAndLeaderAborted) {
  OnceNotification parked;
  Cluster cluster(2, uint64_t{4} << 20, [&](uint32_t rank, const std::string& session) {
    if (rank == 1 && session == "s") parked.Notify();
  });
  DpBox box(4, "k", Box{{0}, {4096}}, 4, {0, 1}, /*leader=*/1);
  absl::Status sender;
  std::thread t([&] { sender = cluster[0].Exchange("s", box.Sends(0), {}, Later()); });
  parked.WaitForNotification();  // the leader holds the stream unread: it has not started
  const absl::Time start = absl::Now();
  cluster[1].CancelSession("s");
  t.join();
  EXPECT_EQ(sender.code(), absl::StatusCode::kAborted) << sender;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // The leader's own Exchange for the cancelled session fails at once too.
  EXPECT_EQ(cluster[1].Exchange("s", {}, box.Recvs(1), Later()).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(box.leader_slot().substr(0, box.slice_bytes(0)), std::string(box.slice_bytes(0), '\0'));
}

TEST(GrpcPeerTransport, Cancel_LeaderWaitingForMissingSlice_ReceiverAborted) {
  Cluster cluster(3);
  // Leader 0 expects slices from ranks 1 and 2; only rank 1 sends.
  DpBox box(5, "k", Box{{0}, {10000}}, 2, {0, 1, 2}, /*leader=*/0);
  absl::Status leader;
  absl::Notification leader_done;
  std::thread t([&] {
    leader = cluster[0].Exchange("s", {}, box.Recvs(0), Later());
    leader_done.Notify();
  });
  // Rank 1's acknowledged send proves the leader is receiving (blocked on rank 2).
  ASSERT_TRUE(cluster[1].Exchange("s", box.Sends(1), {}, Later()).ok());
  EXPECT_FALSE(leader_done.HasBeenNotified());
  const absl::Time start = absl::Now();
  cluster[0].CancelSession("s");
  t.join();
  EXPECT_EQ(leader.code(), absl::StatusCode::kAborted) << leader;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // A late sender is told the session is over.
  EXPECT_EQ(cluster[2].Exchange("s", box.Sends(2), {}, Later()).code(),
            absl::StatusCode::kAborted);
}

TEST(GrpcPeerTransport, Cancel_SenderCancelsWhileParked_SenderAborted) {
  OnceNotification parked;
  Cluster cluster(2, uint64_t{4} << 20, [&](uint32_t rank, const std::string& session) {
    if (rank == 1) parked.Notify();
  });
  DpBox box(6, "k", Box{{0}, {4096}}, 4, {0, 1}, /*leader=*/1);
  absl::Status sender;
  std::thread t([&] { sender = cluster[0].Exchange("s", box.Sends(0), {}, Later()); });
  parked.WaitForNotification();
  cluster[0].CancelSession("s");
  t.join();
  EXPECT_EQ(sender.code(), absl::StatusCode::kAborted) << sender;
}

TEST(GrpcPeerTransport, Send_LeaderNeverStarts_DeadlineExceededAndStreamWithdrawn) {
  OnceNotification parked;
  Cluster cluster(2, uint64_t{4} << 20, [&](uint32_t rank, const std::string& session) {
    if (rank == 1) parked.Notify();
  });
  DpBox box(9, "k", Box{{0}, {4096}}, 4, {0, 1}, /*leader=*/1);
  EXPECT_EQ(cluster[0].Exchange("s", box.Sends(0), {}, absl::Now() + absl::Milliseconds(500))
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(parked.HasBeenNotified());
  // A later session between the same ranks still works.
  std::vector<absl::Status> statuses = RunAll(cluster, 2, "s2", {&box});
  EXPECT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << " " << statuses[1];
  EXPECT_TRUE(box.leader_slot() == box.expected());
}

// A leader slot with guard bytes on both sides.
struct GuardedSlot {
  explicit GuardedSlot(size_t n) : bytes(n + 128, '\xAB') { std::fill_n(dest(), n, '\0'); }
  char* dest() { return bytes.data() + 64; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < 64; ++i) {
      if (bytes[i] != '\xAB' || bytes[bytes.size() - 1 - i] != '\xAB') return false;
    }
    return true;
  }
  std::string bytes;
};

SliceSend SendOf(const std::string& key, const std::string& data, int64_t end, uint32_t leader) {
  SliceSend s;
  s.key = key;
  s.box = Box{{0}, {1 << 20}};
  s.begin = 0;
  s.end = end;
  s.data = data.data();
  s.nbytes = data.size();
  s.leader_rank = leader;
  return s;
}

SliceRecv RecvOf(const std::string& key, void* dest, size_t nbytes, int64_t end, uint32_t from) {
  SliceRecv r;
  r.key = key;
  r.box = Box{{0}, {1 << 20}};
  r.from_rank = from;
  r.begin = 0;
  r.end = end;
  r.dest = dest;
  r.nbytes = nbytes;
  return r;
}

class WrongSize : public ::testing::TestWithParam<size_t> {};

TEST_P(WrongSize, Reject_SliceSizeDiffers_BothSidesInvalidArgumentNothingWritten) {
  Cluster cluster(2, /*chunk_bytes=*/1024);
  GuardedSlot slot(4000);
  const std::string data(GetParam(), 'z');
  absl::Status leader;
  std::thread t([&] {
    leader = cluster[1].Exchange("s", {}, {RecvOf("k", slot.dest(), 4000, 1000, 0)}, Later());
  });
  absl::Status sender = cluster[0].Exchange("s", {SendOf("k", data, 1000, 1)}, {}, Later());
  t.join();
  EXPECT_EQ(sender.code(), absl::StatusCode::kInvalidArgument) << sender;
  EXPECT_EQ(leader.code(), absl::StatusCode::kInvalidArgument) << leader;
  EXPECT_TRUE(slot.GuardsIntact());
  EXPECT_EQ(std::string(slot.dest(), 4000), std::string(4000, '\0'));
}

INSTANTIATE_TEST_SUITE_P(LargerAndSmaller, WrongSize, ::testing::Values(6000, 3000));

TEST(GrpcPeerTransport, Reject_UnknownKey_SenderInvalidArgumentLeaderUnaffected) {
  Cluster cluster(3);
  GuardedSlot slot(400);
  absl::Status leader;
  std::thread t([&] {
    leader = cluster[0].Exchange("s", {}, {RecvOf("k", slot.dest(), 400, 100, 1)}, Later());
  });
  const std::string stray(400, 's');
  EXPECT_EQ(cluster[2].Exchange("s", {SendOf("not-k", stray, 100, 0)}, {}, Later()).code(),
            absl::StatusCode::kInvalidArgument);
  const std::string good(400, 'g');
  EXPECT_TRUE(cluster[1].Exchange("s", {SendOf("k", good, 100, 0)}, {}, Later()).ok());
  t.join();
  EXPECT_TRUE(leader.ok()) << leader;
  EXPECT_EQ(std::string(slot.dest(), 400), good);
  EXPECT_TRUE(slot.GuardsIntact());
}

TEST(GrpcPeerTransport, Sessions_ConcurrentWithSameSlices_DoNotMix) {
  constexpr int kRanks = 4;
  Cluster cluster(kRanks, /*chunk_bytes=*/64 << 10);
  // Same keys, boxes and ranges in both sessions; different bytes.
  DpBox a(7, "k", Box{{0, 0}, {256, 1000}}, 4, {0, 1, 2, 3}, /*leader=*/2, -1, /*data_seed=*/70);
  DpBox b(7, "k", Box{{0, 0}, {256, 1000}}, 4, {0, 1, 2, 3}, /*leader=*/2, -1, /*data_seed=*/80);
  ASSERT_EQ(a.cuts(), b.cuts());
  ASSERT_TRUE(a.expected() != b.expected());
  std::vector<absl::Status> sa, sb;
  std::thread ta([&] { sa = RunAll(cluster, kRanks, "session-a", {&a}); });
  std::thread tb([&] { sb = RunAll(cluster, kRanks, "session-b", {&b}); });
  ta.join();
  tb.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_TRUE(sa[rank].ok()) << sa[rank];
    EXPECT_TRUE(sb[rank].ok()) << sb[rank];
  }
  EXPECT_TRUE(a.leader_slot() == a.expected());
  EXPECT_TRUE(b.leader_slot() == b.expected());
}

TEST(GrpcPeerTransport, Exchange_SameSessionTwice_FailedPrecondition) {
  Cluster cluster(1);
  ASSERT_TRUE(cluster[0].Exchange("s", {}, {}, Later()).ok());
  EXPECT_EQ(cluster[0].Exchange("s", {}, {}, Later()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(GrpcPeerTransport, Exchange_MalformedSlices_InvalidArgument) {
  Cluster cluster(2);
  SliceSend bad;
  bad.key = "k";
  bad.box = Box{{0}, {4}};
  bad.end = 4;
  bad.nbytes = 16;  // data is null
  bad.leader_rank = 1;
  EXPECT_EQ(cluster[0].Exchange("s", {bad}, {}, Later()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GrpcPeerTransport, Exchange_UnknownLeaderAddress_NotFound) {
  Cluster cluster(1);
  const std::string data(16, 'd');
  EXPECT_EQ(cluster[0].Exchange("s", {SendOf("k", data, 4, 7)}, {}, Later()).code(),
            absl::StatusCode::kNotFound);
}

TEST(AdvertisedPeerAddress, PeerHostGiven_UsedWhateverTheListenAddress) {
  EXPECT_EQ(AdvertisedPeerAddress("node7", "0.0.0.0:0", 7000, "h"), "node7:7000");
  EXPECT_EQ(AdvertisedPeerAddress("10.0.0.9", "10.0.0.5:0", 7000, "h"), "10.0.0.9:7000");
}

TEST(AdvertisedPeerAddress, SpecificListenHost_AdvertisedInsteadOfHostname) {
  EXPECT_EQ(AdvertisedPeerAddress("", "10.77.0.11:0", 41000, "shared-name"), "10.77.0.11:41000");
  EXPECT_EQ(AdvertisedPeerAddress("", "[fd00::5]:0", 41000, "h"), "[fd00::5]:41000");
}

TEST(AdvertisedPeerAddress, WildcardListen_Hostname) {
  for (const char* listen : {"0.0.0.0:0", "[::]:0", "*:0", ":0", "0"}) {
    EXPECT_EQ(AdvertisedPeerAddress("", listen, 7000, "node3"), "node3:7000") << listen;
  }
}

TEST(AdvertisedPeerAddress, Ipv6PeerHost_Bracketed) {
  EXPECT_EQ(AdvertisedPeerAddress("fd00::7", "[::]:0", 7000, "h"), "[fd00::7]:7000");
  EXPECT_EQ(AdvertisedPeerAddress("[fd00::7]", "[::]:0", 7000, "h"), "[fd00::7]:7000");
}

TEST(GrpcPeerTransport, Create_ChunkTooLargeForMessageLimit_InvalidArgument) {
  GrpcPeerTransportOptions options;
  options.resolve_peer = StaticPeerResolver({});
  options.chunk_bytes = 8 << 20;  // no room for the header under the default 8 MiB limit
  EXPECT_EQ(GrpcPeerTransport::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.chunk_bytes = 4 << 20;
  options.resolve_peer = nullptr;
  EXPECT_EQ(GrpcPeerTransport::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
