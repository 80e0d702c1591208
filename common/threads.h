// Fork-join on threads of their own: for passes that split a large piece of work (a plan's
// shards, a copy's bytes, a command to every rank of a job) into independent parts.
//
// The threads are started for the call and joined before it returns, so the work never waits
// on a pool that may be busy with the caller's own strand (STYLE.md 17), and no part outlives
// the data it uses. Starting a thread costs tens of microseconds: callers split only work that
// takes milliseconds.
//
// Thread-safety: pure functions; `fn` must be safe to run concurrently for distinct parts.
#ifndef TESSERA_COMMON_THREADS_H_
#define TESSERA_COMMON_THREADS_H_

#include <cstddef>
#include <thread>
#include <vector>

namespace tessera {

// Runs fn(t) for every t in [0, threads), each on its own thread (t = 0 on the caller's),
// and returns when all have returned. Runs nothing when `threads` is 0.
template <typename Fn>
void RunOnThreads(size_t threads, const Fn& fn) {
  if (threads == 0) return;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) pool.emplace_back([&fn, t] { fn(t); });
  fn(0);
  for (std::thread& thread : pool) thread.join();
}

// The CPUs this process may run on (sched_getaffinity; std::thread::hardware_concurrency if
// that fails), at least 1. More threads than this only take turns on the same cores.
int UsableCpus();

}  // namespace tessera

#endif  // TESSERA_COMMON_THREADS_H_
