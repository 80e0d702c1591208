#include "client/cli/usage.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {
namespace cli {
namespace {

constexpr absl::string_view kOnlineFlags =
    "  Connection flags: --coordinator=HOST:PORT (default $TESSERA_COORDINATOR, else\n"
    "  127.0.0.1:7070), --token (default $TESSERA_ADMIN_TOKEN), --tls_ca, --tls_cert,\n"
    "  --tls_key, --timeout_ms.\n";

std::vector<CommandInfo> MakeCommands() {
  return {
      {"jobs", "", 0, true, "list the coordinator's jobs",
       "  Job id, mesh layout, world size, agents alive, latest committed step and the save\n"
       "  in flight, if any.\n"},
      {"agents", "JOB", 1, true, "list a job's agents and their liveness",
       "  Rank, mesh coordinates, node, peer address, alive, time since the last heartbeat,\n"
       "  pinned staging bytes, GPU, incarnation.\n"},
      {"status", "JOB", 1, true, "show a save session with per-rank progress",
       "  The job's current save, else its latest (--session=ID for another): phase, bytes\n"
       "  written, a table of ranks (phase reached, bytes staged/planned/written, chunks,\n"
       "  trainer stall, stragglers), phase timings, and the error with its code and ranks\n"
       "  if it aborted.\n"},
      {"watch", "JOB", 1, true, "follow a save until it commits or aborts",
       "  On a terminal a per-phase display with progress bars is redrawn in place; otherwise\n"
       "  one line per update (with --json: one JSON document per update, one per line).\n"
       "  --session=ID picks a session. Exits 0 when the save commits, 1 when it aborts\n"
       "  (printing the reason).\n"},
      {"checkpoints", "JOB", 1, true,
       "list a job's committed checkpoints, newest first (disk, latest / disk / memory-only)",
       ""},
      {"abort", "JOB", 1, true, "abort the job's save in flight",
       "  --reason=TEXT is recorded with the abort (ABORTED_BY_USER).\n"},
      {"verify", "DIR", 1, false, "check a checkpoint directory completely",
       "  Reads the manifest, checks that every tensor's chunks tile it, that every data\n"
       "  file's safetensors header agrees with the manifest, and every block checksum.\n"
       "  Prints \"OK: N tensors, M chunks, B bytes verified\" (N counts the per-rank extras,\n"
       "  objects and RNG state, and the line says how many), or the problems naming tensor,\n"
       "  chunk and file and exits 1. --checksums=false skips reading the data;\n"
       "  --max_problems=N problems are listed (--json lists all); --parallelism=N files are\n"
       "  read at once.\n"},
      {"inspect", "DIR", 1, false, "summarize a checkpoint directory",
       "  The manifest (job, step, session, layout, commit time, totals), every tensor (key,\n"
       "  kind, dtype, shape, chunks, bytes) and data file. --chunks lists every chunk.\n"},
      {"export", "DIR", 1, false, "write a checkpoint as one plain safetensors file",
       "  Requires --consolidate and --out=FILE. Every tensor is read whole (checksums\n"
       "  verified, resharded from its chunks) and written to FILE, loadable by any\n"
       "  safetensors reader. --filter=params (default) exports parameters, --filter=all\n"
       "  adds optimizer state (named \"<fqn>#<state_key>\"). Extras and optimizer state\n"
       "  recorded as absent are skipped, and the report says so.\n"},
  };
}

}  // namespace

const std::vector<CommandInfo>& Commands() {
  static const std::vector<CommandInfo>* const commands =
      new std::vector<CommandInfo>(MakeCommands());
  return *commands;
}

const CommandInfo* FindCommand(absl::string_view name) {
  for (const CommandInfo& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string ProgramUsage() {
  std::string text =
      "operate Tessera checkpoints: status of jobs and saves from the coordinator, and\n"
      "offline checks of checkpoint directories.\n\n"
      "Usage: tessera <command> [args] [flags]\n\nCommands:\n";
  for (const CommandInfo& c : Commands()) {
    absl::StrAppendFormat(&text, "  %-22s %s\n", absl::StrCat(c.name, " ", c.args), c.summary);
  }
  absl::StrAppend(&text, "  ", absl::StrFormat("%-22s", "help [COMMAND]"),
                  " show help for a command\n\n", kOnlineFlags,
                  "  --json prints one JSON document instead of tables (all commands).\n\n"
                  "Exit codes: 0 ok; 1 the thing checked failed (verify found problems, a\n"
                  "watched save aborted); 2 usage, connection or input errors.\n");
  return text;
}

std::string CommandUsage(const CommandInfo& command) {
  std::string text = absl::StrCat("Usage: tessera ", command.name, command.args.empty() ? "" : " ",
                                  command.args, " [flags]\n\n", command.summary, "\n");
  if (!command.details.empty()) absl::StrAppend(&text, "\n", command.details);
  if (command.online) absl::StrAppend(&text, "\n", kOnlineFlags);
  absl::StrAppend(&text, "  --json prints JSON instead of tables.\n");
  return text;
}

}  // namespace cli
}  // namespace tessera
