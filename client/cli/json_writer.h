// JsonWriter: builds one pretty-printed JSON document for the CLI's --json output of things
// that are not protos (verify reports, inspect summaries, export reports). Protos are printed
// with protobuf's own JSON printer and embedded with Raw().
//
//   JsonWriter w;
//   w.BeginObject().Key("ok").Bool(true).Key("problems").BeginArray().EndArray().EndObject();
//   std::string text = w.Finish();  // "{\n  \"ok\": true,\n  \"problems\": []\n}\n"
//
// Strings are escaped per RFC 8259; bytes that are not valid UTF-8 are written as "\u00XX"
// (their Latin-1 reading), so the output is always valid JSON. Misuse (a value where a key is
// due, unbalanced Begin/End) is a programming error, caught by tests, not reported at run time.
//
// Thread-safety: not thread-safe; one writer per document.
#ifndef TESSERA_CLIENT_CLI_JSON_WRITER_H_
#define TESSERA_CLIENT_CLI_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace tessera {
namespace cli {

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();

  // The next member's name; must be inside an object and followed by one value.
  JsonWriter& Key(absl::string_view key);

  JsonWriter& String(absl::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // An already-serialized JSON value (e.g. MessageToJsonString output), inserted verbatim.
  JsonWriter& Raw(absl::string_view json);

  // The document followed by '\n'. The writer is left empty.
  std::string Finish();

 private:
  struct Level {
    bool object;
    int count;
  };
  // Separator and indentation before a value or key at the current level.
  void BeforeItem();
  void Newline();

  std::string out_;
  std::vector<Level> stack_;
  bool after_key_ = false;
};

// `message` as proto3 JSON with the .proto field names and every field printed (zeros
// included, so scripts need no defaults); pretty-printed if `pretty`, else on one line.
// Errors: Internal if protobuf's printer fails (it does not for valid messages).
absl::StatusOr<std::string> ProtoToJson(const google::protobuf::Message& message, bool pretty);

// Appends `s` as a JSON string literal (quotes included), escaped as described above.
void AppendJsonQuoted(std::string* out, absl::string_view s);

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_JSON_WRITER_H_
