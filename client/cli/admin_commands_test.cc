// The online commands against a fake Admin service: a small v1::Admin::Service serving canned
// answers on a free localhost port, in-process. Checks what the commands print (tables, JSON,
// watch lines and redraws), what they send (job, session, reason, token) and the messages for
// the errors an operator meets (no token, wrong token, unknown job, no coordinator).
#include "client/cli/admin_commands.h"

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/cli/exit_codes.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tessera/v1/admin.grpc.pb.h"

namespace tessera {
namespace cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class FakeAdmin final : public v1::Admin::Service {
 public:
  // Calls must carry "authorization: Bearer <token>" if `token` is not empty.
  void set_token(std::string token) { token_ = std::move(token); }

  v1::ListJobsResponse jobs;
  v1::ListAgentsResponse agents;
  v1::SessionStatus session;
  v1::ListCheckpointsResponse checkpoints;
  std::vector<v1::SessionStatus> watch_updates;

  // What the last calls asked for.
  std::string last_job() {
    absl::MutexLock lock(&mu_);
    return last_job_;
  }
  std::string last_session() {
    absl::MutexLock lock(&mu_);
    return last_session_;
  }
  std::string last_reason() {
    absl::MutexLock lock(&mu_);
    return last_reason_;
  }

  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* response) override {
    if (grpc::Status s = Authorize(context); !s.ok()) return s;
    *response = jobs;
    return grpc::Status::OK;
  }

  grpc::Status ListAgents(grpc::ServerContext* context, const v1::ListAgentsRequest* request,
                          v1::ListAgentsResponse* response) override {
    if (grpc::Status s = Check(context, request->job_id(), ""); !s.ok()) return s;
    *response = agents;
    return grpc::Status::OK;
  }

  grpc::Status GetSession(grpc::ServerContext* context, const v1::GetSessionRequest* request,
                          v1::SessionStatus* response) override {
    if (grpc::Status s = Check(context, request->job_id(), request->session_id()); !s.ok()) {
      return s;
    }
    *response = session;
    return grpc::Status::OK;
  }

  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override {
    if (grpc::Status s = Check(context, request->job_id(), ""); !s.ok()) return s;
    *response = checkpoints;
    return grpc::Status::OK;
  }

  grpc::Status AbortSession(grpc::ServerContext* context, const v1::AbortSessionRequest* request,
                            v1::SessionStatus* response) override {
    if (grpc::Status s = Check(context, request->job_id(), ""); !s.ok()) return s;
    {
      absl::MutexLock lock(&mu_);
      last_reason_ = request->reason();
    }
    *response = session;
    response->set_state(v1::SESSION_STATE_ABORTED);
    response->mutable_error()->set_code(v1::ERROR_CODE_ABORTED_BY_USER);
    response->mutable_error()->set_message(request->reason());
    return grpc::Status::OK;
  }

  grpc::Status WatchSession(grpc::ServerContext* context, const v1::GetSessionRequest* request,
                            grpc::ServerWriter<v1::SessionStatus>* writer) override {
    if (grpc::Status s = Check(context, request->job_id(), request->session_id()); !s.ok()) {
      return s;
    }
    for (const v1::SessionStatus& update : watch_updates) {
      if (!writer->Write(update)) break;
    }
    return grpc::Status::OK;
  }

 private:
  grpc::Status Authorize(grpc::ServerContext* context) {
    if (token_.empty()) return grpc::Status::OK;
    auto it = context->client_metadata().find("authorization");
    if (it == context->client_metadata().end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing admin token");
    }
    if (std::string(it->second.data(), it->second.size()) != "Bearer " + token_) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bad admin token");
    }
    return grpc::Status::OK;
  }

  grpc::Status Check(grpc::ServerContext* context, const std::string& job,
                     const std::string& session_id) {
    if (grpc::Status s = Authorize(context); !s.ok()) return s;
    {
      absl::MutexLock lock(&mu_);
      last_job_ = job;
      last_session_ = session_id;
    }
    if (job != "demo") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no job \"", job, "\""));
    }
    return grpc::Status::OK;
  }

  std::string token_;
  absl::Mutex mu_;
  std::string last_job_ ABSL_GUARDED_BY(mu_);
  std::string last_session_ ABSL_GUARDED_BY(mu_);
  std::string last_reason_ ABSL_GUARDED_BY(mu_);
};

v1::SessionStatus Status(v1::SessionState state, uint64_t written) {
  v1::SessionStatus s;
  s.set_session_id("s100-ab");
  s.set_job_id("demo");
  s.set_step(100);
  s.set_state(state);
  s.set_bytes_total(1000);
  s.set_bytes_written(written);
  s.set_chunks_total(4);
  s.set_chunks_reported(static_cast<uint32_t>(written / 250));
  for (uint32_t rank = 0; rank < 2; ++rank) {
    v1::RankProgress* r = s.add_ranks();
    r->set_rank(rank);
    r->set_coords(absl::StrCat("pp=", rank));
    r->set_reached(state == v1::SESSION_STATE_COMMITTED ? v1::SESSION_STATE_COMMITTING
                                                        : v1::SESSION_STATE_COPYING);
    r->set_bytes_planned(500);
    r->set_bytes_written(written / 2);
    r->set_straggler(rank == 1);
  }
  v1::PhaseTiming* p = s.add_phases();
  p->set_state(v1::SESSION_STATE_PLANNING);
  p->set_entered_unix_ms(1700000000000);
  p->set_duration_ms(40);
  return s;
}

class AdminCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    options_.coordinator = absl::StrCat("127.0.0.1:", port_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  AdminCommands Commands() {
    out_.str("");
    err_.str("");
    auto channel = grpc::CreateChannel(options_.coordinator, grpc::InsecureChannelCredentials());
    return AdminCommands(v1::Admin::NewStub(channel), options_, out_, err_);
  }

  FakeAdmin fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  AdminOptions options_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(AdminCommandsTest, Status_PrintsRankTable_SendsJobAndSession) {
  fake_.session = Status(v1::SESSION_STATE_PERSISTING, 500);
  EXPECT_EQ(Commands().Status("demo", "s100-ab"), kExitOk) << err_.str();
  EXPECT_EQ(fake_.last_job(), "demo");
  EXPECT_EQ(fake_.last_session(), "s100-ab");
  const std::string text = out_.str();
  EXPECT_THAT(text, HasSubstr("job demo  step 100  session s100-ab  state PERSISTING"));
  EXPECT_THAT(text, HasSubstr("50%  500 B / 1000 B written, chunks 2/4"));
  EXPECT_THAT(text, HasSubstr("RANK  COORDS  REACHED  STAGED  PLANNED  WRITTEN  CHUNKS  STALL  "
                              "STRAGGLER\n"));
  EXPECT_THAT(text, HasSubstr("   0  pp=0    COPYING     0 B    500 B    250 B       0     0s\n"));
  EXPECT_THAT(text, HasSubstr("   1  pp=1    COPYING     0 B    500 B    250 B       0     0s  "
                              "yes\n"));
  EXPECT_THAT(text, HasSubstr("PLANNING  2023-11-14 22:13:20Z      40ms"));
  EXPECT_EQ(err_.str(), "");
}

TEST_F(AdminCommandsTest, Status_Json_IsTheSessionProto) {
  fake_.session = Status(v1::SESSION_STATE_ABORTED, 250);
  fake_.session.mutable_error()->set_code(v1::ERROR_CODE_AGENT_LOST);
  fake_.session.mutable_error()->set_message("rank 1 lost its lease");
  options_.json = true;
  EXPECT_EQ(Commands().Status("demo", ""), kExitOk) << err_.str();
  v1::SessionStatus parsed;
  auto status = google::protobuf::util::JsonStringToMessage(out_.str(), &parsed);
  ASSERT_TRUE(status.ok()) << status.ToString() << "\n" << out_.str();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, fake_.session))
      << parsed.DebugString();
  EXPECT_THAT(out_.str(), HasSubstr("\"session_id\": \"s100-ab\"")) << ".proto field names";
}

TEST_F(AdminCommandsTest, Status_Aborted_ShowsErrorCodeAndRanks) {
  fake_.session = Status(v1::SESSION_STATE_ABORTED, 250);
  v1::ErrorDetail* e = fake_.session.mutable_error();
  e->set_code(v1::ERROR_CODE_DUPLICATE_FQN);
  e->set_message("layers.0.wq claimed by ranks 0 and 1 outside one replica group");
  v1::RankRef* r = e->add_ranks();
  r->set_rank(1);
  r->set_coords("pp=1");
  EXPECT_EQ(Commands().Status("demo", ""), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("aborted: DUPLICATE_FQN: layers.0.wq claimed by ranks 0 and "
                                    "1 outside one replica group\n  ranks: 1 (pp=1)\n"));
}

TEST_F(AdminCommandsTest, UnknownJob_PrintsTheCoordinatorsMessage) {
  EXPECT_EQ(Commands().Agents("nojob"), kExitError);
  EXPECT_EQ(err_.str(), "error: no job \"nojob\"\n");
  EXPECT_EQ(out_.str(), "");
}

TEST_F(AdminCommandsTest, Unauthenticated_NoToken_SaysToPassToken) {
  fake_.set_token("s3cret");
  EXPECT_EQ(Commands().Jobs(), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("requires an admin token: pass --token or set "
                                    "TESSERA_ADMIN_TOKEN"));
  EXPECT_THAT(err_.str(), HasSubstr("missing admin token"));

  options_.token = "wrong";
  EXPECT_EQ(Commands().Jobs(), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("rejected the admin token: check --token"));

  options_.token = "s3cret";
  EXPECT_EQ(Commands().Jobs(), kExitOk) << err_.str();
}

TEST_F(AdminCommandsTest, CoordinatorUnreachable_SaysWhereAndHowToFix) {
  // A port that nothing listens on: a second server's, after it shut down.
  int closed_port = 0;
  {
    FakeAdmin other;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &closed_port);
    builder.RegisterService(&other);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    server->Shutdown();
  }
  options_.coordinator = absl::StrCat("127.0.0.1:", closed_port);
  EXPECT_EQ(Commands().Status("demo", ""), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat(
                              "error: cannot reach the coordinator at 127.0.0.1:", closed_port,
                              " (is tessera-coordinator running? set --coordinator or "
                              "TESSERA_COORDINATOR)")));
  EXPECT_EQ(out_.str(), "");
}

TEST_F(AdminCommandsTest, Jobs_Table) {
  v1::JobInfo* job = fake_.jobs.add_jobs();
  job->set_job_id("demo");
  v1::MeshDim* dim = job->mutable_layout()->add_dims();
  dim->set_name("dp");
  dim->set_degree(2);
  job->set_world_size(2);
  job->set_agents_alive(2);
  job->set_latest_committed_step(-1);
  job->set_current_session_id("s100-ab");
  job->set_current_state(v1::SESSION_STATE_COPYING);
  EXPECT_EQ(Commands().Jobs(), kExitOk);
  EXPECT_EQ(out_.str(),
            "JOB   LAYOUT  WORLD  ALIVE  LATEST STEP  SESSION  STATE\n"
            "demo  dp=2        2      2            -  s100-ab  COPYING\n");
}

TEST_F(AdminCommandsTest, Agents_Table_SortedByRank) {
  for (uint32_t rank : {1u, 0u}) {
    v1::AgentInfo* a = fake_.agents.add_agents();
    a->mutable_coord()->set_rank(rank);
    a->set_coords(absl::StrCat("dp=", rank));
    a->set_node_id("node-a");
    a->set_peer_address(absl::StrCat("10.0.0.1:", 7100 + rank));
    a->set_incarnation(0xabcdef);
    a->set_alive(rank == 0);
    a->set_ms_since_heartbeat(rank == 0 ? 500 : 65000);
    a->set_pinned_bytes(3ull << 30);
    if (rank == 0) {
      a->mutable_resident()->set_step(300);
      a->mutable_resident()->set_nbytes(512ull << 20);
      v1::MemoryCopy* held = a->add_buddy_copies();
      held->set_writer_rank(7);
      held->set_nbytes(1ull << 20);
    }
  }
  EXPECT_EQ(Commands().Agents("demo"), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "RANK  COORDS  NODE    PEER           ALIVE  HEARTBEAT   PINNED  IN MEMORY"
            "                                   GPU  INCARNATION\n"
            "   0  dp=0    node-a  10.0.0.1:7100  yes    500ms ago  3.0 GiB  step 300 (512.0 MiB), "
            "buddy of 7 (1.0 MiB)  no   0000000000abcdef\n"
            "   1  dp=1    node-a  10.0.0.1:7101  NO     1m05s ago  3.0 GiB  -"
            "                                           no   0000000000abcdef\n"
            "1 of 2 agents alive\n");
}

TEST_F(AdminCommandsTest, Checkpoints_TableAndJson) {
  v1::CheckpointInfo* c = fake_.checkpoints.add_checkpoints();
  c->set_step(200);
  c->set_dir("/ckpt/demo/step-000000200");
  c->set_session_id("s200-cd");
  c->set_bytes(2048);
  c->set_tensors(3);
  c->set_chunks(9);
  c->set_committed_unix_ms(1700000000000);
  EXPECT_EQ(Commands().Checkpoints("demo"), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("STEP  STATUS        COMMITTED                SIZE  TENSORS  "
                                    "CHUNKS  SESSION  DIR\n"
                                    " 200  disk, latest  2023-11-14 22:13:20Z  2.0 KiB        3  "
                                    "     9  s200-cd  /ckpt/demo/step-000000200\n"));
  options_.json = true;
  EXPECT_EQ(Commands().Checkpoints("demo"), kExitOk);
  v1::ListCheckpointsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &parsed).ok());
  EXPECT_EQ(parsed.checkpoints(0).step(), 200);
}

TEST_F(AdminCommandsTest, Checkpoints_MemoryOnly_ListedAsSuchNeverLatest) {
  v1::CheckpointInfo* memory = fake_.checkpoints.add_checkpoints();
  memory->set_step(5);
  memory->set_session_id("s5");
  memory->set_memory_only(true);
  memory->add_files_not_in_memory("data-00001.safetensors");
  v1::CheckpointInfo* disk = fake_.checkpoints.add_checkpoints();
  disk->set_step(4);
  disk->set_session_id("s4");
  disk->set_dir("/ckpt/demo/step-000000004");
  v1::CheckpointInfo* older = fake_.checkpoints.add_checkpoints();
  older->set_step(2);
  older->set_session_id("s2");
  older->set_dir("/ckpt/demo/step-000000002");
  EXPECT_EQ(Commands().Checkpoints("demo"), kExitOk);
  const std::string out = out_.str();
  EXPECT_THAT(out, ::testing::ContainsRegex("\n +5  memory-only, LOST .* s5 +-\n"));
  EXPECT_THAT(out, ::testing::ContainsRegex("\n +4  disk, latest .* s4 +/ckpt/demo/step-000000004\n"));
  EXPECT_THAT(out, ::testing::ContainsRegex("\n +2  disk  .* s2 +/ckpt/demo/step-000000002\n"));
  EXPECT_THAT(out, HasSubstr("step 5: no live agent holds data-00001.safetensors in memory; it "
                             "can no longer be loaded\n"));
}

TEST_F(AdminCommandsTest, Checkpoints_MemoryOnlyCopiesNotYetKnown_SaidSoNotLost) {
  v1::CheckpointInfo* memory = fake_.checkpoints.add_checkpoints();
  memory->set_step(5);
  memory->set_session_id("s5");
  memory->set_memory_only(true);
  memory->set_memory_copies_unknown(true);
  EXPECT_EQ(Commands().Checkpoints("demo"), kExitOk);
  const std::string out = out_.str();
  EXPECT_THAT(out, ::testing::ContainsRegex("\n +5  memory-only, copies unknown .* s5 +-\n"));
  EXPECT_THAT(out, HasSubstr("step 5: not every live agent has stated its memory copies yet "
                             "(the coordinator started, or an agent registered again, less "
                             "than a lease ago; or an agent has not handled its commit yet); "
                             "list again in a few seconds\n"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("LOST")));
}

TEST_F(AdminCommandsTest, Abort_SendsReason_PrintsOutcome) {
  fake_.session = Status(v1::SESSION_STATE_PERSISTING, 0);
  EXPECT_EQ(Commands().Abort("demo", "maintenance"), kExitOk) << err_.str();
  EXPECT_EQ(fake_.last_reason(), "maintenance");
  EXPECT_THAT(out_.str(), HasSubstr("aborted session s100-ab of job demo (step 100), now "
                                    "ABORTED\n  ABORTED_BY_USER: maintenance\n"));
}

TEST_F(AdminCommandsTest, Watch_NotATerminal_OneLinePerUpdate_Exit0OnCommit) {
  fake_.watch_updates = {Status(v1::SESSION_STATE_PERSISTING, 250),
                         Status(v1::SESSION_STATE_PERSISTING, 750),
                         Status(v1::SESSION_STATE_COMMITTED, 1000)};
  fake_.watch_updates.back().set_checkpoint_dir("/ckpt/demo/step-000000100");
  EXPECT_EQ(Commands().Watch("demo", "s100-ab"), kExitOk) << err_.str();
  EXPECT_EQ(fake_.last_session(), "s100-ab");
  EXPECT_EQ(out_.str(),
            "step 100 PERSISTING 25% 250 B / 1000 B written, chunks 1/4, ranks 0/2\n"
            "step 100 PERSISTING 75% 750 B / 1000 B written, chunks 3/4, ranks 0/2\n"
            "step 100 COMMITTED 1000 B in 4 chunks, checkpoint /ckpt/demo/step-000000100\n");
}

TEST_F(AdminCommandsTest, Watch_Aborted_Exit1WithReason) {
  fake_.watch_updates = {Status(v1::SESSION_STATE_PERSISTING, 250),
                         Status(v1::SESSION_STATE_ABORTED, 250)};
  v1::ErrorDetail* e = fake_.watch_updates.back().mutable_error();
  e->set_code(v1::ERROR_CODE_IO_ERROR);
  e->set_message("pwrite /ckpt/demo/data-1.safetensors: No space left on device");
  e->set_path("/ckpt/demo/data-1.safetensors");
  EXPECT_EQ(Commands().Watch("demo", ""), kExitFailed);
  EXPECT_THAT(out_.str(), HasSubstr("step 100 ABORTED IO_ERROR: pwrite"));
  EXPECT_THAT(out_.str(), HasSubstr("save of step 100 aborted: IO_ERROR: pwrite "
                                    "/ckpt/demo/data-1.safetensors: No space left on device\n"
                                    "  path: /ckpt/demo/data-1.safetensors\n"));
}

TEST_F(AdminCommandsTest, Watch_Terminal_RedrawsFrameInPlace) {
  fake_.watch_updates = {Status(v1::SESSION_STATE_PERSISTING, 250),
                         Status(v1::SESSION_STATE_PERSISTING, 500),
                         Status(v1::SESSION_STATE_COMMITTED, 1000)};
  options_.tty = true;
  EXPECT_EQ(Commands().Watch("demo", ""), kExitOk);
  const std::string text = out_.str();
  // Three frames of 6, 6 and 7 lines; before the 2nd and 3rd the cursor goes up 6 lines.
  std::vector<std::string> parts = absl::StrSplit(text, "\x1b[6A\x1b[J");
  ASSERT_EQ(parts.size(), 3u) << text;
  EXPECT_THAT(parts[0], HasSubstr("PERSISTING  [#######-----------------------] 25%"));
  EXPECT_THAT(parts[1], HasSubstr("PERSISTING  [###############---------------] 50%"));
  EXPECT_THAT(parts[2], HasSubstr("COMMITTED: checkpoint"));
  EXPECT_THAT(parts[2], Not(HasSubstr("pending")));
}

TEST_F(AdminCommandsTest, Watch_Json_OneDocumentPerLine) {
  fake_.watch_updates = {Status(v1::SESSION_STATE_PERSISTING, 250),
                         Status(v1::SESSION_STATE_COMMITTED, 1000)};
  options_.json = true;
  EXPECT_EQ(Commands().Watch("demo", ""), kExitOk);
  std::vector<std::string> lines = absl::StrSplit(out_.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << out_.str();
  v1::SessionStatus last;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines[1], &last).ok());
  EXPECT_EQ(last.state(), v1::SESSION_STATE_COMMITTED);
}

TEST_F(AdminCommandsTest, Watch_StreamEndsEarly_Exit2) {
  fake_.watch_updates = {Status(v1::SESSION_STATE_PERSISTING, 250)};
  EXPECT_EQ(Commands().Watch("demo", ""), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("closed the watch before the session ended (last state "
                                    "PERSISTING)"));
  EXPECT_EQ(Commands().Watch("nojob", ""), kExitError);
  EXPECT_EQ(err_.str(), "error: no job \"nojob\"\n");
}

}  // namespace
}  // namespace cli
}  // namespace tessera
