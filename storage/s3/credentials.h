// AWS-style credentials for S3 requests (an access key id, a secret access key, and a session
// token for temporary credentials) and where they are found.
//
// Sources, in the order LoadDefaultCredentials tries them (the AWS CLI's order, minus the
// instance-metadata and SSO sources this client does not speak):
//   1. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN if set);
//   2. the shared credentials file, AWS_SHARED_CREDENTIALS_FILE else $HOME/.aws/credentials,
//      profile AWS_PROFILE else "default".
// LoadCredentialsFile reads a file the caller names (a flag), in the same INI format.
//
// Secrecy: a Credentials never prints its secret or token, and prints the access key id only
// masked (DebugString, operator<<). No error message of this file or of the S3 client contains
// any of the three: a message about a credentials file names the file, the profile and the key
// name, never a value.
//
// Credentials is an immutable value; the functions are thread-safe (they read the environment
// through the EnvLookup they are given).
#ifndef TESSERA_STORAGE_S3_CREDENTIALS_H_
#define TESSERA_STORAGE_S3_CREDENTIALS_H_

#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera::s3 {

class Credentials {
 public:
  // `source` says where they came from ("environment", "/home/u/.aws/credentials [default]"),
  // for messages; it holds no secret.
  Credentials(std::string access_key_id, std::string secret_access_key,
              std::string session_token = "", std::string source = "explicit");

  const std::string& access_key_id() const { return access_key_id_; }
  const std::string& secret_access_key() const { return secret_access_key_; }
  // "" unless these are temporary credentials.
  const std::string& session_token() const { return session_token_; }
  const std::string& source() const { return source_; }

  // "Credentials{access_key_id=****WXYZ, secret_access_key=<hidden>, session_token=<none>,
  // source=environment}": the last four characters of the key id at most, never the secret.
  std::string DebugString() const;

  // `text` with every occurrence of the key id, the secret and the token replaced by
  // "<redacted>": for text that came from elsewhere (a server's error message) before it goes
  // into a status. Values under 8 characters are left alone: no real credential is that short,
  // and they would match inside ordinary words.
  std::string Redact(absl::string_view text) const;

 private:
  std::string access_key_id_;
  std::string secret_access_key_;
  std::string session_token_;
  std::string source_;
};

std::ostream& operator<<(std::ostream& os, const Credentials& credentials);

// Reads an environment variable; nullopt if unset. Tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// getenv(3).
std::optional<std::string> SystemEnv(const char* name);

// Tries the sources in the order of the header comment.
// Errors: NotFound naming every place looked at if none has credentials; InvalidArgument if
// AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY (or the reverse), or if the file
// chosen is malformed or its profile lacks a key (named, never its value); the errors of
// LoadCredentialsFile for an unreadable file (a missing default file is not an error).
absl::StatusOr<Credentials> LoadDefaultCredentials(const EnvLookup& env = SystemEnv);

// Reads `profile` from the INI credentials file at `path`.
// Errors: NotFound if the file or the profile does not exist; PermissionDenied if it cannot be
// read; InvalidArgument as ParseCredentialsFile.
absl::StatusOr<Credentials> LoadCredentialsFile(const std::string& path,
                                                absl::string_view profile = "default");

// Parses the text of a credentials file: `[profile]` sections (also `[profile name]`, the form
// of ~/.aws/config) of `key = value` lines; '#' and ';' start comment lines. Keys:
// aws_access_key_id, aws_secret_access_key, aws_session_token. `source` names the file in
// messages.
// Errors: NotFound if there is no such profile; InvalidArgument for a line that is neither a
// section, a comment nor `key = value`, or a profile without an access key id or secret.
absl::StatusOr<Credentials> ParseCredentialsFile(absl::string_view text, absl::string_view profile,
                                                 absl::string_view source);

}  // namespace tessera::s3

#endif  // TESSERA_STORAGE_S3_CREDENTIALS_H_
