// gRPC adapter for the trainer-facing Agent service (proto/tessera/v1/agent.proto), served on
// a unix socket. Saves go to the SaveExecutor, loads to the Loader.
//
// Nothing blocks a gRPC thread: BeginSave, Staged and WaitCommitted finish from the
// executor's callbacks; Load, ListResidentBlocks and ReserveStaging run on this service's own
// worker thread (reads, manifests and faulting in a region can take long).
//
// Thread-safety: safe for concurrent RPCs.
#ifndef TESSERA_AGENT_TRAINER_SERVICE_H_
#define TESSERA_AGENT_TRAINER_SERVICE_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/loader.h"
#include "agent/memory_tier.h"
#include "agent/save/save_executor.h"
#include "agent/staging_pool.h"
#include "tessera/v1/agent.grpc.pb.h"

namespace tessera {

struct TrainerServiceOptions {
  // Whether the agent may serve its trainer (Lifeline::Admission): every call that starts
  // something (GetInfo, BeginSave, RefuseSave, Load, ListResidentBlocks, ReserveStaging)
  // answers its error while it is not OK — UNAVAILABLE until registered, naming the
  // coordinator's refusal if it refused. Default: always OK.
  std::function<absl::Status()> admission;
  // Passes a trainer's RefuseSave to the coordinator (a SubmitLocalPlan with its refusal);
  // runs on the service's worker thread. Default: none (RefuseSave answers UNIMPLEMENTED).
  std::function<absl::Status(const v1::RefuseSaveRequest&)> refuse_save;
};

class TrainerService final : public v1::Agent::CallbackService {
 public:
  // `executor`, `loader`, `staging` (the save pool) and `memory` (null with the memory tier
  // off) must outlive the service. `identity` is returned by GetInfo, with the region of
  // `memory`'s resident checkpoint as of the call. ReserveStaging makes `staging_sets` sets
  // (2 with the memory tier).
  TrainerService(SaveExecutor* executor, Loader* loader, v1::AgentIdentity identity,
                 StagingPool* staging, int staging_sets, const MemoryTier* memory,
                 TrainerServiceOptions options = {});
  ~TrainerService() override;

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::GetInfoRequest* request,
                                    v1::AgentIdentity* response) override;
  grpc::ServerUnaryReactor* RefuseSave(grpc::CallbackServerContext* context,
                                       const v1::RefuseSaveRequest* request,
                                       v1::RefuseSaveResponse* response) override;
  grpc::ServerUnaryReactor* BeginSave(grpc::CallbackServerContext* context,
                                      const v1::BeginSaveRequest* request,
                                      v1::BeginSaveResponse* response) override;
  grpc::ServerUnaryReactor* Staged(grpc::CallbackServerContext* context,
                                   const v1::StagedRequest* request,
                                   v1::StagedResponse* response) override;
  grpc::ServerUnaryReactor* WaitCommitted(grpc::CallbackServerContext* context,
                                          const v1::WaitCommittedRequest* request,
                                          v1::WaitCommittedResponse* response) override;
  grpc::ServerUnaryReactor* Load(grpc::CallbackServerContext* context,
                                 const v1::LoadRequest* request,
                                 v1::LoadResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseLoad(grpc::CallbackServerContext* context,
                                        const v1::ReleaseLoadRequest* request,
                                        v1::ReleaseLoadResponse* response) override;
  grpc::ServerUnaryReactor* ListResidentBlocks(grpc::CallbackServerContext* context,
                                               const v1::ListResidentBlocksRequest* request,
                                               v1::ListResidentBlocksResponse* response) override;
  grpc::ServerUnaryReactor* ReserveStaging(grpc::CallbackServerContext* context,
                                           const v1::ReserveStagingRequest* request,
                                           v1::ReserveStagingResponse* response) override;

 private:
  void RunLoads();
  // OK, or the error every call that starts something answers (TrainerServiceOptions).
  absl::Status Admitted() const;
  // Runs `task` on the worker thread, after the tasks queued before it.
  void Queue(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  SaveExecutor* const executor_;
  Loader* const loader_;
  const v1::AgentIdentity identity_;
  StagingPool* const staging_;
  const int staging_sets_;
  const MemoryTier* const memory_;
  const TrainerServiceOptions options_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> loads_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread load_worker_;  // last
};

}  // namespace tessera

#endif  // TESSERA_AGENT_TRAINER_SERVICE_H_
