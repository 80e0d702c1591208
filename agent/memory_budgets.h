// MemoryBudgets: how much memory one agent may take for staging and for buddy copies, and the
// defaults that keep all the agents of one node inside its RAM (docs/OPERATIONS.md "Sizing").
//
// The agents of a node share it: by default they stage in at most half of its physical memory
// together (a default /dev/shm's size), each agent getting an equal part, and each may hold
// buddy copies up to half of its staging budget (one copy of a save the size of the ones it
// stages twice with the memory tier). With the trainers' own copies of their state, a node
// whose ranks each save up to a quarter of its RAM divided among them never runs out.
//
// Pure functions: the caller reads the flags, the environment and the physical memory.
#ifndef TESSERA_AGENT_MEMORY_BUDGETS_H_
#define TESSERA_AGENT_MEMORY_BUDGETS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tessera {

// How many agents share this node's memory: `flag` (--agents_per_node) if above 0, else the
// launcher's count of processes per node — torchrun's LOCAL_WORLD_SIZE, then Slurm's
// SLURM_NTASKS_PER_NODE when it is a plain count — else 1. Null or empty variables are unset.
// Errors: InvalidArgument naming the flag or the variable if it is not a count from 1 to
// 4096 (a flag of 0 means unset).
absl::StatusOr<uint32_t> AgentsPerNode(int64_t flag, const char* local_world_size,
                                       const char* slurm_ntasks_per_node);

struct MemoryBudgets {
  uint64_t staging_bytes = 0;  // StagingPoolOptions::budget_bytes (saves' pool; loads' too)
  uint64_t buddy_bytes = 0;    // BuddyStore's budget
};

// The budgets from --staging_budget_mb and --buddy_budget_mb (MiB; 0: the default), on a node
// of `physical_bytes` shared by `agents_per_node` agents: staging defaults to
// physical / 2 / agents_per_node, buddy copies to half the staging budget.
// Errors: InvalidArgument naming the flag if it is negative, or if a budget comes to less
// than one 4 KiB page; InvalidArgument if a default is needed and physical_bytes is 0 (the
// caller could not read it).
absl::StatusOr<MemoryBudgets> ResolveMemoryBudgets(uint64_t physical_bytes,
                                                   uint32_t agents_per_node,
                                                   int64_t staging_budget_mb,
                                                   int64_t buddy_budget_mb);

}  // namespace tessera

#endif  // TESSERA_AGENT_MEMORY_BUDGETS_H_
