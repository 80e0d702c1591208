#include "storage/s3/s3_config.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera::s3 {
namespace {

// The first of `names` that is set and not empty.
std::optional<std::string> First(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    std::optional<std::string> value = env(name);
    if (value.has_value() && !value->empty()) return value;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<S3ClientOptions> S3ClientOptionsFromEnv(const EnvLookup& env) {
  S3ClientOptions options;
  if (std::optional<std::string> endpoint = First(env, {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})) {
    options.endpoint = *endpoint;
    options.addressing = AddressingStyle::kPath;
  }
  if (std::optional<std::string> region = First(env, {"AWS_REGION", "AWS_DEFAULT_REGION"})) {
    options.region = *region;
  }
  if (std::optional<std::string> ca = First(env, {"AWS_CA_BUNDLE"})) options.ca_file = *ca;
  if (std::optional<std::string> style = First(env, {"TESSERA_S3_ADDRESSING"})) {
    if (*style == "path") {
      options.addressing = AddressingStyle::kPath;
    } else if (*style == "virtual") {
      options.addressing = AddressingStyle::kVirtualHosted;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "TESSERA_S3_ADDRESSING is \"", *style, "\"; it must be \"path\" or \"virtual\""));
    }
  }
  return options;
}

absl::StatusOr<std::unique_ptr<S3Client>> S3ClientFromEnv(const std::string& credentials_file,
                                                          const EnvLookup& env) {
  absl::StatusOr<S3ClientOptions> options = S3ClientOptionsFromEnv(env);
  if (!options.ok()) return options.status();
  absl::StatusOr<Credentials> credentials =
      credentials_file.empty()
          ? LoadDefaultCredentials(env)
          : LoadCredentialsFile(credentials_file, First(env, {"AWS_PROFILE"}).value_or("default"));
  if (!credentials.ok()) return credentials.status();
  return S3Client::Create(*std::move(options), *std::move(credentials));
}

}  // namespace tessera::s3
