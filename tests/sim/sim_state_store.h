// SimStateStore: the coordinator's state store in the simulation — a MemoryStateStore whose
// commits a fault hook may fail, before the batch is applied, or after (a write that reached
// the disk but reported an error: state_store.h says a caller must not assume either).
// It outlives coordinator crashes: a restarted coordinator recovers from it.
//
// Thread-safety: none; the simulation is single-threaded.
#ifndef TESSERA_TESTS_SIM_SIM_STATE_STORE_H_
#define TESSERA_TESTS_SIM_SIM_STATE_STORE_H_

#include <functional>

#include "server/store/memory_state_store.h"
#include "server/store/state_store.h"

namespace tessera::sim {

class SimStateStore : public StateStore {
 public:
  enum class Fault { kNone, kBefore, kAfter };
  using FaultHook = std::function<Fault(const StoreBatch& batch)>;

  void set_fault_hook(FaultHook hook) { hook_ = std::move(hook); }

  absl::Status Commit(const StoreBatch& batch) override;
  absl::StatusOr<std::optional<std::string>> Get(Table table,
                                                 absl::string_view key) const override {
    return store_.Get(table, key);
  }
  absl::Status Scan(Table table, absl::string_view prefix, const ScanFn& fn) const override {
    return store_.Scan(table, prefix, fn);
  }

 protected:
  absl::Status ScanKeyRange(Table table, absl::string_view begin, absl::string_view end,
                            const ScanFn& fn) const override {
    return store_.ScanRange(table, begin, end, fn);
  }

 private:
  MemoryStateStore store_;
  FaultHook hook_;
};

}  // namespace tessera::sim

#endif  // TESSERA_TESTS_SIM_SIM_STATE_STORE_H_
