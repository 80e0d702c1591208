// Where a process's object store is and how to sign for it: read from the environment the AWS
// CLI and SDKs read, so an operator who already has them set adds nothing for Tessera.
//
//   AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL   the store's URL (default: AWS S3 in the region)
//   AWS_REGION, else AWS_DEFAULT_REGION          the signing region (default: us-east-1)
//   AWS_CA_BUNDLE                                a PEM file of CAs to verify TLS against
//   TESSERA_S3_ADDRESSING=path|virtual           request style (default: path with an endpoint
//                                                — MinIO, SeaweedFS, Ceph — virtual without)
// Credentials: the file a process was given (its --s3_credentials_file flag), else the
// environment's and the shared credentials file's (credentials.h LoadDefaultCredentials).
// Credentials never appear in a message.
//
// Thread-safety: pure functions of `env`.
#ifndef TESSERA_STORAGE_S3_S3_CONFIG_H_
#define TESSERA_STORAGE_S3_S3_CONFIG_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_options.h"

namespace tessera::s3 {

// The client options the environment gives. Errors: InvalidArgument naming the variable with
// a value that does not parse (TESSERA_S3_ADDRESSING other than path or virtual).
absl::StatusOr<S3ClientOptions> S3ClientOptionsFromEnv(const EnvLookup& env = SystemEnv);

// A client of the environment's store with the credentials of `credentials_file` (profile
// AWS_PROFILE or "default") if it is not empty, else LoadDefaultCredentials.
// Errors: as S3ClientOptionsFromEnv, the credentials' loading, and S3Client::Create.
absl::StatusOr<std::unique_ptr<S3Client>> S3ClientFromEnv(const std::string& credentials_file,
                                                          const EnvLookup& env = SystemEnv);

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_S3_CONFIG_H_
