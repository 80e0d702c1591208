// PeerAddressBook: the peer addresses of the agent's recent sessions, filled from GATHER
// commands (rank -> "host:port" of the ranks it exchanges slices with) and read by the gRPC
// peer transport when it dials a leader.
//
// Keeps the `capacity` most recently set sessions; setting a session again refreshes it. A
// session older than that is long over (the coordinator runs one session per job at a time).
// Thread-safe.
#ifndef TESSERA_AGENT_PEER_PEER_ADDRESS_BOOK_H_
#define TESSERA_AGENT_PEER_PEER_ADDRESS_BOOK_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class PeerAddressBook {
 public:
  explicit PeerAddressBook(size_t capacity = 8) : capacity_(capacity == 0 ? 1 : capacity) {}

  // Replaces `session`'s addresses and makes it the most recent session.
  void Set(const std::string& session, std::map<uint32_t, std::string> addresses)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Errors: Unavailable ("no address known for rank R in session S") if the session is not
  // kept or has no (or an empty) address for `rank`.
  absl::StatusOr<std::string> Resolve(const std::string& session, uint32_t rank) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::string session;
    std::map<uint32_t, std::string> addresses;
  };
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);  // most recent first
};

}  // namespace tessera

#endif  // TESSERA_AGENT_PEER_PEER_ADDRESS_BOOK_H_
