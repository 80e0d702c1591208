// ReportQueue: one save session's reports to the coordinator, kept until the session ends.
//
// The coordinator keeps no per-chunk progress (DESIGN.md "Decisions"): what a rank reported
// lives only in the coordinator's memory, so the agent keeps every report of a session and
// re-sends them all when asked (coordinator.proto's re-send rule; SaveCore says when).
//
// Order: one report is out at a time, and the next goes only once the previous one is
// acknowledged (or refused for good). So a phase never reaches the coordinator before the
// chunks or hashes it vouches for — a GATHERED ahead of its replica hashes would let the
// coordinator find a hash missing (REPLICA_DIVERGED) — nor a phase before an earlier one.
// ResendAll() starts over with every report, chunk reports first, then phase reports, each in
// the order they were added; if a report is out at that moment, the restart waits for its
// result, so two of the session's reports are never out at once.
//
// What a result means (by who retries, STYLE.md 3):
//   OK                                   delivered; the next one goes
//   FailedPrecondition                   the session already ended on the coordinator (or
//                                        this agent's incarnation is stale): nothing more is
//                                        sent; the outcome arrives as a command
//   InvalidArgument, OutOfRange,         refused for good (resending cannot help): dropped,
//   PermissionDenied, Unauthenticated,   the next one goes
//   Unimplemented
//   anything else (Unavailable,          failed: the queue pauses until the next ResendAll(),
//   DeadlineExceeded, NotFound — a       which the owner schedules with backoff
//   restarted coordinator that does not
//   know this agent yet —, Internal ...)
//
// Pure: no clock, no I/O, no RPC; the owner sends what Next() hands out and feeds the result
// back. Thread-safety: none; owned by one SaveCore.
#ifndef TESSERA_AGENT_SAVE_REPORT_QUEUE_H_
#define TESSERA_AGENT_SAVE_REPORT_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

// Whether a report the coordinator answered with `code` may get through if sent again: the
// table's last row. False for OK, FailedPrecondition and the codes refused for good. The one
// rule for every report to the coordinator (ReportQueue, agent/command_relay.h
// ReportRelayFailed).
bool WorthResending(absl::StatusCode code);

class ReportQueue {
 public:
  // Exactly one of the two is set.
  struct Report {
    std::shared_ptr<const v1::ReportChunksRequest> chunks;
    std::shared_ptr<const v1::ReportPhaseRequest> phase;
  };

  enum class Result {
    kDelivered,     // acknowledged
    kRefused,       // refused for good and dropped; the queue goes on
    kSessionEnded,  // FailedPrecondition: the queue is closed
    kFailed,        // paused until ResendAll()
    kNotOurs,       // `rpc_id` is not the report out: nothing changed
  };

  // Appends `report`; it goes out after every report added before it.
  void Add(Report report);

  // Every report again, from the first: chunk reports, then phase reports. Unpauses. If a
  // report is out, takes effect when its result arrives. No effect once closed.
  void ResendAll();

  // The session ended: nothing more is handed out, results are ignored. Idempotent.
  void Close();

  // After a FailedPrecondition closed the queue (the coordinator had ended the session, but
  // its verdict has not arrived): hands out one report again. The coordinator answers a report
  // of a session it ended by sending that session's verdict again on the command stream, so
  // the owner calls this when a stream may have missed it — after a (re)connection. No effect
  // otherwise; the answer closes the queue again.
  void Remind();
  bool ended_on_coordinator() const { return ended_on_coordinator_; }

  // The report to send now as RPC `rpc_id`, if one may go: not closed, not paused, none out,
  // one pending.
  std::optional<Report> Next(uint64_t rpc_id);

  // The result of the RPC handed out as `rpc_id`; see the header comment.
  Result OnResult(uint64_t rpc_id, absl::StatusCode code);

  bool closed() const { return closed_; }
  bool paused() const { return paused_; }
  // The RPC id of the report out, 0 if none.
  uint64_t out() const { return out_; }
  // Reports added so far.
  size_t size() const { return chunks_.size() + phases_.size(); }

 private:
  struct Ref {
    bool chunk = false;
    size_t index = 0;
  };
  void Restart();
  Report Get(Ref ref) const;

  std::vector<Report> chunks_;  // every chunk report added, in order
  std::vector<Report> phases_;  // every phase report added, in order
  std::deque<Ref> pending_;     // what is still to be delivered, in sending order
  uint64_t out_ = 0;
  Ref out_ref_;
  bool restart_when_back_ = false;
  bool paused_ = false;
  bool closed_ = false;
  bool ended_on_coordinator_ = false;  // closed by a FailedPrecondition (Remind)
};

}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_REPORT_QUEUE_H_
