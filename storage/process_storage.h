// ProcessStorage: the storage a Tessera process (the coordinator, an agent, the CLI) reads and
// writes checkpoints through, made once at start from its flags.
//
// Paths "s3://bucket/prefix/..." go to the object store the environment names
// (storage/s3/s3_config.h: AWS_ENDPOINT_URL, AWS_REGION, credentials), made on the first such
// path; every other path to the file system (PosixStorage). On top, when the test-only
// --inject_storage_fault flag arms faults, a FaultInjectingStorage. The choice is made here
// and nowhere else, so each main says only "open the process's storage".
//
// Lifecycle: made in main before anything that does I/O, and outlives it. Thread-safety: the
// Storage it hands out is thread-safe (storage.h).
#ifndef TESSERA_STORAGE_PROCESS_STORAGE_H_
#define TESSERA_STORAGE_PROCESS_STORAGE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/fault_injecting_storage.h"
#include "storage/posix_storage.h"
#include "storage/routing_storage.h"
#include "storage/s3/s3_storage.h"
#include "storage/storage.h"

namespace tessera {

struct ProcessStorageOptions {
  // The file system's options. Default: PosixStorageOptions's.
  PosixStorageOptions posix;
  // The object store's: part size, parts and reads in flight. Default: S3StorageOptions's.
  S3StorageOptions s3;
  // A credentials file for the object store (--s3_credentials_file); empty: the environment's,
  // then the shared credentials file. Default: "".
  std::string s3_credentials_file;
  // Faults to arm (--inject_storage_fault, FaultInjectingStorage::Configure); empty: none.
  // Default: "".
  std::string fault_spec;
};

class ProcessStorage {
 public:
  // Logs a warning when faults are armed. The object store is not reached yet.
  // Errors: InvalidArgument "--inject_storage_fault: <why>" if the fault spec does not parse;
  // InvalidArgument naming the S3 option out of range.
  static absl::StatusOr<std::unique_ptr<ProcessStorage>> Open(ProcessStorageOptions options);

  ProcessStorage(const ProcessStorage&) = delete;
  ProcessStorage& operator=(const ProcessStorage&) = delete;

  // What the process reads and writes through. Valid for the life of this object.
  Storage& storage() { return *active_; }

 private:
  explicit ProcessStorage(const ProcessStorageOptions& options);

  // Declared in the order each wraps the one before.
  PosixStorage posix_;
  RoutingStorage routed_;
  FaultInjectingStorage faulty_{&routed_};
  Storage* active_ = &routed_;
};

}  // namespace tessera

#endif  // TESSERA_STORAGE_PROCESS_STORAGE_H_
