// Fuzzes the parsers of S3's XML replies (storage/s3/s3_xml.h, libxml2 underneath): the first
// byte picks which reply the rest is parsed as, so each execution is one parse and every kind
// of reply the client reads from an object store is reached. Contract checked: no crash, leak
// or undefined behaviour in our code around libxml2, whatever the store sends.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "storage/s3/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool initialised = (tessera::s3::InitXml(), true);
  (void)initialised;
  if (size < 1) return 0;
  const absl::string_view xml(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 7) {
    case 0: tessera::s3::ParseListObjectsV2(xml).IgnoreError(); break;
    case 1: tessera::s3::ParseListMultipartUploads(xml).IgnoreError(); break;
    case 2: tessera::s3::ParseInitiateMultipartUpload(xml).IgnoreError(); break;
    case 3: tessera::s3::ParseCompleteMultipartUpload(xml).IgnoreError(); break;
    case 4: tessera::s3::ParseError(xml).IgnoreError(); break;
    case 5: tessera::s3::IsErrorReply(xml); break;
    default: tessera::s3::ParseDeleteResult(xml).IgnoreError(); break;
  }
  return 0;
}
