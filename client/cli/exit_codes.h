// Exit codes of the `tessera` CLI, shared by every command so scripts can rely on them.
#ifndef TESSERA_CLIENT_CLI_EXIT_CODES_H_
#define TESSERA_CLIENT_CLI_EXIT_CODES_H_

namespace tessera {
namespace cli {

// The command did what was asked (a checkpoint verified, a watched save committed).
inline constexpr int kExitOk = 0;
// What was checked failed: verify found problems, a watched save aborted.
inline constexpr int kExitFailed = 1;
// The command could not run: bad usage, coordinator unreachable or refusing, unreadable
// input, failed export.
inline constexpr int kExitError = 2;

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_EXIT_CODES_H_
