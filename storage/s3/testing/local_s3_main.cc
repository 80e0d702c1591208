// tessera-local-s3: a real S3 server on loopback for the end-to-end tests and the quickstart's
// S3 demo — SeaweedFS, started as the C++ tests start it (seaweedfs.h: free ports, signed
// identities, a bounded readiness poll), with one bucket made.
//
//   TESSERA_WEED=<weed> tessera-local-s3 --dir=DIR --bucket=NAME --env_file=FILE
//
// Once S3 works it writes FILE (atomically: a temporary name, then rename) with lines a shell
// sources:
//   export AWS_ENDPOINT_URL=http://127.0.0.1:<port>
//   export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_REGION=us-east-1
//   export TESSERA_LOCAL_S3_WEED_PID=<weed's pid>   (tests that kill the server; the
//                                                    benchmark reads its CPU time)
//   export TESSERA_LOCAL_S3_MASTER=http://127.0.0.1:<port>   (SeaweedFS's master: the
//                                                    benchmark vacuums deleted bytes)
// and runs until SIGTERM or SIGINT, when it stops SeaweedFS. Its data lives under DIR.
//
// Faults for tests: SIGUSR1 kills SeaweedFS at once (SIGKILL, as a crash; its data stays) and
// then writes "down" into FILE.state; SIGUSR2 starts it again on the same ports and data and,
// once S3 works, writes "up <weed pid>" there (it is "up ..." from the start).
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/program.h"
#include "storage/s3/testing/seaweedfs.h"

ABSL_FLAG(std::string, dir, "", "directory for SeaweedFS's data and log (required)");
ABSL_FLAG(std::string, bucket, "tessera", "bucket to create");
ABSL_FLAG(std::string, env_file, "", "file to write the environment into when ready (required)");
ABSL_FLAG(int32_t, volume_size_limit_mb, 64,
          "MiB a SeaweedFS volume holds before another is started (a benchmark wants more)");
ABSL_FLAG(int32_t, max_volumes, 100, "the most SeaweedFS volumes");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "tessera-local-s3: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::InitProgram(
      "a SeaweedFS S3 server on loopback for tests and demos.\n\n"
      "Usage: TESSERA_WEED=<weed> tessera-local-s3 --dir=DIR --bucket=NAME --env_file=FILE",
      argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const std::string env_file = absl::GetFlag(FLAGS_env_file);
  if (dir.empty() || env_file.empty()) return Fail("--dir and --env_file are required");
  // Block the stop signals before any thread starts, so sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGUSR1);
  sigaddset(&stop, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  setenv("TESSERA_TEST_TMPDIR", dir.c_str(), 1);  // where seaweedfs.h keeps its data

  tessera::s3::testing::SeaweedFsOptions options;
  options.volume_size_limit_mb = absl::GetFlag(FLAGS_volume_size_limit_mb);
  options.max_volumes = absl::GetFlag(FLAGS_max_volumes);
  if (options.volume_size_limit_mb < 1 || options.max_volumes < 1) {
    return Fail("--volume_size_limit_mb and --max_volumes must be positive");
  }
  absl::StatusOr<std::unique_ptr<tessera::s3::testing::SeaweedFs>> server =
      tessera::s3::testing::SeaweedFs::Start(options);
  if (!server.ok()) return Fail(server.status().ToString());
  std::unique_ptr<tessera::s3::S3Client> client = (*server)->NewClient();
  if (absl::Status made = client->CreateBucket(absl::GetFlag(FLAGS_bucket)); !made.ok()) {
    return Fail(made.ToString());
  }
  const tessera::s3::Credentials& admin = (*server)->admin();
  const std::string tmp = env_file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "export AWS_ENDPOINT_URL=" << (*server)->endpoint() << "\n"
        << "export AWS_ACCESS_KEY_ID=" << admin.access_key_id() << "\n"
        << "export AWS_SECRET_ACCESS_KEY=" << admin.secret_access_key() << "\n"
        << "export AWS_REGION=us-east-1\n"
        << "export TESSERA_LOCAL_S3_WEED_PID=" << (*server)->pid() << "\n"
        << "export TESSERA_LOCAL_S3_MASTER=" << (*server)->master_endpoint() << "\n";
    if (!out) return Fail(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), env_file.c_str()) != 0) {
    return Fail(absl::StrCat("cannot rename ", tmp, " to ", env_file));
  }
  std::fprintf(stderr, "tessera-local-s3: S3 at %s, bucket %s (ready in %s)\n",
               (*server)->endpoint().c_str(), absl::GetFlag(FLAGS_bucket).c_str(),
               absl::FormatDuration((*server)->startup_time()).c_str());
  const std::string state_file = env_file + ".state";
  auto state = [&](const std::string& text) {
    std::ofstream(state_file + ".tmp", std::ios::trunc) << text << "\n";
    std::rename((state_file + ".tmp").c_str(), state_file.c_str());
  };
  state(absl::StrCat("up ", (*server)->pid()));
  for (;;) {
    int signal = 0;
    sigwait(&stop, &signal);
    if (signal == SIGUSR1) {
      (*server)->Kill();
      state("down");
    } else if (signal == SIGUSR2) {
      if (absl::Status up = (*server)->Restart(); !up.ok()) return Fail(up.ToString());
      state(absl::StrCat("up ", (*server)->pid()));
    } else {
      return 0;  // the server stops with `server`
    }
  }
}
