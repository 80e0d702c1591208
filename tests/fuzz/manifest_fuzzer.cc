// Fuzzes the manifest parser: what ReadManifest (format/manifest_io.h) does with the bytes of a
// manifest.pb found in storage — parse, then ValidateManifest — and, for one it accepts, the
// JSON printer that writes manifest.json. Contract checked: no crash, leak or undefined
// behaviour, whatever the bytes.
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "format/manifest_io.h"
#include "tessera/v1/manifest.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::v1::Manifest manifest;
  if (!manifest.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!tessera::ValidateManifest(manifest).ok()) return 0;
  tessera::ManifestToJson(manifest).IgnoreError();
  return 0;
}
