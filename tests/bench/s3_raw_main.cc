// tessera-s3-raw: the object store's limit, the baseline of the S3 figure (tests/bench/run.sh
// --only=s3). The plainest client we have: storage/s3's S3Client (libcurl, SigV4, the retries
// of s3_client.h) called directly — no part buffers, no copies, no checksums — against the
// store the environment names (storage/s3/s3_config.h: AWS_ENDPOINT_URL, AWS_REGION, the
// credentials). Using our own client rather than curl's command line or boto3 keeps the
// baseline free of a process per request and of Python, and adds no dependency; Tessera's
// MultipartFile and ranged reads call the same client, so what the figure holds them to is
// what they add on top of it.
//
//   tessera-s3-raw --op=put --bucket=B --prefix=P --ranks=R --mib=N --part_mb=S --in_flight=K
//       R uploads at once (one per "rank", keys P/rank-<r>), each a multipart upload of N MiB
//       in parts of S MiB, K parts of each upload in flight. Timed: the first
//       CreateMultipartUpload sent -> the last CompleteMultipartUpload answered.
//   tessera-s3-raw --op=get ... (same flags)
//       R objects P/rank-<r> (an earlier put) read whole at once, each with ranged GETs of S MiB,
//       K of each object in flight, into pre-faulted memory; afterwards every byte is checked.
//       Timed: the first GET sent -> the last answered.
//   tessera-s3-raw --op=clean --bucket=B --prefix=P
//       deletes every object under P/ and aborts its incomplete uploads.
//
// put and get print one JSON object: {"op", "ranks", "bytes" (all ranks'), "part_mb",
// "in_flight", "seconds", "bytes_per_s", "cpu_seconds" (this process's user + system time
// while timed), "watched_cpu_seconds" (the same for each process of --watch_pids, e.g. the
// store's server: {"PID": seconds}), "machine_busy" (the share of every CPU's time not idle
// while timed, /proc/stat)}. Exit status: 0 measured, 1 an S3 call failed (named on stderr),
// 2 bad flags.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/program.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_config.h"

ABSL_FLAG(std::string, op, "", "put, get or clean");
ABSL_FLAG(std::string, bucket, "", "the bucket (required)");
ABSL_FLAG(std::string, prefix, "raw", "key prefix of the objects (no trailing '/')");
ABSL_FLAG(int32_t, ranks, 1, "objects moved at once, one per rank");
ABSL_FLAG(int32_t, mib, 256, "MiB per object");
ABSL_FLAG(int32_t, part_mb, 16, "put: MiB per part (the last may be shorter); get: MiB per GET");
ABSL_FLAG(int32_t, in_flight, 4, "requests of each object in flight at once");
ABSL_FLAG(bool, keep, false, "put: keep the objects (for a get); else they are deleted, untimed");
ABSL_FLAG(std::string, watch_pids, "",
          "comma-separated process ids whose CPU time while timed is reported (the server's)");

namespace {

using tessera::s3::S3Client;

int Fail(const std::string& message) {
  std::fprintf(stderr, "tessera-s3-raw: %s\n", message.c_str());
  return 1;
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// A process's user + system CPU ticks (/proc/PID/stat fields 14 and 15), or -1.
int64_t ProcessTicks(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(in, line)) return -1;
  // Fields after the command, which is in parentheses and may hold spaces.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 && !absl::SimpleAtoi(field, &utime)) return -1;
    if (i == 15 && !absl::SimpleAtoi(field, &stime)) return -1;
  }
  return utime + stime;
}

// Every CPU's ticks from /proc/stat's "cpu" line: {busy (not idle or iowait), all}.
std::pair<int64_t, int64_t> MachineTicks() {
  std::ifstream in("/proc/stat");
  std::string name;
  in >> name;
  int64_t all = 0, idle = 0, value = 0;
  for (int i = 1; i <= 10 && in >> value; ++i) {
    all += value;
    if (i == 4 || i == 5) idle += value;
  }
  return {all - idle, all};
}

// The bytes of object `rank` at offset `i` (8-byte words): distinct per object and offset, so
// a GET that returns another range or another object's bytes is caught.
uint64_t Word(int rank, uint64_t i) {
  return (static_cast<uint64_t>(rank) << 48) ^ (i * 0x9E3779B97F4A7C15ull);
}

void Fill(char* out, int rank, uint64_t bytes) {
  uint64_t* words = reinterpret_cast<uint64_t*>(out);
  for (uint64_t i = 0; i < bytes / 8; ++i) words[i] = Word(rank, i);
}

std::string Key(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "/rank-", rank);
}

// Runs `work(rank, piece)` for every piece of every rank's object: `in_flight` threads per
// rank, each taking the next piece of its rank. Returns the first error.
template <typename Work>
absl::Status ForEachPiece(int ranks, int pieces, int in_flight, Work work) {
  absl::Mutex mu;
  absl::Status first;
  std::vector<std::atomic<int>> next(ranks);
  for (auto& n : next) n = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    for (int k = 0; k < std::min(in_flight, pieces); ++k) {
      threads.emplace_back([&, r] {
        for (int p = next[r]++; p < pieces; p = next[r]++) {
          absl::Status done = work(r, p);
          if (!done.ok()) {
            absl::MutexLock lock(&mu);
            if (first.ok()) first = done;
            return;
          }
        }
      });
    }
  }
  for (std::thread& t : threads) t.join();
  return first;
}

absl::Status Clean(S3Client& client, const std::string& bucket, const std::string& prefix) {
  const std::string dir = prefix + "/";
  absl::StatusOr<std::vector<tessera::s3::MultipartUpload>> uploads =
      client.ListMultipartUploads(bucket, dir);
  if (!uploads.ok()) return uploads.status();
  for (const auto& upload : *uploads) {
    absl::Status aborted = client.AbortMultipartUpload(bucket, upload.key, upload.upload_id);
    if (!aborted.ok() && !absl::IsAborted(aborted)) return aborted;
  }
  absl::StatusOr<tessera::s3::ListObjectsResult> listed = client.ListObjects(bucket, dir);
  if (!listed.ok()) return listed.status();
  std::vector<std::string> keys;
  for (const auto& object : listed->objects) keys.push_back(object.key);
  if (keys.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<tessera::s3::DeleteFailure>> refused =
      client.DeleteObjects(bucket, keys);
  if (!refused.ok()) return refused.status();
  if (!refused->empty()) {
    return absl::InternalError(absl::StrCat("the store refused to delete ", refused->size(),
                                            " object(s), the first ", refused->front().key));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  tessera::InitProgram(
      "the object store's limit for the S3 benchmark: multipart PUTs and ranged GETs with our "
      "own S3 client, nothing else.\n\n"
      "Usage: tessera-s3-raw --op=put|get|clean --bucket=B [--prefix=P --ranks=R --mib=N "
      "--part_mb=S --in_flight=K --keep]",
      argc, argv);
  const std::string op = absl::GetFlag(FLAGS_op);
  const std::string bucket = absl::GetFlag(FLAGS_bucket);
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int mib = absl::GetFlag(FLAGS_mib);
  const int part_mb = absl::GetFlag(FLAGS_part_mb);
  const int in_flight = absl::GetFlag(FLAGS_in_flight);
  if ((op != "put" && op != "get" && op != "clean") || bucket.empty() || prefix.empty()) {
    std::fprintf(stderr,
                 "tessera-s3-raw: --op is put, get or clean; --bucket and --prefix "
                 "are required\n");
    return 2;
  }
  if (ranks < 1 || ranks > 64 || mib < 1 || mib > (1 << 16) || part_mb < 5 || part_mb > 1024 ||
      in_flight < 1 || in_flight > 64) {
    std::fprintf(stderr,
                 "tessera-s3-raw: --ranks 1..64, --mib 1..65536, --part_mb 5..1024 "
                 "(S3's smallest part is 5 MiB), --in_flight 1..64\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<S3Client>> made = tessera::s3::S3ClientFromEnv("");
  if (!made.ok()) return Fail(made.status().ToString());
  S3Client& client = **made;
  if (op == "clean") {
    absl::Status cleaned = Clean(client, bucket, prefix);
    return cleaned.ok() ? 0 : Fail(cleaned.ToString());
  }

  const uint64_t bytes = static_cast<uint64_t>(mib) << 20;
  const uint64_t piece = static_cast<uint64_t>(part_mb) << 20;
  const int pieces = static_cast<int>((bytes + piece - 1) / piece);
  auto piece_size = [&](int p) { return std::min(piece, bytes - p * piece); };
  // One buffer per object, written (put: the source; get: pre-faulted destination) before
  // the clock starts, as a rank's tensors are.
  std::vector<std::unique_ptr<char[]>> buffers;
  for (int r = 0; r < ranks; ++r) {
    buffers.emplace_back(new char[bytes]);
    if (op == "put") {
      Fill(buffers.back().get(), r, bytes);
    } else {
      std::memset(buffers.back().get(), 0, bytes);
    }
  }

  std::vector<std::string> watched;
  for (absl::string_view pid :
       absl::StrSplit(absl::GetFlag(FLAGS_watch_pids), ',', absl::SkipEmpty())) {
    watched.emplace_back(pid);
  }
  std::vector<int64_t> watched0;
  for (const std::string& pid : watched) watched0.push_back(ProcessTicks(pid));
  const std::pair<int64_t, int64_t> machine0 = MachineTicks();
  absl::Status moved;
  double cpu0 = CpuSeconds();
  absl::Time start = absl::Now();
  if (op == "put") {
    std::vector<std::string> ids(ranks);
    std::vector<std::vector<tessera::s3::CompletedPart>> parts(
        ranks, std::vector<tessera::s3::CompletedPart>(pieces));
    std::vector<std::thread> uploads;
    std::vector<absl::Status> results(ranks);
    for (int r = 0; r < ranks; ++r) {
      uploads.emplace_back([&, r] {
        const std::string key = Key(prefix, r);
        absl::StatusOr<std::string> id = client.CreateMultipartUpload(bucket, key);
        if (!id.ok()) {
          results[r] = id.status();
          return;
        }
        results[r] = ForEachPiece(1, pieces, in_flight, [&](int, int p) -> absl::Status {
          absl::StatusOr<std::string> etag =
              client.UploadPart(bucket, key, *id, p + 1,
                                absl::string_view(buffers[r].get() + p * piece, piece_size(p)));
          if (!etag.ok()) return etag.status();
          parts[r][p] = {p + 1, *etag};
          return absl::OkStatus();
        });
        if (results[r].ok()) {
          results[r] = client.CompleteMultipartUpload(bucket, key, *id, parts[r]).status();
        }
      });
    }
    for (std::thread& t : uploads) t.join();
    for (const absl::Status& s : results) {
      if (moved.ok()) moved = s;
    }
  } else {
    moved = ForEachPiece(ranks, pieces, in_flight, [&](int r, int p) {
      return client.GetObjectRange(bucket, Key(prefix, r), p * piece, buffers[r].get() + p * piece,
                                   piece_size(p));
    });
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double cpu = CpuSeconds() - cpu0;
  const std::pair<int64_t, int64_t> machine1 = MachineTicks();
  const double tick = 1.0 / sysconf(_SC_CLK_TCK);
  std::string watched_json;
  for (size_t i = 0; i < watched.size(); ++i) {
    const int64_t now = ProcessTicks(watched[i]);
    absl::StrAppend(&watched_json, i ? ", " : "", "\"", watched[i],
                    "\": ", now < 0 || watched0[i] < 0 ? -1.0 : (now - watched0[i]) * tick);
  }
  const double busy = machine1.second > machine0.second
                          ? static_cast<double>(machine1.first - machine0.first) /
                                (machine1.second - machine0.second)
                          : 0.0;
  if (!moved.ok()) return Fail(absl::StrCat(op, ": ", moved.ToString()));
  if (op == "get") {
    for (int r = 0; r < ranks; ++r) {
      const uint64_t* words = reinterpret_cast<const uint64_t*>(buffers[r].get());
      for (uint64_t i = 0; i < bytes / 8; ++i) {
        if (words[i] != Word(r, i)) {
          return Fail(absl::StrCat("get: ", Key(prefix, r), " differs at byte ", i * 8));
        }
      }
    }
  } else if (!absl::GetFlag(FLAGS_keep)) {
    absl::Status cleaned = Clean(client, bucket, prefix);
    if (!cleaned.ok()) return Fail(cleaned.ToString());
  }
  const uint64_t total = bytes * static_cast<uint64_t>(ranks);
  std::printf(
      "{\"op\": \"%s\", \"ranks\": %d, \"bytes\": %llu, \"part_mb\": %d, \"in_flight\": %d, "
      "\"seconds\": %.6f, \"bytes_per_s\": %.1f, \"cpu_seconds\": %.3f, "
      "\"watched_cpu_seconds\": {%s}, \"machine_busy\": %.3f}\n",
      op.c_str(), ranks, static_cast<unsigned long long>(total), part_mb, in_flight, seconds,
      static_cast<double>(total) / seconds, cpu, watched_json.c_str(), busy);
  return 0;
}
