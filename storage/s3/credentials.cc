#include "storage/s3/credentials.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "storage/storage.h"

namespace tessera::s3 {
namespace {

// Shorter values are no real credential (AWS key ids have 16 characters or more, secrets 40)
// and would turn up inside ordinary words: a test's secret "x" in "exist".
constexpr size_t kMinRedactedLength = 8;

std::string Mask(absl::string_view id) {
  if (id.size() <= 4) return "****";
  return absl::StrCat("****", id.substr(id.size() - 4));
}

}  // namespace

Credentials::Credentials(std::string access_key_id, std::string secret_access_key,
                         std::string session_token, std::string source)
    : access_key_id_(std::move(access_key_id)),
      secret_access_key_(std::move(secret_access_key)),
      session_token_(std::move(session_token)),
      source_(std::move(source)) {}

std::string Credentials::DebugString() const {
  return absl::StrCat("Credentials{access_key_id=", Mask(access_key_id_),
                      ", secret_access_key=", secret_access_key_.empty() ? "<none>" : "<hidden>",
                      ", session_token=", session_token_.empty() ? "<none>" : "<hidden>",
                      ", source=", source_, "}");
}

std::string Credentials::Redact(absl::string_view text) const {
  std::vector<std::pair<absl::string_view, absl::string_view>> secrets;
  for (const std::string* s : {&session_token_, &secret_access_key_, &access_key_id_}) {
    if (s->size() >= kMinRedactedLength) secrets.emplace_back(*s, "<redacted>");
  }
  // StrReplaceAll prefers the longest of the matches at one position, so a secret that
  // contains the key id is replaced whole.
  return absl::StrReplaceAll(text, secrets);
}

std::ostream& operator<<(std::ostream& os, const Credentials& credentials) {
  return os << credentials.DebugString();
}

std::optional<std::string> SystemEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::StatusOr<Credentials> ParseCredentialsFile(absl::string_view text, absl::string_view profile,
                                                 absl::string_view source) {
  bool in_profile = false;
  bool found = false;
  std::string id, secret, token;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      if (line.back() != ']') {
        return absl::InvalidArgumentError(absl::StrCat("credentials file ", source, " line ",
                                                       line_number,
                                                       ": a section header must end with ']'"));
      }
      absl::string_view name = absl::StripAsciiWhitespace(line.substr(1, line.size() - 2));
      if (absl::ConsumePrefix(&name, "profile ")) name = absl::StripAsciiWhitespace(name);
      in_profile = name == profile;
      found = found || in_profile;
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      // Never echo the line: it may be a secret that lost its "key =".
      return absl::InvalidArgumentError(absl::StrCat("credentials file ", source, " line ",
                                                     line_number, ": expected key = value"));
    }
    if (!in_profile) continue;
    const std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)));
    const std::string value(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    if (key == "aws_access_key_id") {
      id = value;
    } else if (key == "aws_secret_access_key") {
      secret = value;
    } else if (key == "aws_session_token" || key == "aws_security_token") {
      token = value;
    }
  }
  if (!found) {
    return absl::NotFoundError(
        absl::StrCat("credentials file ", source, " has no profile [", profile, "]"));
  }
  for (const auto& [name, value] :
       std::initializer_list<std::pair<const char*, const std::string*>>{
           {"aws_access_key_id", &id}, {"aws_secret_access_key", &secret}}) {
    if (value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("credentials file ", source, " profile [", profile, "] has no ", name));
    }
  }
  return Credentials(std::move(id), std::move(secret), std::move(token),
                     absl::StrCat(source, " [", profile, "]"));
}

absl::StatusOr<Credentials> LoadCredentialsFile(const std::string& path,
                                                absl::string_view profile) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return ErrnoToStatus(err != 0 ? err : ENOENT, "read S3 credentials file", path);
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return ErrnoToStatus(EIO, "read S3 credentials file", path);
  return ParseCredentialsFile(text.str(), profile, path);
}

absl::StatusOr<Credentials> LoadDefaultCredentials(const EnvLookup& env) {
  const std::optional<std::string> id = env("AWS_ACCESS_KEY_ID");
  const std::optional<std::string> secret = env("AWS_SECRET_ACCESS_KEY");
  const bool has_id = id.has_value() && !id->empty();
  const bool has_secret = secret.has_value() && !secret->empty();
  if (has_id && has_secret) {
    return Credentials(*id, *secret, env("AWS_SESSION_TOKEN").value_or(""), "environment");
  }
  if (has_id != has_secret) {
    return absl::InvalidArgumentError(
        absl::StrCat(has_id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY", " is set but ",
                     has_id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID", " is not"));
  }
  std::string path;
  bool explicit_path = false;
  if (std::optional<std::string> file = env("AWS_SHARED_CREDENTIALS_FILE");
      file.has_value() && !file->empty()) {
    path = *file;
    explicit_path = true;
  } else if (std::optional<std::string> home = env("HOME"); home.has_value() && !home->empty()) {
    path = absl::StrCat(*home, "/.aws/credentials");
  }
  std::string profile = env("AWS_PROFILE").value_or("");
  if (profile.empty()) profile = "default";
  if (path.empty()) {
    return absl::NotFoundError(
        "no S3 credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and neither "
        "AWS_SHARED_CREDENTIALS_FILE nor HOME names a credentials file");
  }
  absl::StatusOr<Credentials> loaded = LoadCredentialsFile(path, profile);
  // A missing default file means "no credentials here"; a missing file the environment named
  // is a mistake worth its own message.
  if (absl::IsNotFound(loaded.status()) && !explicit_path) {
    return absl::NotFoundError(
        absl::StrCat("no S3 credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and ",
                     loaded.status().message()));
  }
  return loaded;
}

}  // namespace tessera::s3
