#include "agent/shm_huge_pages.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace {

// The bracketed word of a sysfs choice ("always [never] deny"), or "".
std::string Selected(absl::string_view choices) {
  const size_t open = choices.find('[');
  const size_t close = choices.find(']', open);
  if (open == absl::string_view::npos || close == absl::string_view::npos) return "";
  return std::string(choices.substr(open + 1, close - open - 1));
}

}  // namespace

ShmHugePages ShmHugePagesFrom(absl::string_view proc_mounts, absl::string_view shmem_enabled,
                              absl::string_view mount_point) {
  const std::string global = Selected(shmem_enabled);
  if (global == "deny" || global == "force") {
    return ShmHugePages{global == "force",
                        absl::StrCat("transparent_hugepage/shmem_enabled is ", global)};
  }
  bool mounted = false;
  std::string huge = "never";
  for (absl::string_view line : absl::StrSplit(proc_mounts, '\n')) {
    // device mount_point type options dump pass
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 4 || fields[1] != mount_point) continue;
    mounted = true;
    huge = "never";
    for (absl::string_view option : absl::StrSplit(fields[3], ',')) {
      if (absl::ConsumePrefix(&option, "huge=")) huge = std::string(option);
    }
  }
  if (!mounted) return ShmHugePages{false, absl::StrCat(mount_point, " is not a mount point")};
  return ShmHugePages{huge == "always" || huge == "within_size",
                      absl::StrCat(mount_point, " is mounted with huge=", huge)};
}

}  // namespace tessera
