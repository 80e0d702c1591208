// ProcessStorage: the storage a Tessera process (the coordinator or an agent) reads and writes
// checkpoints through, made once at start from its flags.
//
// Today that is the POSIX file system, wrapped in a FaultInjectingStorage when the test-only
// --inject_storage_fault flag arms faults; the choice is made here and nowhere else, so each
// main says only "open the process's storage".
//
// Lifecycle: made in main before anything that does I/O and outlives it. Thread-safety: the
// Storage it hands out is as thread-safe as Storage is (storage.h); Open is not to be called
// concurrently with itself.
#ifndef TESSERA_STORAGE_PROCESS_STORAGE_H_
#define TESSERA_STORAGE_PROCESS_STORAGE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/fault_injecting_storage.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"

namespace tessera {

class ProcessStorage {
 public:
  // The process's storage, with the faults `fault_spec` arms (FaultInjectingStorage::Configure;
  // empty: none, and the file system is used directly). Logs a warning when faults are armed.
  // Errors: InvalidArgument "--inject_storage_fault: <why>" if `fault_spec` does not parse.
  static absl::StatusOr<std::unique_ptr<ProcessStorage>> Open(absl::string_view fault_spec);

  ProcessStorage(const ProcessStorage&) = delete;
  ProcessStorage& operator=(const ProcessStorage&) = delete;

  // What the process reads and writes through. Valid for the life of this object.
  Storage& storage() { return *active_; }

 private:
  ProcessStorage() = default;

  PosixStorage posix_;
  FaultInjectingStorage faulty_{&posix_};  // wraps posix_: declared after it
  Storage* active_ = &posix_;
};

}  // namespace tessera

#endif  // TESSERA_STORAGE_PROCESS_STORAGE_H_
