// Fuzzes the parsers of S3's XML replies (storage/s3/s3_xml.h, libxml2 underneath): every
// reply kind the client reads from an object store is parsed from the same input. Contract
// checked: no crash, leak or undefined behaviour in our code around libxml2, whatever the
// store sends.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "storage/s3/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool initialised = (tessera::s3::InitXml(), true);
  (void)initialised;
  const absl::string_view xml(reinterpret_cast<const char*>(data), size);
  tessera::s3::ParseListObjectsV2(xml).IgnoreError();
  tessera::s3::ParseListMultipartUploads(xml).IgnoreError();
  tessera::s3::ParseInitiateMultipartUpload(xml).IgnoreError();
  tessera::s3::ParseCompleteMultipartUpload(xml).IgnoreError();
  tessera::s3::ParseError(xml).IgnoreError();
  tessera::s3::IsErrorReply(xml);
  tessera::s3::ParseDeleteResult(xml).IgnoreError();
  return 0;
}
