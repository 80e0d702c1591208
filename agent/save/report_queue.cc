#include "agent/save/report_queue.h"

#include <utility>

namespace tessera {

void ReportQueue::Add(Report report) {
  const bool chunk = report.chunks != nullptr;
  std::vector<Report>& list = chunk ? chunks_ : phases_;
  list.push_back(std::move(report));
  if (!closed_) pending_.push_back({chunk, list.size() - 1});
}

void ReportQueue::ResendAll() {
  if (closed_) return;
  paused_ = false;
  if (out_ != 0) {
    restart_when_back_ = true;
    return;
  }
  Restart();
}

void ReportQueue::Restart() {
  pending_.clear();
  for (size_t i = 0; i < chunks_.size(); ++i) pending_.push_back({true, i});
  for (size_t i = 0; i < phases_.size(); ++i) pending_.push_back({false, i});
}

void ReportQueue::Close() {
  closed_ = true;
  pending_.clear();
  out_ = 0;
  restart_when_back_ = false;
}

void ReportQueue::Remind() {
  if (!ended_on_coordinator_ || !closed_ || size() == 0) return;
  closed_ = false;
  paused_ = false;
  pending_.clear();
  pending_.push_back(phases_.empty() ? Ref{true, chunks_.size() - 1}
                                     : Ref{false, phases_.size() - 1});
}

ReportQueue::Report ReportQueue::Get(Ref ref) const {
  return ref.chunk ? chunks_[ref.index] : phases_[ref.index];
}

std::optional<ReportQueue::Report> ReportQueue::Next(uint64_t rpc_id) {
  if (closed_ || paused_ || out_ != 0 || pending_.empty()) return std::nullopt;
  out_ref_ = pending_.front();
  pending_.pop_front();
  out_ = rpc_id;
  return Get(out_ref_);
}

bool WorthResending(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kUnimplemented:
      return false;
    default:
      return true;
  }
}

ReportQueue::Result ReportQueue::OnResult(uint64_t rpc_id, absl::StatusCode code) {
  if (closed_ || rpc_id == 0 || rpc_id != out_) return Result::kNotOurs;
  out_ = 0;
  Result result;
  switch (code) {
    case absl::StatusCode::kOk:
      result = Result::kDelivered;
      break;
    case absl::StatusCode::kFailedPrecondition:
      Close();
      ended_on_coordinator_ = true;
      return Result::kSessionEnded;
    default:
      if (!WorthResending(code)) {
        result = Result::kRefused;
        break;
      }
      pending_.push_front(out_ref_);
      paused_ = true;
      result = Result::kFailed;
      break;
  }
  if (restart_when_back_) {
    restart_when_back_ = false;
    paused_ = false;
    Restart();
  }
  return result;
}

}  // namespace tessera
