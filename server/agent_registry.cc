#include "server/agent_registry.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status.h"

namespace tessera {
namespace {

absl::Status LayoutMismatch(absl::string_view message) {
  return MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_LAYOUT_MISMATCH, message);
}

absl::Duration MaxUnheardStep(const AgentRegistryOptions& options) {
  if (options.max_unheard_step > absl::ZeroDuration()) return options.max_unheard_step;
  return std::min(absl::Seconds(1), options.lease / 4);
}

}  // namespace

AgentRegistry::AgentRegistry(const Clock* clock, AgentRegistryOptions options)
    : options_(options), clock_(clock, MaxUnheardStep(options)), serving_since_(clock_.Now()) {}

void AgentRegistry::StartServing() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  serving_since_ = now;
  for (auto& [job_id, note] : memory_notes_) {
    note.until = std::max(note.until, serving_since_ + options_.lease);
  }
}

AgentRegistry::MemoryCommitNote* AgentRegistry::NoteLocked(const std::string& job_id,
                                                           absl::Time now) const {
  auto note = memory_notes_.find(job_id);
  // Past its lease agents are judged by what they state.
  if (note == memory_notes_.end() || now >= note->second.until) return nullptr;
  return &note->second;
}

absl::StatusOr<AgentRegistry::Registered> AgentRegistry::Register(
    const v1::RegisterAgentRequest& request) {
  if (!IsValidJobId(request.job_id())) {
    return LayoutMismatch(absl::StrCat("invalid job id \"", request.job_id(),
                                       "\" (1..128 of [A-Za-z0-9._-], not starting with '.')"));
  }
  const uint32_t rank = request.coord().rank();
  // A refusal for a rank of a known job's mesh is recorded against the rank: a session that
  // waits for it learns why it will not come (Liveness).
  auto refuse = [&](absl::Status refusal) {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(request.job_id());
    if (job != jobs_.end()) RefuseLocked(job->second, rank, refusal);
    return refusal;
  };
  if (request.incarnation() == 0) {
    return refuse(absl::InvalidArgumentError("incarnation must be non-zero"));
  }
  absl::StatusOr<MeshLayout> layout = MeshLayout::FromProto(request.layout());
  if (!layout.ok()) return refuse(LayoutMismatch(layout.status().message()));
  if (rank >= layout->world_size()) {
    return refuse(LayoutMismatch(absl::StrCat("rank ", rank, " is outside the mesh of ",
                                              layout->world_size(), " ranks")));
  }
  if (!request.coord().index().empty()) {
    std::vector<uint32_t> index(request.coord().index().begin(), request.coord().index().end());
    absl::StatusOr<uint32_t> from_coords = layout->Rank(index);
    if (!from_coords.ok()) return refuse(LayoutMismatch(from_coords.status().message()));
    if (*from_coords != rank) {
      return refuse(LayoutMismatch(absl::StrCat("rank ", rank, " has the coordinates of rank ",
                                                *from_coords, " (",
                                                layout->CoordString(*from_coords), ")")));
    }
  }

  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  auto [it, inserted] = jobs_.try_emplace(request.job_id(), Job{*layout, {}});
  Job& job = it->second;
  if (!inserted && !job.layout.SameMesh(request.layout())) {
    // A job may resume on another layout once every agent of the old one is gone.
    bool any_alive = false;
    for (const auto& [r, agent] : job.agents) any_alive = any_alive || LiveLocked(agent, now);
    if (!any_alive) {
      job.layout = *layout;
      job.agents.clear();
      job.holders.clear();
      job.unstated.clear();
      job.refused.clear();
      job.absent_changed = ++job.version;  // every rank is absent now
      memory_notes_.erase(request.job_id());  // the old mesh's save
    }
  }
  if (!inserted && !job.layout.SameMesh(request.layout())) {
    absl::Status refusal =
        LayoutMismatch(absl::StrCat("job \"", request.job_id(), "\" has layout ",
                                    LayoutSpec(job.layout.proto()), " but rank ", rank,
                                    " registered with ", LayoutSpec(request.layout())));
    RefuseLocked(job, rank, refusal);
    return refusal;
  }
  Registered result;
  Agent& agent = job.agents[rank];
  MemoryCommitNote* note = NoteLocked(request.job_id(), now);
  if (agent.registration.incarnation() == 0) {
    if (note != nullptr) note->unkept.insert(rank);  // may be the process that had the step
    result.lease_kept = now - serving_since_ <= options_.lease;  // judged gone only after
  } else if (agent.registration.incarnation() != request.incarnation()) {
    result.replaced_incarnation = agent.registration.incarnation();
    if (note != nullptr) note->unkept.erase(rank);  // a new process: it holds nothing of it
  } else {
    result.lease_kept = LiveLocked(agent, now) && agent.judged != AgentLiveness::State::kLost;
  }
  agent.registration = request;
  agent.registration.mutable_coord()->clear_index();
  for (uint32_t c : job.layout.Coords(rank)) agent.registration.mutable_coord()->add_index(c);
  agent.last_heartbeat = now;
  agent.dead.reset();
  agent.judged = AgentLiveness::State::kLive;
  job.refused.erase(rank);
  ChangedLocked(job, rank);
  job.IndexCopies(rank, agent, /*add=*/false);
  agent.resident.reset();  // its next heartbeat states what it holds
  agent.buddy_copies.clear();
  job.unstated.insert(rank);  // until then, MayMissCopies
  job.buddies.reset();
  return result;
}

absl::StatusOr<AgentRegistry::Agent*> AgentRegistry::FindLocked(const std::string& job_id,
                                                                uint32_t rank,
                                                                uint64_t incarnation) const {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown job \"", job_id, "\""));
  }
  auto agent = job->second.agents.find(rank);
  if (agent == job->second.agents.end()) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " of job \"", job_id,
                                            "\" is not registered"));
  }
  if (agent->second.registration.incarnation() != incarnation) {
    return MakeError(absl::StatusCode::kFailedPrecondition, v1::ERROR_CODE_STALE_INCARNATION,
                     absl::StrCat("rank ", rank, " of job \"", job_id,
                                  "\" sent a message from a previous incarnation"));
  }
  return &agent->second;
}

absl::StatusOr<AgentRegistry::Renewal> AgentRegistry::Heartbeat(
    const std::string& job_id, uint32_t rank, uint64_t incarnation, uint64_t pinned_bytes,
    std::optional<v1::MemoryCopy> resident, std::vector<v1::MemoryCopy> buddy_copies,
    std::string last_committed_session) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  ASSIGN_OR_RETURN(Agent * agent, FindLocked(job_id, rank, incarnation));
  Job& job = jobs_.at(job_id);
  Renewal renewal;
  // Kept: live now, and not handed to a session as lost meanwhile (Liveness judged it so).
  renewal.lease_kept = LiveLocked(*agent, now) && agent->judged != AgentLiveness::State::kLost;
  // An agent back from an expired lease (frozen, not dead) rejoins BuddyOf's ring.
  if (!renewal.lease_kept) job.buddies.reset();
  // Heard from: whatever was refused for its rank, or thought of it, no longer stands.
  if (!renewal.lease_kept || agent->judged != AgentLiveness::State::kLive ||
      job.refused.erase(rank) > 0) {
    ChangedLocked(job, rank);
  }
  agent->dead.reset();
  agent->judged = AgentLiveness::State::kLive;
  agent->last_heartbeat = now;
  agent->pinned_bytes = pinned_bytes;
  auto held_here = [&](v1::MemoryCopy& copy) {
    copy.set_rank(rank);
    copy.set_node_id(agent->registration.node_id());
    copy.set_peer_address(agent->registration.peer_address());
    copy.set_bulk_address(agent->registration.memory_bulk_address());
  };
  if (resident.has_value()) {
    held_here(*resident);
    resident->set_writer_rank(rank);
  }
  for (v1::MemoryCopy& copy : buddy_copies) held_here(copy);
  job.unstated.erase(rank);
  if (now - serving_since_ < options_.lease) {
    job.heard_while_young.insert(rank);
  } else if (!job.heard_while_young.empty()) {
    job.heard_while_young.clear();  // no longer asked for
  }
  if (MemoryCommitNote* note = NoteLocked(job_id, now);
      note != nullptr && last_committed_session == note->session_id) {
    note->unkept.erase(rank);  // what it states now is what it kept of that commit
  }
  job.IndexCopies(rank, *agent, /*add=*/false);
  agent->resident = std::move(resident);
  agent->buddy_copies = std::move(buddy_copies);
  job.IndexCopies(rank, *agent, /*add=*/true);
  return renewal;
}

bool AgentRegistry::MarkDead(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                             const std::string& why) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Agent*> agent = FindLocked(job_id, rank, incarnation);
  if (!agent.ok() || (*agent)->dead.has_value()) return false;
  (*agent)->dead = why;
  (*agent)->judged = AgentLiveness::State::kLost;
  Job& job = jobs_.at(job_id);
  job.buddies.reset();
  ChangedLocked(job, rank);
  return true;
}

void AgentRegistry::RefuseLocked(Job& job, uint32_t rank, const absl::Status& refusal) {
  // Only a rank of this job's mesh, and only a refusal of its layout: one the agent cannot
  // get past by trying again (a zero incarnation is a broken client, not a verdict on a rank).
  if (rank >= job.layout.world_size() || GetErrorCode(refusal) != v1::ERROR_CODE_LAYOUT_MISMATCH) {
    return;
  }
  v1::ErrorDetail refused = GetErrorDetail(refusal).value_or(v1::ErrorDetail());
  refused.set_message(absl::StrCat("its registration was refused: ", refusal.message()));
  job.refused.insert_or_assign(rank, std::move(refused));
  ChangedLocked(job, rank);
}

void AgentRegistry::ChangedLocked(Job& job, uint32_t rank) {
  job.changes.emplace_back(++job.version, rank);
  // Nobody may be taking them (a job no session of which this coordinator has seen): keep one
  // entry per rank, the newest, once the log is twice the mesh.
  if (job.changes.size() > 2 * static_cast<size_t>(job.layout.world_size()) + 64) {
    absl::flat_hash_map<uint32_t, uint64_t> newest;
    for (const auto& [version, r] : job.changes) newest[r] = std::max(newest[r], version);
    job.changes.clear();
    for (const auto& [r, version] : newest) job.changes.emplace_back(version, r);
    std::sort(job.changes.begin(), job.changes.end());
  }
}

AgentLiveness AgentRegistry::JudgeLocked(const Job* job, uint32_t rank, absl::Time now) const {
  AgentLiveness verdict;
  verdict.rank = rank;
  const Agent* agent = nullptr;
  if (job != nullptr) {
    auto it = job->agents.find(rank);
    if (it != job->agents.end()) agent = &it->second;
  }
  if (agent != nullptr) {
    const v1::RegisterAgentRequest& r = agent->registration;
    verdict.incarnation = r.incarnation();
    verdict.peer_address = r.peer_address();
    verdict.storage_root_mounted = r.storage_root_mounted();
    verdict.memory_tier = r.memory_tier();
    verdict.copies_when_pinned = r.copies_when_pinned();
    verdict.writes_when_staged = r.writes_when_staged();
    if (LiveLocked(*agent, now)) {
      verdict.state = AgentLiveness::State::kLive;
      return verdict;
    }
  }
  if (job != nullptr) {
    if (auto refused = job->refused.find(rank); refused != job->refused.end()) {
      verdict.state = AgentLiveness::State::kLost;
      verdict.lost = refused->second;
      return verdict;
    }
  }
  if (agent != nullptr) {
    verdict.state = AgentLiveness::State::kLost;
    verdict.lost.set_code(v1::ERROR_CODE_AGENT_LOST);
    verdict.lost.set_message(agent->dead.has_value() ? *agent->dead
                                                     : "no heartbeat within the lease");
    return verdict;
  }
  verdict.gone = now - serving_since_ > options_.lease;
  return verdict;
}

std::vector<AgentLiveness> AgentRegistry::Liveness(const std::string& job_id, uint32_t world,
                                                   uint64_t* since, bool judge_leases) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  std::vector<AgentLiveness> out;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    // No agent of the job has registered: every rank is absent (and gone after a lease).
    for (uint32_t r = 0; r < world; ++r) out.push_back(JudgeLocked(nullptr, r, now));
    *since = 0;
    return out;
  }
  Job& job = it->second;
  if (judge_leases) {
    for (auto& [rank, agent] : job.agents) {
      const AgentLiveness::State state =
          LiveLocked(agent, now) ? AgentLiveness::State::kLive : AgentLiveness::State::kLost;
      if (state != agent.judged) {
        agent.judged = state;
        ChangedLocked(job, rank);
      }
    }
    const bool absent_gone = now - serving_since_ > options_.lease;
    if (absent_gone != job.absent_gone) {
      job.absent_gone = absent_gone;
      job.absent_changed = ++job.version;
    }
  }
  // What the consumer has seen is done with.
  auto seen = std::find_if(job.changes.begin(), job.changes.end(),
                           [&](const auto& change) { return change.first > *since; });
  job.changes.erase(job.changes.begin(), seen);
  absl::btree_set<uint32_t> ranks;
  if (*since == 0) {
    for (uint32_t r = 0; r < world; ++r) ranks.insert(r);
  } else {
    for (const auto& [version, rank] : job.changes) {
      if (rank < world) ranks.insert(rank);
    }
    if (job.absent_changed > *since) {
      for (uint32_t r = 0; r < world; ++r) {
        if (job.agents.count(r) == 0) ranks.insert(r);
      }
    }
  }
  out.reserve(ranks.size());
  for (uint32_t r : ranks) out.push_back(JudgeLocked(&job, r, now));
  *since = job.version;
  return out;
}

void AgentRegistry::Job::IndexCopies(uint32_t rank, const Agent& agent, bool add) {
  auto index = [&](const v1::MemoryCopy& copy) {
    if (add) {
      holders[copy.file()].insert(rank);
      return;
    }
    auto it = holders.find(copy.file());
    if (it == holders.end()) return;
    it->second.erase(rank);
    if (it->second.empty()) holders.erase(it);
  };
  if (agent.resident.has_value()) index(*agent.resident);
  for (const v1::MemoryCopy& copy : agent.buddy_copies) index(copy);
}

void AgentRegistry::NoteMemoryCommit(const std::string& job_id, const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  MemoryCommitNote& note = memory_notes_[job_id];
  if (note.session_id == session_id) return;  // noted before: agents that named it stay out
  note.session_id = session_id;
  note.until = std::max(clock_.Now(), serving_since_) + options_.lease;
  note.unkept.clear();
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  for (const auto& [rank, agent] : job->second.agents) note.unkept.insert(rank);
}

std::optional<v1::MemoryBuddy> AgentRegistry::BuddyOf(const std::string& job_id,
                                                      uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return std::nullopt;
  const Job& j = job->second;
  const absl::Time now = clock_.Now();
  if (!j.buddies.has_value() || now > j.buddies_valid_until) {
    // A ring over the nodes of live agents: the i-th rank of a node (by rank) pairs with the
    // i-th of the next. It holds until the first of their leases can expire.
    absl::btree_map<std::string, std::vector<uint32_t>> nodes;
    j.buddies_valid_until = absl::InfiniteFuture();
    for (const auto& [r, agent] : j.agents) {
      // An agent with the memory tier off neither holds nor sends copies.
      if (!agent.registration.memory_tier() || !LiveLocked(agent, now)) {
        continue;
      }
      nodes[agent.registration.node_id()].push_back(r);
      j.buddies_valid_until = std::min(j.buddies_valid_until, agent.last_heartbeat + options_.lease);
    }
    j.buddies.emplace();
    if (nodes.size() > 1) {
      for (auto it = nodes.begin(); it != nodes.end(); ++it) {
        auto next = std::next(it) == nodes.end() ? nodes.begin() : std::next(it);
        for (size_t i = 0; i < it->second.size(); ++i) {
          (*j.buddies)[it->second[i]] = next->second[std::min(i, next->second.size() - 1)];
        }
      }
    }
  }
  auto buddy = j.buddies->find(rank);
  if (buddy == j.buddies->end()) return std::nullopt;
  const Agent& agent = j.agents.at(buddy->second);
  v1::MemoryBuddy out;
  out.set_rank(buddy->second);
  out.set_peer_address(agent.registration.peer_address());
  out.set_bulk_address(agent.registration.memory_bulk_address());
  out.set_node_id(agent.registration.node_id());
  out.set_incarnation(agent.registration.incarnation());
  return out;
}

bool AgentRegistry::MayMissCopies(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  return MayMissCopiesLocked(job_id, JobLocked(job_id), now);
}

bool AgentRegistry::MayMissCopiesLocked(const std::string& job_id, const Job* job,
                                        absl::Time now, const std::string* session_id) const {
  auto any_live = [&](const absl::btree_set<uint32_t>& ranks) {
    for (uint32_t rank : ranks) {
      auto agent = job->agents.find(rank);
      if (agent != job->agents.end() && LiveLocked(agent->second, now)) {
        return true;
      }
    }
    return false;
  };
  if (job != nullptr) {
    if (any_live(job->unstated)) return true;
    const MemoryCommitNote* note =
        session_id != nullptr ? NoteLocked(job_id, now) : nullptr;
    if (note != nullptr && note->session_id == *session_id && any_live(note->unkept)) {
      return true;
    }
  }
  if (now - serving_since_ >= options_.lease) return false;
  return job == nullptr || job->heard_while_young.size() < job->layout.world_size();
}

std::vector<v1::MemoryCopy> AgentRegistry::MemoryCopies(const std::string& job_id, int64_t step,
                                                        const std::string& session_id,
                                                        absl::Span<const std::string> files,
                                                        bool* may_miss) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  std::vector<v1::MemoryCopy> copies;
  auto job = jobs_.find(job_id);
  if (may_miss != nullptr) {
    *may_miss =
        MayMissCopiesLocked(job_id, job == jobs_.end() ? nullptr : &job->second, now,
                            &session_id);
  }
  if (job == jobs_.end()) return copies;
  const absl::flat_hash_set<absl::string_view> file_set(files.begin(), files.end());
  auto wanted = [&](const v1::MemoryCopy& c) {
    return c.step() == step && c.session_id() == session_id &&
           (file_set.empty() || file_set.contains(c.file()));
  };
  auto add = [&](const Agent& agent) {
    if (!LiveLocked(agent, now)) return;
    if (agent.resident.has_value() && wanted(*agent.resident)) copies.push_back(*agent.resident);
    for (const v1::MemoryCopy& c : agent.buddy_copies) {
      if (wanted(c)) copies.push_back(c);
    }
  };
  if (files.empty()) {
    for (const auto& [rank, agent] : job->second.agents) add(agent);
    return copies;
  }
  absl::btree_set<uint32_t> ranks;  // by rank, as without `files`
  for (const std::string& file : files) {
    auto it = job->second.holders.find(file);
    if (it != job->second.holders.end()) ranks.insert(it->second.begin(), it->second.end());
  }
  for (uint32_t rank : ranks) {
    auto agent = job->second.agents.find(rank);
    if (agent != job->second.agents.end()) add(agent->second);
  }
  return copies;
}

absl::StatusOr<std::vector<v1::MemoryCopy>> AgentRegistry::FindMemoryCopies(
    const v1::FindMemoryCopiesRequest& request) const {
  RETURN_IF_ERROR(CheckIncarnation(request.job_id(), request.rank(), request.incarnation()));
  const std::vector<std::string> files(request.files().begin(), request.files().end());
  bool may_miss = false;
  std::vector<v1::MemoryCopy> copies =
      MemoryCopies(request.job_id(), request.step(), request.session_id(), files, &may_miss);
  if (!request.memory_only() || !may_miss) return copies;
  absl::flat_hash_set<absl::string_view> held;
  for (const v1::MemoryCopy& copy : copies) held.insert(copy.file());
  std::string unknown = files.empty() ? "the checkpoint's files" : "";
  for (const std::string& file : files) {
    if (!held.contains(file)) {
      unknown = file;
      break;
    }
  }
  if (unknown.empty()) return copies;
  return absl::UnavailableError(
      absl::StrCat("not every live agent of job ", request.job_id(),
                   " has stated its memory copies of step ", request.step(),
                   " yet (the coordinator started, or an agent registered again, less than a "
                   "lease ago; or an agent has not handled its commit yet): who holds ",
                   unknown, " is not known; ask again"));
}

absl::Status AgentRegistry::CheckIncarnation(const std::string& job_id, uint32_t rank,
                                             uint64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  return FindLocked(job_id, rank, incarnation).status();
}

std::optional<MeshLayout> AgentRegistry::JobLayout(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return std::nullopt;
  return job->second.layout;
}

const AgentRegistry::Job* AgentRegistry::JobLocked(const std::string& job_id) const {
  auto job = jobs_.find(job_id);
  return job == jobs_.end() ? nullptr : &job->second;
}

const v1::RegisterAgentRequest* AgentRegistry::RegistrationOf(const Job* job, uint32_t rank) {
  if (job == nullptr) return nullptr;
  auto agent = job->agents.find(rank);
  return agent == job->agents.end() ? nullptr : &agent->second.registration;
}

std::optional<v1::RegisterAgentRequest> AgentRegistry::Get(const std::string& job_id,
                                                           uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  const v1::RegisterAgentRequest* registration = RegistrationOf(JobLocked(job_id), rank);
  if (registration == nullptr) return std::nullopt;
  return *registration;
}

std::vector<NodeBudget> AgentRegistry::NodeBudgets(const std::string& job_id,
                                                   uint32_t world) const {
  std::vector<NodeBudget> nodes(world);
  absl::MutexLock lock(&mu_);
  const Job* job = JobLocked(job_id);
  for (uint32_t r = 0; r < world; ++r) {
    const v1::RegisterAgentRequest* registration = RegistrationOf(job, r);
    if (registration == nullptr) {
      nodes[r].node_id = absl::StrCat("(rank ", r, ", not registered)");
    } else {
      nodes[r] = {registration->node_id(), registration->node_host_ram_budget()};
    }
  }
  return nodes;
}

std::vector<RelayPeer> AgentRegistry::RelayPeers(const std::string& job_id,
                                                 uint32_t world) const {
  std::vector<RelayPeer> peers(world);
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  const Job* job = JobLocked(job_id);
  if (job == nullptr) return peers;
  for (const auto& [rank, agent] : job->agents) {
    if (rank >= world) break;
    const v1::RegisterAgentRequest& r = agent.registration;
    RelayPeer& peer = peers[rank];
    peer.relays = r.relays_commands() && !r.peer_address().empty() &&
                  LiveLocked(agent, now);
    peer.node_id = r.node_id();
    peer.peer_address = r.peer_address();
    peer.incarnation = r.incarnation();
  }
  return peers;
}

std::vector<std::string> AgentRegistry::Jobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> jobs;
  for (const auto& [id, job] : jobs_) jobs.push_back(id);
  return jobs;
}

absl::StatusOr<std::vector<v1::AgentInfo>> AgentRegistry::ListAgents(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();  // under the lock: judged in the order of the events
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown job \"", job_id, "\""));
  }
  std::vector<v1::AgentInfo> agents;
  for (const auto& [rank, agent] : job->second.agents) {
    v1::AgentInfo info;
    *info.mutable_coord() = agent.registration.coord();
    info.set_coords(job->second.layout.CoordString(rank));
    info.set_node_id(agent.registration.node_id());
    info.set_peer_address(agent.registration.peer_address());
    info.set_incarnation(agent.registration.incarnation());
    info.set_alive(LiveLocked(agent, now));
    info.set_ms_since_heartbeat(absl::ToInt64Milliseconds(now - agent.last_heartbeat));
    info.set_pinned_bytes(agent.pinned_bytes);
    info.set_has_gpu(agent.registration.has_gpu());
    if (agent.resident.has_value()) *info.mutable_resident() = *agent.resident;
    for (const v1::MemoryCopy& c : agent.buddy_copies) *info.add_buddy_copies() = c;
    agents.push_back(std::move(info));
  }
  return agents;
}

}  // namespace tessera
