// tessera-gpu-bench: one trainer rank of the GPU benchmark (tests/gpu/run.sh). Saves and loads
// CUDA tensors (host tensors where no GPU is usable, chosen at run time) through tessera::Client
// and writes what it measured as one JSON object. Exit 0 only if every call succeeded and, for
// a load, every byte matched.
//
//   barrier --barrier=/NAME --parties=N     create the ranks' barrier (before starting them)
//   save --agent=SOCK --rank=R --world=N --mib=S --steps=K --out=F.json
//        1. fills its pieces (tests/gpu/bench_tensors.h) in --memory;
//        2. the copy limit of the same bytes: pinned cudaMemcpy device->host and host->device
//           (memcpy for host tensors), --repeats times, every rank at once;
//        3. with --reserve (default), Client::ReserveStaging of the tensors first, timed, as
//           a trainer does before its first save (DESIGN.md "The first save");
//        4. K saves (step 1 plans, and sizes and pins staging unless reserved: reported apart;
//           later steps reuse both). Per save: stall = wall time Save() blocks, the client's
//           own stall and copy time, and Save() call -> WaitCommitted() returned. Between saves the stamped row
//           of every piece changes on the device, outside the timed region.
//   load --agent=SOCK --rank=R --world=N --saved_world=M --mib=S --step=K --out=F.json
//        Load(-1) into this rank's pieces of ITS layout (destinations allocated and written
//        first, as a resumed model's are), timed; checks the step is K and every byte.
// With --barrier every rank waits for the others before each timed pass.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/program.h"
#include "common/status.h"
#include "tests/gpu/bench_memory.h"
#include "tests/gpu/bench_tensors.h"
#include "tests/gpu/process_barrier.h"

ABSL_FLAG(std::string, agent, "", "unix socket of this rank's tessera-agent (save, load)");
ABSL_FLAG(int32_t, rank, 0, "this rank");
ABSL_FLAG(int32_t, world, 1, "ranks of this layout (tp=N)");
ABSL_FLAG(int32_t, saved_world, 0, "load: ranks of the saved layout (default: --world)");
ABSL_FLAG(int64_t, mib, 64, "MiB per rank of the saved layout");
ABSL_FLAG(int64_t, tensor_mib, 64, "MiB per tensor per saved rank");
ABSL_FLAG(int32_t, steps, 6, "save: saves, steps 1..K");
ABSL_FLAG(int64_t, step, -1, "load: the step the latest checkpoint must be");
ABSL_FLAG(int32_t, repeats, 5, "save: repetitions of the copy-limit measurement");
ABSL_FLAG(bool, reserve, true, "save: Client::ReserveStaging before the first save");
ABSL_FLAG(std::string, memory, "auto",
          "where the tensors live: auto (CUDA if a GPU is usable, else host), cuda, host");
ABSL_FLAG(std::string, barrier, "", "process barrier (/NAME) shared by the ranks");
ABSL_FLAG(int32_t, parties, 1, "barrier: ranks that meet at it");
ABSL_FLAG(std::string, out, "", "JSON report (save, load)");

namespace tessera::gpubench {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double WallNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

int Threads() { return std::max(1u, std::min(16u, std::thread::hardware_concurrency())); }

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "tessera-gpu-bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

// Seconds and wall-clock stamps with every digit they have (StrCat keeps only 6).
std::string Num(double x) { return absl::StrFormat("%.9f", x); }

std::string JsonList(const std::vector<double>& v) {
  return absl::StrCat(
      "[", absl::StrJoin(v, ", ", [](std::string* out, double x) { out->append(Num(x)); }), "]");
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text << "\n";
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// The agent registered before the ranks start (run.sh waits for it), but its trainer socket
// may lag by a moment: retry Unavailable for a bounded time.
absl::StatusOr<std::unique_ptr<Client>> ConnectToAgent(const std::string& socket) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket);
    if (client.ok() || client.status().code() != absl::StatusCode::kUnavailable ||
        absl::Now() > deadline) {
      return client;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

struct Rank {
  Where where = Where::kHost;
  std::vector<Piece> pieces;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::unique_ptr<ProcessBarrier> barrier;
  uint64_t bytes = 0;

  void Meet() {
    if (barrier != nullptr) barrier->Wait();
  }

  std::vector<TensorRef> Refs() const {
    std::vector<TensorRef> refs;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      TensorRef t;
      t.fqn = p.fqn;
      t.dtype = v1::DTYPE_I32;
      t.global_shape = {p.global_rows, kCols};
      t.box = Box{{p.row0, 0}, {p.rows, kCols}};
      t.replicated_over = std::vector<std::string>{};  // every rank holds distinct rows
      t.data = buffers[i]->data();
      t.nbytes = p.nbytes();
      t.memory = where == Where::kCuda ? Memory::kCuda : Memory::kHost;
      refs.push_back(std::move(t));
    }
    return refs;
  }
};

absl::StatusOr<Rank> MakeRank(int saved_world) {
  Rank rank;
  ASSIGN_OR_RETURN(rank.where, ChooseMemory(absl::GetFlag(FLAGS_memory)));
  ASSIGN_OR_RETURN(rank.pieces,
                   Pieces(absl::GetFlag(FLAGS_mib), saved_world, absl::GetFlag(FLAGS_world),
                          absl::GetFlag(FLAGS_rank), absl::GetFlag(FLAGS_tensor_mib)));
  for (const Piece& p : rank.pieces) {
    ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, Buffer::Allocate(rank.where, p.nbytes()));
    rank.buffers.push_back(std::move(b));
    rank.bytes += p.nbytes();
  }
  if (!absl::GetFlag(FLAGS_barrier).empty()) {
    ASSIGN_OR_RETURN(rank.barrier, ProcessBarrier::Open(absl::GetFlag(FLAGS_barrier)));
  }
  return rank;
}

std::string Header(const char* mode, const Rank& rank) {
  return absl::StrCat("\"mode\": \"", mode, "\", \"rank\": ", absl::GetFlag(FLAGS_rank),
                      ", \"world\": ", absl::GetFlag(FLAGS_world), ", \"memory\": \"",
                      WhereName(rank.where), "\", \"gpu\": ", JsonString(GpuName()),
                      ", \"bytes\": ", rank.bytes, ", \"tensors\": ", rank.pieces.size());
}

int Save() {
  absl::StatusOr<Rank> made = MakeRank(absl::GetFlag(FLAGS_world));
  if (!made.ok()) return Fail("setting up", made.status());
  Rank& rank = *made;
  {
    std::vector<int32_t> host(rank.pieces.front().nbytes() / 4);
    for (size_t i = 0; i < rank.pieces.size(); ++i) {
      Fill(rank.pieces[i], /*step=*/1, host.data(), Threads());
      absl::Status s = rank.buffers[i]->Write(0, host.data(), rank.pieces[i].nbytes());
      if (!s.ok()) return Fail("filling the tensors", s);
    }
  }
  std::vector<Buffer*> raw;
  for (auto& b : rank.buffers) raw.push_back(b.get());
  absl::StatusOr<CopyLimit> limit =
      MeasureCopyLimit(raw, absl::GetFlag(FLAGS_repeats), [&] { rank.Meet(); });
  if (!limit.ok()) return Fail("measuring the copy limit", limit.status());

  absl::StatusOr<std::unique_ptr<Client>> client = ConnectToAgent(absl::GetFlag(FLAGS_agent));
  if (!client.ok()) return Fail("connecting to the agent", client.status());
  const std::vector<TensorRef> refs = rank.Refs();
  std::string reserved = "null";
  if (absl::GetFlag(FLAGS_reserve)) {
    rank.Meet();
    const Clock::time_point start = Clock::now();
    absl::Status s = (*client)->ReserveStaging(refs);
    if (!s.ok()) return Fail("ReserveStaging", s);
    reserved = Num(Since(start));
  }
  std::vector<std::string> saves;
  std::vector<int32_t> row(kCols);
  for (int64_t step = 1; step <= absl::GetFlag(FLAGS_steps); ++step) {
    if (step > 1) {
      for (size_t i = 0; i < rank.pieces.size(); ++i) {
        FillStampRow(rank.pieces[i], step, row.data());
        absl::Status s = rank.buffers[i]->Write(0, row.data(), kRowBytes);
        if (!s.ok()) return Fail("stamping the step", s);
      }
    }
    rank.Meet();
    const double wall = WallNow();
    const Clock::time_point start = Clock::now();
    absl::StatusOr<SaveResult> saved = (*client)->Save(step, refs);
    const double blocked = Since(start);
    if (!saved.ok()) return Fail(absl::StrCat("Save(", step, ")"), saved.status());
    absl::StatusOr<std::string> dir = (*client)->WaitCommitted(step, absl::Hours(1));
    const double committed = Since(start);
    if (!dir.ok()) return Fail(absl::StrCat("WaitCommitted(", step, ")"), dir.status());
    saves.push_back(absl::StrCat(
        "{\"step\": ", step, ", \"start\": ", Num(wall), ", \"blocked_s\": ", Num(blocked),
        ", \"stall_s\": ", Num(absl::ToDoubleSeconds(saved->stall)),
        ", \"copy_s\": ", Num(absl::ToDoubleSeconds(saved->copy)),
        ", \"committed_s\": ", Num(committed), ", \"committed_at\": ", Num(wall + committed),
        ", \"plan_cached\": ", saved->plan_cached ? "true" : "false", "}"));
  }
  const std::string json = absl::StrCat(
      "{", Header("save", rank), ", \"to_host_s\": ", JsonList(limit->to_host_s),
      ", \"to_device_s\": ", JsonList(limit->to_device_s), ", \"reserve_s\": ", reserved,
      ", \"saves\": [",
      absl::StrJoin(saves, ", "), "]}");
  absl::Status written = WriteFile(absl::GetFlag(FLAGS_out), json);
  if (!written.ok()) return Fail("writing the report", written);
  return 0;
}

int Load() {
  const int saved_world =
      absl::GetFlag(FLAGS_saved_world) > 0 ? absl::GetFlag(FLAGS_saved_world) : absl::GetFlag(FLAGS_world);
  absl::StatusOr<Rank> made = MakeRank(saved_world);
  if (!made.ok()) return Fail("setting up", made.status());
  Rank& rank = *made;
  // Destinations hold something other than the checkpoint (all bytes 0xff) before the load.
  {
    std::vector<char> junk(rank.pieces.front().nbytes(), static_cast<char>(0xff));
    for (size_t i = 0; i < rank.pieces.size(); ++i) {
      absl::Status s = rank.buffers[i]->Write(0, junk.data(), rank.pieces[i].nbytes());
      if (!s.ok()) return Fail("preparing the destinations", s);
    }
  }
  absl::StatusOr<std::unique_ptr<Client>> client = ConnectToAgent(absl::GetFlag(FLAGS_agent));
  if (!client.ok()) return Fail("connecting to the agent", client.status());
  const std::vector<TensorRef> refs = rank.Refs();
  rank.Meet();
  const double wall = WallNow();
  const Clock::time_point start = Clock::now();
  absl::StatusOr<LoadResult> loaded = (*client)->Load(-1, refs);
  const double load_s = Since(start);
  if (!loaded.ok()) return Fail("Load(latest)", loaded.status());

  // Every byte, against the values of the step that must have been loaded.
  const int64_t step = absl::GetFlag(FLAGS_step);
  uint64_t mismatched_elements = 0;
  int mismatched_tensors = 0;
  std::vector<int32_t> host(rank.pieces.front().nbytes() / 4);
  for (size_t i = 0; i < rank.pieces.size(); ++i) {
    absl::Status s = rank.buffers[i]->Read(0, host.data(), rank.pieces[i].nbytes());
    if (!s.ok()) return Fail("reading back", s);
    const uint64_t bad = CountMismatches(rank.pieces[i], step, host.data(), Threads());
    mismatched_elements += bad;
    mismatched_tensors += bad > 0;
  }
  const std::string json = absl::StrCat(
      "{", Header("load", rank), ", \"saved_world\": ", saved_world,
      ", \"step\": ", loaded->step, ", \"expected_step\": ", step, ", \"start\": ", Num(wall),
      ", \"load_s\": ", Num(load_s), ", \"end\": ", Num(wall + load_s),
      ", \"copy_s\": ", Num(absl::ToDoubleSeconds(loaded->copy_time)),
      ", \"mismatched_tensors\": ", mismatched_tensors,
      ", \"mismatched_elements\": ", mismatched_elements, "}");
  absl::Status written = WriteFile(absl::GetFlag(FLAGS_out), json);
  if (!written.ok()) return Fail("writing the report", written);
  if (loaded->step != step || mismatched_tensors > 0) {
    std::fprintf(stderr,
                 "tessera-gpu-bench: rank %d loaded step %lld (expected %lld); %d of %zu tensors "
                 "differ (%llu elements)\n",
                 absl::GetFlag(FLAGS_rank), static_cast<long long>(loaded->step),
                 static_cast<long long>(step), mismatched_tensors, rank.pieces.size(),
                 static_cast<unsigned long long>(mismatched_elements));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tessera::gpubench

int main(int argc, char** argv) {
  std::vector<char*> args = tessera::InitProgram(
      "tessera-gpu-bench barrier|save|load [flags]: one rank of the GPU benchmark "
      "(tests/gpu/run.sh)",
      argc, argv);
  const std::string mode = args.size() > 1 ? args[1] : "";
  if (mode == "barrier") {
    absl::Status s = tessera::gpubench::ProcessBarrier::Create(absl::GetFlag(FLAGS_barrier),
                                                                absl::GetFlag(FLAGS_parties));
    return s.ok() ? 0 : tessera::gpubench::Fail("creating the barrier", s);
  }
  if ((mode == "save" || mode == "load") &&
      (absl::GetFlag(FLAGS_agent).empty() || absl::GetFlag(FLAGS_out).empty())) {
    std::fprintf(stderr, "tessera-gpu-bench: %s needs --agent and --out\n", mode.c_str());
    return 2;
  }
  if (mode == "save") return tessera::gpubench::Save();
  if (mode == "load") {
    if (absl::GetFlag(FLAGS_step) < 0) {
      std::fprintf(stderr, "tessera-gpu-bench: load needs --step (the step it must find)\n");
      return 2;
    }
    return tessera::gpubench::Load();
  }
  std::fprintf(stderr, "tessera-gpu-bench: the first argument must be barrier, save or load\n");
  return 2;
}
