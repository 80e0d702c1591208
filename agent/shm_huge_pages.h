// ShmHugePages: whether staging regions in /dev/shm are backed by transparent huge pages.
//
// A trainer that maps a region it has not touched before — a restarted trainer restoring from
// the memory tier, or the first save into a new region — takes one page fault per page: 65,536
// per 256 MiB with 4 KiB pages, 128 with 2 MiB ones. On the reference VM a restore of 256 MiB
// from local memory took 36.4 ms on the default /dev/shm and 27.3 ms with huge=within_size
// (docs/OPERATIONS.md "Sizing"). Whether a tmpfs file gets huge pages is the mount's `huge=`
// option, unless /sys/kernel/mm/transparent_hugepage/shmem_enabled says `deny` (none for any
// mount) or `force` (all) (the kernel's admin-guide/mm/transhuge). The agent logs the answer
// at start.
//
// Pure: the caller reads /proc/mounts and shmem_enabled.
#ifndef TESSERA_AGENT_SHM_HUGE_PAGES_H_
#define TESSERA_AGENT_SHM_HUGE_PAGES_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tessera {

struct ShmHugePages {
  bool on = false;
  std::string why;  // e.g. "/dev/shm is mounted with huge=within_size"
};

// From the text of /proc/mounts (the last entry for `mount_point` is the one in effect) and of
// shmem_enabled (the bracketed word is the setting; empty if unreadable). `advise` counts as
// off: staging is not madvised.
ShmHugePages ShmHugePagesFrom(absl::string_view proc_mounts, absl::string_view shmem_enabled,
                              absl::string_view mount_point = "/dev/shm");

}  // namespace tessera

#endif  // TESSERA_AGENT_SHM_HUGE_PAGES_H_
