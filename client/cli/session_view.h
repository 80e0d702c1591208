// How the CLI shows a save session (tessera.v1.SessionStatus) to a person: the full status of
// `tessera status`, the redrawn per-phase display of `tessera watch` on a terminal, and the
// one-line-per-update form of `tessera watch` when the output is not a terminal.
//
// Phases are shown in protocol order (PLANNING, PINNING, COPYING, PERSISTING, COMMITTING);
// a rank has finished a phase when its `reached` is at or beyond it (RankProgress.reached is
// the last phase it completed).
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_CLIENT_CLI_SESSION_VIEW_H_
#define TESSERA_CLIENT_CLI_SESSION_VIEW_H_

#include <ostream>
#include <string>

#include "absl/strings/string_view.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace cli {

// True for COMMITTED and ABORTED.
bool IsTerminal(v1::SessionState state);

// `tessera status`: a summary line, overall progress, the per-rank table (rank, coords,
// reached phase, bytes staged / planned / written, chunks, trainer stall, straggler mark),
// the phase timings, and the error (code, message, ranks, tensors, path) when ABORTED or the
// checkpoint directory when COMMITTED.
void PrintSessionStatus(const v1::SessionStatus& status, std::ostream& out);

// An error detail as "CODE: message" followed by indented lines for its ranks, tensors,
// region, state key and path (only those that are set).
void PrintErrorDetail(const v1::ErrorDetail& error, std::ostream& out,
                      absl::string_view indent = "");

// `tessera watch` on a terminal: a header line and one line per phase — done phases with
// their duration, the current one with a progress bar (bytes written for PERSISTING, ranks
// done for the others), later ones as pending. Every line ends in '\n'; the number of lines
// depends only on whether the session has ended, so a redraw can move the cursor back over
// the previous frame.
std::string WatchFrame(const v1::SessionStatus& status, int bar_width = 30);

// `tessera watch` when not on a terminal: one line (no '\n') per update, e.g.
// "step 100 PERSISTING 52% 1.4 GiB / 2.7 GiB written, chunks 21/40, ranks 5/8".
std::string WatchLine(const v1::SessionStatus& status);

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_SESSION_VIEW_H_
