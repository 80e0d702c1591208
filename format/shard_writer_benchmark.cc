// Writing a rank's data file: ShardWriter::WriteFile (checksums on a second thread, fsync of
// the file and its directory) of 256 MiB in four 64 MiB chunks, by write size and writes in
// flight, against the limit measured in the same run: the same bytes written by plain
// O_DIRECT pwrite calls one after another, then fsync — no hashing, no header, nothing else.
// Rates are bytes_per_second; compare rows of one run only (a disk's speed varies by day).
//
//   bazel run -c opt //format:shard_writer_benchmark -- --benchmark_repetitions=5 \
//       --benchmark_report_aggregates_only=true
//
// The files go to $TESSERA_BENCH_DIR, else the directory `bazel run` was started from (put it
// on the disk to measure, not on tmpfs).
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/box.h"
#include "format/data_file.h"
#include "format/shard_writer.h"
#include "storage/posix_storage.h"

namespace tessera {
namespace {

constexpr uint64_t kChunkBytes = uint64_t{64} << 20;
constexpr int kChunks = 4;

std::string BenchDir() {
  for (const char* name : {"TESSERA_BENCH_DIR", "BUILD_WORKING_DIRECTORY"}) {
    const char* dir = std::getenv(name);
    if (dir != nullptr && *dir != '\0') return dir;
  }
  return ".";
}

struct Staged {
  FileLayout layout;
  char* staging = nullptr;
};

// A layout of kChunks chunks and page-aligned staging with a pattern, made once.
const Staged& Fixture() {
  static const Staged* staged = [] {
    std::vector<ChunkSpec> chunks;
    for (int i = 0; i < kChunks; ++i) {
      const int64_t elements = static_cast<int64_t>(kChunkBytes / 4);
      chunks.push_back(ChunkSpec{absl::StrCat("layers.", i, ".w"), BoxToProto(Box{{0}, {elements}}),
                                 v1::DTYPE_F32, kChunkBytes});
    }
    auto* s = new Staged;
    absl::StatusOr<FileLayout> layout = ComputeFileLayout(chunks);
    if (!layout.ok()) std::abort();
    s->layout = *std::move(layout);
    void* p = nullptr;
    if (posix_memalign(&p, 4096, s->layout.data_size) != 0) std::abort();
    s->staging = static_cast<char*>(p);
    for (uint64_t i = 0; i < s->layout.data_size; i += 8) {
      const uint64_t v = i * 0x9E3779B97F4A7C15ull;
      std::memcpy(s->staging + i, &v, 8);
    }
    ZeroPadding(s->layout, s->staging);
    return s;
  }();
  return *staged;
}

// args: write size (MiB), writes in flight.
void BM_ShardWriter(benchmark::State& state) {
  const Staged& s = Fixture();
  PosixStorage storage;
  ShardWriterOptions options;
  options.write_size = static_cast<size_t>(state.range(0)) << 20;
  options.writes_in_flight = static_cast<int>(state.range(1));
  const std::string dir = BenchDir();
  for (auto _ : state) {
    absl::StatusOr<WrittenFile> written = ShardWriter::WriteFile(
        storage, dir, "shard_writer_benchmark.safetensors", s.layout, s.staging, options);
    if (!written.ok()) {
      state.SkipWithError(written.status().ToString().c_str());
      break;
    }
  }
  (void)storage.RemoveTree(dir + "/shard_writer_benchmark.safetensors");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.layout.data_size));
}
BENCHMARK(BM_ShardWriter)
    ->ArgNames({"write_mib", "in_flight"})
    ->ArgsProduct({{1, 8}, {1, 2, 4, 8}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The limit: the data section's bytes by O_DIRECT pwrite, one at a time, then fsync.
// args: write size (MiB).
void BM_RawDirectWrite(benchmark::State& state) {
  const Staged& s = Fixture();
  const uint64_t step = static_cast<uint64_t>(state.range(0)) << 20;
  const std::string path = BenchDir() + "/raw_direct_write_benchmark.bin";
  for (auto _ : state) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) {
      state.SkipWithError(absl::StrCat("open ", path, " with O_DIRECT: ", strerror(errno)).c_str());
      break;
    }
    for (uint64_t off = 0; off < s.layout.data_size; off += step) {
      const uint64_t n = std::min(step, s.layout.data_size - off);
      if (pwrite(fd, s.staging + off, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
        std::abort();
      }
    }
    if (fsync(fd) != 0) std::abort();
    close(fd);
  }
  unlink(path.c_str());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.layout.data_size));
}
BENCHMARK(BM_RawDirectWrite)
    ->ArgName("write_mib")
    ->Arg(1)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
