// tessera: the operator's command-line tool. Online commands talk to the coordinator's Admin
// service (client/cli/admin_commands.h); offline commands work on a checkpoint directory
// (client/cli/offline_commands.h). Flags are defined here only (STYLE.md 11); `tessera help`
// and client/cli/usage.cc describe the commands. Exit codes: client/cli/exit_codes.h.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "storage/process_storage.h"
#include "storage/storage.h"
#include "client/cli/admin_commands.h"
#include "client/cli/exit_codes.h"
#include "client/cli/export.h"
#include "client/cli/offline_commands.h"
#include "client/cli/usage.h"
#include "common/program.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "tessera/v1/admin.grpc.pb.h"

ABSL_FLAG(bool, json, false, "print one JSON document instead of tables (watch: one per line)");
ABSL_FLAG(std::string, coordinator, "",
          "host:port of the coordinator (default $TESSERA_COORDINATOR, else 127.0.0.1:7070)");
ABSL_FLAG(std::string, token, "",
          "admin token, sent as 'authorization: Bearer <token>' (default "
          "$TESSERA_ADMIN_TOKEN)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA to verify the coordinator's certificate (enables TLS; system roots if only "
          "--tls_cert is given)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate for mutual TLS (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, s3_credentials_file, "",
          "verify, inspect, export of an s3:// checkpoint: an AWS-style credentials file; "
          "empty: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then ~/.aws/credentials "
          "(the store: AWS_ENDPOINT_URL, AWS_REGION)");
ABSL_FLAG(int64_t, timeout_ms, 10000, "deadline of each coordinator call (watch has none)");
ABSL_FLAG(std::string, session, "",
          "status, watch: the session to show (default: the job's current, else latest)");
ABSL_FLAG(std::string, reason, "aborted with tessera abort", "abort: the reason recorded");
ABSL_FLAG(bool, consolidate, false,
          "export: write one full tensor per tensor key (the only export mode; required)");
ABSL_FLAG(std::string, out, "", "export: the safetensors file to write");
ABSL_FLAG(std::string, filter, "params",
          "export: params (parameters only) or all (parameters and optimizer state)");
ABSL_FLAG(bool, checksums, true, "verify: check every block checksum (reads all data)");
ABSL_FLAG(int32_t, parallelism, 4, "verify, export: data files read concurrently");
ABSL_FLAG(int32_t, max_problems, 20, "verify: problems listed (--json lists all)");
ABSL_FLAG(bool, chunks, false, "inspect: list every chunk");

namespace {

using tessera::cli::kExitError;
using tessera::cli::kExitOk;

int UsageError(const std::string& message) {
  std::cerr << "tessera: " << message << '\n';
  return kExitError;
}

// The flag if set, else the environment variable if set, else `fallback`.
std::string FlagOrEnv(const std::string& flag, const char* env, const std::string& fallback) {
  if (!flag.empty()) return flag;
  const char* value = std::getenv(env);
  if (value != nullptr && *value != '\0') return value;
  return fallback;
}

// The first argument that looks like a flag but names none, or empty. Checked before the flags
// are parsed because absl exits with 1 on an unknown flag, and usage errors exit with 2.
std::string FirstUnknownFlag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    absl::string_view name = arg.substr(arg[1] == '-' ? 2 : 1);
    name = name.substr(0, name.find('='));
    if (absl::FindCommandLineFlag(name) != nullptr) continue;
    // absl's own flags, which the lookup does not list.
    static constexpr absl::string_view kBuiltin[] = {
        "help",    "helpfull",        "helpshort", "helppackage", "helpon",     "helpmatch",
        "version", "only_check_args", "flagfile",  "fromenv",     "tryfromenv", "undefok"};
    if (std::find(std::begin(kBuiltin), std::end(kBuiltin), name) != std::end(kBuiltin)) continue;
    // --nojson is --json=false.
    if (absl::StartsWith(name, "no") && absl::FindCommandLineFlag(name.substr(2)) != nullptr) {
      continue;
    }
    return std::string(arg);
  }
  return "";
}

bool StdoutIsTerminal() {
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) == 1 && !(term != nullptr && std::string(term) == "dumb");
}

int RunOnline(const tessera::cli::CommandInfo& command, const std::vector<std::string>& args) {
  tessera::cli::AdminOptions options;
  options.coordinator =
      FlagOrEnv(absl::GetFlag(FLAGS_coordinator), "TESSERA_COORDINATOR", "127.0.0.1:7070");
  options.token = FlagOrEnv(absl::GetFlag(FLAGS_token), "TESSERA_ADMIN_TOKEN", "");
  options.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  options.json = absl::GetFlag(FLAGS_json);
  options.tty = StdoutIsTerminal();
  if (options.timeout_ms <= 0) return UsageError("--timeout_ms must be positive");

  tessera::TlsFiles tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                        absl::GetFlag(FLAGS_tls_ca)};
  auto credentials = tessera::MakeChannelCredentials(tls);
  if (!credentials.ok()) {
    return UsageError(absl::StrCat("TLS setup failed: ", credentials.status().message()));
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.coordinator, *credentials, channel_args);
  tessera::cli::AdminCommands admin(tessera::v1::Admin::NewStub(channel), options, std::cout,
                                    std::cerr);
  const std::string job = args.empty() ? "" : args[0];
  if (command.name == "jobs") return admin.Jobs();
  if (command.name == "agents") return admin.Agents(job);
  if (command.name == "status") return admin.Status(job, absl::GetFlag(FLAGS_session));
  if (command.name == "watch") return admin.Watch(job, absl::GetFlag(FLAGS_session));
  if (command.name == "checkpoints") return admin.Checkpoints(job);
  if (command.name == "abort") return admin.Abort(job, absl::GetFlag(FLAGS_reason));
  return UsageError(absl::StrCat("no handler for ", command.name));
}

int RunOffline(const tessera::cli::CommandInfo& command, const std::vector<std::string>& args) {
  tessera::ProcessStorageOptions storage_options;
  storage_options.posix.direct_io = false;  // the CLI reads and writes single files in order
  storage_options.s3_credentials_file = absl::GetFlag(FLAGS_s3_credentials_file);
  absl::StatusOr<std::unique_ptr<tessera::ProcessStorage>> process_storage =
      tessera::ProcessStorage::Open(storage_options);
  if (!process_storage.ok()) return UsageError(std::string(process_storage.status().message()));
  tessera::Storage& storage = (*process_storage)->storage();
  const std::string& dir = args[0];
  const bool json = absl::GetFlag(FLAGS_json);
  const int parallelism = absl::GetFlag(FLAGS_parallelism);
  if (parallelism < 1) return UsageError("--parallelism must be at least 1");

  if (command.name == "verify") {
    tessera::cli::VerifyCommandOptions options;
    options.json = json;
    options.max_listed = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_max_problems)));
    options.verify.checksums = absl::GetFlag(FLAGS_checksums);
    options.verify.parallelism = parallelism;
    return tessera::cli::VerifyCommand(storage, dir, options, std::cout, std::cerr);
  }
  if (command.name == "inspect") {
    tessera::cli::InspectCommandOptions options;
    options.json = json;
    options.chunks = absl::GetFlag(FLAGS_chunks);
    return tessera::cli::InspectCommand(storage, dir, options, std::cout, std::cerr);
  }
  if (command.name == "export") {
    if (!absl::GetFlag(FLAGS_consolidate)) {
      return UsageError(
          "export needs --consolidate (one full tensor per key, the only export mode)");
    }
    const std::string out = absl::GetFlag(FLAGS_out);
    if (out.empty()) return UsageError("export needs --out=FILE");
    auto filter = tessera::cli::ParseExportFilter(absl::GetFlag(FLAGS_filter));
    if (!filter.ok()) return UsageError(std::string(filter.status().message()));
    tessera::cli::ExportOptions options;
    options.filter = *filter;
    options.reader.parallelism = parallelism;
    return tessera::cli::ExportCommand(storage, dir, out, options, json, std::cout, std::cerr);
  }
  return UsageError(absl::StrCat("no handler for ", command.name));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = tessera::cli::ProgramUsage();
  if (argc == 2 && std::string(argv[1]) == "-h") {
    std::cout << usage << "\nRun 'tessera --help' for all flags.\n";
    return kExitOk;
  }
  if (std::string unknown = FirstUnknownFlag(argc, argv); !unknown.empty()) {
    return UsageError(absl::StrCat("unknown flag ", unknown, " (see tessera --help)"));
  }
  std::vector<char*> positional = tessera::InitProgram(usage, argc, argv);
  if (positional.size() < 2) {
    std::cerr << usage << "\nRun 'tessera --help' for all flags.\n";
    return kExitError;
  }
  const std::string name = positional[1];
  std::vector<std::string> args(positional.begin() + 2, positional.end());

  if (name == "help") {
    if (args.empty()) {
      std::cout << usage << "\nRun 'tessera --help' for all flags.\n";
      return kExitOk;
    }
    const tessera::cli::CommandInfo* command = tessera::cli::FindCommand(args[0]);
    if (command == nullptr) {
      return UsageError(absl::StrCat("unknown command \"", args[0], "\" (see tessera help)"));
    }
    std::cout << tessera::cli::CommandUsage(*command);
    return kExitOk;
  }
  const tessera::cli::CommandInfo* command = tessera::cli::FindCommand(name);
  if (command == nullptr) {
    return UsageError(absl::StrCat("unknown command \"", name, "\" (see tessera help)"));
  }
  if (static_cast<int>(args.size()) != command->arg_count) {
    std::cerr << "tessera " << command->name << ": expected "
              << (command->arg_count == 0
                      ? std::string("no arguments")
                      : absl::StrCat("exactly ", command->arg_count, " argument: ", command->args))
              << ", got " << args.size() << "\n\n"
              << tessera::cli::CommandUsage(*command);
    return kExitError;
  }
  return command->online ? RunOnline(*command, args) : RunOffline(*command, args);
}
