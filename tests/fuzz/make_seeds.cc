// Writes the fuzzers' seed corpora (tests/fuzz/corpus/<target>/) from the product's own
// encoders: a checkpoint written by the real data-file layout and shard writer (its manifest,
// its data files' headers), a rank assignment, peer chunks framed by the peer codec and bulk
// frames by the bulk wire, its handshake's frames (a challenge, a hello and a first status
// with proofs under the fuzzers' fixed credential, fuzz_peer_credential.h) and a Peer call's
// proof metadata by the peer call proof's encoder. The S3 seeds are the replies of storage/s3/testdata (SeaweedFS's and
// S3's), each behind the byte that picks its parser in s3_xml_fuzzer.cc. Run after a format
// change, then commit what changed:
//
//   bazel run //tests/fuzz:make_seeds -- "$PWD/tests/fuzz/corpus"
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "agent/peer/chunk_codec.h"
#include "common/box.h"
#include "common/bulk_handshake.h"
#include "common/bulk_wire.h"
#include "common/peer_call_proof.h"
#include "format/manifest_io.h"
#include "format/test_checkpoint.h"
#include "storage/posix_storage.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/manifest.pb.h"
#include "tessera/v1/peer.pb.h"
#include "tests/fuzz/fuzz_peer_credential.h"

namespace tessera {
namespace {

using testing_checkpoint::GridChunks;
using testing_checkpoint::RandomTensor;
using testing_checkpoint::TestChunk;
using testing_checkpoint::TestTensor;

std::string out_dir;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string path = absl::StrCat(out_dir, "/", target, "/", name);
  std::ofstream(path, std::ios::binary) << bytes;
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string U32(uint32_t n) {
  return {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
          static_cast<char>(n >> 24)};
}

std::string U16(uint16_t n) { return {static_cast<char>(n), static_cast<char>(n >> 8)}; }

// Two checkpoints: several tensors over two files, and one tensor in one file (the reader's
// seed: its fuzzer gives every file the same bytes).
int Checkpoints(const std::string& tmp) {
  PosixStorage storage;
  TestTensor wq = RandomTensor("layers.0.attn.wq", v1::DTYPE_F32, {8, 12}, 11);
  wq.chunks = GridChunks(wq.shape, {2, 2}, 2);
  TestTensor exp_avg = RandomTensor("layers.0.attn.wq", v1::DTYPE_F32, {8, 12}, 12);
  exp_avg.kind = v1::SHARD_KIND_OPTIMIZER;
  exp_avg.state_key = "exp_avg";
  exp_avg.chunks = GridChunks(exp_avg.shape, {2, 1}, 2);
  TestTensor scalar = RandomTensor("step", v1::DTYPE_I64, {}, 15);
  scalar.chunks = {TestChunk{Box{}, 1}};
  TestTensor extra = RandomTensor("rng", v1::DTYPE_U8, {20}, 16);
  extra.kind = v1::SHARD_KIND_EXTRA;
  extra.rank = 3;
  extra.chunks = {TestChunk{FullBox(extra.shape), 0}};
  TestTensor absent;
  absent.kind = v1::SHARD_KIND_OPTIMIZER;
  absent.fqn = "layers.1.mlp.w";
  absent.state_key = "exp_avg";
  absent.dtype = v1::DTYPE_BF16;
  absent.shape = {4, 6, 10};
  absent.state_absent = true;

  const std::string many = tmp + "/many";
  const std::string one = tmp + "/one";
  if (!storage.CreateDirs(many).ok() || !storage.CreateDirs(one).ok()) return 1;
  absl::StatusOr<v1::Manifest> m =
      testing_checkpoint::WriteTestCheckpoint(storage, many, {wq, exp_avg, scalar, extra, absent});
  TestTensor mlp = RandomTensor("layers.1.mlp.w", v1::DTYPE_BF16, {4, 6, 10}, 13);
  mlp.chunks = GridChunks(mlp.shape, {1, 2, 2}, 1);
  absl::StatusOr<v1::Manifest> single = testing_checkpoint::WriteTestCheckpoint(storage, one, {mlp});
  if (!m.ok() || !single.ok()) {
    std::fprintf(stderr, "%s %s\n", m.status().ToString().c_str(),
                 single.status().ToString().c_str());
    return 1;
  }
  Write("manifest", "several_tensors.pb", m->SerializeAsString());
  Write("manifest", "one_tensor.pb", single->SerializeAsString());
  for (int file = 0; file < 2; ++file) {
    const std::string name = testing_checkpoint::DataFileName(file);
    Write("safetensors", name, ReadFile(many + "/" + name));
  }
  const std::string manifest = single->SerializeAsString();
  Write("checkpoint_reader", "one_file",
        U32(manifest.size()) + manifest +
            ReadFile(one + "/" + testing_checkpoint::DataFileName(0)));
  const std::string several = m->SerializeAsString();
  Write("checkpoint_reader", "several_files",
        U32(several.size()) + several + ReadFile(many + "/" + testing_checkpoint::DataFileName(0)));
  return 0;
}

void PlanWire() {
  v1::RankAssignment a;
  a.set_file("data-00001.safetensors");
  v1::WriteItem* w = a.add_writes();
  w->set_key("layers.0.attn.wq#exp_avg");
  *w->mutable_box() = BoxToProto(Box{{0, 0}, {4, 12}});
  w->set_dtype(v1::DTYPE_F32);
  w->set_nbytes(4 * 12 * 4);
  for (uint32_t rank : {1u, 2u, 5u}) {
    v1::ChunkSource* s = w->add_sources();
    s->set_rank(rank);
    s->set_local_shard(static_cast<int32_t>(rank));
    s->mutable_range()->set_begin(16 * (rank % 3));
    s->mutable_range()->set_end(16 * (rank % 3) + 16);
  }
  v1::HashItem* h = a.add_hashes();
  h->set_local_shard(2);
  h->set_writer_rank(3);
  v1::GatherSend* g = a.add_sends();
  g->set_local_shard(0);
  g->mutable_range()->set_begin(0);
  g->mutable_range()->set_end(32);
  g->set_leader_rank(4);
  Write("plan_wire", "assignment_self1", std::string(1, '\1') + a.SerializeAsString());
  Write("plan_wire", "assignment_self5", std::string(1, '\5') + a.SerializeAsString());
}

void PeerChunks() {
  // The slice the fuzzer's inbox expects, in two chunks, then one resent.
  std::string slices = std::string(1, '\0') + std::string(1, '\7');
  for (uint64_t offset : {0, 16, 16}) {
    v1::SliceChunk h;
    h.set_session_id("s");
    h.set_key("w");
    *h.mutable_box() = BoxToProto(Box{{0}, {8}});
    h.set_from_rank(1);
    h.mutable_range()->set_begin(0);
    h.mutable_range()->set_end(8);
    h.set_slice_nbytes(32);
    h.set_offset(offset);
    const std::string message = EncodeChunkPrefix(h, 16) + std::string(16, 'd');
    slices += U16(message.size()) + message;
  }
  Write("peer_chunk", "slice_chunks", slices);
  std::string copy = std::string(1, '\1') + std::string(1, '\77');
  v1::MemoryCopyChunk c;
  c.mutable_copy()->set_step(100);
  c.mutable_copy()->set_session_id("s100-00000000000000aa");
  c.mutable_copy()->set_file("data-00000.safetensors");
  c.mutable_copy()->set_nbytes(64);
  c.set_job_id("job");
  const std::string message = EncodeChunkPrefix(c, 64) + std::string(64, 'm');
  copy += U16(message.size()) + message;
  Write("peer_chunk", "memory_copy_chunk", copy);
}

void BulkFrames() {
  v1::MemoryCopy copy;
  copy.set_step(100);
  copy.set_session_id("s100-00000000000000aa");
  copy.set_file("data-00000.safetensors");
  copy.set_nbytes(8192);
  copy.set_writer_rank(2);
  v1::BulkRequest read;
  *read.mutable_read() = MemoryCopyReadRequest("job", copy, 0, 4096);
  v1::BulkRequest put;
  put.mutable_put()->set_job_id("job");
  *put.mutable_put()->mutable_copy() = copy;
  v1::BulkStatus ok;
  ok.set_nbytes(4096);
  v1::BulkStatus refused;
  refused.set_code(8);
  refused.set_message("a memory copy of 8192 bytes for rank 2 is refused");
  Write("bulk_wire", "read_then_status", EncodeBulkFrame(read) + EncodeBulkFrame(ok));
  Write("bulk_wire", "put_twice", EncodeBulkFrame(put) + EncodeBulkFrame(put));
  Write("bulk_wire", "refused", EncodeBulkFrame(refused));

  // The handshake of a put, each frame as its side sends it; and a hello of another job.
  const PeerCredential credential = fuzz::Credential();
  v1::BulkChallenge challenge;
  challenge.set_nonce(fuzz::HolderNonce());
  v1::BulkHello hello;
  hello.set_nonce(fuzz::PeerNonce());
  hello.set_request(put.SerializeAsString());
  hello.set_proof(
      BulkClientProof(credential, fuzz::HolderNonce(), fuzz::PeerNonce(), hello.request()));
  v1::BulkStatus reserved;
  reserved.set_nbytes(8192);
  reserved.set_proof(BulkServerProof(credential, fuzz::HolderNonce(), fuzz::PeerNonce()));
  Write("bulk_wire", "handshake_put",
        EncodeBulkFrame(challenge) + EncodeBulkFrame(hello) + EncodeBulkFrame(reserved));
  hello.set_request(read.SerializeAsString());
  hello.set_proof(BulkClientProof(PeerCredential{"other", credential.secret}, fuzz::HolderNonce(),
                                  fuzz::PeerNonce(), hello.request()));
  Write("bulk_wire", "hello_of_another_job", EncodeBulkFrame(hello));
}

void PeerCallProofs() {
  const PeerCredential credential = fuzz::Credential();
  const std::string nonce(kPeerNonceBytes, 'n');
  Write("peer_call_proof", "admitted",
        EncodePeerCallProof(
            MakePeerCallProof(credential, kPutMemoryCopyMethod, fuzz::Now(), nonce)));
  Write("peer_call_proof", "stale",
        EncodePeerCallProof(MakePeerCallProof(credential, kPutMemoryCopyMethod,
                                              fuzz::Now() - 2 * kPeerCallSkew, nonce)));
  Write("peer_call_proof", "another_method",
        EncodePeerCallProof(MakePeerCallProof(credential, kRelayMethod, fuzz::Now(), nonce)));
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  tessera::out_dir = argv[1];
  char tmp[] = "/tmp/make_seeds.XXXXXX";
  if (mkdtemp(tmp) == nullptr) return 1;
  if (tessera::Checkpoints(tmp) != 0) return 1;
  tessera::PlanWire();
  tessera::PeerChunks();
  tessera::BulkFrames();
  tessera::PeerCallProofs();
  return 0;
}
