#include "storage/process_storage.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "storage/s3/s3_config.h"

namespace tessera {

ProcessStorage::ProcessStorage(const ProcessStorageOptions& options)
    : posix_(options.posix),
      routed_(&posix_,
              [s3 = options.s3, file = options.s3_credentials_file]()
                  -> absl::StatusOr<std::unique_ptr<Storage>> {
                absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3ClientFromEnv(file);
                if (!client.ok()) return client.status();
                absl::StatusOr<std::unique_ptr<S3Storage>> storage =
                    S3Storage::Create(std::shared_ptr<s3::S3Client>(*std::move(client)), s3);
                if (!storage.ok()) return storage.status();
                return std::unique_ptr<Storage>(*std::move(storage));
              }) {}

absl::StatusOr<std::unique_ptr<ProcessStorage>> ProcessStorage::Open(
    ProcessStorageOptions options) {
  if (absl::Status s3 = options.s3.Check(); !s3.ok()) return s3;
  std::unique_ptr<ProcessStorage> storage(new ProcessStorage(options));
  if (absl::Status armed = storage->faulty_.Configure(options.fault_spec); !armed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inject_storage_fault: ", armed.message()));
  }
  if (!options.fault_spec.empty()) {
    LogWarning("fault injection: storage faults armed: ", options.fault_spec);
    storage->active_ = &storage->faulty_;
  }
  return storage;
}

}  // namespace tessera
