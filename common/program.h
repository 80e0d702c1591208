// Start-up shared by every Tessera binary: the usage text and a --help that lists the flags
// defined in the binary's *_main.cc (absl's default looks for a file named like the binary,
// which "tessera-agent" vs "agent_main.cc" would never match); absl::Mutex deadlock detection
// off (program.cc says why).
//
// Thread-safety: call once, first thing in main().
#ifndef TESSERA_COMMON_PROGRAM_H_
#define TESSERA_COMMON_PROGRAM_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tessera {

// Sets the usage message, parses flags (exiting on --help or a bad flag) and returns the
// positional arguments, argv[0] first.
std::vector<char*> InitProgram(absl::string_view usage, int argc, char** argv);

}  // namespace tessera

#endif  // TESSERA_COMMON_PROGRAM_H_
