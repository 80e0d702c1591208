// CommandStreams: the gRPC side of the Coordinator.Commands RPC and the CommandSink the
// SessionManager emits commands into.
//
// Each connected agent has one server-streaming reactor. Send() queues a command for
// (job, rank) and starts a write if none is in flight; it never blocks. A command for an
// agent that is not connected is dropped: when the agent (re)connects, Open() replays the
// SessionManager's current command for it, which is all it needs to resume (commands are
// idempotent on the agent side). A newer stream for the same (job, rank) replaces the older
// one, which is finished with UNAVAILABLE.
//
// Thread-safety: all methods are safe for concurrent use; reactor callbacks run on gRPC's
// threads and take only this object's mutex, briefly. gRPC's StartWrite and Finish are never
// called under a lock: a reactor found under the mutex is held, then used without it.
#ifndef TESSERA_SERVER_COMMAND_STREAMS_H_
#define TESSERA_SERVER_COMMAND_STREAMS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/command_sink.h"
#include "tessera/v1/coordinator.grpc.pb.h"

namespace tessera {

// `pin` (a Command whose PinCommand has no assignment) with `assignment`, an encoded
// v1::RankAssignment, as its PinCommand.assignment in wire format: its serialization parses as
// the same Command with that assignment parsed. In-process readers of the result see the
// assignment as an unknown field, not as pin().assignment(); it is for serialization only.
v1::Command PinWithEncodedAssignment(const v1::Command& pin, absl::string_view assignment);

class CommandStreams : public CommandSink {
 public:
  // What a death watch needs to know of the streams (server/death_watch.h), each call with the
  // stream's serial (it grows with every stream opened), on a gRPC thread with no lock held:
  //   opened  a stream of (job, rank, incarnation) was registered (it replaces any older one);
  //   broken  it broke from the agent's side — the call was cancelled or a write failed (the
  //           agent's process or its connection went away) — not a stream this object finished
  //           (replaced by a newer one, or CloseAll). A broken stream's call may come after a
  //           newer stream's opened: the serials order them.
  struct Events {
    std::function<void(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                       uint64_t serial)>
        opened;
    std::function<void(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                       uint64_t serial)>
        broken;
  };

  explicit CommandStreams(Events events = {}) : events_(std::move(events)) {}
  ~CommandStreams() override;

  // Starts a stream for (job, rank). Once the stream is registered, calls `current` (the
  // SessionManager's CurrentCommand) and queues what it returns. Reading it only after
  // registering is what keeps a command emitted while the agent connects from being lost:
  // it is either sent to this stream or already what `current` returns. The replay may thus
  // repeat a command, or follow a newer one; agents ignore a seq they have handled. The
  // reactor deletes itself when the RPC is done.
  grpc::ServerWriteReactor<v1::Command>* Open(
      const std::string& job_id, uint32_t rank, uint64_t incarnation,
      const std::function<std::optional<v1::Command>()>& current) ABSL_LOCKS_EXCLUDED(mu_);

  void Send(const std::string& job_id, uint32_t rank, const v1::Command& command) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Queues the PIN with `assignment`'s bytes appended to it as they are: they are written as
  // field PinCommand.assignment (as an unknown field of the PinCommand, which serializes
  // verbatim), so the agent parses the same message it would from a parsed assignment, and the
  // coordinator never parses nor re-encodes it. See PinWithEncodedAssignment.
  void SendPin(const std::string& job_id, uint32_t rank, const v1::Command& command,
               absl::string_view assignment) override ABSL_LOCKS_EXCLUDED(mu_);

  // Finishes every open stream with UNAVAILABLE (coordinator shutting down).
  void CloseAll() ABSL_LOCKS_EXCLUDED(mu_);

  size_t open_streams() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Reactor;
  using Key = std::pair<std::string, uint32_t>;

  void Detach(const Key& key, Reactor* reactor) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream `reactor` of `key` broke from the agent's side: events_.broken.
  void Broken(const Key& key, uint64_t incarnation, uint64_t serial) ABSL_LOCKS_EXCLUDED(mu_);

  const Events events_;
  // The stream of (job, rank) with a hold taken (Reactor::Release it), or null.
  Reactor* HoldStream(const std::string& job_id, uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<Key, Reactor*> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SERVER_COMMAND_STREAMS_H_
