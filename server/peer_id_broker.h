// PeerIdBroker: hands a DP gather group's NCCL unique id from its leader to its members.
//
// The leader Post()s the id for (session, group); members Wait() for it with a callback, so
// no RPC thread blocks. Waiters past their deadline get DeadlineExceeded from Expire(), which
// the coordinator calls periodically. Ids are forgotten by Forget(session) or when they are
// older than `retention`.
//
// Thread-safety: all methods are safe for concurrent use; callbacks run without the lock held,
// on the thread that made them ready (Post, Wait or Expire).
#ifndef TESSERA_SERVER_PEER_ID_BROKER_H_
#define TESSERA_SERVER_PEER_ID_BROKER_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

class PeerIdBroker {
 public:
  using Callback = std::function<void(absl::StatusOr<std::string> unique_id)>;

  // Records the id of (session, group) and wakes its waiters.
  // Errors: InvalidArgument if a different id was posted for the group already.
  absl::Status Post(const std::string& session_id, const std::string& group,
                    const std::string& unique_id, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls `done` with the id once posted (at once if it already is), or with
  // DeadlineExceeded from an Expire() at or after `deadline`.
  void Wait(const std::string& session_id, const std::string& group, absl::Time deadline,
            Callback done) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails waiters whose deadline passed and forgets ids posted before now - retention.
  void Expire(absl::Time now, absl::Duration retention = absl::Minutes(30))
      ABSL_LOCKS_EXCLUDED(mu_);

  // Fails the session's waiters with Aborted and forgets its ids.
  void Forget(const std::string& session_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every waiter with Unavailable, and every later Wait at once: the coordinator is
  // stopping, and an ExchangePeerId waiting for its leader (up to a minute) would otherwise
  // hold the server's shutdown past its grace period. Agents retry Unavailable.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Group {
    std::string unique_id;  // empty until posted
    absl::Time posted;
    std::vector<std::pair<absl::Time, Callback>> waiters;
  };
  using Key = std::pair<std::string, std::string>;

  absl::Mutex mu_;
  absl::flat_hash_map<Key, Group> groups_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_PEER_ID_BROKER_H_
