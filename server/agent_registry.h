// AgentRegistry: which agents serve which job, their leases and incarnations — the
// coordinator's judge of liveness (DESIGN.md "Liveness").
//
// An agent is (job_id, rank). It registers with a random `incarnation` picked at process start
// and renews its lease by heartbeat. A registration with a new incarnation replaces the old
// one (the process restarted); any later message from the old incarnation is rejected with
// STALE_INCARNATION, so a frozen-then-resumed agent can never act for its previous life.
//
// Leases are judged in running time (running_clock.h), not wall time: time the coordinator
// was not running to hear heartbeats (it was stopped, frozen or migrated) is not counted
// against them, so a pause of the coordinator longer than the lease loses no agent. An agent
// not heard from for a lease of running time is expired; one whose command stream broke and
// whose peer port refuses connections is dead (MarkDead, from the DeathWatch) at once; a
// registration refused for a rank of a known job is recorded against that rank until its
// agent is heard from. Each rank's verdict (agent_liveness.h) reaches the job's session core
// as an event (Liveness), never by the core asking.
//
// The first registration of a job fixes its layout; every later one must match while any agent
// of that layout is alive. Once all of them are expired, a registration with another layout
// replaces the job's layout (a job resuming on a different mesh).
//
// Thread-safety: all methods are safe for concurrent use. Time comes from the injected Clock,
// read through a RunningClock.
#ifndef TESSERA_SERVER_AGENT_REGISTRY_H_
#define TESSERA_SERVER_AGENT_REGISTRY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/layout.h"
#include "server/agent_liveness.h"
#include "server/running_clock.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

// Where a rank stages: its node and the node's host-RAM budget (0: none declared).
struct NodeBudget {
  std::string node_id;
  uint64_t budget = 0;
};

// What the coordinator knows of a rank's agent for relaying a command (server/relay.h).
struct RelayPeer {
  // It registered relays_commands and a peer_address, and its lease is current.
  bool relays = false;
  std::string node_id;
  std::string peer_address;
  uint64_t incarnation = 0;
};

struct AgentRegistryOptions {
  // An agent is expired when its last heartbeat is older than this. Default: 10 s.
  absl::Duration lease = absl::Seconds(10);
  // How often agents are told to heartbeat. Default: 2 s (a fifth of the lease).
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // The most wall time one reading of the clock counts against leases (running_clock.h): a
  // pause of the coordinator longer than this counts as this much. Zero: a quarter of the
  // lease, at most 1 s. Default: zero.
  absl::Duration max_unheard_step = absl::ZeroDuration();
};

class AgentRegistry {
 public:
  struct Registered {
    // Incarnation this registration replaced, if the agent restarted.
    std::optional<uint64_t> replaced_incarnation;
    // The coordinator has not given this agent up since it last renewed its lease
    // (RegisterAgentResponse.lease_kept): the same incarnation was registered and live, or this
    // registry has served for less than a lease and never knew it (a restarted coordinator
    // judges nobody gone before then).
    bool lease_kept = false;
  };
  struct Renewal {
    // As Registered::lease_kept: false if the agent's lease had expired, or it had been found
    // dead, before this heartbeat (HeartbeatResponse.lease_kept).
    bool lease_kept = false;
  };

  AgentRegistry(const Clock* clock, AgentRegistryOptions options);

  // Registers or re-registers an agent and starts its lease.
  // Errors: InvalidArgument + LAYOUT_MISMATCH if the job id is invalid, the layout is malformed,
  // the coordinates are outside the mesh or disagree with `coord.rank`, or the layout differs
  // from the job's while an agent of the job's layout is alive; InvalidArgument if the
  // incarnation is 0. A refusal for a rank of a known job's mesh is recorded against the rank
  // (Liveness: kLost with the refusal) until an agent of that rank is heard from.
  absl::StatusOr<Registered> Register(const v1::RegisterAgentRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the lease and records what the heartbeat states: pinned bytes, the memory copy
  // the agent holds (none if unset), those it holds as a buddy, and the commit it
  // handled last (HeartbeatRequest.last_committed_session). Errors: NotFound if (job, rank)
  // is not registered; FailedPrecondition + STALE_INCARNATION if `incarnation` is not the
  // registered one.
  absl::StatusOr<Renewal> Heartbeat(const std::string& job_id, uint32_t rank,
                                    uint64_t incarnation, uint64_t pinned_bytes,
                         std::optional<v1::MemoryCopy> resident = std::nullopt,
                                    std::vector<v1::MemoryCopy> buddy_copies = {},
                                    std::string last_committed_session = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // The agent (job, rank, incarnation) is dead: its process is gone (DeathWatch: its command
  // stream broke and its peer port refuses connections). `why` completes "lost the agent of
  // rank R during PHASE (...)". Ignored for another incarnation or an unknown agent. A heartbeat
  // of it afterwards (it was not dead after all) revives it as one of an expired lease does.
  // Returns whether it was recorded.
  bool MarkDead(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  // The verdicts on ranks 0 .. world - 1 of `job_id` that changed since `*since` (0: all of
  // them); sets `*since` to pass next time. With `judge_leases`, every lease is judged now
  // first (O(world), without allocation: a tick's work); without, only what events changed
  // (a registration, a death) is seen. One consumer per job (its LivenessFeed), which starts
  // again from 0 with a new core.
  std::vector<AgentLiveness> Liveness(const std::string& job_id, uint32_t world,
                                      uint64_t* since, bool judge_leases = true)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The memory-only save `session_id` of `job_id` committed, and its COMMITTED commands are
  // about to go out (after the commit, or again when the job is recovered from the store):
  // for one lease from now (or from StartServing, if later), each agent of the job holds its
  // copy "not yet" until a heartbeat of it names the session as its last commit handled —
  // those registered now, and those that register meanwhile for the first time with this
  // registry (a coordinator that restarted cannot tell a restarted agent from one that may
  // hold the step); one that registers with another incarnation holds nothing. Meanwhile,
  // while such an agent is live, MemoryCopies' may_miss is true for that session. Past the
  // lease an agent that has not handled the commit (its command stream down that long, or a
  // new process that never had the session) is judged by the copies it states. Replaces the
  // job's earlier note; the same session noted again (a job recovered while this registry
  // lives, after a refused store write) leaves the note as it is, lapsed or not.
  void NoteMemoryCommit(const std::string& job_id, const std::string& session_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Memory tier: the copies of checkpoint (step, session_id) that live agents of `job_id`
  // hold — their own and those they hold as buddies — by holder rank, with rank, node_id and
  // peer_address filled in (writer_rank too, for an agent's own). An agent that re-registered
  // has none until its next heartbeat states them (MayMissCopies meanwhile); an expired
  // agent's are left out.
  // With `files`, only copies of those data files: found through an index by file, so a
  // load's question costs what its files have holders, not the job's agent count (at 16,384
  // agents restarting, every one of them asks).
  // With `may_miss`, also whether live agents may hold copies of the checkpoint that are not
  // known yet, under the same lock (an agent's heartbeat between two questions would
  // otherwise make a copy it states missing from the first and "none missing" the second's
  // answer): MayMissCopies(job_id), or — for the session of NoteMemoryCommit, within its
  // lease — a live agent that has not said it handled that commit yet, whose copy is "not
  // yet", not "never".
  std::vector<v1::MemoryCopy> MemoryCopies(const std::string& job_id, int64_t step,
                                           const std::string& session_id,
                                           absl::Span<const std::string> files = {},
                                           bool* may_miss = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The answer to agent (request.job_id, request.rank)'s FindMemoryCopies: MemoryCopies of
  // the request's step, session and files. For a memory-only checkpoint (request.memory_only)
  // asked while copies may be missing (MemoryCopies' may_miss), a file of the request that no
  // copy found is held of has no known holder — "not known yet", not "none" — so the question
  // is refused rather than answered short. (A checkpoint on disk reads what no copy is known
  // of from disk, so its question is answered as it stands.)
  // Errors: as CheckIncarnation; Unavailable naming such a file ("ask again").
  absl::StatusOr<std::vector<v1::MemoryCopy>> FindMemoryCopies(
      const v1::FindMemoryCopiesRequest& request) const ABSL_LOCKS_EXCLUDED(mu_);

  // Whether MemoryCopies may lack copies that live agents of `job_id` hold: while an agent
  // that registered (again — after a failed heartbeat, or restarted) is live and has not
  // heartbeated since, and for one lease after StartServing (a coordinator that restarted
  // learns the copies only from heartbeats) until every rank of the job's mesh has
  // heartbeated. Past one lease an agent not heard from is expired, and its copies are left
  // out anyway. To judge copies found, ask MemoryCopies(..., &may_miss) instead: one lock.
  bool MayMissCopies(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Starts MayMissCopies' window now (else it starts when the registry is made): when agents
  // can first reach the coordinator, after it recovered its sessions. Ranks heard before
  // count. A NoteMemoryCommit made before holds for a lease from now.
  void StartServing() ABSL_LOCKS_EXCLUDED(mu_);

  // OK if `incarnation` is the registered one for (job, rank). Errors as Heartbeat.
  absl::Status CheckIncarnation(const std::string& job_id, uint32_t rank,
                                uint64_t incarnation) const ABSL_LOCKS_EXCLUDED(mu_);

  // Memory tier: the agent (job, rank) replicates its resident copy to — the agent of the
  // same position (by rank) on the next node in a ring over the nodes of the job's live agents
  // with the memory tier on (by node id), or the next node's last if it has fewer; nullopt if
  // they are on one node, or the agent is unknown, expired or has the tier off. Follows
  // registrations and lease expiries: a node whose agents expired leaves the ring until they
  // heartbeat again or are replaced.
  std::optional<v1::MemoryBuddy> BuddyOf(const std::string& job_id, uint32_t rank) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The job's mesh, if any agent of it has registered.
  std::optional<MeshLayout> JobLayout(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Where each of ranks 0 .. world - 1 of the job stages (host-RAM admission,
  // plan_work.h): its registration's node_id and node_host_ram_budget; a rank that has not
  // registered gets the node "(rank R, not registered)" and no budget. One lock, no copies
  // of the registrations: the coordinator asks it for every save.
  std::vector<NodeBudget> NodeBudgets(const std::string& job_id, uint32_t world) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Relayed PINs (server/relay.h): for each of ranks 0 .. world - 1 of the job, its node, peer
  // address and incarnation, and whether it relays (registered relays_commands with a
  // peer_address, lease current). One lock: the coordinator asks it for every large fan-out.
  std::vector<RelayPeer> RelayPeers(const std::string& job_id, uint32_t world) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The registration of (job, rank), if any.
  std::optional<v1::RegisterAgentRequest> Get(const std::string& job_id, uint32_t rank) const
      ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<std::string> Jobs() const ABSL_LOCKS_EXCLUDED(mu_);

  // Agents of a job, by rank. Errors: NotFound for an unknown job.
  absl::StatusOr<std::vector<v1::AgentInfo>> ListAgents(const std::string& job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  const AgentRegistryOptions& options() const { return options_; }

  // Running time now (running_clock.h). Every method reads it; the coordinator's ticker also
  // calls this on every tick, so that running time keeps pace with the wall while the
  // coordinator runs even when nothing else asks.
  absl::Time RunningNow() const { return clock_.Now(); }

 private:
  struct Agent {
    v1::RegisterAgentRequest registration;
    absl::Time last_heartbeat;  // running time
    // MarkDead's reason; cleared when it is heard from again.
    std::optional<std::string> dead;
    // Liveness' last verdict on it, and when (Job::version) that changed.
    AgentLiveness::State judged = AgentLiveness::State::kAbsent;
    uint64_t changed = 0;
    uint64_t pinned_bytes = 0;
    std::optional<v1::MemoryCopy> resident;  // rank, node_id, peer_address filled in
    std::vector<v1::MemoryCopy> buddy_copies;  // likewise
  };
  struct Job {
    MeshLayout layout;
    absl::btree_map<uint32_t, Agent> agents;
    // BuddyOf's ring over live agents, by rank; recomputed on first use after `agents`
    // changed, an expired agent heartbeated again, or `buddies_valid_until` (the first lease
    // of a ring member that can expire) passed.
    mutable std::optional<absl::btree_map<uint32_t, uint32_t>> buddies;
    mutable absl::Time buddies_valid_until = absl::InfinitePast();
    // Data file -> the ranks whose resident or buddy copies are of it (any step).
    absl::flat_hash_map<std::string, absl::btree_set<uint32_t>> holders;
    // Ranks that heartbeated during MayMissCopies' window.
    absl::btree_set<uint32_t> heard_while_young;
    // Ranks registered and not heard from since: what they hold is not known yet.
    absl::btree_set<uint32_t> unstated;
    // Liveness: registrations refused for a rank, until an agent of it is heard from; the
    // job's change counter; ranks that changed, by when (oldest first); and Liveness' last
    // verdict on whether absent ranks are gone.
    absl::btree_map<uint32_t, v1::ErrorDetail> refused;
    uint64_t version = 0;
    std::vector<std::pair<uint64_t, uint32_t>> changes;
    bool absent_gone = false;
    uint64_t absent_changed = 0;

    // Adds `agent`'s copies (rank `rank`) to `holders`, or removes them.
    void IndexCopies(uint32_t rank, const Agent& agent, bool add);
  };

  // NoteMemoryCommit's note of a job.
  struct MemoryCommitNote {
    std::string session_id;
    absl::Time until;  // it holds before this (then kept, lapsed: NoteMemoryCommit)
    absl::btree_set<uint32_t> unkept;  // ranks that have not said they handled the commit
  };

  // MayMissCopies' answer for `job` (null: not registered) at `now`; with `session_id`, also
  // true while a live agent has not said it handled that session's noted commit
  // (MemoryCopies' `may_miss`).
  bool MayMissCopiesLocked(const std::string& job_id, const Job* job, absl::Time now,
                           const std::string* session_id = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's note, if it holds at `now`; else null (a lapsed one stays).
  MemoryCommitNote* NoteLocked(const std::string& job_id, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes that the verdict on `rank` may have changed (Liveness reports it next).
  static void ChangedLocked(Job& job, uint32_t rank);
  // Records `refusal` of a registration for `rank`, if the rank is in the job's mesh.
  static void RefuseLocked(Job& job, uint32_t rank, const absl::Status& refusal);
  // The verdict on `rank` of `job` (null: not known) at running time `now`.
  AgentLiveness JudgeLocked(const Job* job, uint32_t rank, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LiveLocked(const Agent& agent, absl::Time now) const {
    return !agent.dead.has_value() && now - agent.last_heartbeat <= options_.lease;
  }
  // Errors as CheckIncarnation.
  absl::StatusOr<Agent*> FindLocked(const std::string& job_id, uint32_t rank,
                                    uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The registration of (job, rank), whatever its incarnation; null if there is none. `job`
  // may be null (an unknown job): JobLocked's answer.
  static const v1::RegisterAgentRequest* RegistrationOf(const Job* job, uint32_t rank);
  const Job* JobLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AgentRegistryOptions options_;
  const RunningClock clock_;  // leases are judged in running time
  absl::Time serving_since_ ABSL_GUARDED_BY(mu_);  // MayMissCopies' window starts here
  mutable absl::Mutex mu_;
  // Mutable so that const lookups can share FindLocked with Heartbeat.
  mutable absl::btree_map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  // By job id (one per job, as jobs_); kept apart from jobs_: a recovered commit is noted
  // before its job's agents register. Mutable so that const lookups share NoteLocked with
  // Register and Heartbeat.
  mutable absl::btree_map<std::string, MemoryCommitNote> memory_notes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_AGENT_REGISTRY_H_
