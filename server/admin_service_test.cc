// In-process gRPC test of the Admin service over a real AgentRegistry and SessionManager:
// token enforcement, listings, and structured errors across the wire.
#include "server/admin_service.h"

#include <memory>

#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/store/memory_state_store.h"

namespace tessera {
namespace {

class NullSink : public CommandSink {
 public:
  void Send(const std::string&, uint32_t, const v1::Command&) override {}
};

class NullCommitter : public CommitEdge {
 public:
  CommitResolution Commit(const CommitAttempt&) override {
    return {CommitOutcome::kCommitted, absl::OkStatus()};
  }
  absl::Status Retain(const RetentionWork&) override { return absl::OkStatus(); }
  absl::Status Remove(const std::string&) override { return absl::OkStatus(); }
};

class AdminServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SessionManagerOptions options;
    options.session.storage_root = "/ckpt";
    sessions_ = std::make_unique<SessionManager>(&store_, &registry_, &sink_, &committer_,
                                                 &clock_, options);
    service_ = std::make_unique<AdminService>(&registry_, sessions_.get(), "s3cret");
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Admin::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                   grpc::InsecureChannelCredentials()));
    v1::RegisterAgentRequest r;
    r.set_job_id("llama");
    r.set_incarnation(7);
    v1::MeshDim* dim = r.mutable_layout()->add_dims();
    dim->set_name("dp");
    dim->set_degree(2);
    ASSERT_TRUE(registry_.Register(r).ok());
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  FakeClock clock_;
  AgentRegistry registry_{&clock_, AgentRegistryOptions()};
  MemoryStateStore store_;
  NullSink sink_;
  NullCommitter committer_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<AdminService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Admin::Stub> stub_;
};

TEST_F(AdminServiceTest, ListJobs_WithoutOrWithWrongToken_Unauthenticated) {
  v1::ListJobsResponse response;
  EXPECT_EQ(stub_->ListJobs(Context("").get(), {}, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub_->ListJobs(Context("guess").get(), {}, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(AdminServiceTest, ListJobs_WithToken_ShowsRegisteredJob) {
  v1::ListJobsResponse response;
  ASSERT_TRUE(stub_->ListJobs(Context("s3cret").get(), {}, &response).ok());
  ASSERT_EQ(response.jobs_size(), 1);
  EXPECT_EQ(response.jobs(0).job_id(), "llama");
  EXPECT_EQ(response.jobs(0).world_size(), 2u);
  EXPECT_EQ(response.jobs(0).agents_alive(), 1u);
  EXPECT_EQ(response.jobs(0).latest_committed_step(), -1);
}

TEST_F(AdminServiceTest, ListAgents_ShowsCoordinates) {
  v1::ListAgentsRequest request;
  request.set_job_id("llama");
  v1::ListAgentsResponse response;
  ASSERT_TRUE(stub_->ListAgents(Context("s3cret").get(), request, &response).ok());
  ASSERT_EQ(response.agents_size(), 1);
  EXPECT_EQ(response.agents(0).coords(), "dp=0");
}

TEST_F(AdminServiceTest, GetSessionAndAbort_UnknownJob_NotFound) {
  v1::GetSessionRequest get;
  get.set_job_id("nope");
  v1::SessionStatus status;
  EXPECT_EQ(stub_->GetSession(Context("s3cret").get(), get, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::AbortSessionRequest abort;
  abort.set_job_id("nope");
  EXPECT_EQ(stub_->AbortSession(Context("s3cret").get(), abort, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(AdminServiceTest, WatchSession_WithoutToken_Unauthenticated) {
  v1::GetSessionRequest request;
  request.set_job_id("llama");
  auto context = Context("");
  std::unique_ptr<grpc::ClientReader<v1::SessionStatus>> reader =
      stub_->WatchSession(context.get(), request);
  v1::SessionStatus status;
  EXPECT_FALSE(reader->Read(&status));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace tessera
