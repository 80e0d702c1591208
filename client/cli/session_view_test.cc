#include "client/cli/session_view.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::RankProgress* AddRank(v1::SessionStatus& s, uint32_t rank, const std::string& coords,
                          v1::SessionState reached) {
  v1::RankProgress* r = s.add_ranks();
  r->set_rank(rank);
  r->set_coords(coords);
  r->set_reached(reached);
  return r;
}

void AddPhase(v1::SessionStatus& s, v1::SessionState state, int64_t entered, int64_t duration) {
  v1::PhaseTiming* p = s.add_phases();
  p->set_state(state);
  p->set_entered_unix_ms(entered);
  p->set_duration_ms(duration);
}

// A save of 2 ranks half-way through PERSISTING; rank 1 straggles.
v1::SessionStatus Persisting() {
  v1::SessionStatus s;
  s.set_session_id("s100-ab");
  s.set_job_id("demo");
  s.set_step(100);
  s.set_state(v1::SESSION_STATE_PERSISTING);
  s.set_started_unix_ms(1700000000000);
  s.set_bytes_total(4ull << 20);
  s.set_bytes_written(2ull << 20);
  s.set_chunks_total(8);
  s.set_chunks_reported(4);
  s.set_plan_cached(true);
  v1::RankProgress* r0 = AddRank(s, 0, "pp=0,dp=0", v1::SESSION_STATE_PERSISTING);
  r0->set_bytes_staged(2ull << 20);
  r0->set_bytes_planned(2ull << 20);
  r0->set_bytes_written(2ull << 20);
  r0->set_chunks_reported(4);
  r0->set_trainer_stall_ns(1500000);
  v1::RankProgress* r1 = AddRank(s, 1, "pp=1,dp=0", v1::SESSION_STATE_COPYING);
  r1->set_bytes_staged(2ull << 20);
  r1->set_bytes_planned(2ull << 20);
  r1->set_straggler(true);
  AddPhase(s, v1::SESSION_STATE_PLANNING, 1700000000000, 120);
  AddPhase(s, v1::SESSION_STATE_PINNING, 1700000000120, 30);
  AddPhase(s, v1::SESSION_STATE_COPYING, 1700000000150, 1200);
  AddPhase(s, v1::SESSION_STATE_PERSISTING, 1700000001350, 0);
  return s;
}

int Lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

TEST(PrintSessionStatus, Persisting_RankTableAndPhases) {
  std::ostringstream out;
  PrintSessionStatus(Persisting(), out);
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("job demo  step 100  session s100-ab  state PERSISTING  "
                              "(plan cached)"));
  EXPECT_THAT(text, HasSubstr("50%  2.0 MiB / 4.0 MiB written, chunks 4/8"));
  EXPECT_THAT(text, HasSubstr("RANK  COORDS     REACHED"));
  // Rank 0: every column; rank 1: marked as a straggler.
  EXPECT_THAT(text, HasSubstr("   0  pp=0,dp=0  PERSISTING  2.0 MiB  2.0 MiB  2.0 MiB       4    "
                              "1ms\n"));
  EXPECT_THAT(text, HasSubstr("   1  pp=1,dp=0  COPYING     2.0 MiB  2.0 MiB      0 B       0     "
                              "0s  yes\n"));
  EXPECT_THAT(text, HasSubstr("COPYING     2023-11-14 22:13:20Z         1.2s\n"));
  EXPECT_THAT(text, HasSubstr("PERSISTING  2023-11-14 22:13:21Z  in progress"));
  EXPECT_THAT(text, Not(HasSubstr("aborted")));
}

TEST(PrintSessionStatus, Aborted_ErrorWithCodeRanksAndTensors) {
  v1::SessionStatus s = Persisting();
  s.set_state(v1::SESSION_STATE_ABORTED);
  v1::ErrorDetail* e = s.mutable_error();
  e->set_code(v1::ERROR_CODE_REPLICA_DIVERGED);
  e->set_message("replicas of layers.0.wq differ");
  e->add_fqns("layers.0.wq");
  v1::RankRef* r = e->add_ranks();
  r->set_rank(1);
  r->set_coords("pp=1,dp=0");
  std::ostringstream out;
  PrintSessionStatus(s, out);
  EXPECT_THAT(out.str(), HasSubstr("aborted: REPLICA_DIVERGED: replicas of layers.0.wq differ\n"
                                   "  ranks: 1 (pp=1,dp=0)\n"
                                   "  tensors: layers.0.wq\n"));
}

TEST(PrintSessionStatus, Committed_ShowsCheckpointDir) {
  v1::SessionStatus s = Persisting();
  s.set_state(v1::SESSION_STATE_COMMITTED);
  s.set_checkpoint_dir("/ckpt/demo/step-000000100");
  std::ostringstream out;
  PrintSessionStatus(s, out);
  EXPECT_THAT(out.str(), HasSubstr("checkpoint /ckpt/demo/step-000000100\n"));
}

TEST(WatchFrame, Persisting_DonePhasesActiveBarPending) {
  const std::string frame = WatchFrame(Persisting(), 10);
  EXPECT_EQ(Lines(frame), 6) << frame;
  EXPECT_THAT(frame, HasSubstr("PLANNING    done 120ms"));
  EXPECT_THAT(frame, HasSubstr("plan cached"));
  EXPECT_THAT(frame, HasSubstr("COPYING     done 1.2s"));
  EXPECT_THAT(frame, HasSubstr("max trainer stall 1ms"));
  EXPECT_THAT(frame, HasSubstr("PERSISTING  [#####-----] 50%"));
  EXPECT_THAT(frame, HasSubstr("chunks 4/8, ranks 1/2"));
  EXPECT_THAT(frame, HasSubstr("COMMITTING  pending"));
}

TEST(WatchFrame, EarlierPhase_BarCountsRanks) {
  v1::SessionStatus s = Persisting();
  s.set_state(v1::SESSION_STATE_COPYING);
  const std::string frame = WatchFrame(s, 4);
  EXPECT_THAT(frame, HasSubstr("COPYING     [####] 100%  ranks 2/2"));
  EXPECT_THAT(frame, HasSubstr("PERSISTING  pending"));
}

TEST(WatchFrame, Ended_OneMoreLineWithTheOutcome) {
  v1::SessionStatus s = Persisting();
  s.set_state(v1::SESSION_STATE_ABORTED);
  s.mutable_error()->set_code(v1::ERROR_CODE_AGENT_LOST);
  s.mutable_error()->set_message("rank 1 lost its lease");
  std::string frame = WatchFrame(s, 10);
  EXPECT_EQ(Lines(frame), 7) << frame;
  EXPECT_THAT(frame, HasSubstr("ABORTED: AGENT_LOST: rank 1 lost its lease\n"));
  EXPECT_THAT(frame, HasSubstr("50%  2.0 MiB / 4.0 MiB written, chunks 4/8, ranks 1/2  ABORTED"));

  s.set_state(v1::SESSION_STATE_COMMITTED);
  s.set_checkpoint_dir("/ckpt/x");
  frame = WatchFrame(s, 10);
  EXPECT_EQ(Lines(frame), 7) << frame;
  EXPECT_THAT(frame, HasSubstr("COMMITTING  done\n"));
  EXPECT_THAT(frame, HasSubstr("COMMITTED: checkpoint /ckpt/x\n"));
}

TEST(WatchLine, OneLinePerState) {
  v1::SessionStatus s = Persisting();
  EXPECT_EQ(WatchLine(s),
            "step 100 PERSISTING 50% 2.0 MiB / 4.0 MiB written, chunks 4/8, ranks 1/2");
  s.set_state(v1::SESSION_STATE_COPYING);
  EXPECT_EQ(WatchLine(s), "step 100 COPYING ranks 2/2, 4.0 MiB staged");
  s.set_state(v1::SESSION_STATE_COMMITTED);
  s.set_checkpoint_dir("/ckpt/x");
  EXPECT_EQ(WatchLine(s), "step 100 COMMITTED 2.0 MiB in 4 chunks, checkpoint /ckpt/x");
  s.set_state(v1::SESSION_STATE_ABORTED);
  s.mutable_error()->set_code(v1::ERROR_CODE_TIMEOUT);
  s.mutable_error()->set_message("PERSISTING exceeded 1800 s");
  EXPECT_EQ(WatchLine(s), "step 100 ABORTED TIMEOUT: PERSISTING exceeded 1800 s");
  EXPECT_EQ(WatchLine(s).find('\n'), std::string::npos);
}

}  // namespace
}  // namespace cli
}  // namespace tessera
