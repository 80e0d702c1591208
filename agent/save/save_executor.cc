#include "agent/save/save_executor.h"

#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "agent/save/save_work.h"
#include "common/log.h"

namespace tessera {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// The callback of `ticket`, removed from `calls`; empty if it has none.
template <typename Callback>
Callback TakeCall(std::map<uint64_t, Callback>& calls, uint64_t ticket) {
  auto it = calls.find(ticket);
  if (it == calls.end()) return nullptr;
  Callback done = std::move(it->second);
  calls.erase(it);
  return done;
}

void Write(const LogLine& line) {
  switch (line.severity) {
    case LogLine::Severity::kInfo:
      LogInfo(line.text);
      break;
    case LogLine::Severity::kWarning:
      LogWarning(line.text);
      break;
    case LogLine::Severity::kError:
      LogError(line.text);
      break;
  }
}

}  // namespace

SaveExecutor::SaveExecutor(CoordinatorClient* coordinator, StagingPool* staging,
                           Storage* storage, PeerTransport* peers, SaveExecutorOptions options)
    : coordinator_(coordinator),
      staging_(staging),
      storage_(storage),
      peers_(peers),
      options_(std::move(options)),
      core_(options_.core) {
  worker_ = std::thread([this] { RunWorker(); });
  rpc_thread_ = std::thread([this] { RunRpcs(); });
  timer_ = std::thread([this] { RunTimer(); });
}

SaveExecutor::~SaveExecutor() { Shutdown(); }

void SaveExecutor::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (joined_) return;
  }
  Drive([](SaveCore& core, absl::Time now) { return core.Shutdown(now); });
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread* t : {&worker_, &rpc_thread_, &timer_}) {
    if (t->joinable()) t->join();
  }
  absl::MutexLock lock(&mu_);
  joined_ = true;
}

bool SaveExecutor::AwaitTrainerFree(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  // Evaluated at every release of mu_ while someone waits: no allocation.
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (begin_calls_.empty() && !core_.AnyCopying());
  };
  return mu_.AwaitWithTimeout(absl::Condition(&free), timeout);
}

uint64_t SaveExecutor::sessions_committed() const {
  absl::MutexLock lock(&mu_);
  return core_.sessions_committed();
}

// ---------------------------------------------------------------------------------------------
// Events

void SaveExecutor::LeaseMayHaveChanged() {
  // Drive reads the lease first and tells the core if it changed; the event is a Tick, which
  // does only what is due and says when the core next needs one.
  Drive([](SaveCore& core, absl::Time now) { return core.Tick(now); });
}

void SaveExecutor::Drive(const Event& event) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (options_.lease_generation) {
      const std::optional<uint64_t> lease = options_.lease_generation();
      if (!lease_told_.has_value() || *lease_told_ != lease) {
        lease_told_ = lease;
        ApplyLocked(core_.OnLease(now, lease), out);
      }
    }
    ApplyLocked(event(core_, now), out);
    if (!out.committed.empty()) out.commit_order = ++commits_ended_;
  }
  for (const std::string& session : out.cancel_exchanges) peers_->CancelSession(session);
  for (const LogLine& line : out.logs) Write(line);
  // Kept before the trainer hears of the commit, so a load it starts next finds it.
  if (out.resident.has_value() && options_.at_fault_point) options_.at_fault_point("keep");
  const uint64_t kept = out.resident.has_value() ? KeepResident(*out.resident) : 0;
  if (!out.committed.empty() && options_.memory_tier != nullptr) {  // heartbeats state it
    {
      absl::MutexLock lock(&mu_);
      if (out.commit_order > last_committed_order_) {  // not one an earlier event ended
        last_committed_ = out.committed;
        last_committed_order_ = out.commit_order;
      }
    }
    if (options_.after_keep) options_.after_keep();
  }
  for (auto& reply : out.replies) reply();
  if (kept > 0) {
    // The next save stages in the other set of regions: make it now, while the trainer
    // computes, not in that save's stall — on the worker, so the command stream is not held
    // up (a no-op once both sets exist; a PIN queued after it reuses what it made).
    absl::MutexLock lock(&mu_);
    prepare_bytes_ = kept;
  }
}

std::string SaveExecutor::LastCommittedSession() const {
  absl::MutexLock lock(&mu_);
  return last_committed_;
}

uint64_t SaveExecutor::KeepResident(const ResidentSave& save) {
  if (options_.memory_tier == nullptr) return 0;
  std::vector<ResidentRegion> regions = staging_->Retain(save.memory.acquisition);
  if (regions.empty()) {
    LogInfo("step ", save.step, " is not kept in memory: its staging was handed to another save");
    return 0;
  }
  LogInfo("step ", save.step, " kept in memory: ", save.nbytes, " bytes of ", save.file, " in ",
          regions[0].name, " (a region of ", regions[0].capacity, " bytes)");
  options_.memory_tier->Publish(ResidentCheckpoint{save.step, save.session_id, save.file,
                                                   save.file_offset, save.nbytes, regions[0]});
  return regions[0].capacity;
}

void SaveExecutor::ApplyLocked(SaveEffects effects, Outbox& out) {
  if (effects.resident.has_value()) out.resident = std::move(effects.resident);
  if (!effects.committed.empty()) out.committed = std::move(effects.committed);
  for (CoordinatorRpc& rpc : effects.rpcs) rpcs_.push_back(std::move(rpc));
  for (SaveWork& work : effects.work) work_.push_back(std::move(work));
  for (TrainerReply& reply : effects.replies) {
    if (auto* r = std::get_if<BeginSaveReply>(&reply.reply)) {
      if (BeginSaveDone done = TakeCall(begin_calls_, reply.ticket)) {
        const bool copy = r->result.ok() && options_.at_fault_point != nullptr;
        out.replies.push_back(
            [this, copy, done = std::move(done), r = std::move(*r)]() mutable {
              if (copy) options_.at_fault_point("copy");
              done(std::move(r.result));
            });
      }
    } else if (auto* r = std::get_if<StagedReply>(&reply.reply)) {
      if (StatusDone done = TakeCall(staged_calls_, reply.ticket)) {
        out.replies.push_back([done = std::move(done), r = std::move(*r)] { done(r.result); });
      }
    } else if (auto* r = std::get_if<WaitCommittedReply>(&reply.reply)) {
      if (CommitDone done = TakeCall(wait_calls_, reply.ticket)) {
        out.replies.push_back([done = std::move(done), r = std::move(*r)]() mutable {
          done(std::move(r.result));
        });
      }
    }
  }
  for (std::string& session : effects.cancel_exchanges) {
    out.cancel_exchanges.push_back(std::move(session));
  }
  for (LogLine& line : effects.logs) out.logs.push_back(std::move(line));
  next_tick_ = effects.next_tick;
}

uint64_t SaveExecutor::BeginSave(v1::BeginSaveRequest request, BeginSaveDone done) {
  uint64_t ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = next_ticket_++;
    begin_calls_[ticket] = std::move(done);
  }
  // The request is moved into the event: the core takes its shards without copying them.
  auto shared = std::make_shared<v1::BeginSaveRequest>(std::move(request));
  Drive([ticket, shared](SaveCore& core, absl::Time now) {
    return core.BeginSave(now, ticket, std::move(*shared));
  });
  return ticket;
}

void SaveExecutor::TrainerGone(uint64_t ticket) {
  Drive([ticket](SaveCore& core, absl::Time now) { return core.TrainerGone(now, ticket); });
}

void SaveExecutor::Staged(const std::string& session_id, uint64_t stall_ns, StatusDone done,
                          std::optional<v1::ErrorDetail> withdrawn) {
  uint64_t ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = next_ticket_++;
    staged_calls_[ticket] = std::move(done);
  }
  Drive([&](SaveCore& core, absl::Time now) {
    return core.Staged(now, ticket, session_id, stall_ns,
                       withdrawn.has_value() ? &*withdrawn : nullptr);
  });
}

void SaveExecutor::WaitCommitted(int64_t step, absl::Time deadline, CommitDone done) {
  uint64_t ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = next_ticket_++;
    wait_calls_[ticket] = std::move(done);
  }
  Drive([&](SaveCore& core, absl::Time now) {
    return core.WaitCommitted(now, ticket, step, deadline);
  });
}

void SaveExecutor::OnCommand(const v1::Command& command) {
  Drive([&](SaveCore& core, absl::Time now) { return core.OnCommand(now, command); });
}

void SaveExecutor::OnRegistered(const v1::RegisterAgentResponse& response) {
  Drive([&](SaveCore& core, absl::Time now) {
    return core.OnRegistered(now, response.coordinator_incarnation(), response.storage_root());
  });
}

void SaveExecutor::OnStreamConnected() {
  Drive([](SaveCore& core, absl::Time now) { return core.OnStreamConnected(now); });
}

// ---------------------------------------------------------------------------------------------
// Threads

void SaveExecutor::RunTimer() {
  while (true) {
    bool due;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time wake = next_tick_;
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || next_tick_ != wake;
      };
      due = !mu_.AwaitWithDeadline(absl::Condition(&changed), wake);
      if (stop_) return;
    }
    if (due) Drive([](SaveCore& core, absl::Time now) { return core.Tick(now); });
  }
}

void SaveExecutor::RunRpcs() {
  while (true) {
    CoordinatorRpc rpc;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !rpcs_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      rpc = std::move(rpcs_.front());
      rpcs_.pop_front();
    }
    Send(rpc);
  }
}

void SaveExecutor::Send(const CoordinatorRpc& rpc) {
  const uint64_t id = rpc.id;
  std::visit(
      Overloaded{
          [&](const std::shared_ptr<const v1::SubmitLocalPlanRequest>& request) {
            absl::StatusOr<v1::SubmitLocalPlanResponse> result =
                coordinator_->SubmitLocalPlan(*request);
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnPlanSubmitted(now, id, result);
            });
          },
          [&](const std::shared_ptr<const v1::ReportPhaseRequest>& request) {
            const absl::Status result = coordinator_->ReportPhase(*request).status();
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnReportDone(now, id, result);
            });
          },
          [&](const std::shared_ptr<const v1::ReportChunksRequest>& request) {
            const absl::Status result = coordinator_->ReportChunks(*request).status();
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnReportDone(now, id, result);
            });
          },
      },
      rpc.request);
}

void SaveExecutor::RunWorker() {
  while (true) {
    SaveWork work;
    uint64_t prepare = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !work_.empty() || prepare_bytes_ > 0;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      if (prepare_bytes_ > 0) {
        prepare = std::exchange(prepare_bytes_, 0);
      } else {
        work = std::move(work_.front());
        work_.pop_front();
      }
    }
    if (prepare > 0) {
      staging_->Prepare({prepare});
      continue;
    }
    Run(work);
  }
}

void SaveExecutor::Run(const SaveWork& work) {
  const uint64_t id = work.id;
  std::visit(
      Overloaded{
          [&](const PinWork& pin) {
            if (options_.at_fault_point) options_.at_fault_point("pin");
            absl::StatusOr<StagingMemory> memory;
            if (options_.before_acquire) options_.before_acquire();
            const uint64_t evictions = staging_->resident_evictions();
            absl::StatusOr<std::vector<StagingSlot>> slots =
                staging_->Acquire({pin.layout->total_bytes});
            if (staging_->resident_evictions() != evictions) {
              LogInfo("the memory copy of the last committed step was dropped: session ",
                      work.session_id, " needs its room in the staging budget");
            }
            if (!slots.ok()) {
              memory = slots.status();
            } else {
              const StagingSlot& slot = (*slots)[0];
              memory = StagingMemory{slot.name, slot.data, slot.capacity, slot.acquisition};
              if (absl::Status prepared = PrepareStaging(*pin.layout, *memory); !prepared.ok()) {
                memory = prepared;
              }
            }
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnStagingReady(now, id, std::move(memory));
            });
          },
          [&](const GatherWork& gather) {
            if (options_.at_fault_point) options_.at_fault_point("gather");
            if (options_.on_peer_addresses) {
              options_.on_peer_addresses(work.session_id, gather.peer_addresses);
            }
            absl::StatusOr<std::vector<v1::ReplicaHash>> hashes =
                GatherSlices(*peers_, work.session_id, gather);
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnGathered(now, id, std::move(hashes));
            });
          },
          [&](const PersistWork& persist) {
            if (options_.at_fault_point) options_.at_fault_point("persist");
            ShardWriterOptions writer = options_.writer;
            writer.writer_rank = options_.core.rank;
            // The coordinator admits memory-only saves only of agents that registered with
            // their tier on; this refuses one all the same rather than lose it.
            absl::StatusOr<std::vector<v1::ChunkReport>> chunks =
                persist.memory_only && options_.memory_tier == nullptr
                    ? absl::FailedPreconditionError(
                          "a memory-only save on an agent whose memory tier is off")
                    : WriteShards(*storage_, persist, writer);
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnPersisted(now, id, std::move(chunks));
            });
          },
          [&](const CommitWork& commit) {
            if (options_.at_fault_point) options_.at_fault_point("commit");
            const CommitWorkResult result = ResolveAndRetain(*storage_, commit);
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnCommitResolved(now, id, result);
            });
          },
          [&](const RemoveWork& remove) {
            const absl::Status removed = RemoveSessionDir(*storage_, remove);
            Drive([&](SaveCore& core, absl::Time now) {
              return core.OnRemoved(now, id, removed);
            });
          },
      },
      work.item);
}

}  // namespace tessera
