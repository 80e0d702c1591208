// tessera-plan-load: the planning benchmark through a REAL tessera-coordinator over gRPC.
//
// Registers one fake agent per rank of a pp x tp x dp mesh (default 4 x 8 x 32 = 1,024 ranks),
// each submitting a local plan of `--shards_per_rank` pieces shaped like a llama model under a
// distributed optimizer (server/plan/planner_benchmark.cc's generator: TP shards replicated over
// dp, three optimizer states as flat DP slices, every tenth parameter a norm replicated over dp
// and tp). The fake agents speak the coordinator protocol as a real agent does
// (proto/tessera/v1/coordinator.proto; modelled on server/protocol_test.cc's FakeAgent):
// RegisterAgent, heartbeats, a Commands stream each (read by a callback reactor, no thread per
// agent), PINNED, STAGED, replica hashes + GATHERED, chunk reports + PERSISTED — with made-up
// but consistent block checksums and no data files (the coordinator writes the manifest into
// the session's directory, which the fake writers create).
//
// Save 1 (step 1) is planned from scratch and carried to COMMITTED. Save 2 (step 2) is what
// every later save of an unchanged model does: each agent holds its assignment from save 1's
// PIN, so it submits only its plan's fingerprint (SubmitLocalPlanRequest.shards_omitted), the
// coordinator reuses the validated plan, and each PIN names the plan without its assignment
// (DESIGN.md "Plan caching"). Save 2 is timed up to PIN and left open. The agents are spread
// over --processes worker processes (RunWorker).
// Measured, for each save:
//   plan_s:  from the start of the last SubmitLocalPlan call to the arrival of the last PIN
//            (every rank's plan arrived -> global plan validated, persisted, PIN delivered).
//            Agents report PINNED only once every agent has its PIN, so the PINs are not
//            timed against 1,024 replies competing for the CPU;
//   span_s:  from the first SubmitLocalPlan call to the last PIN (includes sending 1,024
//            plans over gRPC and the coordinator parsing and fingerprinting them);
// the committed manifest's read and write times (MeasureManifest), and the coordinator's
// VmHWM / VmRSS (/proc/<pid>/status) after registration, after the first
// save and after the cached plan, and the wall-clock times of the last submission and the last
// PIN (run.sh sets them against the coordinator's "plan validated" log line). Prints one JSON
// object on stdout; progress on stderr.
// Exit status 0 only if both saves reached PIN, the first committed, and every PIN of the
// second said plan_cached and left the assignment out.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/layout.h"
#include "common/plan_fingerprint.h"
#include "common/program.h"
#include "common/status.h"
#include "common/strand.h"
#include "common/tensor_key.h"
#include "format/manifest_io.h"
#include "server/testing/llama_plans.h"
#include "storage/posix_storage.h"
#include "tests/bench/command_wire.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/coordinator.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "", "host:port of the tessera-coordinator; required");
ABSL_FLAG(int32_t, coordinator_pid, 0, "its pid, to read VmHWM from /proc/<pid>/status");
ABSL_FLAG(std::string, job, "planbench", "job id");
ABSL_FLAG(int32_t, pp, 4, "pipeline degree");
ABSL_FLAG(int32_t, tp, 8, "tensor-parallel degree (divides 1024)");
ABSL_FLAG(int32_t, dp, 32, "data-parallel degree (divides 4096 / tp)");
ABSL_FLAG(int32_t, shards_per_rank, 1000, "pieces per rank (rounded up to a multiple of 4)");
ABSL_FLAG(int32_t, threads, 16,
          "threads per worker process that register and submit, and that handle the commands "
          "needing RPCs (PINs are handled on gRPC's callback threads)");
ABSL_FLAG(int32_t, processes, 4, "worker processes the fake agents are spread over");
ABSL_FLAG(bool, fingerprints, true,
          "agents submit an unchanged plan as its fingerprint (false: always the whole plan, "
          "as agents did before plan fingerprints; the baseline of the cached figure)");
ABSL_FLAG(int32_t, channels, 8, "gRPC connections per worker process");
ABSL_FLAG(bool, relay, true,
          "agents say they relay commands (RegisterAgentRequest.relays_commands, as "
          "tessera-agent does), so a cached save's PIN comes once per node of 8 ranks and the "
          "fake agent it comes to passes it on to the node's others in-process (a real agent "
          "makes a call per other agent of its node: not part of this figure)");
ABSL_FLAG(int32_t, timeout_s, 600, "give up on any wait after this long");

namespace tessera {
namespace {

// The plans: server/testing/llama_plans.h LlamaRankShards, the same as
// server/plan/planner_benchmark.cc's, each worker building only its ranks'.

// Ranks a fake node holds (RegisterAgentRequest.node_id), as on an 8-GPU machine.
constexpr uint32_t kRanksPerNode = 8;

// --- Made-up checksums every claimant of a piece computes alike

std::string BoxString(const v1::Box& box) {
  std::string s;
  for (int i = 0; i < box.offsets_size(); ++i) absl::StrAppend(&s, box.offsets(i), ",");
  absl::StrAppend(&s, ":");
  for (int i = 0; i < box.lengths_size(); ++i) absl::StrAppend(&s, box.lengths(i), ",");
  return s;
}

std::vector<uint64_t> FakeBlocks(const std::string& key, const v1::Box& box, uint64_t nbytes) {
  std::vector<uint64_t> blocks;
  const std::string base = absl::StrCat(key, "@", BoxString(box), "#");
  for (uint64_t b = 0; b * kDefaultBlockSize < nbytes; ++b) {
    const std::string id = absl::StrCat(base, b);
    blocks.push_back(Xxh3(id.data(), id.size()));
  }
  return blocks;
}

// --- /proc

struct Mem {
  long hwm_kib = -1;
  long rss_kib = -1;
};

Mem ReadMem(int pid) {
  Mem m;
  if (pid <= 0) return m;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) m.hwm_kib = std::atol(line.c_str() + 6);
    if (line.rfind("VmRSS:", 0) == 0) m.rss_kib = std::atol(line.c_str() + 6);
  }
  return m;
}

void MkdirP(const std::string& path) {
  std::string partial;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    absl::StrAppend(&partial, part, "/");
    if (partial == "/") continue;
    mkdir(partial.c_str(), 0755);  // EEXIST is fine; a real failure shows in the commit
  }
}

// --- Shared progress of all fake agents

struct Progress {
  absl::Mutex mu;
  std::map<std::string, int> pins ABSL_GUARDED_BY(mu);  // session -> PINs received
  std::map<std::string, int> cached_pins ABSL_GUARDED_BY(mu);
  std::map<std::string, int> committed ABSL_GUARDED_BY(mu);
  std::map<std::string, int> omitted_pins ABSL_GUARDED_BY(mu);  // without an assignment
  std::string checkpoint_dir ABSL_GUARDED_BY(mu);               // the last COMMITTED's
  std::map<std::string, absl::Time> last_pin ABSL_GUARDED_BY(mu);
  std::atomic<int> full_plans_asked{0};  // send_full_plan replies and SEND_PLAN commands
  std::atomic<int> relayed{0};           // commands passed on by a relay
  std::string error ABSL_GUARDED_BY(mu);

  void Fail(const std::string& why) {
    absl::MutexLock lock(&mu);
    if (error.empty()) error = why;
  }
};

class FakeAgent {
 public:
  FakeAgent(std::string job, uint32_t rank, v1::Layout layout, const MeshLayout& mesh,
            std::shared_ptr<grpc::Channel> channel, Progress* progress)
      : job_(std::move(job)),
        rank_(rank),
        layout_(std::move(layout)),
        coords_(mesh.Coords(rank)),
        stub_(v1::Coordinator::NewStub(channel)),
        commands_stub_(channel),
        progress_(progress),
        incarnation_(0x7e55e7a000000000ull + rank) {}

  ~FakeAgent() { CloseStream(); }

  absl::Status Register(uint32_t* heartbeat_ms) {
    v1::RegisterAgentRequest request;
    request.set_copies_when_pinned(true);  // as tessera-agent does
    request.set_relays_commands(absl::GetFlag(FLAGS_relay));
    request.set_job_id(job_);
    request.mutable_coord()->set_rank(rank_);
    for (uint32_t c : coords_) request.mutable_coord()->add_index(c);
    *request.mutable_layout() = layout_;
    request.set_incarnation(incarnation_);
    request.set_node_id(absl::StrCat("benchnode-", rank_ / kRanksPerNode));
    request.set_peer_address(absl::StrCat("127.0.0.1:", 20000 + rank_));
    request.set_storage_root_mounted(true);
    v1::RegisterAgentResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    grpc::Status status = stub_->RegisterAgent(&context, request, &response);
    if (!status.ok()) return absl::UnavailableError(status.error_message());
    *heartbeat_ms = response.heartbeat_interval_ms();
    return absl::OkStatus();
  }

  void Heartbeat() {
    v1::HeartbeatRequest request;
    request.set_job_id(job_);
    request.set_rank(rank_);
    request.set_incarnation(incarnation_);
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    stub_->Heartbeat(&context, request, &response);  // a missed beat is covered by the lease
  }

  // Opens the Commands stream. It is read by a gRPC callback reactor, not a thread per agent:
  // a real agent is a process of its own on its own machine, and 16,384 blocked reader
  // threads on the coordinator's cores would measure the load generator's context switches
  // rather than the coordinator. `pool` runs the commands that need RPCs of their own.
  void OpenStream(ThreadPool* pool) {
    pool_ = pool;
    context_ = std::make_unique<grpc::ClientContext>();
    commands_request_.set_job_id(job_);
    commands_request_.set_rank(rank_);
    commands_request_.set_incarnation(incarnation_);
    reader_.agent = this;
    commands_stub_.PrepareBidiStreamingCall(context_.get(), kCommandsMethod, grpc::StubOptions(),
                                            &reader_);
    reader_.StartWriteLast(&commands_request_, grpc::WriteOptions());
    reader_.StartRead(&reader_.buffer);
    // Reads are also started on the pool, outside the reactions: a hold until no read will
    // follow (Reader::StopReading), as gRPC requires it to be taken before StartCall.
    reader_.AddHold();
    reader_.StartCall();
  }

  void CloseStream() {
    if (context_ == nullptr) return;
    context_->TryCancel();
    reader_.done.WaitForNotification();
  }

  // Reports PINNED for the PIN received last. Called by the main thread after every agent got
  // its PIN, so that PIN delivery is timed without 1,024 agents' replies competing for the CPU.
  // A PIN that says copy_when_pinned has the trainer copy at once: STAGED follows.
  absl::Status AckPin() {
    absl::Status pinned = Phase(pinned_session_, v1::AGENT_PHASE_PINNED);
    if (!pinned.ok() || !copy_when_pinned_) return pinned;
    return Phase(pinned_session_, v1::AGENT_PHASE_STAGED);
  }

  // Prepared SubmitLocalPlan requests (built before the clock starts): the full plan, and the
  // fingerprint-only one a real agent sends once it holds the plan's assignment
  // (agent/save/save_core.h R10).
  // Finds the fake agents of this worker by rank (null for a rank that is not here), for
  // passing on relayed PINs.
  void SetPeers(std::function<FakeAgent*(uint32_t rank)> peers) { peers_ = std::move(peers); }

  void SetPlan(std::vector<v1::ShardDesc> shards) ABSL_LOCKS_EXCLUDED(submit_mu_) {
    absl::MutexLock lock(&submit_mu_);
    shards_ = std::move(shards);
    submit_.set_job_id(job_);
    submit_.set_rank(rank_);
    submit_.set_incarnation(incarnation_);
    submit_.set_local_plan_fingerprint(FingerprintShards(rank_, shards_));
    slim_ = submit_;
    slim_.set_shards_omitted(true);
    for (const v1::ShardDesc& s : shards_) *submit_.add_shards() = s;
  }

  absl::StatusOr<std::string> Submit(int64_t step) ABSL_LOCKS_EXCLUDED(submit_mu_) {
    absl::MutexLock lock(&submit_mu_);  // a SEND_PLAN handled meanwhile waits
    const uint64_t held = absl::GetFlag(FLAGS_fingerprints) ? held_plan_.load() : 0;
    const bool slim = held != 0;
    v1::SubmitLocalPlanRequest& request = slim ? slim_ : submit_;
    request.set_step(step);
    request.set_held_plan_fingerprint(held);
    absl::StatusOr<v1::SubmitLocalPlanResponse> response = SubmitRequest(request);
    if (response.ok() && response->send_full_plan()) {
      if (!slim) return absl::InternalError("send_full_plan in reply to a full plan");
      ++progress_->full_plans_asked;
      submit_.set_step(step);
      submit_.set_held_plan_fingerprint(held);
      response = SubmitRequest(submit_);
    }
    if (!response.ok()) return response.status();
    return response->session_id();
  }

 private:
  absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitRequest(
      const v1::SubmitLocalPlanRequest& request) {
    v1::SubmitLocalPlanResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(300)));
    grpc::Status status = stub_->SubmitLocalPlan(&context, request, &response);
    if (!status.ok()) {
      return absl::UnknownError(absl::StrCat("rank ", rank_, ": SubmitLocalPlan: ",
                                             status.error_message()));
    }
    return response;
  }

  // Handles a command. `assignment`: a PIN's assignment as it arrived (taken if it is kept).
  void Handle(const v1::Command& command, std::string* assignment) {
    if (command.session_id() == last_session_ && command.seq() <= last_seq_) return;  // replay
    // A relay (coordinator.proto Command.relay_to): pass the command on to the others, each
    // with its own seq, as tessera-agent does at their Peer ports. They are in this
    // worker (Main gives each worker whole nodes).
    // Their streams are idle meanwhile: the bench drives one save at a time.
    for (const v1::RelayTarget& target : command.relay_to()) {
      FakeAgent* peer = peers_ ? peers_(target.rank()) : nullptr;
      if (peer == nullptr || peer->incarnation_ != target.incarnation()) {
        progress_->Fail(absl::StrCat("rank ", rank_, ": a command relayed to rank ",
                                     target.rank(), ", which is not an agent of this worker "
                                     "with incarnation ", target.incarnation()));
        return;
      }
      v1::Command passed = command;
      passed.clear_relay_to();
      passed.set_seq(target.seq());
      std::string no_assignment;
      peer->Handle(passed, &no_assignment);
      progress_->relayed.fetch_add(1);
    }
    last_session_ = command.session_id();
    last_seq_ = command.seq();
    const std::string& session = command.session_id();
    absl::Status status;
    switch (command.body_case()) {
      case v1::Command::kPin: {
        const v1::PinCommand& pin = command.pin();
        if (pin.assignment_omitted()) {
          if (held_plan_.load() != pin.plan_fingerprint()) {
            progress_->Fail(absl::StrCat("rank ", rank_, ": PIN left out the assignment of a "
                                         "plan this agent does not hold"));
            break;
          }
        } else {
          assignment_bytes_ = std::move(*assignment);
          assignment_parsed_ = false;
          held_plan_ = pin.plan_fingerprint();
        }
        pinned_session_ = session;
        copy_when_pinned_ = pin.copy_when_pinned();
        absl::MutexLock lock(&progress_->mu);
        ++progress_->pins[session];
        if (pin.plan_cached()) ++progress_->cached_pins[session];
        if (pin.assignment_omitted()) ++progress_->omitted_pins[session];
        progress_->last_pin[session] = absl::Now();
        break;  // the main thread reports PINNED once every rank has its PIN (AckPin)
      }
      case v1::Command::kCopy:
        status = Phase(session, v1::AGENT_PHASE_STAGED);
        break;
      case v1::Command::kGather:
        status = ReportHashes(session);
        if (status.ok()) status = Phase(session, v1::AGENT_PHASE_GATHERED);
        break;
      case v1::Command::kPersist:
        MkdirP(command.persist().tmp_dir());
        status = ReportWrites(session, command.persist().tmp_dir());
        if (status.ok()) status = Phase(session, v1::AGENT_PHASE_PERSISTED);
        break;
      case v1::Command::kCommitted: {
        absl::MutexLock lock(&progress_->mu);
        ++progress_->committed[session];
        progress_->checkpoint_dir = command.committed().checkpoint_dir();
        break;
      }
      case v1::Command::kSendPlan: {
        ++progress_->full_plans_asked;
        absl::MutexLock lock(&submit_mu_);
        submit_.set_step(command.step());
        submit_.set_held_plan_fingerprint(held_plan_.load());
        absl::StatusOr<v1::SubmitLocalPlanResponse> r = SubmitRequest(submit_);
        status = r.status();
        break;
      }
      case v1::Command::kAbort:
        progress_->Fail(absl::StrCat("rank ", rank_, " got ABORT: ",
                                     command.abort().error().message()));
        break;
      default:
        break;
    }
    if (!status.ok()) progress_->Fail(absl::StrCat("rank ", rank_, ": ", status.ToString()));
  }

  absl::Status Phase(const std::string& session, v1::AgentPhase phase) {
    v1::ReportPhaseRequest request;
    request.set_job_id(job_);
    request.set_rank(rank_);
    request.set_incarnation(incarnation_);
    request.set_session_id(session);
    request.set_phase(phase);
    if (phase == v1::AGENT_PHASE_PINNED) {
      uint64_t pinned = 0;
      for (const v1::ShardDesc& s : shards_) pinned += s.nbytes();
      request.set_pinned_bytes(pinned);
    }
    if (phase == v1::AGENT_PHASE_STAGED) request.set_trainer_stall_ns(1000);
    v1::ReportPhaseResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    grpc::Status status = stub_->ReportPhase(&context, request, &response);
    if (!status.ok()) return absl::UnknownError(absl::StrCat("ReportPhase: ", status.error_message()));
    return absl::OkStatus();
  }

  absl::Status Chunks(const v1::ReportChunksRequest& request) {
    v1::ReportChunksResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    grpc::Status status = stub_->ReportChunks(&context, request, &response);
    if (!status.ok()) return absl::UnknownError(absl::StrCat("ReportChunks: ", status.error_message()));
    return absl::OkStatus();
  }

  v1::ReportChunksRequest ChunksRequest(const std::string& session) const {
    v1::ReportChunksRequest request;
    request.set_job_id(job_);
    request.set_rank(rank_);
    request.set_incarnation(incarnation_);
    request.set_session_id(session);
    return request;
  }

  // The assignment of the PIN received last, parsed on first use.
  absl::StatusOr<const v1::RankAssignment*> Assignment() {
    if (!assignment_parsed_) {
      if (!assignment_.ParseFromString(assignment_bytes_)) {
        return absl::DataLossError(absl::StrCat("rank ", rank_, ": the PIN's assignment does "
                                                "not parse"));
      }
      assignment_parsed_ = true;
    }
    return &assignment_;
  }

  absl::Status ReportHashes(const std::string& session) {
    ASSIGN_OR_RETURN(const v1::RankAssignment* assignment, Assignment());
    v1::ReportChunksRequest request = ChunksRequest(session);
    for (const v1::HashItem& item : assignment->hashes()) {
      v1::ReplicaHash* hash = request.add_hashes();
      hash->set_chunk(item.chunk());
      // The replica's key and box are its local shard's, as a real agent takes them.
      const v1::ShardDesc& shard = shards_.at(item.local_shard());
      const std::string key = TensorKeyOf(shard, rank_);
      if (item.has_range()) {
        *hash->mutable_range() = item.range();
        const std::string id = absl::StrCat(key, "@", BoxString(shard.box()), "[",
                                            item.range().begin(), ",", item.range().end(), ")");
        hash->set_xxh3(Xxh3(id.data(), id.size()));
      } else {
        hash->set_xxh3(ChunkDigest(FakeBlocks(key, shard.box(), shard.nbytes())));
      }
    }
    return Chunks(request);
  }

  // Reports every WriteItem as written, and creates the data file as a sparse file of the
  // right size (the committer checks that the chunks lie inside it; nothing reads them).
  absl::Status ReportWrites(const std::string& session, const std::string& tmp_dir) {
    ASSIGN_OR_RETURN(const v1::RankAssignment* assignment, Assignment());
    v1::ReportChunksRequest request = ChunksRequest(session);
    uint64_t offset = 4096;
    for (const v1::WriteItem& w : assignment->writes()) {
      v1::ChunkReport* report = request.add_chunks();
      report->set_key(w.key());
      v1::ChunkEntry* entry = report->mutable_chunk();
      *entry->mutable_box() = w.box();
      entry->set_file(assignment->file());
      entry->set_offset(offset);
      entry->set_nbytes(w.nbytes());
      entry->set_block_size(kDefaultBlockSize);
      for (uint64_t b : FakeBlocks(w.key(), w.box(), w.nbytes())) entry->add_block_xxh3(b);
      offset += (w.nbytes() + 4095) / 4096 * 4096;
    }
    if (!assignment->file().empty()) {
      const std::string path = absl::StrCat(tmp_dir, "/", assignment->file());
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0 || ftruncate(fd, offset) != 0) {
        const int err = errno;
        if (fd >= 0) close(fd);
        return absl::InternalError(absl::StrCat("cannot create ", path, ": errno ", err));
      }
      close(fd);
    }
    return Chunks(request);
  }

  const std::string job_;
  const uint32_t rank_;
  const v1::Layout layout_;
  const std::vector<uint32_t> coords_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::TemplatedGenericStub<v1::CommandsRequest, grpc::ByteBuffer> commands_stub_;
  Progress* const progress_;
  const uint64_t incarnation_;
  std::vector<v1::ShardDesc> shards_;
  // Submissions: the submitting thread's (Submit), or the command handler's on SEND_PLAN.
  absl::Mutex submit_mu_;
  v1::SubmitLocalPlanRequest submit_ ABSL_GUARDED_BY(submit_mu_);
  v1::SubmitLocalPlanRequest slim_ ABSL_GUARDED_BY(submit_mu_);
  std::atomic<uint64_t> held_plan_{0};  // PinCommand.plan_fingerprint of the assignment held
  // Used by Handle only, which runs for one command at a time (one read in flight), on gRPC's
  // callback thread or the pool; the main thread reads the last two in AckPin once every PIN
  // has been counted under progress_->mu.
  std::string last_session_;
  uint64_t last_seq_ = 0;
  std::string assignment_bytes_;  // of the PIN received last, as it arrived
  bool assignment_parsed_ = false;
  v1::RankAssignment assignment_;  // assignment_bytes_, parsed (Assignment())
  std::string pinned_session_;  // written before the PIN is counted
  bool copy_when_pinned_ = false;  // likewise
  // The stream is opened as a generic call (the request written once, then half-closed, as
  // a server-streaming call is on the wire) so that each message arrives as bytes for
  // ParseCommandKeepingAssignment. One read is in flight at a time, so an agent's commands are
  // handled in order, each after the one before, whichever thread runs it.
  struct Reader : grpc::ClientBidiReactor<v1::CommandsRequest, grpc::ByteBuffer> {
    FakeAgent* agent = nullptr;
    grpc::ByteBuffer buffer;
    v1::Command command;     // the message read last, without a PIN's assignment
    std::string assignment;  // the PIN's assignment, as bytes
    absl::Notification done;

    void OnReadDone(bool ok) override {
      if (!ok) return StopReading();  // the stream ended: OnDone follows
      grpc::Slice slice;
      absl::Status parsed =
          buffer.DumpToSingleSlice(&slice).ok()
              ? ParseCommandKeepingAssignment(
                    absl::string_view(reinterpret_cast<const char*>(slice.begin()),
                                      slice.size()),
                    &command, &assignment)
              : absl::DataLossError("a Command that cannot be read");
      if (!parsed.ok()) {
        agent->progress_->Fail(absl::StrCat("rank ", agent->rank_, ": ", parsed.ToString()));
        return StopReading();  // the main thread sees the failure
      }
      if (HandledInline(command)) {
        agent->Handle(command, &assignment);
        StartRead(&buffer);
        return;
      }
      agent->pool_->Post([this] {
        agent->Handle(command, &assignment);
        StartRead(&buffer);
      });
    }
    void OnDone(const grpc::Status& status) override {
      if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
        agent->progress_->Fail(absl::StrCat("rank ", agent->rank_, ": Commands stream: ",
                                            status.error_message()));
      }
      done.Notify();
    }
    void StopReading() { RemoveHold(); }

    // Commands handled on gRPC's callback thread: those whose handling makes no RPC (a
    // reaction must not block). Every other one goes to the pool.
    static bool HandledInline(const v1::Command& c) {
      return c.has_pin() || c.has_committed() || c.has_abort();
    }
  };

  static constexpr char kCommandsMethod[] = "/tessera.v1.Coordinator/Commands";

  ThreadPool* pool_ = nullptr;
  std::function<FakeAgent*(uint32_t rank)> peers_;
  v1::CommandsRequest commands_request_;
  std::unique_ptr<grpc::ClientContext> context_;
  Reader reader_;  // last: its callbacks use the members above
};

// "1795269435.961616": wall-clock seconds, to compare with the coordinator's log times.
std::string UnixSeconds(absl::Time t) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6f", absl::ToDoubleSeconds(t - absl::UnixEpoch()));
  return buf;
}

// Runs fn(i) for i in [0, n) on `threads` threads.
template <typename Fn>
void ParallelFor(int n, int threads, Fn fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

// --- Worker processes
//
// The fake agents are spread over --processes worker processes (forked before gRPC starts), so
// that one process's gRPC threads are not the bottleneck of 16,384 agents. The parent drives
// the workers over pipes, one line per message:
//   parent -> worker  "submit <step>"  submit every rank's plan; answer when all have their PIN:
//   worker -> parent  "pinned <first submit ns> <last submit ns> <last PIN ns> <cached PINs>
//                      <PINs without assignment> <full plans asked> <PINs passed on by relays>"
//                                      (times in unix-epoch nanoseconds)
//   parent -> worker  "ack"            (once EVERY worker is pinned) report PINNED, carry the
//                                      save through; answer "committed <checkpoint dir>"
//   parent -> worker  "exit"
//   worker -> parent  "error <message>" instead of any answer.

struct Pinned {
  int64_t first_submit_ns = 0;
  int64_t last_submit_ns = 0;
  int64_t last_pin_ns = 0;
  int cached = 0;
  int omitted = 0;
  int full_asked = 0;
  int relayed = 0;
};

bool WriteLine(int fd, const std::string& line) {
  const std::string out = line + "\n";
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Reads one line (without its newline); false at EOF.
bool ReadLine(FILE* in, std::string* line) {
  line->clear();
  int ch;
  while ((ch = std::fgetc(in)) != EOF && ch != '\n') line->push_back(static_cast<char>(ch));
  return ch != EOF || !line->empty();
}

struct Config {
  std::string target;
  std::string job;
  v1::Layout layout;
  MeshLayout mesh;
  int params = 0;
  int threads = 1;
  int channels = 1;
  absl::Duration timeout;
};

// Serves ranks [begin, end) until "exit" or EOF on `in`.
[[noreturn]] void RunWorker(const Config& config, uint32_t begin, uint32_t end, FILE* in,
                            int out) {
  const uint32_t n = end - begin;
  auto fail = [&](const std::string& why) {
    WriteLine(out, absl::StrCat("error ", why));
    std::_Exit(1);
  };
  Progress progress;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < std::max(1, config.channels); ++c) {
    grpc::ChannelArguments args;
    args.SetInt("tessera.bench.channel", c);  // distinct args: distinct connections
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    channels.push_back(
        grpc::CreateCustomChannel(config.target, grpc::InsecureChannelCredentials(), args));
  }
  // The commands that make RPCs (all but PIN, COMMITTED and ABORT: Reader::HandledInline) run
  // here. Declared before the agents, so it outlives their streams.
  ThreadPool command_pool(std::max(1, config.threads));
  std::vector<std::unique_ptr<FakeAgent>> agents;
  for (uint32_t r = begin; r < end; ++r) {
    agents.push_back(std::make_unique<FakeAgent>(config.job, r, config.layout, config.mesh,
                                                 channels[r % channels.size()], &progress));
    agents.back()->SetPlan(LlamaRankShards(config.mesh, r, config.params));
  }
  for (auto& a : agents) {
    a->SetPeers([&agents, begin, end](uint32_t rank) -> FakeAgent* {
      return rank >= begin && rank < end ? agents[rank - begin].get() : nullptr;
    });
  }
  std::atomic<uint32_t> heartbeat_ms{1000};
  ParallelFor(n, config.threads, [&](int i) {
    uint32_t ms = 0;
    absl::Status s = agents[i]->Register(&ms);
    if (!s.ok()) progress.Fail(absl::StrCat("rank ", begin + i, ": RegisterAgent: ", s.ToString()));
    if (ms > 0) heartbeat_ms = ms;
  });
  for (auto& a : agents) a->OpenStream(&command_pool);
  // Heartbeats keep the leases alive for the whole run (the worker ends with _Exit). Their
  // period is the protocol's heartbeat interval, not a wait for an event: this is the one
  // place a timed sleep is what a real agent does too.
  std::thread([&] {
    while (true) {
      absl::SleepFor(absl::Milliseconds(heartbeat_ms.load()));
      for (auto& a : agents) a->Heartbeat();
    }
  }).detach();
  {
    absl::MutexLock lock(&progress.mu);
    if (!progress.error.empty()) fail(progress.error);
  }
  WriteLine(out, "ready");

  std::string line, session;
  while (ReadLine(in, &line)) {
    if (line == "exit") break;
    if (absl::StartsWith(line, "submit ")) {
      const int64_t step = std::atoll(line.c_str() + 7);
      std::vector<absl::Time> starts(n);
      std::vector<std::string> ids(n);
      const int asked_before = progress.full_plans_asked.load();
      const int relayed_before = progress.relayed.load();
      ParallelFor(n, config.threads, [&](int i) {
        starts[i] = absl::Now();
        absl::StatusOr<std::string> id = agents[i]->Submit(step);
        if (!id.ok()) return progress.Fail(id.status().ToString());
        ids[i] = *id;
      });
      session = ids[0];
      absl::MutexLock lock(&progress.mu);
      auto all_pinned = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress.mu) {
        return !progress.error.empty() || progress.pins[session] == static_cast<int>(n);
      };
      if (!progress.mu.AwaitWithTimeout(absl::Condition(&all_pinned), config.timeout)) {
        fail(absl::StrCat("step ", step, ": ", progress.pins[session], " of ", n,
                          " agents got PIN"));
      }
      if (!progress.error.empty()) fail(progress.error);
      WriteLine(out, absl::StrCat(
                         "pinned ", absl::ToUnixNanos(*std::min_element(starts.begin(), starts.end())),
                         " ", absl::ToUnixNanos(*std::max_element(starts.begin(), starts.end())),
                         " ", absl::ToUnixNanos(progress.last_pin[session]), " ",
                         progress.cached_pins[session], " ", progress.omitted_pins[session], " ",
                         progress.full_plans_asked.load() - asked_before, " ",
                         progress.relayed.load() - relayed_before));
    } else if (line == "ack") {
      ParallelFor(n, config.threads, [&](int i) {
        absl::Status s = agents[i]->AckPin();
        if (!s.ok()) progress.Fail(absl::StrCat("rank ", begin + i, ": ", s.ToString()));
      });
      absl::MutexLock lock(&progress.mu);
      auto all_committed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress.mu) {
        return !progress.error.empty() || progress.committed[session] == static_cast<int>(n);
      };
      if (!progress.mu.AwaitWithTimeout(absl::Condition(&all_committed), config.timeout)) {
        fail(absl::StrCat(progress.committed[session], " of ", n, " agents got COMMITTED"));
      }
      if (!progress.error.empty()) fail(progress.error);
      WriteLine(out, absl::StrCat("committed ", progress.checkpoint_dir));
    }
  }
  // Closing thousands of streams one by one is slow and measures nothing: leave it to exit.
  std::_Exit(0);
}

struct Worker {
  pid_t pid = 0;
  int to = -1;         // the worker's stdin
  FILE* from = nullptr;  // its answers
};

struct SaveTiming {
  double plan_s = 0;  // last submission's start -> last PIN
  double span_s = 0;  // first submission's start -> last PIN
  int cached = 0, omitted = 0, full_asked = 0, relayed = 0;
  int64_t last_submit_ns = 0, last_pin_ns = 0;
  std::string checkpoint_dir;  // the committed save's
};

// Sends `command` to every worker and reads one answer line from each.
absl::StatusOr<std::vector<std::string>> Broadcast(std::vector<Worker>& workers,
                                                   const std::string& command) {
  for (Worker& w : workers) {
    if (!WriteLine(w.to, command)) return absl::InternalError("a worker is gone");
  }
  std::vector<std::string> answers;
  for (Worker& w : workers) {
    std::string line;
    if (!ReadLine(w.from, &line)) return absl::InternalError("a worker exited");
    if (absl::StartsWith(line, "error ")) return absl::AbortedError(line.substr(6));
    answers.push_back(line);
  }
  return answers;
}

absl::StatusOr<SaveTiming> RunSave(std::vector<Worker>& workers, int64_t step, bool to_commit) {
  ASSIGN_OR_RETURN(std::vector<std::string> answers,
                   Broadcast(workers, absl::StrCat("submit ", step)));
  SaveTiming t;
  int64_t first = INT64_MAX;
  for (const std::string& a : answers) {
    Pinned p;
    if (std::sscanf(a.c_str(), "pinned %ld %ld %ld %d %d %d %d", &p.first_submit_ns,
                    &p.last_submit_ns, &p.last_pin_ns, &p.cached, &p.omitted, &p.full_asked,
                    &p.relayed) != 7) {
      return absl::InternalError(absl::StrCat("unexpected answer \"", a, "\""));
    }
    first = std::min(first, p.first_submit_ns);
    t.last_submit_ns = std::max(t.last_submit_ns, p.last_submit_ns);
    t.last_pin_ns = std::max(t.last_pin_ns, p.last_pin_ns);
    t.cached += p.cached;
    t.omitted += p.omitted;
    t.full_asked += p.full_asked;
    t.relayed += p.relayed;
  }
  t.plan_s = (t.last_pin_ns - t.last_submit_ns) / 1e9;
  t.span_s = (t.last_pin_ns - first) / 1e9;
  if (to_commit) {
    ASSIGN_OR_RETURN(std::vector<std::string> committed, Broadcast(workers, "ack"));
    t.checkpoint_dir = committed[0].substr(std::string("committed ").size());
  }
  return t;
}

// The committed checkpoint's manifest, `runs` times each: read (ReadManifest: parse and
// validate) and written (WriteManifest, what a commit does: manifest.pb and manifest.json,
// each to a temporary name, fsynced and renamed, then the directory fsynced) into a scratch
// directory beside the checkpoint, on the same file system. Medians and p90s, the manifest's
// size and chunk count.
struct ManifestTimes {
  double load_median_s = 0, load_p90_s = 0;
  double write_median_s = 0, write_p90_s = 0;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
};

std::pair<double, double> MedianP90(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times[std::min(times.size() - 1, times.size() * 9 / 10)]};
}

absl::StatusOr<ManifestTimes> MeasureManifest(const std::string& dir, int runs) {
  PosixStorage storage;
  std::vector<double> loads, writes;
  ManifestTimes m;
  v1::Manifest manifest;
  for (int i = 0; i < runs; ++i) {
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(manifest, ReadManifest(storage, dir));
    loads.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  for (const v1::TensorEntry& t : manifest.tensors()) m.chunks += t.chunks_size();
  for (int i = 0; i < runs; ++i) {  // each into a new directory, as a commit writes it
    const std::string scratch = absl::StrCat(dir, ".manifest-write-", i);
    MkdirP(scratch);
    const absl::Time start = absl::Now();
    absl::Status written = WriteManifest(storage, scratch, manifest);
    writes.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    std::error_code ignored;  // a scratch directory left behind changes no figure
    std::filesystem::remove_all(scratch, ignored);
    RETURN_IF_ERROR(written);
  }
  struct stat st;
  if (stat(absl::StrCat(dir, "/manifest.pb").c_str(), &st) == 0) m.bytes = st.st_size;
  std::tie(m.load_median_s, m.load_p90_s) = MedianP90(loads);
  std::tie(m.write_median_s, m.write_p90_s) = MedianP90(writes);
  return m;
}

std::string UnixNanosString(int64_t ns) { return UnixSeconds(absl::FromUnixNanos(ns)); }

int Main() {
  Config config;
  config.target = absl::GetFlag(FLAGS_coordinator);
  if (config.target.empty()) {
    std::fprintf(stderr, "tessera-plan-load: --coordinator is required\n");
    return 2;
  }
  const int pid = absl::GetFlag(FLAGS_coordinator_pid);
  config.job = absl::GetFlag(FLAGS_job);
  config.threads = absl::GetFlag(FLAGS_threads);
  config.channels = absl::GetFlag(FLAGS_channels);
  config.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  const std::string spec = absl::StrCat("pp=", absl::GetFlag(FLAGS_pp), ",tp=",
                                        absl::GetFlag(FLAGS_tp), ",dp=", absl::GetFlag(FLAGS_dp));
  absl::StatusOr<v1::Layout> layout = ParseLayoutSpec(spec);
  if (!layout.ok()) {
    std::fprintf(stderr, "tessera-plan-load: %s\n", layout.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<MeshLayout> mesh = MeshLayout::FromProto(*layout);
  if (!mesh.ok()) {
    std::fprintf(stderr, "tessera-plan-load: %s\n", mesh.status().ToString().c_str());
    return 2;
  }
  config.layout = *layout;
  config.mesh = *mesh;
  const uint32_t world = mesh->world_size();
  config.params = (absl::GetFlag(FLAGS_shards_per_rank) + 3) / 4;
  // Whole nodes (kRanksPerNode ranks) to a worker, so that a relay's node is all in one.
  const uint32_t nodes = (world + kRanksPerNode - 1) / kRanksPerNode;
  const uint32_t processes =
      std::clamp<uint32_t>(absl::GetFlag(FLAGS_processes), 1, nodes);

  std::fprintf(stderr, "plan-load: %u fake agents with %d shards each in %u processes\n", world,
               4 * config.params, processes);
  std::vector<Worker> workers(processes);
  for (uint32_t p = 0; p < processes; ++p) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
      std::perror("pipe");
      return 1;
    }
    const uint32_t begin = std::min(world, kRanksPerNode * (nodes * p / processes));
    const uint32_t end = std::min(world, kRanksPerNode * (nodes * (p + 1) / processes));
    const pid_t child = fork();
    if (child < 0) {
      std::perror("fork");
      return 1;
    }
    if (child == 0) {
      close(down[1]);
      close(up[0]);
      for (uint32_t q = 0; q < p; ++q) {  // the earlier workers' pipes are not this one's
        close(workers[q].to);
        std::fclose(workers[q].from);
      }
      RunWorker(config, begin, end, fdopen(down[0], "r"), up[1]);
    }
    close(down[0]);
    close(up[1]);
    workers[p] = {child, down[1], fdopen(up[0], "r")};
  }
  int rc = 0;
  std::string error;
  for (Worker& w : workers) {
    std::string line;
    if (!ReadLine(w.from, &line) || line != "ready") {
      error = absl::StrCat("a worker did not start: ", line);
      rc = 1;
      break;
    }
  }
  const Mem registered = ReadMem(pid);
  SaveTiming first, cached;
  Mem after_first, after_cached;
  if (rc == 0) {
    std::fprintf(stderr, "plan-load: save 1 (first plan), carried to COMMITTED\n");
    absl::StatusOr<SaveTiming> t = RunSave(workers, 1, /*to_commit=*/true);
    after_first = ReadMem(pid);
    if (!t.ok()) {
      error = t.status().ToString();
      rc = 1;
    } else {
      first = *t;
    }
  }
  ManifestTimes manifest;
  if (rc == 0) {
    absl::StatusOr<ManifestTimes> m = MeasureManifest(first.checkpoint_dir, 5);
    if (!m.ok()) {
      error = m.status().ToString();
      rc = 1;
    } else {
      manifest = *m;
    }
  }
  if (rc == 0) {
    std::fprintf(stderr, "plan-load: save 2 (same plans: fingerprints, cached plan), up to PIN\n");
    absl::StatusOr<SaveTiming> t = RunSave(workers, 2, /*to_commit=*/false);
    after_cached = ReadMem(pid);
    if (!t.ok()) {
      error = t.status().ToString();
      rc = 1;
    } else {
      cached = *t;
      const int omitted = absl::GetFlag(FLAGS_fingerprints) ? static_cast<int>(world) : 0;
      if (cached.cached != static_cast<int>(world) || cached.omitted != omitted) {
        error = absl::StrCat("save 2: ", cached.cached, " of ", world,
                             " PINs said plan_cached and ", cached.omitted,
                             " left the assignment out");
        rc = 1;
      }
    }
  }
  for (Worker& w : workers) WriteLine(w.to, "exit");
  for (Worker& w : workers) waitpid(w.pid, nullptr, 0);

  std::string json = absl::StrCat(
      "{\"ranks\": ", world, ", \"shards_per_rank\": ", 4 * config.params, ", \"layout\": \"",
      spec, "\", \"processes\": ", processes, ", \"fingerprints\": ",
      absl::GetFlag(FLAGS_fingerprints) ? "true" : "false", ", \"first_plan_s\": ", first.plan_s,
      ", \"first_span_s\": ", first.span_s, ", \"cached_plan_s\": ", cached.plan_s,
      ", \"cached_span_s\": ", cached.span_s, ", \"cached_pins\": ", cached.cached,
      ", \"pins_without_assignment\": ", cached.omitted,
      ", \"full_plans_asked_cached\": ", cached.full_asked,
      ", \"pins_relayed_first\": ", first.relayed, ", \"pins_relayed_cached\": ", cached.relayed,
      ", \"manifest_bytes\": ",
      manifest.bytes, ", \"manifest_chunks\": ", manifest.chunks, ", \"manifest_load_s\": ",
      manifest.load_median_s, ", \"manifest_load_p90_s\": ", manifest.load_p90_s,
      ", \"manifest_write_s\": ", manifest.write_median_s, ", \"manifest_write_p90_s\": ",
      manifest.write_p90_s,
      ", \"rss_kib_registered\": ",
      registered.rss_kib, ", \"hwm_kib_after_first\": ", after_first.hwm_kib,
      ", \"hwm_kib_after_cached\": ", after_cached.hwm_kib, ", \"rss_kib_after_cached\": ",
      after_cached.rss_kib, ", \"first_last_submit_unix\": ",
      UnixNanosString(first.last_submit_ns), ", \"first_last_pin_unix\": ",
      UnixNanosString(first.last_pin_ns), ", \"cached_last_submit_unix\": ",
      UnixNanosString(cached.last_submit_ns), ", \"cached_last_pin_unix\": ",
      UnixNanosString(cached.last_pin_ns), ", \"ok\": ", rc == 0 ? "true" : "false",
      ", \"error\": \"");
  for (char ch : error) {
    if (ch == '"' || ch == '\\') json += '\\';
    json += (ch == '\n' ? ' ' : ch);
  }
  json += "\"}";
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);
  if (rc != 0) std::fprintf(stderr, "plan-load: FAILED: %s\n", error.c_str());
  return rc;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::InitProgram(
      "the planning benchmark: 1,024 fake agents against a real tessera-coordinator.\n\n"
      "Usage: tessera-plan-load --coordinator=127.0.0.1:PORT --coordinator_pid=PID",
      argc, argv);
  return tessera::Main();
}
