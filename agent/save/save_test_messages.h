// Messages for tests of the agent's save path (SaveCore, SaveExecutor): one rank saving one
// float tensor "w" of 1024 elements (4096 bytes), which it writes into its own data file.
#ifndef TESSERA_AGENT_SAVE_SAVE_TEST_MESSAGES_H_
#define TESSERA_AGENT_SAVE_SAVE_TEST_MESSAGES_H_

#include <cstdint>
#include <string>

#include "tessera/v1/agent.pb.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {
namespace testing_save {

// The trainer's BeginSave of `step`: the one shard.
inline v1::BeginSaveRequest OneShardRequest(int64_t step) {
  v1::BeginSaveRequest request;
  request.set_step(step);
  v1::ShardDesc* shard = request.add_shards();
  shard->set_fqn("w");
  shard->set_kind(v1::SHARD_KIND_PARAM);
  shard->set_dtype(v1::DTYPE_F32);
  shard->add_global_shape(1024);
  shard->mutable_box()->add_offsets(0);
  shard->mutable_box()->add_lengths(1024);
  shard->set_nbytes(4096);
  return request;
}

// A command of `session` (of `step`) with `seq` and no body yet.
inline v1::Command BareCommand(const std::string& session, int64_t step, uint64_t seq) {
  v1::Command c;
  c.set_session_id(session);
  c.set_step(step);
  c.set_seq(seq);
  return c;
}

// The PIN that has `rank` write the shard, whole, into `file`.
inline v1::Command OneShardPin(const std::string& session, int64_t step, uint64_t seq,
                               uint32_t rank, const std::string& file) {
  v1::Command c = BareCommand(session, step, seq);
  v1::RankAssignment* a = c.mutable_pin()->mutable_assignment();
  a->set_file(file);
  v1::WriteItem* w = a->add_writes();
  w->set_key("w");
  w->mutable_box()->add_offsets(0);
  w->mutable_box()->add_lengths(1024);
  w->set_dtype(v1::DTYPE_F32);
  w->set_nbytes(4096);
  v1::ChunkSource* source = w->add_sources();
  source->set_rank(rank);
  source->set_local_shard(0);
  return c;
}

}  // namespace testing_save
}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_SAVE_TEST_MESSAGES_H_
