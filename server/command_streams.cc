#include "server/command_streams.h"

#include "google/protobuf/unknown_field_set.h"

namespace tessera {

// One agent's stream. Writes go out one at a time from `queue_`. Lifetime: created by Open();
// gRPC calls OnDone() once it is finished with it, and CommandStreams forgets it then
// (Detach). Callers that found it under CommandStreams' mutex take a hold first and call
// into it without that mutex (gRPC's StartWrite and Finish are never called under a lock);
// the reactor is deleted once gRPC is done with it and no hold is left.
class CommandStreams::Reactor : public grpc::ServerWriteReactor<v1::Command> {
 public:
  Reactor(CommandStreams* owner, Key key, uint64_t incarnation)
      : owner_(owner), key_(std::move(key)), incarnation_(incarnation) {}

  // Set by Open under the owner's mutex, before the reactor is used.
  void set_serial(uint64_t serial) { serial_ = serial; }

  // Taken under CommandStreams' mutex, so the reactor is alive; keeps it alive until Release.
  void Hold() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++holds_;
  }
  void Release() ABSL_LOCKS_EXCLUDED(mu_) {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --holds_ == 0 && done_;
    }
    if (last) delete this;
  }

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

  // Returns whether this call finished it (false: it was finished already).
  bool FinishNow(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return false;
      finished_ = true;
    }
    Finish(std::move(status));
    return true;
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      if (FinishNow(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken"))) {
        owner_->Broken(key_, incarnation_, serial_);
      }
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

  void OnCancel() override {
    if (FinishNow(grpc::Status::CANCELLED)) owner_->Broken(key_, incarnation_, serial_);
  }

  void OnDone() override {
    owner_->Detach(key_, this);
    bool last;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      last = holds_ == 0;
    }
    if (last) delete this;
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
  const uint64_t incarnation_;
  uint64_t serial_ = 0;
  absl::Mutex mu_;
  std::deque<v1::Command> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // OnDone ran: gRPC is finished with it
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
    const std::string& job_id, uint32_t rank, uint64_t incarnation,
    const std::function<std::optional<v1::Command>()>& current) {
  Key key{job_id, rank};
  auto* reactor = new Reactor(this, key, incarnation);
  Reactor* replaced = nullptr;
  uint64_t serial = 0;
  {
    absl::MutexLock lock(&mu_);
    serial = ++next_serial_;
    reactor->set_serial(serial);
    auto [it, inserted] = streams_.try_emplace(key, reactor);
    if (!inserted) {
      replaced = it->second;
      replaced->Hold();
      it->second = reactor;
    }
  }
  if (replaced != nullptr) {
    replaced->FinishNow(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "replaced by a newer command stream"));
    replaced->Release();
  }
  if (events_.opened) events_.opened(job_id, rank, incarnation, serial);
  // Not under mu_: `current` takes the SessionManager's lock. The reactor stays alive until
  // returned to gRPC (OnDone cannot run before), so it may be used here even if replaced.
  std::optional<v1::Command> replay = current();
  if (replay.has_value()) {
    bool still_current;
    {
      absl::MutexLock lock(&mu_);
      auto it = streams_.find(key);
      still_current = it != streams_.end() && it->second == reactor;
    }
    if (still_current) reactor->Enqueue(*std::move(replay));
  }
  return reactor;
}

CommandStreams::Reactor* CommandStreams::HoldStream(const std::string& job_id, uint32_t rank) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(Key{job_id, rank});
  if (it == streams_.end()) return nullptr;
  it->second->Hold();
  return it->second;
}

void CommandStreams::Send(const std::string& job_id, uint32_t rank,
                          const v1::Command& command) {
  if (Reactor* reactor = HoldStream(job_id, rank)) {
    reactor->Enqueue(command);
    reactor->Release();
  }
}

void CommandStreams::SendPin(const std::string& job_id, uint32_t rank,
                             const v1::Command& command, absl::string_view assignment) {
  Reactor* reactor = HoldStream(job_id, rank);
  if (reactor == nullptr) return;  // replayed when it connects
  reactor->Enqueue(PinWithEncodedAssignment(command, assignment));
  reactor->Release();
}

void CommandStreams::CloseAll() {
  std::vector<Reactor*> open;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, reactor] : streams_) {
      reactor->Hold();
      open.push_back(reactor);
    }
  }
  for (Reactor* reactor : open) {
    reactor->FinishNow(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator stopping"));
    reactor->Release();
  }
}

size_t CommandStreams::open_streams() const {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

void CommandStreams::Broken(const Key& key, uint64_t incarnation, uint64_t serial) {
  if (events_.broken) events_.broken(key.first, key.second, incarnation, serial);
}

void CommandStreams::Detach(const Key& key, Reactor* reactor) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(key);
  if (it != streams_.end() && it->second == reactor) streams_.erase(it);
}

}  // namespace tessera
