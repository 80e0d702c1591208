#include "server/command_streams.h"

#include "google/protobuf/unknown_field_set.h"

namespace tessera {

// One agent's stream. Writes go out one at a time from `queue_`. Lifetime: created by Open(),
// deleted in OnDone() after gRPC is finished with it; CommandStreams forgets it in Detach()
// before that, under its mutex, so Send() never touches a deleted reactor.
class CommandStreams::Reactor : public grpc::ServerWriteReactor<v1::Command> {
 public:
  Reactor(CommandStreams* owner, Key key) : owner_(owner), key_(std::move(key)) {}

  // Called with owner_->mu_ held, so the reactor is registered and alive.
  void Enqueue(v1::Command command) {
    const v1::Command* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      queue_.push_back(std::move(command));
      next = TakeNextWriteLocked();
    }
    if (next != nullptr) StartWrite(next);
  }

  void FinishNow(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(std::move(status));
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      FinishNow(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken"));
      return;
    }
    const v1::Command* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      queue_.pop_front();
      next = TakeNextWriteLocked();
    }
    if (next != nullptr) StartWrite(next);
  }

  void OnCancel() override { FinishNow(grpc::Status::CANCELLED); }

  void OnDone() override {
    owner_->Detach(key_, this);
    delete this;
  }

 private:
  // The command to write next, or null if a write is in flight or nothing is queued. The
  // front of the deque stays put (push_back keeps references valid) until OnWriteDone pops
  // it. gRPC is called outside mu_, so an inlined callback cannot deadlock on it.
  const v1::Command* TakeNextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || queue_.empty()) return nullptr;
    writing_ = true;
    return &queue_.front();
  }

  CommandStreams* const owner_;
  const Key key_;
  absl::Mutex mu_;
  std::deque<v1::Command> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

v1::Command PinWithEncodedAssignment(const v1::Command& pin, absl::string_view assignment) {
  v1::Command c = pin;
  v1::PinCommand* body = c.mutable_pin();
  body->clear_assignment();
  body->GetReflection()
      ->MutableUnknownFields(body)
      ->AddLengthDelimited(v1::PinCommand::kAssignmentFieldNumber)
      ->assign(assignment.data(), assignment.size());
  return c;
}

CommandStreams::~CommandStreams() { CloseAll(); }

grpc::ServerWriteReactor<v1::Command>* CommandStreams::Open(
    const std::string& job_id, uint32_t rank,
    const std::function<std::optional<v1::Command>()>& current) {
  Key key{job_id, rank};
  auto* reactor = new Reactor(this, key);
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = streams_.try_emplace(key, reactor);
    if (!inserted) {
      it->second->FinishNow(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "replaced by a newer command stream"));
      it->second = reactor;
    }
  }
  // Not under mu_: `current` takes the SessionManager's lock. The reactor stays alive until
  // returned to gRPC (OnDone cannot run before), so it may be used here even if replaced.
  std::optional<v1::Command> replay = current();
  if (replay.has_value()) {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(key);
    if (it != streams_.end() && it->second == reactor) reactor->Enqueue(*std::move(replay));
  }
  return reactor;
}

void CommandStreams::Send(const std::string& job_id, uint32_t rank,
                          const v1::Command& command) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(Key{job_id, rank});
  if (it != streams_.end()) it->second->Enqueue(command);
}

void CommandStreams::SendPin(const std::string& job_id, uint32_t rank,
                             const v1::Command& command, absl::string_view assignment) {
  {
    absl::MutexLock lock(&mu_);
    if (!streams_.contains(Key{job_id, rank})) return;  // replayed when it connects
  }
  v1::Command pin = PinWithEncodedAssignment(command, assignment);  // a copy: not under mu_
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(Key{job_id, rank});
  if (it != streams_.end()) it->second->Enqueue(std::move(pin));
}

void CommandStreams::CloseAll() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, reactor] : streams_) {
    reactor->FinishNow(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator stopping"));
  }
}

size_t CommandStreams::open_streams() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

void CommandStreams::Detach(const Key& key, Reactor* reactor) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(key);
  if (it != streams_.end() && it->second == reactor) streams_.erase(it);
}

}  // namespace tessera
