// ThreadPool and Strand: blocking work off the threads that accept it.
//
// A ThreadPool runs posted tasks on a fixed set of threads. A Strand runs its tasks one at a
// time, in the order they were posted, on a pool's threads: the unit of serialization. The
// coordinator gives each job a Strand, so a job's events, synced store writes, planning and
// commit I/O never run concurrently with each other, and never on a gRPC callback thread,
// while different jobs proceed in parallel (STYLE.md 17).
//
// Lifecycle: ~ThreadPool runs every task already posted (strands' included), then joins its
// threads; posting after the destructor started is a bug. A Strand must outlive the tasks
// posted to it: destroy the pool first (which finishes them), then the strands.
//
// Thread-safety: Post may be called from any thread, also from inside a task.
#ifndef TESSERA_COMMON_STRAND_H_
#define TESSERA_COMMON_STRAND_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class ThreadPool {
 public:
  // Starts `threads` threads (at least 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // last: started once the queue exists
};

class Strand {
 public:
  // `pool` must outlive the strand and every task posted to it.
  explicit Strand(ThreadPool* pool) : pool_(pool) {}
  Strand(const Strand&) = delete;
  Strand& operator=(const Strand&) = delete;

  // Runs `task` after every task posted before it has run, never concurrently with them.
  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  ThreadPool* const pool_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;  // a Drain is posted or running
};

}  // namespace tessera

#endif  // TESSERA_COMMON_STRAND_H_
