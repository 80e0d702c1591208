// ProcessBarrier: lines up the benchmark's trainer processes before each timed step, so that
// no rank's time includes waiting for another to start (tests/gpu/run.sh starts one driver
// process per rank). A process-shared pthread barrier in a POSIX shared-memory object that
// the orchestrating script creates (Create, from a short-lived process) and removes
// (/dev/shm/<name>); every rank opens it (Open) and waits on it. Waiting blocks on the
// barrier itself (futex), never polls; a rank that dies leaves the others blocked, so the
// caller bounds the run (the script's `timeout`).
//
// Lifecycle: Create once per run; Open in each rank; the object outlives its creator.
// Thread-safety: Wait may be called from one thread per process at a time.
#ifndef TESSERA_TESTS_GPU_PROCESS_BARRIER_H_
#define TESSERA_TESTS_GPU_PROCESS_BARRIER_H_

#include <pthread.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::gpubench {

class ProcessBarrier {
 public:
  // Creates the object `name` ("/..."), initialised for `parties` processes.
  // Errors: InvalidArgument for a bad name or parties < 1; AlreadyExists if it exists;
  // Internal (with errno) for other failures.
  static absl::Status Create(const std::string& name, int parties);

  // Maps an object made by Create. Errors: NotFound if it does not exist; Internal otherwise.
  static absl::StatusOr<std::unique_ptr<ProcessBarrier>> Open(const std::string& name);

  ~ProcessBarrier();
  ProcessBarrier(const ProcessBarrier&) = delete;
  ProcessBarrier& operator=(const ProcessBarrier&) = delete;

  // Blocks until `parties` processes have called Wait for this round.
  void Wait();

 private:
  explicit ProcessBarrier(pthread_barrier_t* barrier) : barrier_(barrier) {}
  pthread_barrier_t* const barrier_;
};

}  // namespace tessera::gpubench

#endif  // TESSERA_TESTS_GPU_PROCESS_BARRIER_H_
