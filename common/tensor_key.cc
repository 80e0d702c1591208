#include "common/tensor_key.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace {

// Length of the UTF-8 sequence starting at s[i], or 0 if it is not well formed: truncated,
// a bad continuation byte, an overlong encoding, a UTF-16 surrogate or beyond U+10FFFF
// (the Unicode Standard's table 3-7, which is what strict decoders such as Python's and
// Rust's accept).
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // beyond U+10FFFF
  } else {
    return 0;  // continuation byte, overlong C0/C1, or F5..FF
  }
  if (i + len > s.size()) return 0;
  const auto second = static_cast<unsigned char>(s[i + 1]);
  if (second < lo || second > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  }
  return len;
}

// True for C0 controls, DEL and C1 controls (U+0080..U+009F, encoded C2 80..C2 9F).
bool IsControl(absl::string_view s, size_t i, size_t len) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (len == 1) return c < 0x20 || c == 0x7F;
  return len == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) <= 0x9F;
}

}  // namespace

absl::Status ValidateName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("name is empty");
  if (name.size() > kMaxFqnBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("name is ", name.size(), " bytes long; the limit is ", kMaxFqnBytes));
  }
  for (size_t i = 0; i < name.size();) {
    size_t len = Utf8SequenceLength(name, i);
    if (len == 0) {
      return absl::InvalidArgumentError(absl::StrCat("name is not valid UTF-8 at byte ", i));
    }
    const auto c = static_cast<unsigned char>(name[i]);
    if (IsControl(name, i, len)) {
      return absl::InvalidArgumentError(
          absl::StrCat("name has a control character at byte ", i));
    }
    if (c == '#' || c == '@') {
      return absl::InvalidArgumentError(
          absl::StrCat("name contains reserved character '", std::string(1, name[i]), "'"));
    }
    i += len;
  }
  return absl::OkStatus();
}

std::string PrintableName(absl::string_view name) {
  return ValidateName(name).ok() ? std::string(name) : absl::CHexEscape(name);
}

std::string TensorKey(v1::ShardKind kind, absl::string_view fqn, absl::string_view state_key,
                      uint32_t rank) {
  switch (kind) {
    case v1::SHARD_KIND_OPTIMIZER:
      return absl::StrCat(fqn, "#", state_key);
    case v1::SHARD_KIND_EXTRA:
      return absl::StrCat(fqn, "#rank", rank);
    default:
      return std::string(fqn);
  }
}

std::string TensorKeyOf(const v1::ShardDesc& shard, uint32_t rank) {
  return TensorKey(shard.kind(), shard.fqn(), shard.state_key(), rank);
}

std::string ChunkName(absl::string_view key, const Box& box) {
  return absl::StrCat(key, "@", absl::StrJoin(box.offsets, ","));
}

absl::StatusOr<ParsedChunkName> ParseChunkName(absl::string_view name) {
  size_t at = name.rfind('@');
  if (at == absl::string_view::npos || at == 0) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is not a chunk name"));
  }
  ParsedChunkName parsed;
  parsed.key = std::string(name.substr(0, at));
  absl::string_view offsets = name.substr(at + 1);
  if (offsets.empty()) return parsed;  // 0-d tensor
  for (absl::string_view part : absl::StrSplit(offsets, ',')) {
    // Only the canonical form ChunkName writes: decimal digits (SimpleAtoi alone would also
    // take a sign and surrounding whitespace).
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) {
      return ch >= '0' && ch <= '9';
    });
    int64_t v = 0;
    if (!digits || !absl::SimpleAtoi(part, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk name \"", name, "\" has a bad offset \"", part, "\""));
    }
    parsed.offsets.push_back(v);
  }
  return parsed;
}

}  // namespace tessera
