// The Commands stream as the planning benchmark's fake agents read it (plan_load.cc): a
// PIN's assignment kept as the bytes it arrived as, parsed only when GATHER or PERSIST needs
// it, after the clock has stopped.
//
// Why: a real agent parses its own assignment on its own machine. In the benchmark 16,384 fake
// agents share the coordinator's two cores, and parsing the 140 MB of assignments of
// 16,384 x 300 into messages is the load generator's cost, not the coordinator's: while a
// first plan's PINs went out, the fake agents' processes took three quarters of the CPU, most
// of it faulting in memory for the parsed messages (perf, system-wide).
//
// Thread-safety: a pure function.
#ifndef TESSERA_TESTS_BENCH_COMMAND_WIRE_H_
#define TESSERA_TESTS_BENCH_COMMAND_WIRE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

// `wire`, a serialized v1::Command, parsed into *command without its PinCommand.assignment,
// whose bytes go to *assignment (empty if it has none, or if the command is not a PIN).
// Every other field is parsed by v1::Command itself, so this follows the protocol as it
// changes. Parsing *assignment as a v1::RankAssignment gives the assignment v1::Command would
// have parsed (occurrences of a repeated PIN or assignment field are merged, as protobuf
// merges them).
// Errors: DataLoss if `wire` is not a well-formed Command, or holds a PIN beside another
// member of Command.body (which of them came last is not kept; the coordinator sends one).
absl::Status ParseCommandKeepingAssignment(absl::string_view wire, v1::Command* command,
                                           std::string* assignment);

}  // namespace tessera

#endif  // TESSERA_TESTS_BENCH_COMMAND_WIRE_H_
