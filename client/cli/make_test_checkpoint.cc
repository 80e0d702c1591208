// make_test_checkpoint DIR: writes a small real checkpoint into DIR (created) for
// tessera_cli_test.sh, using the format's own test writer (format/test_checkpoint.h):
// parameters of several dtypes split into chunks across data files, a 0-d and an empty
// tensor, present and absent optimizer state, and an extra. It also writes, for the export
// check, DIR.expected_params and DIR.expected_all: one line per tensor a consolidated export
// must hold, "<hex of the name>\t<dtype>\t<shape joined by ','>\t<hex of the whole tensor>",
// the fields read_safetensors.py --machine prints. On stdout it prints shell assignments
// naming the first chunk of the first tensor (CHUNK_KEY, CHUNK_BOX, CHUNK_FILE,
// CHUNK_OFFSET), where the test flips a byte.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/posix_storage.h"
#include "storage/storage.h"
#include "common/box.h"
#include "common/dtype.h"
#include "format/test_checkpoint.h"
#include "tessera/v1/manifest.pb.h"

namespace {

using tessera::testing_checkpoint::GridChunks;
using tessera::testing_checkpoint::RandomTensor;
using tessera::testing_checkpoint::TestChunk;
using tessera::testing_checkpoint::TestTensor;

std::string ExpectedLine(const TestTensor& t) {
  return absl::StrCat(absl::BytesToHexString(t.key()), "\t", tessera::DTypeName(t.dtype), "\t",
                      absl::StrJoin(t.shape, ","), "\t", absl::BytesToHexString(t.data));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_test_checkpoint DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  tessera::PosixStorage storage;
  if (auto s = storage.CreateDirs(dir); !s.ok()) {
    std::cerr << s << '\n';
    return 1;
  }

  TestTensor wq = RandomTensor("layers.0.wq", tessera::v1::DTYPE_F32, {8, 12}, 1);
  wq.chunks = GridChunks(wq.shape, {2, 2}, 2);
  TestTensor mlp = RandomTensor("layers.1.mlp", tessera::v1::DTYPE_BF16, {6, 6, 10}, 2);
  mlp.chunks = GridChunks(mlp.shape, {3, 1, 2}, 3);
  TestTensor step = RandomTensor("step", tessera::v1::DTYPE_I64, {}, 3);
  step.chunks = {TestChunk{tessera::Box{}, 1}};
  TestTensor empty = RandomTensor("empty", tessera::v1::DTYPE_F32, {0, 5}, 4);
  empty.chunks = {TestChunk{tessera::FullBox(empty.shape), 2}};
  TestTensor exp_avg = RandomTensor("layers.0.wq", tessera::v1::DTYPE_F32, {8, 12}, 5);
  exp_avg.kind = tessera::v1::SHARD_KIND_OPTIMIZER;
  exp_avg.state_key = "exp_avg";
  exp_avg.chunks = GridChunks(exp_avg.shape, {4, 1}, 2);
  TestTensor absent;
  absent.kind = tessera::v1::SHARD_KIND_OPTIMIZER;
  absent.fqn = "layers.1.mlp";
  absent.state_key = "exp_avg";
  absent.dtype = tessera::v1::DTYPE_BF16;
  absent.shape = {6, 6, 10};
  absent.state_absent = true;
  TestTensor rng = RandomTensor("rng", tessera::v1::DTYPE_U8, {16}, 6);
  rng.kind = tessera::v1::SHARD_KIND_EXTRA;
  rng.rank = 0;
  rng.chunks = {TestChunk{tessera::FullBox(rng.shape), 0}};

  auto manifest = tessera::testing_checkpoint::WriteTestCheckpoint(
      storage, dir, {wq, mlp, step, empty, exp_avg, absent, rng});
  if (!manifest.ok()) {
    std::cerr << manifest.status() << '\n';
    return 1;
  }

  std::ofstream params(dir + ".expected_params");
  std::ofstream all(dir + ".expected_all");
  for (const TestTensor* t : {&wq, &mlp, &step, &empty}) {
    params << ExpectedLine(*t) << '\n';
    all << ExpectedLine(*t) << '\n';
  }
  all << ExpectedLine(exp_avg) << '\n';
  if (!params.good() || !all.good()) {
    std::cerr << "cannot write the expected files\n";
    return 1;
  }

  const tessera::v1::TensorEntry& first = manifest->tensors(0);
  const tessera::v1::ChunkEntry& chunk = first.chunks(0);
  std::cout << "CHUNK_KEY='" << first.key() << "'\n"
            << "CHUNK_BOX='" << tessera::BoxToString(tessera::BoxFromProto(chunk.box())) << "'\n"
            << "CHUNK_FILE='" << chunk.file() << "'\n"
            << "CHUNK_OFFSET=" << chunk.offset() << '\n';
  return 0;
}
