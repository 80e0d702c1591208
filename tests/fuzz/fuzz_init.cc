// Linked into every fuzzer (tests/fuzz/fuzz.bzl): once, before the first input, silences what
// the product's libraries log about the malformed inputs a fuzzer feeds them on purpose
// (protobuf's "invalid UTF-8" errors), so that a run's output shows the fuzzer's own lines and
// any finding.
#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}
