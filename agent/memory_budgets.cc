#include "agent/memory_budgets.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera {
namespace {

constexpr int64_t kMostAgentsPerNode = 4096;
constexpr uint64_t kPage = 4096;

absl::StatusOr<uint32_t> Count(const std::string& name, int64_t value) {
  if (value < 1 || value > kMostAgentsPerNode) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is ", value, ": agents per node must be 1 to ", kMostAgentsPerNode));
  }
  return static_cast<uint32_t>(value);
}

absl::StatusOr<uint32_t> FromVariable(const char* name, const char* value) {
  int64_t count = 0;
  if (!absl::SimpleAtoi(value, &count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, "='", value, "' is not a count of processes per node (set --agents_per_node)"));
  }
  return Count(name, count);
}

absl::StatusOr<uint64_t> Budget(const char* flag, int64_t mb, uint64_t default_bytes) {
  if (mb < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " is ", mb, " MiB: it cannot be negative"));
  }
  const uint64_t bytes = mb > 0 ? static_cast<uint64_t>(mb) << 20 : default_bytes;
  if (bytes < kPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " comes to ", bytes, " bytes, less than one page"));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<uint32_t> AgentsPerNode(int64_t flag, const char* local_world_size,
                                       const char* slurm_ntasks_per_node) {
  if (flag != 0) return Count("--agents_per_node", flag);
  if (local_world_size != nullptr && *local_world_size != '\0') {
    return FromVariable("LOCAL_WORLD_SIZE", local_world_size);
  }
  // Slurm writes "4" for --ntasks-per-node=4; an uneven layout ("2(x3),1") is not one count.
  int64_t count = 0;
  if (slurm_ntasks_per_node != nullptr && absl::SimpleAtoi(slurm_ntasks_per_node, &count)) {
    return Count("SLURM_NTASKS_PER_NODE", count);
  }
  return 1u;
}

absl::StatusOr<MemoryBudgets> ResolveMemoryBudgets(uint64_t physical_bytes,
                                                   uint32_t agents_per_node,
                                                   int64_t staging_budget_mb,
                                                   int64_t buddy_budget_mb) {
  if (physical_bytes == 0 && (staging_budget_mb == 0 || buddy_budget_mb == 0) &&
      staging_budget_mb >= 0 && buddy_budget_mb >= 0) {
    return absl::InvalidArgumentError(
        "the host's physical memory is unknown (sysconf): set --staging_budget_mb and "
        "--buddy_budget_mb");
  }
  const uint64_t share = physical_bytes / 2 / (agents_per_node > 0 ? agents_per_node : 1);
  MemoryBudgets budgets;
  ASSIGN_OR_RETURN(budgets.staging_bytes, Budget("staging_budget_mb", staging_budget_mb, share));
  ASSIGN_OR_RETURN(budgets.buddy_bytes,
                   Budget("buddy_budget_mb", buddy_budget_mb, budgets.staging_bytes / 2));
  return budgets;
}

}  // namespace tessera
