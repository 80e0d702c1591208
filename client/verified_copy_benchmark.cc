// Restoring from local memory, without the RPCs: VerifiedCopy (copy each piece, then hash it
// while in cache) of 256 MiB against the physical limit in the same run — a memcpy of the same
// bytes with as many threads (ParallelCopy) — and the two costs a restore adds around it:
// hashing the bytes in a pass of their own (what the agent's check was), and copying from a
// mapping of another process's shared memory made just before, whose pages fault in as the
// copy reads them (a restarted trainer's first touch of the agent's region). Two ways around
// those faults, measured so that the client's choice (fault as the copy reads) stays
// checked: the mapping made with MAP_POPULATE, and no mapping at all (pread). Each with 1 and
// 2 threads, and with 2 threads into a destination 16 bytes off its alignment.
//
//   bazel run -c opt //client:verified_copy_benchmark
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "client/parallel_copy.h"
#include "client/verified_copy.h"
#include "common/checksum.h"

namespace tessera {
namespace {

constexpr uint64_t kBytes = uint64_t{256} << 20;
constexpr uint64_t kBlock = kDefaultBlockSize;

// A shared-memory file of kBytes, filled, its blocks' checksums, and a destination (4 KiB
// more, 4 KiB-aligned); all faulted in once.
struct Fixture {
  Fixture() {
    fd = memfd_create("verified_copy_benchmark", 0);
    if (fd < 0 || ftruncate(fd, kBytes) != 0) std::abort();
    region = static_cast<char*>(
        mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0));
    if (region == MAP_FAILED) std::abort();
    for (uint64_t i = 0; i < kBytes; i += 8) {
      const uint64_t v = i * 0x9E3779B97F4A7C15ull;
      std::memcpy(region + i, &v, 8);
    }
    for (uint64_t at = 0; at < kBytes; at += kBlock) {
      blocks.push_back(BlockCheck{at, kBlock, Xxh3(region + at, kBlock)});
    }
    dest = static_cast<char*>(aligned_alloc(4096, kBytes + 4096));
    std::memset(dest, 1, kBytes + 4096);
  }
  int fd = -1;
  char* region = nullptr;
  std::vector<BlockCheck> blocks;
  char* dest = nullptr;
};

Fixture& F() {
  static Fixture* fixture = new Fixture();
  return *fixture;
}

// Arguments: threads, and how far the destination starts past a 4 KiB boundary (the region's
// blocks start on one; a tensor's storage is 64-byte aligned, a view of it may be less).
int Threads(const benchmark::State& state) { return static_cast<int>(state.range(0)); }
char* Dest(const benchmark::State& state) { return F().dest + state.range(1); }

void Report(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}

void BM_Memcpy(benchmark::State& state) {
  Fixture& f = F();
  for (auto _ : state) {
    ParallelCopy({CopyItem{Dest(state), f.region, kBytes}}, Threads(state), 0);
  }
  Report(state);
}

void BM_VerifiedCopy(benchmark::State& state) {
  Fixture& f = F();
  for (auto _ : state) {
    absl::StatusOr<VerifiedCopyResult> result =
        VerifiedCopy(f.region, kBytes, {SlotCopy{Dest(state), 0, kBytes}}, f.blocks, {},
                     Threads(state), 0);
    if (!result.ok() || !result->mismatched.empty()) state.SkipWithError("blocks do not match");
  }
  Report(state);
}

// Every block checked ahead (client/resident_prefetch.h, while the model is built): the load
// only copies, through the same block walk.
void BM_VerifiedCopyCheckedAhead(benchmark::State& state) {
  Fixture& f = F();
  for (auto _ : state) {
    absl::StatusOr<VerifiedCopyResult> result =
        VerifiedCopy(f.region, kBytes, {SlotCopy{Dest(state), 0, kBytes}}, f.blocks, f.blocks,
                     Threads(state), 0);
    if (!result.ok() || result->checked_ahead_bytes != kBytes) {
      state.SkipWithError("blocks not taken as checked ahead");
    }
  }
  Report(state);
}

// The agent's check, then the trainer's copy: two passes over the bytes.
void BM_HashThenMemcpy(benchmark::State& state) {
  Fixture& f = F();
  for (auto _ : state) {
    std::vector<std::thread> threads;
    const int n = Threads(state);
    for (int t = 0; t < n; ++t) {
      threads.emplace_back([&, t] {
        for (size_t b = t; b < f.blocks.size(); b += n) {
          benchmark::DoNotOptimize(Xxh3(f.region + f.blocks[b].offset, f.blocks[b].length));
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    ParallelCopy({CopyItem{Dest(state), f.region, kBytes}}, n, 0);
  }
  Report(state);
}

// VerifiedCopy from a read-only mapping made for this copy with `mmap_flags` besides
// MAP_SHARED (its time included), unmapped after (outside the time).
void VerifiedCopyFromNewMapping(benchmark::State& state, int mmap_flags) {
  Fixture& f = F();
  for (auto _ : state) {
    void* mapped = mmap(nullptr, kBytes, PROT_READ, MAP_SHARED | mmap_flags, f.fd, 0);
    if (mapped == MAP_FAILED) std::abort();
    absl::StatusOr<VerifiedCopyResult> result =
        VerifiedCopy(static_cast<const char*>(mapped), kBytes, {SlotCopy{Dest(state), 0, kBytes}},
                     f.blocks, {}, Threads(state), 0);
    if (!result.ok() || !result->mismatched.empty()) state.SkipWithError("blocks do not match");
    state.PauseTiming();
    munmap(mapped, kBytes);
    state.ResumeTiming();
  }
  Report(state);
}

// The pages fault in as the copy reads them (what the client does).
void BM_VerifiedCopyFreshMapping(benchmark::State& state) { VerifiedCopyFromNewMapping(state, 0); }

// The kernel maps every page in the mmap call, before the copy.
void BM_VerifiedCopyPopulatedMapping(benchmark::State& state) {
  VerifiedCopyFromNewMapping(state, MAP_POPULATE);
}

// Reading the region with pread from its file into the destination, 64 KiB at a time, each
// piece hashed after it is read: no mapping, so no page faults on the reading side.
void BM_PreadThenHashPieces(benchmark::State& state) {
  Fixture& f = F();
  const int n = Threads(state);
  for (auto _ : state) {
    std::vector<std::thread> threads;
    for (int t = 0; t < n; ++t) {
      threads.emplace_back([&, t] {
        for (size_t b = t; b < f.blocks.size(); b += n) {
          const uint64_t begin = f.blocks[b].offset, end = begin + f.blocks[b].length;
          for (uint64_t at = begin; at < end; at += 65536) {
            char* to = Dest(state) + at;
            if (pread(f.fd, to, 65536, static_cast<off_t>(at)) != 65536) std::abort();
            benchmark::DoNotOptimize(Xxh3(to, 65536));
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
  Report(state);
}

void Args(benchmark::internal::Benchmark* b) {
  b->Args({1, 0})->Args({2, 0})->Args({2, 16})->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Memcpy)->Apply(Args);
BENCHMARK(BM_VerifiedCopy)->Apply(Args);
BENCHMARK(BM_VerifiedCopyCheckedAhead)->Apply(Args);
BENCHMARK(BM_HashThenMemcpy)->Apply(Args);
BENCHMARK(BM_VerifiedCopyFreshMapping)->Apply(Args);
BENCHMARK(BM_VerifiedCopyPopulatedMapping)->Apply(Args);
BENCHMARK(BM_PreadThenHashPieces)->Apply(Args);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
