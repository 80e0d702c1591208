#include "storage/process_storage.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<ProcessStorage>> ProcessStorage::Open(
    absl::string_view fault_spec) {
  std::unique_ptr<ProcessStorage> storage(new ProcessStorage());
  if (absl::Status armed = storage->faulty_.Configure(fault_spec); !armed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inject_storage_fault: ", armed.message()));
  }
  if (!fault_spec.empty()) {
    LogWarning("fault injection: storage faults armed: ", fault_spec);
    storage->active_ = &storage->faulty_;
  }
  return storage;
}

}  // namespace tessera
