// tessera-plan-load: the planning benchmark through a REAL tessera-coordinator over gRPC.
//
// Registers one fake agent per rank of a pp x tp x dp mesh (default 4 x 8 x 32 = 1,024 ranks),
// each submitting a local plan of `--shards_per_rank` pieces shaped like a llama model under a
// distributed optimizer (server/planner_benchmark.cc's generator: TP shards replicated over dp,
// three optimizer states as flat DP slices, every tenth parameter a norm replicated over dp and
// tp). The fake agents speak the coordinator protocol as a real agent does
// (proto/tessera/v1/coordinator.proto; modelled on server/protocol_test.cc's FakeAgent):
// RegisterAgent, heartbeats, a Commands stream each, PINNED, STAGED, replica hashes +
// GATHERED, chunk reports + PERSISTED — with made-up but consistent block checksums and no
// data files (the coordinator writes the manifest into the session's directory, which the
// fake writers create).
//
// Save 1 (step 1) is planned from scratch and carried to COMMITTED; save 2 (step 2) submits the
// same plans, so the coordinator reuses the validated plan (plan caching); it is timed up to
// PIN and left open (the benchmark stops the coordinator afterwards).
//
// Measured, for each save:
//   plan_s:  from the start of the last SubmitLocalPlan call to the arrival of the last PIN
//            (every rank's plan arrived -> global plan validated, persisted, PIN delivered).
//            Agents report PINNED only once every agent has its PIN, so the PINs are not
//            timed against 1,024 replies competing for the CPU;
//   span_s:  from the first SubmitLocalPlan call to the last PIN (includes sending 1,024
//            plans over gRPC and the coordinator parsing and fingerprinting them);
// and the coordinator's VmHWM / VmRSS (/proc/<pid>/status) after registration, after the first
// save and after the cached plan, and the wall-clock times of the last submission and the last
// PIN (run.sh sets them against the coordinator's "plan validated" log line). Prints one JSON
// object on stdout; progress on stderr.
// Exit status 0 only if both saves reached PIN and the first committed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/layout.h"
#include "common/program.h"
#include "server/testing/llama_plans.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/coordinator.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "", "host:port of the tessera-coordinator; required");
ABSL_FLAG(int32_t, coordinator_pid, 0, "its pid, to read VmHWM from /proc/<pid>/status");
ABSL_FLAG(std::string, job, "planbench", "job id");
ABSL_FLAG(int32_t, pp, 4, "pipeline degree");
ABSL_FLAG(int32_t, tp, 8, "tensor-parallel degree (divides 1024)");
ABSL_FLAG(int32_t, dp, 32, "data-parallel degree (divides 4096 / tp)");
ABSL_FLAG(int32_t, shards_per_rank, 1000, "pieces per rank (rounded up to a multiple of 4)");
ABSL_FLAG(int32_t, threads, 16, "threads that register and submit");
ABSL_FLAG(int32_t, channels, 32, "gRPC connections the fake agents share");
ABSL_FLAG(int32_t, timeout_s, 600, "give up on any wait after this long");

namespace tessera {
namespace {

// --- The plans: server/testing/llama_plans.h, the same as server/planner_benchmark.cc's.

std::vector<std::vector<v1::ShardDesc>> BenchPlans(const MeshLayout& layout, int params_per_stage) {
  std::vector<std::vector<v1::ShardDesc>> plans(layout.world_size());
  for (uint32_t rank = 0; rank < layout.world_size(); ++rank) {
    plans[rank] = LlamaRankShards(layout, rank, params_per_stage);
  }
  return plans;
}

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
  std::map<std::string, absl::Time> last_pin ABSL_GUARDED_BY(mu);
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
        progress_(progress),
        incarnation_(0x7e55e7a000000000ull + rank) {}

  ~FakeAgent() { CloseStream(); }

  absl::Status Register(uint32_t* heartbeat_ms) {
    v1::RegisterAgentRequest request;
    request.set_job_id(job_);
    request.mutable_coord()->set_rank(rank_);
    for (uint32_t c : coords_) request.mutable_coord()->add_index(c);
    *request.mutable_layout() = layout_;
    request.set_incarnation(incarnation_);
    request.set_node_id(absl::StrCat("benchnode-", rank_ / 8));
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

  void OpenStream() {
    context_ = std::make_unique<grpc::ClientContext>();
    reader_ = std::thread([this] {
      v1::CommandsRequest request;
      request.set_job_id(job_);
      request.set_rank(rank_);
      request.set_incarnation(incarnation_);
      std::unique_ptr<grpc::ClientReader<v1::Command>> reader =
          stub_->Commands(context_.get(), request);
      v1::Command command;
      while (reader->Read(&command)) Handle(command);
      reader->Finish();
    });
  }

  void CloseStream() {
    if (context_ != nullptr) context_->TryCancel();
    if (reader_.joinable()) reader_.join();
  }

  // Reports PINNED for the PIN received last. Called by the main thread after every agent got
  // its PIN, so that PIN delivery is timed without 1,024 agents' replies competing for the CPU.
  absl::Status AckPin() { return Phase(pinned_session_, v1::AGENT_PHASE_PINNED); }

  // A prepared SubmitLocalPlan request (built before the clock starts).
  void SetPlan(std::vector<v1::ShardDesc> shards) {
    shards_ = std::move(shards);
    submit_.set_job_id(job_);
    submit_.set_rank(rank_);
    submit_.set_incarnation(incarnation_);
    for (const v1::ShardDesc& s : shards_) *submit_.add_shards() = s;
  }

  absl::StatusOr<std::string> Submit(int64_t step) {
    submit_.set_step(step);
    v1::SubmitLocalPlanResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(300)));
    grpc::Status status = stub_->SubmitLocalPlan(&context, submit_, &response);
    if (!status.ok()) {
      return absl::UnknownError(absl::StrCat("rank ", rank_, ": SubmitLocalPlan: ",
                                             status.error_message()));
    }
    return response.session_id();
  }

 private:
  void Handle(const v1::Command& command) {
    if (command.session_id() == last_session_ && command.seq() <= last_seq_) return;  // replay
    last_session_ = command.session_id();
    last_seq_ = command.seq();
    const std::string& session = command.session_id();
    absl::Status status;
    switch (command.body_case()) {
      case v1::Command::kPin: {
        assignment_ = command.pin().assignment();
        pinned_session_ = session;
        absl::MutexLock lock(&progress_->mu);
        ++progress_->pins[session];
        if (command.pin().plan_cached()) ++progress_->cached_pins[session];
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

  absl::Status ReportHashes(const std::string& session) {
    v1::ReportChunksRequest request = ChunksRequest(session);
    for (const v1::HashItem& item : assignment_.hashes()) {
      v1::ReplicaHash* hash = request.add_hashes();
      hash->set_key(item.key());
      *hash->mutable_box() = item.box();
      if (item.has_range()) {
        *hash->mutable_range() = item.range();
        const std::string id = absl::StrCat(item.key(), "@", BoxString(item.box()), "[",
                                            item.range().begin(), ",", item.range().end(), ")");
        hash->set_xxh3(Xxh3(id.data(), id.size()));
      } else {
        const uint64_t nbytes = shards_.at(item.local_shard()).nbytes();
        hash->set_xxh3(ChunkDigest(FakeBlocks(item.key(), item.box(), nbytes)));
      }
    }
    return Chunks(request);
  }

  // Reports every WriteItem as written, and creates the data file as a sparse file of the
  // right size (the committer checks that the chunks lie inside it; nothing reads them).
  absl::Status ReportWrites(const std::string& session, const std::string& tmp_dir) {
    v1::ReportChunksRequest request = ChunksRequest(session);
    uint64_t offset = 4096;
    for (const v1::WriteItem& w : assignment_.writes()) {
      v1::ChunkReport* report = request.add_chunks();
      report->set_key(w.key());
      v1::ChunkEntry* entry = report->mutable_chunk();
      *entry->mutable_box() = w.box();
      entry->set_file(assignment_.file());
      entry->set_offset(offset);
      entry->set_nbytes(w.nbytes());
      entry->set_block_size(kDefaultBlockSize);
      for (uint64_t b : FakeBlocks(w.key(), w.box(), w.nbytes())) entry->add_block_xxh3(b);
      offset += (w.nbytes() + 4095) / 4096 * 4096;
    }
    if (!assignment_.file().empty()) {
      const std::string path = absl::StrCat(tmp_dir, "/", assignment_.file());
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
  Progress* const progress_;
  const uint64_t incarnation_;
  std::vector<v1::ShardDesc> shards_;
  v1::SubmitLocalPlanRequest submit_;
  // Used by the reader thread only.
  std::string last_session_;
  uint64_t last_seq_ = 0;
  v1::RankAssignment assignment_;
  std::string pinned_session_;  // written by the reader before the PIN is counted
  std::unique_ptr<grpc::ClientContext> context_;
  std::thread reader_;  // last: joined before the members it uses go away
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

struct SaveTiming {
  std::string session;
  double plan_s = 0;
  double span_s = 0;
  int cached_pins = 0;
  absl::Time last_submit_start = absl::UnixEpoch();
  absl::Time last_pin = absl::UnixEpoch();
};

int Main() {
  const std::string target = absl::GetFlag(FLAGS_coordinator);
  if (target.empty()) {
    std::fprintf(stderr, "tessera-plan-load: --coordinator is required\n");
    return 2;
  }
  const int pid = absl::GetFlag(FLAGS_coordinator_pid);
  const std::string job = absl::GetFlag(FLAGS_job);
  const int threads = absl::GetFlag(FLAGS_threads);
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
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
  const uint32_t world = mesh->world_size();
  const int params = (absl::GetFlag(FLAGS_shards_per_rank) + 3) / 4;

  std::fprintf(stderr, "plan-load: building %u local plans of %d shards\n", world, 4 * params);
  std::vector<std::vector<v1::ShardDesc>> plans = BenchPlans(*mesh, params);

  Progress progress;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < std::max(1, absl::GetFlag(FLAGS_channels)); ++c) {
    grpc::ChannelArguments args;
    args.SetInt("tessera.bench.channel", c);  // distinct args: distinct connections
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    channels.push_back(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  }
  std::vector<std::unique_ptr<FakeAgent>> agents;
  for (uint32_t r = 0; r < world; ++r) {
    agents.push_back(std::make_unique<FakeAgent>(job, r, *layout, *mesh,
                                                 channels[r % channels.size()], &progress));
    agents.back()->SetPlan(std::move(plans[r]));
  }
  plans.clear();

  std::fprintf(stderr, "plan-load: registering %u agents\n", world);
  std::atomic<uint32_t> heartbeat_ms{1000};
  ParallelFor(world, threads, [&](int r) {
    uint32_t ms = 0;
    absl::Status s = agents[r]->Register(&ms);
    if (!s.ok()) progress.Fail(absl::StrCat("rank ", r, ": RegisterAgent: ", s.ToString()));
    if (ms > 0) heartbeat_ms = ms;
  });
  for (auto& a : agents) a->OpenStream();
  absl::Notification stop_heartbeats;
  std::thread heartbeats([&] {
    while (!stop_heartbeats.WaitForNotificationWithTimeout(absl::Milliseconds(heartbeat_ms.load()))) {
      for (auto& a : agents) {
        if (stop_heartbeats.HasBeenNotified()) break;
        a->Heartbeat();
      }
    }
  });
  const Mem registered = ReadMem(pid);

  auto run_save = [&](int64_t step, bool to_commit) -> absl::StatusOr<SaveTiming> {
    std::vector<absl::Time> starts(world);
    std::vector<std::string> ids(world);
    ParallelFor(world, threads, [&](int r) {
      starts[r] = absl::Now();
      absl::StatusOr<std::string> id = agents[r]->Submit(step);
      if (!id.ok()) {
        progress.Fail(id.status().ToString());
        return;
      }
      ids[r] = *id;
    });
    const absl::Time first_start = *std::min_element(starts.begin(), starts.end());
    const absl::Time last_start = *std::max_element(starts.begin(), starts.end());
    SaveTiming t;
    t.session = ids[0];
    absl::MutexLock lock(&progress.mu);
    auto all_pinned = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress.mu) {
      return !progress.error.empty() || progress.pins[t.session] == static_cast<int>(world);
    };
    if (!progress.mu.AwaitWithTimeout(absl::Condition(&all_pinned), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("step ", step, ": ",
                                                      progress.pins[t.session], " of ", world,
                                                      " agents got PIN"));
    }
    if (!progress.error.empty()) return absl::AbortedError(progress.error);
    const absl::Time last_pin = progress.last_pin[t.session];
    t.plan_s = absl::ToDoubleSeconds(last_pin - last_start);
    t.span_s = absl::ToDoubleSeconds(last_pin - first_start);
    t.cached_pins = progress.cached_pins[t.session];
    t.last_submit_start = last_start;
    t.last_pin = last_pin;
    if (to_commit) {
      progress.mu.Unlock();
      ParallelFor(world, threads, [&](int r) {
        absl::Status s = agents[r]->AckPin();
        if (!s.ok()) progress.Fail(absl::StrCat("rank ", r, ": ", s.ToString()));
      });
      progress.mu.Lock();
      auto all_committed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress.mu) {
        return !progress.error.empty() ||
               progress.committed[t.session] == static_cast<int>(world);
      };
      if (!progress.mu.AwaitWithTimeout(absl::Condition(&all_committed), timeout)) {
        return absl::DeadlineExceededError(
            absl::StrCat("step ", step, ": ", progress.committed[t.session], " of ", world,
                         " agents got COMMITTED"));
      }
      if (!progress.error.empty()) return absl::AbortedError(progress.error);
    }
    return t;
  };

  int rc = 0;
  std::string error;
  SaveTiming first, cached;
  Mem after_first, after_cached;
  {
    std::string fatal;
    {
      absl::MutexLock lock(&progress.mu);
      fatal = progress.error;
    }
    if (!fatal.empty()) {
      error = fatal;
      rc = 1;
    }
  }
  if (rc == 0) {
    std::fprintf(stderr, "plan-load: save 1 (first plan), carried to COMMITTED\n");
    absl::StatusOr<SaveTiming> t = run_save(1, /*to_commit=*/true);
    after_first = ReadMem(pid);
    if (!t.ok()) {
      error = t.status().ToString();
      rc = 1;
    } else {
      first = *t;
    }
  }
  if (rc == 0) {
    std::fprintf(stderr, "plan-load: save 2 (same plans: cached plan), up to PIN\n");
    absl::StatusOr<SaveTiming> t = run_save(2, /*to_commit=*/false);
    after_cached = ReadMem(pid);
    if (!t.ok()) {
      error = t.status().ToString();
      rc = 1;
    } else {
      cached = *t;
      if (cached.cached_pins != static_cast<int>(world)) {
        error = absl::StrCat("save 2: only ", cached.cached_pins, " of ", world,
                             " PINs said plan_cached");
        rc = 1;
      }
    }
  }
  stop_heartbeats.Notify();
  heartbeats.join();

  std::string json = absl::StrCat(
      "{\"ranks\": ", world, ", \"shards_per_rank\": ", 4 * params, ", \"layout\": \"", spec,
      "\", \"first_plan_s\": ", first.plan_s, ", \"first_span_s\": ", first.span_s,
      ", \"cached_plan_s\": ", cached.plan_s, ", \"cached_span_s\": ", cached.span_s,
      ", \"cached_pins\": ", cached.cached_pins, ", \"rss_kib_registered\": ",
      registered.rss_kib, ", \"hwm_kib_after_first\": ", after_first.hwm_kib,
      ", \"hwm_kib_after_cached\": ", after_cached.hwm_kib, ", \"rss_kib_after_cached\": ",
      after_cached.rss_kib, ", \"first_last_submit_unix\": ",
      UnixSeconds(first.last_submit_start), ", \"first_last_pin_unix\": ",
      UnixSeconds(first.last_pin), ", \"cached_last_submit_unix\": ",
      UnixSeconds(cached.last_submit_start), ", \"cached_last_pin_unix\": ",
      UnixSeconds(cached.last_pin), ", \"ok\": ", rc == 0 ? "true" : "false", ", \"error\": \"");
  for (char ch : error) {
    if (ch == '"' || ch == '\\') json += '\\';
    json += (ch == '\n' ? ' ' : ch);
  }
  json += "\"}";
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);
  if (rc != 0) std::fprintf(stderr, "plan-load: FAILED: %s\n", error.c_str());
  // Closing 1,024 streams one by one is slow and measures nothing: leave it to exit.
  std::_Exit(rc);
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
