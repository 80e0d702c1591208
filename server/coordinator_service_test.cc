// In-process gRPC test: a real CoordinatorService on a free localhost port, called through
// the agent's GrpcCoordinatorClient, so structured errors are checked across the wire.
#include "server/coordinator_service.h"

#include <memory>

#include "agent/coordinator_client.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/command_streams.h"

namespace tessera {
namespace {

v1::RegisterAgentRequest Registration(uint32_t rank, uint64_t incarnation) {
  v1::RegisterAgentRequest r;
  r.set_job_id("job");
  r.mutable_coord()->set_rank(rank);
  r.set_incarnation(incarnation);
  v1::MeshDim* dim = r.mutable_layout()->add_dims();
  dim->set_name("dp");
  dim->set_degree(4);
  return r;
}

class CoordinatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServiceOptions options;
    options.coordinator_incarnation = 77;
    options.storage_root = "/ckpt";
    service_ = std::make_unique<CoordinatorService>(&registry_, nullptr, nullptr, nullptr, &clock_,
                                                    options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
    client_ = std::make_unique<GrpcCoordinatorClient>(channel_);
  }
  void TearDown() override { server_->Shutdown(); }

  FakeClock clock_;
  AgentRegistry registry_{&clock_, AgentRegistryOptions{absl::Seconds(6), absl::Seconds(1)}};
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<GrpcCoordinatorClient> client_;
};

TEST_F(CoordinatorServiceTest, Register_ReturnsLeaseAndIncarnation) {
  absl::StatusOr<v1::RegisterAgentResponse> r = client_->Register(Registration(2, 9));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->lease_ms(), 6000u);
  EXPECT_EQ(r->heartbeat_interval_ms(), 1000u);
  EXPECT_EQ(r->coordinator_incarnation(), 77u);
  EXPECT_EQ(r->storage_root(), "/ckpt");
  EXPECT_TRUE(registry_.Get("job", 2).has_value());
}

TEST_F(CoordinatorServiceTest, Heartbeat_RenewsLease_SaysWhetherItWasKept) {
  ASSERT_TRUE(client_->Register(Registration(0, 9)).ok());
  // Time the coordinator runs through (its clock read every 200 ms), 5 s of the 6 s lease.
  auto run_for = [&](absl::Duration d) {
    for (absl::Duration passed; passed < d; passed += absl::Milliseconds(200)) {
      clock_.Advance(absl::Milliseconds(200));
      registry_.RunningNow();
    }
  };
  run_for(absl::Seconds(5));
  v1::HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_rank(0);
  beat.set_incarnation(9);
  absl::StatusOr<v1::HeartbeatResponse> kept = client_->Heartbeat(beat);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->lease_kept());
  run_for(absl::Seconds(5));
  absl::StatusOr<std::vector<v1::AgentInfo>> agents = registry_.ListAgents("job");
  ASSERT_TRUE(agents.ok());
  EXPECT_TRUE((*agents)[0].alive()) << "renewed 5 s ago, within its 6 s lease";

  run_for(absl::Seconds(2));  // 7 s since the heartbeat: expired
  absl::StatusOr<v1::HeartbeatResponse> late = client_->Heartbeat(beat);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_FALSE(late->lease_kept()) << "the lease had expired before this heartbeat";
}

TEST_F(CoordinatorServiceTest, Heartbeat_StaleIncarnation_PayloadCrossesTheWire) {
  ASSERT_TRUE(client_->Register(Registration(1, 1)).ok());
  ASSERT_TRUE(client_->Register(Registration(1, 2)).ok());
  v1::HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_rank(1);
  beat.set_incarnation(1);
  absl::StatusOr<v1::HeartbeatResponse> r = client_->Heartbeat(beat);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetErrorCode(r.status()), v1::ERROR_CODE_STALE_INCARNATION);
}

TEST_F(CoordinatorServiceTest, Register_BadLayout_InvalidArgumentWithCode) {
  v1::RegisterAgentRequest r = Registration(0, 1);
  r.mutable_layout()->mutable_dims(0)->set_degree(0);
  absl::Status status = client_->Register(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorCode(status), v1::ERROR_CODE_LAYOUT_MISMATCH);
}

TEST_F(CoordinatorServiceTest, SessionRpcs_WithoutSessionManager_Unimplemented) {
  ASSERT_TRUE(client_->Register(Registration(0, 1)).ok());
  auto stub = v1::Coordinator::NewStub(channel_);
  grpc::ClientContext context;
  v1::SubmitLocalPlanRequest request;
  request.set_job_id("job");
  request.set_incarnation(1);
  v1::SubmitLocalPlanResponse response;
  EXPECT_EQ(stub->SubmitLocalPlan(&context, request, &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(CoordinatorServiceTest, Heartbeat_Unregistered_NotFound) {
  v1::HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_rank(0);
  beat.set_incarnation(1);
  EXPECT_EQ(client_->Heartbeat(beat).status().code(), absl::StatusCode::kNotFound);
}

// CommandStreams sends a PIN's assignment as the plan's encoded bytes: what goes on the wire
// must parse as the same Command with the assignment parsed.
TEST_F(CoordinatorServiceTest,
       FindMemoryCopies_MemoryOnlyBeforeEveryAgentStatedItsCopies_Unavailable) {
  // A coordinator just (re)started: rank 0 asks where data-00001 is before rank 1, its holder,
  // has heartbeated. "Nobody holds it" would call a memory-only step lost; it is not known.
  for (uint32_t r = 0; r < 4; ++r) ASSERT_TRUE(client_->Register(Registration(r, 10 + r)).ok());
  v1::FindMemoryCopiesRequest find;
  find.set_job_id("job");
  find.set_rank(0);
  find.set_incarnation(10);
  find.set_step(7);
  find.set_session_id("s7");
  find.add_files("data-00001");
  // For a checkpoint on disk the copies known are the answer: what none is known of is read
  // from disk.
  absl::StatusOr<v1::FindMemoryCopiesResponse> found = client_->FindMemoryCopies(find);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->copies_size(), 0);
  find.set_memory_only(true);
  found = client_->FindMemoryCopies(find);
  ASSERT_EQ(found.status().code(), absl::StatusCode::kUnavailable) << found.status();
  EXPECT_NE(found.status().message().find("data-00001"), std::string::npos) << found.status();

  // Every rank heartbeats, rank 1 stating its copy: the answer names it.
  for (uint32_t r = 0; r < 4; ++r) {
    v1::HeartbeatRequest beat;
    beat.set_job_id("job");
    beat.set_rank(r);
    beat.set_incarnation(10 + r);
    if (r == 1) {
      v1::MemoryCopy* copy = beat.mutable_resident();
      copy->set_step(7);
      copy->set_session_id("s7");
      copy->set_file("data-00001");
      copy->set_nbytes(4096);
    }
    ASSERT_TRUE(client_->Heartbeat(beat).ok());
  }
  found = client_->FindMemoryCopies(find);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->copies_size(), 1);
  EXPECT_EQ(found->copies(0).rank(), 1u);

  // A file nobody states: once every rank was heard, no holder is the answer.
  find.set_files(0, "data-00002");
  found = client_->FindMemoryCopies(find);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->copies_size(), 0);

  // Unless the step committed in memory only and a live agent has not said it handled that
  // commit (its writer, say, between the commit and keeping the step): not known either.
  registry_.NoteMemoryCommit("job", "s7");
  v1::HeartbeatRequest beat;
  beat.set_job_id("job");
  beat.set_rank(2);
  beat.set_incarnation(12);
  ASSERT_TRUE(client_->Heartbeat(beat).ok());
  found = client_->FindMemoryCopies(find);
  ASSERT_EQ(found.status().code(), absl::StatusCode::kUnavailable) << found.status();
  EXPECT_NE(found.status().message().find("data-00002"), std::string::npos) << found.status();
  // Once every agent said so (rank 2 kept nothing of it), none holds data-00002.
  for (uint32_t r = 0; r < 4; ++r) {
    beat.set_rank(r);
    beat.set_incarnation(10 + r);
    beat.set_last_committed_session("s7");
    ASSERT_TRUE(client_->Heartbeat(beat).ok());
  }
  found = client_->FindMemoryCopies(find);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->copies_size(), 0);
}

TEST(PinWithEncodedAssignment, SerializesAsTheParsedCommand) {
  v1::RankAssignment assignment;
  assignment.set_file("data-00001.safetensors");
  v1::WriteItem* write = assignment.add_writes();
  write->set_key("w#exp_avg");
  write->mutable_box()->add_offsets(0);
  write->mutable_box()->add_lengths(8);
  write->add_sources()->set_rank(3);
  assignment.add_sends()->set_leader_rank(2);
  for (bool empty : {false, true}) {
    v1::Command header;
    header.set_session_id("s-1");
    header.set_step(7);
    header.set_seq(42);
    header.mutable_pin()->set_plan_cached(true);
    v1::Command expected = header;
    if (!empty) *expected.mutable_pin()->mutable_assignment() = assignment;
    const std::string bytes = empty ? "" : assignment.SerializeAsString();

    v1::Command parsed;
    ASSERT_TRUE(
        parsed.ParseFromString(PinWithEncodedAssignment(header, bytes).SerializeAsString()));
    EXPECT_EQ(parsed.session_id(), "s-1");
    EXPECT_EQ(parsed.seq(), 42u);
    EXPECT_TRUE(parsed.pin().plan_cached());
    EXPECT_EQ(parsed.pin().assignment().SerializeAsString(), bytes);
    EXPECT_EQ(parsed.pin().assignment().SerializeAsString(),
              expected.pin().assignment().SerializeAsString());
    EXPECT_EQ(parsed.pin().GetReflection()->GetUnknownFields(parsed.pin()).field_count(), 0);
  }
}

}  // namespace
}  // namespace tessera
