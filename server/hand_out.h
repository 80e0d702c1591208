// HandOut: a step's commands to agents, handed to the CommandSink that writes them.
//
// A fan-out to every rank of a large job (a PIN to 16,384 agents) is one write per agent
// stream, and each write is a system call (gRPC sends a stream's message at once when its
// connection is idle). On one thread that is most of a cached save's time at that size
// (DESIGN.md "Plan caching"), so a large fan-out is split over threads by rank. Commands
// for one rank keep their order, and every command is handed over before HandOut returns,
// so the next step's commands never overtake this step's.
//
// Thread-safety: HandOut may run for different vectors at once; `sink` must accept calls from
// several threads at once (CommandSink's contract).
#ifndef TESSERA_SERVER_HAND_OUT_H_
#define TESSERA_SERVER_HAND_OUT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "server/command_sink.h"
#include "server/session/effects.h"

namespace tessera {

// Fan-outs of fewer commands than this are handed out on the calling thread alone: a thread
// costs tens of microseconds to start, a write ~15 microseconds (perf, 2-core VM).
inline constexpr size_t kParallelHandOutFrom = 512;

// At most this many threads, whatever the machine: a bound on what one fan-out starts.
// Measured on two cores only (two threads and four did equally well there).
inline constexpr size_t kMaxHandOutThreads = 8;

// How many threads HandOut uses for `commands` commands when allowed `max_threads` (0: one
// per usable core, at most kMaxHandOutThreads): 1 below kParallelHandOutFrom, else
// max_threads.
size_t HandOutThreads(size_t commands, size_t max_threads);

// Hands every command to `sink` for job `job_id`: a PIN with its plan's assignment
// (pin_plan->assignments[rank]) by SendPin, any other command by Send. Each command is freed
// once handed over. Runs on HandOutThreads(commands.size(), max_threads) threads, thread t
// taking the ranks with rank % threads == t, each in the order given; returns when all are
// handed over.
void HandOut(CommandSink& sink, const std::string& job_id, std::vector<Outgoing>& commands,
             size_t max_threads);

}  // namespace tessera

#endif  // TESSERA_SERVER_HAND_OUT_H_
