// Clean shutdown on SIGTERM/SIGINT for the daemons: block the signals in every thread (call
// BlockTerminationSignals() first thing in main, before any thread starts), then have one
// thread wait for them synchronously. No async-signal-safety pitfalls, no polling.
//
// Thread-safety: BlockTerminationSignals before threads exist; WaitForTerminationSignal from
// one thread.
#ifndef TESSERA_COMMON_SIGNALS_H_
#define TESSERA_COMMON_SIGNALS_H_

namespace tessera {

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every thread it creates later.
void BlockTerminationSignals();

// Blocks until one of those signals arrives; returns its number.
int WaitForTerminationSignal();

}  // namespace tessera

#endif  // TESSERA_COMMON_SIGNALS_H_
