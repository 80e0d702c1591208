#include "server/hand_out.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// Records every command handed to it, with the thread that handed it; safe for several
// threads at once, as CommandSink requires.
class RecordingSink : public CommandSink {
 public:
  struct Sent {
    std::string job_id;
    uint32_t rank = 0;
    uint64_t seq = 0;
    std::string assignment;  // a PIN's, as passed to SendPin
    bool by_send_pin = false;
    std::thread::id thread;
  };

  void Send(const std::string& job_id, uint32_t rank, const v1::Command& command) override {
    Record(Sent{job_id, rank, command.seq(), "", false, std::this_thread::get_id()});
  }
  void SendPin(const std::string& job_id, uint32_t rank, const v1::Command& command,
               absl::string_view assignment) override {
    Record(Sent{job_id, rank, command.seq(), std::string(assignment), true,
                std::this_thread::get_id()});
  }

  std::vector<Sent> sent() const {
    absl::MutexLock lock(&mu_);
    return sent_;
  }

 private:
  void Record(Sent s) {
    absl::MutexLock lock(&mu_);
    sent_.push_back(std::move(s));
  }
  mutable absl::Mutex mu_;
  std::vector<Sent> sent_ ABSL_GUARDED_BY(mu_);
};

Outgoing Command(uint32_t rank, uint64_t seq) {
  Outgoing o;
  o.rank = rank;
  o.command.set_seq(seq);
  o.command.mutable_commit();
  return o;
}

TEST(HandOutThreadsTest, OneBelowTheThresholdElseAsAllowed) {
  EXPECT_EQ(HandOutThreads(kParallelHandOutFrom - 1, 4), 1u);
  EXPECT_EQ(HandOutThreads(kParallelHandOutFrom, 4), 4u);
  EXPECT_EQ(HandOutThreads(kParallelHandOutFrom, 1), 1u);
  const size_t machine = HandOutThreads(kParallelHandOutFrom, 0);  // one per core, capped
  EXPECT_GE(machine, 1u);
  EXPECT_LE(machine, kMaxHandOutThreads);
}

TEST(HandOutTest, SmallFanOut_InOrderOnTheCallersThread_PinsWithTheirAssignment) {
  auto plan = std::make_shared<GlobalPlan>();
  plan->assignments = {"rank0-bytes", "rank1-bytes"};
  std::vector<Outgoing> commands;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    Outgoing pin;
    pin.rank = rank;
    pin.command.set_seq(7);
    pin.command.mutable_pin()->set_plan_cached(false);
    pin.pin_plan = plan;
    commands.push_back(std::move(pin));
  }
  commands.push_back(Command(1, 8));
  RecordingSink sink;

  HandOut(sink, "job", commands, /*max_threads=*/4);

  const std::vector<RecordingSink::Sent> sent = sink.sent();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[0].by_send_pin);
  EXPECT_EQ(sent[0].rank, 0u);
  EXPECT_EQ(sent[0].assignment, "rank0-bytes");
  EXPECT_TRUE(sent[1].by_send_pin);
  EXPECT_EQ(sent[1].assignment, "rank1-bytes");
  EXPECT_FALSE(sent[2].by_send_pin);
  EXPECT_EQ(sent[2].seq, 8u);
  for (const auto& s : sent) {
    EXPECT_EQ(s.job_id, "job");
    EXPECT_EQ(s.thread, std::this_thread::get_id());
  }
}

TEST(HandOutTest, LargeFanOut_EveryCommandOnceOneThreadPerRankRankOrderKept) {
  constexpr uint32_t kRanks = 1024;
  constexpr size_t kThreads = 4;
  std::vector<Outgoing> commands;
  for (uint64_t seq = 1; seq <= 2; ++seq) {  // two commands per rank: seq 1, then seq 2
    for (uint32_t rank = 0; rank < kRanks; ++rank) commands.push_back(Command(rank, seq));
  }
  RecordingSink sink;

  HandOut(sink, "job", commands, kThreads);

  const std::vector<RecordingSink::Sent> sent = sink.sent();
  ASSERT_EQ(sent.size(), 2 * kRanks);
  std::map<uint32_t, std::vector<uint64_t>> seqs;  // rank -> seqs in the order handed over
  std::map<uint32_t, std::set<std::thread::id>> threads_of_rank;
  std::set<std::thread::id> threads;
  for (const auto& s : sent) {
    seqs[s.rank].push_back(s.seq);
    threads_of_rank[s.rank].insert(s.thread);
    threads.insert(s.thread);
  }
  ASSERT_EQ(seqs.size(), kRanks);
  for (const auto& [rank, order] : seqs) {
    EXPECT_EQ(order, (std::vector<uint64_t>{1, 2})) << "rank " << rank;
    EXPECT_EQ(threads_of_rank[rank].size(), 1u) << "rank " << rank;
  }
  EXPECT_EQ(threads.size(), kThreads);
  // Each command was freed once handed over.
  for (const Outgoing& o : commands) EXPECT_EQ(o.command.body_case(), v1::Command::BODY_NOT_SET);
}

}  // namespace
}  // namespace tessera
