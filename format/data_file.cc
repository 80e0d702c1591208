#include "format/data_file.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/box.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor_key.h"

namespace tessera {
namespace {

uint64_t AlignUp(uint64_t v) { return (v + kDataAlignment - 1) / kDataAlignment * kDataAlignment; }

absl::Status Malformed(int index, absl::string_view key, absl::string_view what) {
  // ErrorDetail.message is a proto3 string: it must stay valid UTF-8 whatever the key holds.
  const std::string printable = IsValidUtf8(key) ? std::string(key) : absl::CHexEscape(key);
  return MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_MALFORMED_SHARD,
                   absl::StrCat("chunk ", index, " (\"", printable, "\"): ", what));
}

void AppendEntry(std::string* json, absl::string_view name, absl::string_view dtype,
                 const std::vector<int64_t>& shape, uint64_t begin, uint64_t end) {
  json->push_back(',');
  AppendJsonString(json, name);
  absl::StrAppend(json, ":{\"dtype\":\"", dtype, "\",\"shape\":[");
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) json->push_back(',');
    absl::StrAppend(json, shape[i]);
  }
  absl::StrAppend(json, "],\"data_offsets\":[", begin, ",", end, "]}");
}

}  // namespace

void AppendJsonString(std::string* out, absl::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20 || c == 0x7f) {
      out->append("\\u00");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xf]);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

absl::StatusOr<FileLayout> ComputeFileLayout(absl::Span<const ChunkSpec> items) {
  FileLayout layout;
  layout.items.reserve(items.size());
  absl::flat_hash_set<std::string> names;
  names.reserve(items.size());

  std::string json = "{\"__metadata__\":{\"format\":";
  AppendJsonString(&json, kMetadataFormat);
  json += ",\"version\":";
  AppendJsonString(&json, kMetadataVersion);
  json += "}";

  uint64_t cursor = 0;  // end of the data section so far
  int pads = 0;
  auto pad_to = [&](uint64_t target) {
    if (target == cursor) return;
    const std::string name = absl::StrCat("__tessera_pad_", pads++, "__");
    AppendEntry(&json, name, "U8", {static_cast<int64_t>(target - cursor)}, cursor, target);
    layout.padding.push_back(PaddingRange{cursor, target - cursor});
    cursor = target;
  };

  for (int i = 0; i < static_cast<int>(items.size()); ++i) {
    const ChunkSpec& item = items[i];
    if (!IsKnownDType(item.dtype)) return Malformed(i, item.key, "unknown dtype");
    if (!IsValidUtf8(item.key)) return Malformed(i, item.key, "key is not valid UTF-8");
    const Box box = BoxFromProto(item.box);
    if (box.offsets.size() != box.lengths.size()) {
      return Malformed(i, item.key, "box offsets and lengths differ in rank");
    }
    for (size_t axis = 0; axis < box.rank(); ++axis) {
      if (box.offsets[axis] < 0 || box.lengths[axis] < 0) {
        return Malformed(i, item.key, absl::StrCat("negative box on axis ", axis));
      }
    }
    absl::StatusOr<int64_t> volume = Volume(box);
    if (!volume.ok()) return Malformed(i, item.key, volume.status().message());
    const uint64_t elem = DTypeSize(item.dtype);
    const uint64_t elements = static_cast<uint64_t>(*volume);
    if (elements != 0 && elem > UINT64_MAX / elements) {
      return Malformed(i, item.key, "byte size overflows");
    }
    if (elements * elem != item.nbytes) {
      return Malformed(i, item.key,
                       absl::StrCat("nbytes is ", item.nbytes, " but box ", BoxToString(box),
                                    " of ", DTypeName(item.dtype), " holds ", elements * elem));
    }
    FileLayoutItem out;
    out.key = item.key;
    out.box = item.box;
    out.dtype = item.dtype;
    out.name = ChunkName(item.key, box);
    out.nbytes = item.nbytes;
    if (!names.insert(out.name).second) {
      return Malformed(i, item.key, absl::StrCat("chunk \"", out.name, "\" appears twice"));
    }
    pad_to(AlignUp(cursor));
    out.staging_offset = cursor;
    AppendEntry(&json, out.name, DTypeName(out.dtype), box.lengths, cursor, cursor + out.nbytes);
    cursor += out.nbytes;
    layout.items.push_back(std::move(out));
  }
  pad_to(AlignUp(cursor));  // the file ends on a 4 KiB boundary: every write can be O_DIRECT
  json += "}";

  layout.data_size = cursor;
  layout.data_start = AlignUp(8 + json.size());
  const uint64_t n = layout.data_start - 8;
  if (n > kMaxSafetensorsHeaderBytes) {
    return MakeError(absl::StatusCode::kInvalidArgument, v1::ERROR_CODE_PLAN_TOO_LARGE,
                     absl::StrCat("the data file's header for ", items.size(), " chunks needs ",
                                  n, " bytes; safetensors allows ",
                                  kMaxSafetensorsHeaderBytes));
  }
  layout.header.reserve(layout.data_start);
  for (int b = 0; b < 8; ++b) layout.header.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  layout.header += json;
  layout.header.resize(layout.data_start, ' ');
  for (FileLayoutItem& item : layout.items) {
    item.file_offset = layout.data_start + item.staging_offset;
  }
  return layout;
}

void ZeroPadding(const FileLayout& layout, void* staging) {
  char* base = static_cast<char*>(staging);
  for (const PaddingRange& pad : layout.padding) memset(base + pad.staging_offset, 0, pad.nbytes);
}

bool PaddingIsZero(const FileLayout& layout, const void* staging) {
  const auto* base = static_cast<const unsigned char*>(staging);
  for (const PaddingRange& pad : layout.padding) {
    const unsigned char* p = base + pad.staging_offset;
    for (uint64_t i = 0; i < pad.nbytes; ++i) {
      if (p[i] != 0) return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

// A strict reader of the safetensors JSON subset over a bounded buffer. Every access checks
// `pos_ < text_.size()`; recursion is fixed (object -> entry -> array), so input cannot make
// it deep.
class HeaderParser {
 public:
  // `base` is the file offset of text[0], for error positions.
  HeaderParser(absl::string_view text, uint64_t base) : text_(text), base_(base) {}

  absl::Status Parse(SafetensorsHeader* out) {
    if (!IsValidUtf8(text_)) return Error("the header is not valid UTF-8");
    SkipWs();
    // Safetensors requires the header to start with '{' (no leading whitespace).
    if (pos_ != 0) return Error("the header must start with '{'");
    RETURN_IF_ERROR(Expect('{'));
    absl::flat_hash_set<std::string> names;
    bool saw_metadata = false;
    SkipWs();
    if (Peek() == '}') {
      ++pos_;
    } else {
      while (true) {
        SkipWs();
        std::string name;
        RETURN_IF_ERROR(ParseString(&name));
        SkipWs();
        RETURN_IF_ERROR(Expect(':'));
        SkipWs();
        if (name == "__metadata__") {
          if (saw_metadata) return Error("\"__metadata__\" appears twice");
          saw_metadata = true;
          RETURN_IF_ERROR(ParseMetadata(&out->metadata));
        } else {
          if (!names.insert(name).second) {
            return Error(absl::StrCat("entry \"", name, "\" appears twice"));
          }
          SafetensorsEntry entry;
          entry.name = std::move(name);
          RETURN_IF_ERROR(ParseEntry(&entry));
          out->entries.push_back(std::move(entry));
        }
        SkipWs();
        if (Peek() == ',') {
          ++pos_;
          continue;
        }
        RETURN_IF_ERROR(Expect('}'));
        break;
      }
    }
    SkipWs();
    if (pos_ != text_.size()) return Error("unexpected bytes after the header object");
    return absl::OkStatus();
  }

 private:
  static constexpr int kEnd = -1;

  int Peek() const {
    return pos_ < text_.size() ? static_cast<unsigned char>(text_[pos_]) : kEnd;
  }

  void SkipWs() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat("safetensors header: ", what, " at byte ", base_ + pos_));
  }

  absl::Status Expect(char c) {
    if (Peek() != static_cast<unsigned char>(c)) {
      if (Peek() == kEnd) return Error(absl::StrCat("expected '", std::string(1, c), "', found the end"));
      return Error(absl::StrCat("expected '", std::string(1, c), "'"));
    }
    ++pos_;
    return absl::OkStatus();
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    *out = v;
    return absl::OkStatus();
  }

  static void AppendUtf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  absl::Status ParseString(std::string* out) {
    RETURN_IF_ERROR(Expect('"'));
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("unescaped control character in a string");
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          RETURN_IF_ERROR(ParseHex4(&cp));
          if (cp >= 0xdc00 && cp <= 0xdfff) return Error("unpaired low surrogate");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
              return Error("unpaired high surrogate");
            }
            pos_ += 2;
            uint32_t low = 0;
            RETURN_IF_ERROR(ParseHex4(&low));
            if (low < 0xdc00 || low > 0xdfff) return Error("unpaired high surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return Error("bad escape in a string");
      }
    }
  }

  absl::Status ParseUint(uint64_t* out) {
    if (Peek() == '-') return Error("negative number");
    if (Peek() < '0' || Peek() > '9') return Error("expected a non-negative integer");
    if (Peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      return Error("number with a leading zero");
    }
    uint64_t v = 0;
    while (Peek() >= '0' && Peek() <= '9') {
      const uint64_t d = static_cast<uint64_t>(Peek() - '0');
      if (v > (UINT64_MAX - d) / 10) return Error("number overflows 64 bits");
      v = v * 10 + d;
      ++pos_;
    }
    if (Peek() == '.' || Peek() == 'e' || Peek() == 'E') return Error("expected an integer");
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseUintArray(std::vector<uint64_t>* out) {
    RETURN_IF_ERROR(Expect('['));
    SkipWs();
    if (Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipWs();
      uint64_t v;
      RETURN_IF_ERROR(ParseUint(&v));
      out->push_back(v);
      SkipWs();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      return Expect(']');
    }
  }

  absl::Status ParseMetadata(std::vector<std::pair<std::string, std::string>>* out) {
    RETURN_IF_ERROR(Expect('{'));
    SkipWs();
    if (Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    absl::flat_hash_set<std::string> keys;
    while (true) {
      SkipWs();
      std::string key, value;
      RETURN_IF_ERROR(ParseString(&key));
      SkipWs();
      RETURN_IF_ERROR(Expect(':'));
      SkipWs();
      if (Peek() != '"') return Error("metadata values must be strings");
      RETURN_IF_ERROR(ParseString(&value));
      if (!keys.insert(key).second) {
        return Error(absl::StrCat("metadata key \"", key, "\" appears twice"));
      }
      out->emplace_back(std::move(key), std::move(value));
      SkipWs();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      return Expect('}');
    }
  }

  absl::Status ParseEntry(SafetensorsEntry* entry) {
    RETURN_IF_ERROR(Expect('{'));
    bool has_dtype = false, has_shape = false, has_offsets = false;
    SkipWs();
    if (Peek() != '}') {
      while (true) {
        SkipWs();
        std::string field;
        RETURN_IF_ERROR(ParseString(&field));
        SkipWs();
        RETURN_IF_ERROR(Expect(':'));
        SkipWs();
        auto once = [&](bool* seen) -> absl::Status {
          if (*seen) return Error(absl::StrCat("field \"", field, "\" appears twice"));
          *seen = true;
          return absl::OkStatus();
        };
        if (field == "dtype") {
          RETURN_IF_ERROR(once(&has_dtype));
          if (Peek() != '"') return Error("\"dtype\" must be a string");
          RETURN_IF_ERROR(ParseString(&entry->dtype));
        } else if (field == "shape") {
          RETURN_IF_ERROR(once(&has_shape));
          RETURN_IF_ERROR(ParseUintArray(&entry->shape));
        } else if (field == "data_offsets") {
          RETURN_IF_ERROR(once(&has_offsets));
          std::vector<uint64_t> offsets;
          RETURN_IF_ERROR(ParseUintArray(&offsets));
          if (offsets.size() != 2) return Error("\"data_offsets\" must hold two integers");
          if (offsets[0] > offsets[1]) return Error("\"data_offsets\" begin exceeds end");
          entry->begin = offsets[0];
          entry->end = offsets[1];
        } else {
          return Error(absl::StrCat("unknown field \"", field, "\" in entry \"", entry->name,
                                    "\""));
        }
        SkipWs();
        if (Peek() == ',') {
          ++pos_;
          continue;
        }
        RETURN_IF_ERROR(Expect('}'));
        break;
      }
    } else {
      ++pos_;
    }
    if (!has_dtype || !has_shape || !has_offsets) {
      return Error(absl::StrCat("entry \"", entry->name,
                                "\" lacks one of \"dtype\", \"shape\", \"data_offsets\""));
    }
    return absl::OkStatus();
  }

  const absl::string_view text_;
  const uint64_t base_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<uint64_t> ParseSafetensorsHeaderSize(absl::string_view prefix) {
  if (prefix.size() < 8) {
    return absl::DataLossError(absl::StrCat("safetensors file of ", prefix.size(),
                                            " bytes is shorter than its 8-byte length prefix"));
  }
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(prefix[b]);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::DataLossError(absl::StrCat("safetensors header length ", n, " exceeds ",
                                            kMaxSafetensorsHeaderBytes));
  }
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes) {
  ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsHeaderSize(bytes));
  if (bytes.size() - 8 < n) {
    return absl::DataLossError(absl::StrCat("safetensors header of ", n, " bytes is truncated: ",
                                            bytes.size() - 8, " bytes follow the length"));
  }
  SafetensorsHeader header;
  header.json_size = n;
  header.data_start = 8 + n;
  HeaderParser parser(bytes.substr(8, n), 8);
  RETURN_IF_ERROR(parser.Parse(&header));
  return header;
}

absl::Status ValidateSafetensorsLayout(const SafetensorsHeader& header, uint64_t file_size) {
  if (file_size < header.data_start) {
    return absl::DataLossError(absl::StrCat("file of ", file_size, " bytes ends inside its ",
                                            header.data_start, "-byte header"));
  }
  std::vector<const SafetensorsEntry*> sorted;
  sorted.reserve(header.entries.size());
  for (const SafetensorsEntry& entry : header.entries) {
    absl::StatusOr<v1::DType> dtype = DTypeFromName(entry.dtype);
    if (!dtype.ok()) {
      return absl::DataLossError(
          absl::StrCat("entry \"", entry.name, "\": unknown dtype \"", entry.dtype, "\""));
    }
    uint64_t bytes = DTypeSize(*dtype);
    for (uint64_t d : entry.shape) {
      if (d != 0 && bytes > UINT64_MAX / d) {
        return absl::DataLossError(absl::StrCat("entry \"", entry.name, "\": shape overflows"));
      }
      bytes *= d;
    }
    if (bytes != entry.end - entry.begin) {
      return absl::DataLossError(absl::StrCat("entry \"", entry.name, "\": ", entry.dtype,
                                              " shape needs ", bytes, " bytes but data_offsets [",
                                              entry.begin, ", ", entry.end, ") hold ",
                                              entry.end - entry.begin));
    }
    sorted.push_back(&entry);
  }
  std::sort(sorted.begin(), sorted.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  uint64_t cursor = 0;
  for (const SafetensorsEntry* entry : sorted) {
    if (entry->begin != cursor) {
      return absl::DataLossError(absl::StrCat(
          "entry \"", entry->name, "\" starts at data offset ", entry->begin, " but ",
          entry->begin > cursor ? "a hole" : "an overlap", " precedes it (expected ", cursor, ")"));
    }
    cursor = entry->end;
  }
  const uint64_t data_size = file_size - header.data_start;
  if (cursor != data_size) {
    return absl::DataLossError(absl::StrCat("entries cover ", cursor,
                                            " bytes of a data section of ", data_size));
  }
  return absl::OkStatus();
}

}  // namespace tessera
