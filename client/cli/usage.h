// The `tessera` CLI's command table and help texts: what `tessera --help`, `tessera help`
// and `tessera help <command>` print, and the argument counts the dispatcher checks.
//
// Thread-safety: read-only data after static initialization.
#ifndef TESSERA_CLIENT_CLI_USAGE_H_
#define TESSERA_CLIENT_CLI_USAGE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tessera {
namespace cli {

struct CommandInfo {
  std::string name;     // "status"
  std::string args;     // positional arguments, "JOB"; empty if none
  int arg_count = 0;    // how many positional arguments it takes
  bool online = false;  // talks to the coordinator
  std::string summary;  // one line
  std::string details;  // flags and behaviour, several lines, each ending in '\n'
};

// Every command, in the order help lists them.
const std::vector<CommandInfo>& Commands();

// The command called `name`, or nullptr.
const CommandInfo* FindCommand(absl::string_view name);

// The program's usage: synopsis, the commands with their summaries, common flags, exit codes.
std::string ProgramUsage();

// `tessera help <command>`: its synopsis, summary and details.
std::string CommandUsage(const CommandInfo& command);

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_USAGE_H_
