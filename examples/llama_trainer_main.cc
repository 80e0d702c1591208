// tessera-llama-trainer: one trainer rank of a llama-like model (examples/llama_model.h),
// saving and loading through its agent with the C++ client. Used by the quickstart demo, the
// end-to-end tests and the benchmarks. Exit 0 only if everything asked for held.
//
//   save: fill this rank's pieces for each step, Save (the trainer stall is printed), and with
//         --wait wait for the commit.
//   save with --persist_every=M: a step divisible by M goes to disk, the others to memory only
//         (DESIGN.md "Memory-only saves").
//   load: Load (--load_step, -1 = latest on disk, -2 = newest incl. memory-only) into this rank's pieces of ITS layout (the agent's),
//         then check every byte against the deterministic values of the loaded step.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/layout.h"
#include "common/program.h"
#include "common/status.h"
#include "examples/llama_model.h"

ABSL_FLAG(std::string, agent_socket, "", "unix socket of this rank's tessera-agent; required");
ABSL_FLAG(std::string, mode, "save", "save or load");
ABSL_FLAG(std::string, steps, "1", "save: comma-separated steps to save, in order");
ABSL_FLAG(int64_t, load_step, -1,
          "load: the step to load (-1: the latest on disk; -2: the newest commit, a memory-only "
          "one included)");
ABSL_FLAG(int64_t, persist_every, 0,
          "save: if > 0, only steps divisible by it are saved to disk; the others are "
          "memory-only saves (kept in the agents' memory, never the latest on disk)");
ABSL_FLAG(std::string, optimizer, "replicated",
          "AdamW state: replicated (over dp, like the params), distributed (flat-range slices "
          "across dp) or absent (before the first step)");
ABSL_FLAG(int32_t, layers, 4, "transformer layers (divisible by pp)");
ABSL_FLAG(int64_t, dim, 256, "hidden size (divisible by tp)");
ABSL_FLAG(int64_t, total_mb, 0, "if set: size the model to about this many MiB with AdamW state");
ABSL_FLAG(bool, wait, true, "save: wait for each save's commit before the next");
ABSL_FLAG(int32_t, wait_timeout_s, 600,
          "save: how long each wait for a commit may take (WaitCommitted's timeout)");
ABSL_FLAG(std::string, step_barrier, "",
          "save: a directory where every rank meets the others before each save (benchmarks: "
          "each rank's stall then excludes waiting for ranks still filling their tensors)");
ABSL_FLAG(bool, reserve_staging, true,
          "save: have the agent make (and map) the staging before the first save, so the "
          "first save stalls like the later ones (Client::ReserveStaging)");
ABSL_FLAG(std::string, expect_error, "",
          "save: expect the save to fail with this error code (e.g. DUPLICATE_FQN); exit 0 if so");
ABSL_FLAG(bool, kill_after_save, false,
          "save: SIGKILL this trainer right after the first Save returns, before its commit "
          "(fault tests)");
ABSL_FLAG(bool, kill_during_copy, false,
          "save: SIGKILL this trainer in the middle of the first Save's copy into staging, "
          "before Save returns (fault tests): the largest tensor's buffer is made unreadable "
          "and the fault handler kills the process");
ABSL_FLAG(bool, box_outside_shape, false,
          "save: move the first tensor's box past the end of its global shape, so that this "
          "rank's client refuses its tensors (fault tests: a refusal must reach every rank)");
ABSL_FLAG(std::string, rename_layers_from_stage, "",
          "save: reproduce the torchtitan PP bug: every stage names its layers from 0");

namespace {

// --step_barrier: marks `name` done for `rank` in `dir`, then waits (polling each millisecond,
// at most 10 minutes) until all `world` ranks marked it. A benchmark harness tool, not a
// protocol: a real job's ranks arrive at a save when their step ends.
bool FileBarrier(const std::string& dir, const std::string& name, uint32_t rank,
                 uint32_t world) {
  const auto path = [&](uint32_t r) { return absl::StrCat(dir, "/", name, ".", r); };
  if (FILE* f = std::fopen(path(rank).c_str(), "w")) {
    std::fclose(f);
  } else {
    return false;
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  for (uint32_t r = 0; r < world;) {
    if (access(path(r).c_str(), F_OK) == 0) {
      ++r;
    } else if (absl::Now() > deadline) {
      return false;
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  return true;
}

// --kill_during_copy: the client's copy touches a protected page; die like kill -9.
void KillOnFault(int) {
  static const char kMessage[] = "fault injection: killed during the copy into staging\n";
  (void)!write(STDOUT_FILENO, kMessage, sizeof(kMessage) - 1);
  raise(SIGKILL);
}

// Makes the page-aligned middle of the largest buffer unreadable. False if none is big enough.
bool ArmKillDuringCopy(std::vector<std::vector<unsigned char>>& buffers) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char>* largest = nullptr;
  for (auto& b : buffers) {
    if (largest == nullptr || b.size() > largest->size()) largest = &b;
  }
  if (largest == nullptr) return false;
  const auto begin = reinterpret_cast<uintptr_t>(largest->data());
  const uintptr_t first = (begin + largest->size() / 2 + page - 1) / page * page;
  if (first + page > begin + largest->size()) return false;
  struct sigaction action = {};
  action.sa_handler = KillOnFault;
  sigaction(SIGSEGV, &action, nullptr);
  sigaction(SIGBUS, &action, nullptr);
  return mprotect(reinterpret_cast<void*>(first), page, PROT_NONE) == 0;
}


int Fail(const std::string& message) {
  std::fprintf(stderr, "tessera-llama-trainer: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::InitProgram(
      "one trainer rank of a llama-like model, saving or loading through tessera-agent.\n\n"
      "Usage: tessera-llama-trainer --agent_socket=PATH --mode=save --steps=10,20",
      argc, argv);
  absl::StatusOr<std::unique_ptr<tessera::Client>> client =
      tessera::Client::Connect(absl::GetFlag(FLAGS_agent_socket));
  if (!client.ok()) return Fail(client.status().ToString());
  const tessera::v1::AgentIdentity& id = (*client)->identity();
  absl::StatusOr<tessera::MeshLayout> layout = tessera::MeshLayout::FromProto(id.layout());
  if (!layout.ok()) return Fail(layout.status().ToString());
  const uint32_t rank = id.coord().rank();

  tessera::LlamaConfig config;
  config.layers = absl::GetFlag(FLAGS_layers);
  if (absl::GetFlag(FLAGS_total_mb) > 0) {
    config = tessera::LlamaConfig::ForTotalBytes(
        static_cast<uint64_t>(absl::GetFlag(FLAGS_total_mb)) << 20, config.layers);
  } else {
    config.dim = absl::GetFlag(FLAGS_dim);
    config.ffn = config.dim * 11 / 4 / 64 * 64;
    config.vocab = config.dim * 4;
  }
  const std::string opt = absl::GetFlag(FLAGS_optimizer);
  tessera::OptimizerMode mode = opt == "distributed" ? tessera::OptimizerMode::kDistributed
                                : opt == "absent"    ? tessera::OptimizerMode::kAbsent
                                                     : tessera::OptimizerMode::kReplicated;
  absl::StatusOr<std::vector<tessera::LlamaPiece>> pieces =
      tessera::LlamaPieces(config, *layout, rank, mode);
  if (!pieces.ok()) return Fail(pieces.status().ToString());
  if (absl::GetFlag(FLAGS_rename_layers_from_stage) == "0") {
    // torchtitan's PP bug: each stage numbers its layers from 0.
    const int per_stage = config.layers / static_cast<int>(
        layout->DimIndex("pp") ? layout->degree(*layout->DimIndex("pp")) : 1);
    for (tessera::LlamaPiece& p : *pieces) {
      int layer = 0;
      if (sscanf(p.fqn.c_str(), "layers.%d.", &layer) == 1) {
        const std::string rest = p.fqn.substr(p.fqn.find('.', 7));
        p.fqn = absl::StrCat("layers.", layer % per_stage, rest);
      }
    }
  }

  std::vector<std::vector<unsigned char>> buffers;
  std::vector<tessera::TensorRef> refs;
  uint64_t total = 0;
  for (const tessera::LlamaPiece& p : *pieces) {
    buffers.emplace_back(p.nbytes);
    tessera::TensorRef ref;
    ref.fqn = p.fqn;
    ref.kind = p.kind;
    ref.dtype = p.kind == tessera::v1::SHARD_KIND_EXTRA ? tessera::v1::DTYPE_U8
                                                         : tessera::v1::DTYPE_F32;
    ref.global_shape = p.global_shape;
    ref.box = p.box;
    if (p.has_flat_range) ref.flat_range = std::make_pair(p.flat_begin, p.flat_end);
    ref.replicated_over = p.replicated_over;
    ref.state_key = p.state_key;
    ref.state_absent = p.state_absent;
    ref.data = buffers.back().data();
    ref.nbytes = p.nbytes;
    refs.push_back(ref);
    total += p.nbytes;
  }
  if (absl::GetFlag(FLAGS_box_outside_shape)) {
    for (tessera::TensorRef& ref : refs) {
      if (ref.global_shape.empty() || ref.kind == tessera::v1::SHARD_KIND_EXTRA) continue;
      ref.box = tessera::BoxOf(ref);
      ref.box.offsets[0] = ref.global_shape[0];  // one past the end: outside the shape
      break;
    }
  }

  if (absl::GetFlag(FLAGS_mode) == "save") {
    if (absl::GetFlag(FLAGS_reserve_staging)) {
      // Advisory: a save makes what it needs anyway (dropping a memory copy for room, which a
      // reservation does not do).
      const absl::Time start = absl::Now();
      const absl::Status reserved = (*client)->ReserveStaging(refs);
      if (reserved.ok()) {
        std::printf("rank %u: staging reserved for %.1f MiB in %.1f ms\n", rank,
                    total / 1048576.0, absl::ToDoubleMilliseconds(absl::Now() - start));
      } else {
        std::printf("rank %u: staging not reserved (the first save makes it): %s\n", rank,
                    reserved.ToString().c_str());
      }
    }
    for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_steps), ',')) {
      int64_t step = 0;
      if (!absl::SimpleAtoi(part, &step)) return Fail(absl::StrCat("bad step \"", part, "\""));
      for (size_t i = 0; i < pieces->size(); ++i) {
        tessera::FillPiece((*pieces)[i], rank, step, buffers[i].data());
      }
      if (absl::GetFlag(FLAGS_kill_during_copy) && !ArmKillDuringCopy(buffers)) {
        return Fail("--kill_during_copy: no buffer spans a whole page");
      }
      const std::string barrier = absl::GetFlag(FLAGS_step_barrier);
      if (!barrier.empty() &&
          !FileBarrier(barrier, absl::StrCat("save-", step), rank, layout->world_size())) {
        return Fail(absl::StrCat("--step_barrier: not every rank reached step ", step, " in ",
                                 barrier, " within 10 minutes"));
      }
      const int64_t persist_every = absl::GetFlag(FLAGS_persist_every);
      tessera::SaveOptions save_options;
      save_options.memory_only = persist_every > 0 && step % persist_every != 0;
      absl::StatusOr<tessera::SaveResult> saved = (*client)->Save(step, refs, save_options);
      const std::string expected = absl::GetFlag(FLAGS_expect_error);
      if (!expected.empty()) {
        if (saved.ok()) return Fail(absl::StrCat("expected ", expected, " but the save started"));
        const std::string got = tessera::ErrorCodeName(tessera::GetErrorCode(saved.status()));
        std::printf("rank %u: save of step %lld failed as expected: %s: %s\n", rank,
                    static_cast<long long>(step), got.c_str(),
                    std::string(saved.status().message()).c_str());
        return got == expected ? 0 : Fail(absl::StrCat("expected ", expected, ", got ", got));
      }
      if (!saved.ok()) return Fail(absl::StrCat("save of step ", step, ": ", saved.status().ToString()));
      std::printf(
          "rank %u: step %lld staged%s: %.1f ms trainer stall for %.1f MiB (copy %.1f ms, %.0f "
          "MiB/s)%s\n",
          rank, static_cast<long long>(step), save_options.memory_only ? " (memory-only)" : "",
          absl::ToDoubleMilliseconds(saved->stall),
          total / 1048576.0, absl::ToDoubleMilliseconds(saved->copy),
          total / 1048576.0 / std::max(1e-9, absl::ToDoubleSeconds(saved->copy)),
          saved->plan_cached ? " (plan cached)" : "");
      std::fflush(stdout);
      if (absl::GetFlag(FLAGS_kill_after_save)) raise(SIGKILL);
      if (absl::GetFlag(FLAGS_wait)) {
        absl::StatusOr<std::string> dir = (*client)->WaitCommitted(
            step, absl::Seconds(absl::GetFlag(FLAGS_wait_timeout_s)));
        if (!dir.ok()) return Fail(absl::StrCat("step ", step, ": ", dir.status().ToString()));
        if (dir->empty()) {
          std::printf("rank %u: step %lld committed in memory only\n", rank,
                      static_cast<long long>(step));
        } else {
          std::printf("rank %u: step %lld committed at %s\n", rank, static_cast<long long>(step),
                      dir->c_str());
        }
      }
    }
    return 0;
  }

  // Load into this layout's pieces and check every byte.
  for (auto& b : buffers) std::fill(b.begin(), b.end(), 0xA5);  // poison
  const absl::Time start = absl::Now();
  absl::StatusOr<tessera::LoadResult> loaded =
      (*client)->Load(absl::GetFlag(FLAGS_load_step), refs);
  if (!loaded.ok()) {
    return Fail(absl::StrCat(
        "load: ", tessera::ErrorCodeName(tessera::GetErrorCode(loaded.status())), ": ",
        loaded.status().ToString()));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<bool> absent(pieces->size(), false);
  for (size_t i : loaded->absent) absent[i] = true;
  for (size_t i = 0; i < pieces->size(); ++i) {
    const tessera::LlamaPiece& p = (*pieces)[i];
    if (absent[i]) continue;  // the checkpoint has no optimizer state for it yet
    int64_t bad = tessera::FirstMismatch(p, rank, loaded->step, buffers[i].data());
    if (bad >= 0) {
      return Fail(absl::StrCat("rank ", rank, ": ", p.fqn, p.state_key.empty() ? "" : "#",
                               p.state_key, " differs at byte ", bad, " after loading step ",
                               loaded->step));
    }
  }
  std::printf("rank %u: loaded step %lld on %s: %.1f MiB verified byte for byte in %.2f s",
              rank, static_cast<long long>(loaded->step), tessera::LayoutSpec(id.layout()).c_str(),
              total / 1048576.0, seconds);
  if (!loaded->absent.empty()) {
    std::printf(" (%zu optimizer states or extras absent in the checkpoint)",
                loaded->absent.size());
  }
  std::printf("\n");
  std::printf("rank %u: load sources: memory_bytes=%llu disk_bytes=%llu "
              "memory_blocks_rejected=%llu fetched_from_peers=%llu memory_only=%d "
              "verified_by_client=%llu fetched_by_client=%llu prefetched_bytes=%llu\n",
              rank, static_cast<unsigned long long>(loaded->bytes_from_memory),
              static_cast<unsigned long long>(loaded->bytes_from_disk),
              static_cast<unsigned long long>(loaded->memory_blocks_rejected),
              static_cast<unsigned long long>(loaded->bytes_fetched_from_peers),
              loaded->memory_only ? 1 : 0,
              static_cast<unsigned long long>(loaded->bytes_verified_by_client),
              static_cast<unsigned long long>(loaded->bytes_fetched_by_client),
              static_cast<unsigned long long>(loaded->prefetched_bytes));
  return 0;
}
