// Fuzzes the safetensors reader (format/data_file.h): the header size prefix, the strict JSON
// header parser and the layout check that every reader of a data file runs before it trusts an
// offset (format/verify.h). The input is the start of a data file; its length stands for the
// file's size. Contract checked: no crash, out-of-bounds read or undefined behaviour, and an
// accepted header's entries lie inside the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/data_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (!tessera::ParseSafetensorsHeaderSize(bytes).ok()) return 0;
  absl::StatusOr<tessera::SafetensorsHeader> header = tessera::ParseSafetensorsHeader(bytes);
  if (!header.ok()) return 0;
  if (!tessera::ValidateSafetensorsLayout(*header, size).ok()) return 0;
  for (const tessera::SafetensorsEntry& entry : header->entries) {
    if (entry.begin > entry.end || header->data_start + entry.end > size) std::abort();
  }
  return 0;
}
