// How the SeaweedFS fixture fails when it cannot run weed: at once, saying why.
#include "storage/s3/testing/seaweedfs.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "storage/testing.h"

namespace tessera::s3::testing {
namespace {

TEST(SeaweedFsStart, TesseraWeedUnset_FailedPreconditionNamingIt) {
  unsetenv("TESSERA_WEED");
  absl::StatusOr<std::unique_ptr<SeaweedFs>> server = SeaweedFs::Start();
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(server.status().message().find("TESSERA_WEED is not set"), std::string::npos)
      << server.status();
}

TEST(SeaweedFsStart, NoSuchWeed_FailedPreconditionNamingInstallDeps) {
  setenv("TESSERA_WEED", "/nonexistent/bin/weed", 1);
  absl::StatusOr<std::unique_ptr<SeaweedFs>> server = SeaweedFs::Start();
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(server.status().message().find("deploy/install-deps.sh"), std::string::npos)
      << server.status();
}

// What @tessera_python//:weed does in a venv without weed (bazel/python_venv.bzl).
TEST(SeaweedFsStart, LauncherExits_FailedPreconditionWithItsMessage) {
  const std::string launcher = MakeTempDir("launcher") + "/weed";
  std::ofstream(launcher)
      << "#!/bin/sh\n"
         "echo 'tessera_weed: no /venv/bin/weed; run deploy/install-deps.sh' >&2\n"
         "exit 2\n";
  ASSERT_EQ(chmod(launcher.c_str(), 0755), 0);
  setenv("TESSERA_WEED", launcher.c_str(), 1);
  absl::StatusOr<std::unique_ptr<SeaweedFs>> server = SeaweedFs::Start();
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(server.status().message().find("exited with status 2 before S3 worked"),
            std::string::npos)
      << server.status();
  EXPECT_NE(server.status().message().find("tessera_weed: no /venv/bin/weed"), std::string::npos)
      << server.status();
}

}  // namespace
}  // namespace tessera::s3::testing
