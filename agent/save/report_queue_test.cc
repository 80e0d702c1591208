#include "agent/save/report_queue.h"

#include <memory>

#include "gtest/gtest.h"

namespace tessera {
namespace {

ReportQueue::Report Phase(v1::AgentPhase phase) {
  auto r = std::make_shared<v1::ReportPhaseRequest>();
  r->set_phase(phase);
  return {nullptr, r};
}

ReportQueue::Report Chunks(const std::string& key) {
  auto r = std::make_shared<v1::ReportChunksRequest>();
  r->add_chunks()->set_key(key);
  return {r, nullptr};
}

// "P<phase>" or "C<key>" for the report handed out as `id`, "" if none may go.
std::string NextName(ReportQueue& q, uint64_t id) {
  std::optional<ReportQueue::Report> r = q.Next(id);
  if (!r.has_value()) return "";
  if (r->chunks != nullptr) return "C" + r->chunks->chunks(0).key();
  return "P" + std::to_string(r->phase->phase());
}

TEST(ReportQueue, OneOutAtATime_NextAfterAcknowledged) {
  ReportQueue q;
  q.Add(Chunks("a"));
  q.Add(Phase(v1::AGENT_PHASE_GATHERED));
  EXPECT_EQ(NextName(q, 1), "Ca");
  EXPECT_EQ(NextName(q, 2), "");  // the hashes are not acknowledged yet
  EXPECT_EQ(q.OnResult(1, absl::StatusCode::kOk), ReportQueue::Result::kDelivered);
  EXPECT_EQ(NextName(q, 3), "P3");
  EXPECT_EQ(q.OnResult(3, absl::StatusCode::kOk), ReportQueue::Result::kDelivered);
  EXPECT_EQ(NextName(q, 4), "");
}

TEST(ReportQueue, Failed_PausedUntilResendAll_ThenEverythingChunksFirst) {
  ReportQueue q;
  q.Add(Phase(v1::AGENT_PHASE_PINNED));
  q.Add(Chunks("a"));
  q.Add(Phase(v1::AGENT_PHASE_PERSISTED));
  EXPECT_EQ(NextName(q, 1), "P1");
  EXPECT_EQ(q.OnResult(1, absl::StatusCode::kOk), ReportQueue::Result::kDelivered);
  EXPECT_EQ(NextName(q, 2), "Ca");
  EXPECT_EQ(q.OnResult(2, absl::StatusCode::kUnavailable), ReportQueue::Result::kFailed);
  EXPECT_TRUE(q.paused());
  EXPECT_EQ(NextName(q, 3), "");
  q.ResendAll();
  EXPECT_EQ(NextName(q, 4), "Ca");
  EXPECT_EQ(q.OnResult(4, absl::StatusCode::kOk), ReportQueue::Result::kDelivered);
  EXPECT_EQ(NextName(q, 5), "P1");
  EXPECT_EQ(q.OnResult(5, absl::StatusCode::kOk), ReportQueue::Result::kDelivered);
  EXPECT_EQ(NextName(q, 6), "P4");
}

TEST(ReportQueue, ResendAllWhileOut_RestartsWhenTheResultArrives) {
  ReportQueue q;
  q.Add(Chunks("a"));
  q.Add(Phase(v1::AGENT_PHASE_PERSISTED));
  EXPECT_EQ(NextName(q, 1), "Ca");
  EXPECT_EQ(q.OnResult(1, absl::StatusCode::kOk), ReportQueue::Result::kDelivered);
  EXPECT_EQ(NextName(q, 2), "P4");
  q.ResendAll();
  EXPECT_EQ(NextName(q, 3), "");  // never two out at once
  EXPECT_EQ(q.OnResult(2, absl::StatusCode::kOk), ReportQueue::Result::kDelivered);
  EXPECT_EQ(NextName(q, 4), "Ca");
}

TEST(ReportQueue, FailedPrecondition_SessionEnded_Closed) {
  ReportQueue q;
  q.Add(Phase(v1::AGENT_PHASE_STAGED));
  q.Add(Phase(v1::AGENT_PHASE_GATHERED));
  EXPECT_EQ(NextName(q, 1), "P2");
  EXPECT_EQ(q.OnResult(1, absl::StatusCode::kFailedPrecondition),
            ReportQueue::Result::kSessionEnded);
  EXPECT_TRUE(q.closed());
  q.ResendAll();
  EXPECT_EQ(NextName(q, 2), "");
}

TEST(ReportQueue, EndedOnTheCoordinator_RemindSendsTheLastReportOnce) {
  ReportQueue q;
  q.Add(Phase(v1::AGENT_PHASE_STAGED));
  q.Add(Phase(v1::AGENT_PHASE_GATHERED));
  EXPECT_EQ(NextName(q, 1), "P2");
  ASSERT_EQ(q.OnResult(1, absl::StatusCode::kFailedPrecondition),
            ReportQueue::Result::kSessionEnded);
  q.Remind();
  EXPECT_EQ(NextName(q, 2), "P3");  // one report, the last
  EXPECT_EQ(NextName(q, 3), "");
  EXPECT_EQ(q.OnResult(2, absl::StatusCode::kFailedPrecondition),
            ReportQueue::Result::kSessionEnded);
  EXPECT_TRUE(q.closed());
}

TEST(ReportQueue, ClosedAtTheSessionsEnd_RemindDoesNothing) {
  ReportQueue q;
  q.Add(Phase(v1::AGENT_PHASE_STAGED));
  q.Close();
  q.Remind();
  EXPECT_EQ(NextName(q, 1), "");
}

TEST(ReportQueue, InvalidArgument_RefusedAndDropped_NextGoes) {
  ReportQueue q;
  q.Add(Chunks("a"));
  q.Add(Phase(v1::AGENT_PHASE_PERSISTED));
  EXPECT_EQ(NextName(q, 1), "Ca");
  EXPECT_EQ(q.OnResult(1, absl::StatusCode::kInvalidArgument), ReportQueue::Result::kRefused);
  EXPECT_EQ(NextName(q, 2), "P4");
}

TEST(ReportQueue, ResultOfAnotherRpc_NotOurs) {
  ReportQueue q;
  q.Add(Chunks("a"));
  EXPECT_EQ(NextName(q, 7), "Ca");
  EXPECT_EQ(q.OnResult(8, absl::StatusCode::kOk), ReportQueue::Result::kNotOurs);
  EXPECT_EQ(q.out(), 7u);
}

}  // namespace
}  // namespace tessera
