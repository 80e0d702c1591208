#include "storage/s3/credentials.h"

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "storage/testing.h"

namespace tessera::s3 {
namespace {

constexpr char kId[] = "AKIDEXAMPLE12345WXYZ";
constexpr char kSecret[] = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
constexpr char kToken[] = "FwoGZXIvYXdzEXAMPLETOKEN";

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string WriteTempFile(const std::string& name, const std::string& content) {
  const std::string dir = MakeTempDir("credentials");
  const std::string path = dir + "/" + name;
  std::ofstream(path) << content;
  return path;
}

const char kFile[] =
    "# comment\n"
    "[default]\n"
    "aws_access_key_id = AKIDDEFAULT000000001\n"
    "aws_secret_access_key = default/secret+key\n"
    "\n"
    "; another comment\n"
    "[profile ckpt]\n"
    "aws_access_key_id=AKIDCKPT000000000002\n"
    "aws_secret_access_key=ckpt-secret\n"
    "aws_session_token = ckpt-token\n"
    "[no-secret]\n"
    "aws_access_key_id = AKIDNOSECRET00000003\n";

TEST(LoadDefaultCredentials, Environment_WinsWithSessionToken) {
  const std::string file = WriteTempFile("credentials", kFile);
  absl::StatusOr<Credentials> c =
      LoadDefaultCredentials(MapEnv({{"AWS_ACCESS_KEY_ID", kId},
                                     {"AWS_SECRET_ACCESS_KEY", kSecret},
                                     {"AWS_SESSION_TOKEN", kToken},
                                     {"AWS_SHARED_CREDENTIALS_FILE", file}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id(), kId);
  EXPECT_EQ(c->secret_access_key(), kSecret);
  EXPECT_EQ(c->session_token(), kToken);
  EXPECT_EQ(c->source(), "environment");
}

TEST(LoadDefaultCredentials, IdWithoutSecret_InvalidArgumentNamingTheVariables) {
  absl::StatusOr<Credentials> c = LoadDefaultCredentials(MapEnv({{"AWS_ACCESS_KEY_ID", kId}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("AWS_SECRET_ACCESS_KEY"), std::string::npos);
  EXPECT_EQ(c.status().message().find(kId), std::string::npos);
}

TEST(LoadDefaultCredentials, SharedFile_DefaultProfile) {
  const std::string file = WriteTempFile("credentials", kFile);
  absl::StatusOr<Credentials> c =
      LoadDefaultCredentials(MapEnv({{"AWS_SHARED_CREDENTIALS_FILE", file}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id(), "AKIDDEFAULT000000001");
  EXPECT_EQ(c->secret_access_key(), "default/secret+key");
  EXPECT_EQ(c->session_token(), "");
  EXPECT_EQ(c->source(), file + " [default]");
}

TEST(LoadDefaultCredentials, SharedFile_ProfileFromAwsProfile) {
  const std::string file = WriteTempFile("credentials", kFile);
  absl::StatusOr<Credentials> c = LoadDefaultCredentials(
      MapEnv({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "ckpt"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id(), "AKIDCKPT000000000002");
  EXPECT_EQ(c->session_token(), "ckpt-token");
}

TEST(LoadDefaultCredentials, HomeFile_Read) {
  const std::string home = MakeTempDir("home");
  ASSERT_EQ(mkdir((home + "/.aws").c_str(), 0700), 0);
  std::ofstream(home + "/.aws/credentials") << kFile;
  absl::StatusOr<Credentials> c = LoadDefaultCredentials(MapEnv({{"HOME", home}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id(), "AKIDDEFAULT000000001");
}

TEST(LoadDefaultCredentials, NothingAnywhere_NotFoundSayingWhereItLooked) {
  const std::string home = MakeTempDir("empty-home");
  absl::StatusOr<Credentials> c = LoadDefaultCredentials(MapEnv({{"HOME", home}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  EXPECT_NE(c.status().message().find(home + "/.aws/credentials"), std::string::npos)
      << c.status().message();
}

TEST(LoadDefaultCredentials, NamedFileMissing_NotFoundNamingIt) {
  absl::StatusOr<Credentials> c =
      LoadDefaultCredentials(MapEnv({{"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/creds"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/creds"), std::string::npos);
}

TEST(LoadCredentialsFile, MissingProfile_NotFound) {
  const std::string file = WriteTempFile("credentials", kFile);
  absl::StatusOr<Credentials> c = LoadCredentialsFile(file, "nope");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("[nope]"), std::string::npos);
}

TEST(LoadCredentialsFile, ProfileWithoutSecret_InvalidArgumentNamingTheKeyNotTheValue) {
  const std::string file = WriteTempFile("credentials", kFile);
  absl::StatusOr<Credentials> c = LoadCredentialsFile(file, "no-secret");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("aws_secret_access_key"), std::string::npos);
  EXPECT_EQ(c.status().message().find("AKIDNOSECRET00000003"), std::string::npos);
}

TEST(ParseCredentialsFile, LineWithoutEquals_InvalidArgumentWithoutEchoingIt) {
  absl::StatusOr<Credentials> c =
      ParseCredentialsFile("[default]\nwJalrXUtnFEMI-a-pasted-secret\n", "default", "f");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("line 2"), std::string::npos);
  EXPECT_EQ(c.status().message().find("pasted-secret"), std::string::npos);
}

TEST(Credentials, DebugString_HidesSecretAndTokenMasksKeyId) {
  const Credentials c(kId, kSecret, kToken, "environment");
  const std::string text = c.DebugString();
  EXPECT_EQ(text,
            "Credentials{access_key_id=****WXYZ, secret_access_key=<hidden>, "
            "session_token=<hidden>, source=environment}");
  std::ostringstream os;
  os << c;
  EXPECT_EQ(os.str(), text);
}

TEST(Credentials, Redact_ReplacesEveryCredential) {
  const Credentials c(kId, kSecret, kToken);
  EXPECT_EQ(c.Redact(std::string("id ") + kId + " secret " + kSecret + " token " + kToken),
            "id <redacted> secret <redacted> token <redacted>");
}

TEST(Credentials, Redact_ShortValuesLeftAlone) {
  const Credentials c("AKIDEXAMPLE12345WXYZ", "x");
  EXPECT_EQ(c.Redact("The key does not exist"), "The key does not exist");
}

}  // namespace
}  // namespace tessera::s3
