#include "tests/hosts/wire_core.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status ValidateWireOptions(const WireOptions& options) {
  if (options.delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("wire delay must not be negative: ", absl::FormatDuration(options.delay)));
  }
  if (!(options.loss >= 0.0 && options.loss <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("wire loss must be a probability in [0, 1]: ", options.loss));
  }
  if (options.queue_limit == 0) return absl::InvalidArgumentError("wire queue_limit must be > 0");
  return absl::OkStatus();
}

WireCore::WireCore(const WireOptions& options) : options_(options), random_(options.seed) {}

bool WireCore::Offer(absl::Time now, End from, std::string packet) {
  // Drawn for every packet, queued or not, so that the drops depend on the packets alone.
  const bool lost = draw_(random_) < options_.loss;
  std::deque<InFlight>& queue = queue_[from];
  if (lost || queue.size() >= options_.queue_limit) {
    ++dropped_;
    return false;
  }
  queue.push_back(InFlight{now + options_.delay, std::move(packet)});
  return true;
}

std::vector<WireCore::Delivery> WireCore::TakeDue(absl::Time now) {
  std::vector<Delivery> out;
  for (End from : {kA, kB}) {
    std::deque<InFlight>& queue = queue_[from];
    while (!queue.empty() && queue.front().due <= now) {
      out.push_back(Delivery{from == kA ? kB : kA, std::move(queue.front().packet)});
      queue.pop_front();
      ++delivered_;
    }
  }
  return out;
}

std::optional<absl::Time> WireCore::NextDue() const {
  std::optional<absl::Time> next;
  for (const std::deque<InFlight>& queue : queue_) {
    if (!queue.empty() && (!next || queue.front().due < *next)) next = queue.front().due;
  }
  return next;
}

}  // namespace tessera
