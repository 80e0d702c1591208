#include "server/store/keys.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

constexpr char kEscape = '\x01';
// kEscape followed by these stands for 0x00 and 0x01.
constexpr char kEscapedSeparator = '\x01';
constexpr char kEscapedEscape = '\x02';

void AppendEscaped(absl::string_view component, std::string* out) {
  for (char c : component) {
    if (c == kKeySeparator) {
      out->push_back(kEscape);
      out->push_back(kEscapedSeparator);
    } else if (c == kEscape) {
      out->push_back(kEscape);
      out->push_back(kEscapedEscape);
    } else {
      out->push_back(c);
    }
  }
}

template <typename Range>
std::string JoinRange(const Range& components) {
  std::string key;
  bool first = true;
  for (absl::string_view component : components) {
    if (!first) key.push_back(kKeySeparator);
    first = false;
    AppendEscaped(component, &key);
  }
  return key;
}

absl::Status CheckFixedWidth(absl::string_view bytes) {
  if (bytes.size() == 8) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "an ordered integer key component must be 8 bytes, got ", bytes.size()));
}

}  // namespace

std::string EncodeOrderedUint64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(value & 0xFF);
    value >>= 8;
  }
  return out;
}

std::string EncodeOrderedInt64(int64_t value) {
  // Flipping the sign bit maps INT64_MIN..INT64_MAX onto 0..UINT64_MAX in order.
  return EncodeOrderedUint64(static_cast<uint64_t>(value) ^ (uint64_t{1} << 63));
}

absl::StatusOr<uint64_t> DecodeOrderedUint64(absl::string_view bytes) {
  if (absl::Status s = CheckFixedWidth(bytes); !s.ok()) return s;
  uint64_t value = 0;
  for (char c : bytes) value = (value << 8) | static_cast<uint8_t>(c);
  return value;
}

absl::StatusOr<int64_t> DecodeOrderedInt64(absl::string_view bytes) {
  absl::StatusOr<uint64_t> raw = DecodeOrderedUint64(bytes);
  if (!raw.ok()) return raw.status();
  return static_cast<int64_t>(*raw ^ (uint64_t{1} << 63));
}

std::string KeyJoin(std::initializer_list<absl::string_view> components) {
  return JoinRange(components);
}

std::string KeyJoin(const std::vector<std::string>& components) { return JoinRange(components); }

std::string KeyPrefix(std::initializer_list<absl::string_view> components) {
  std::string prefix = JoinRange(components);
  prefix.push_back(kKeySeparator);
  return prefix;
}

std::string KeyPrefix(const std::vector<std::string>& components) {
  std::string prefix = JoinRange(components);
  prefix.push_back(kKeySeparator);
  return prefix;
}

absl::StatusOr<std::vector<std::string>> KeySplit(absl::string_view key) {
  std::vector<std::string> components(1);
  for (size_t i = 0; i < key.size(); ++i) {
    const char c = key[i];
    if (c == kKeySeparator) {
      components.emplace_back();
    } else if (c == kEscape) {
      const char next = i + 1 < key.size() ? key[i + 1] : '\0';
      if (next == kEscapedSeparator) {
        components.back().push_back(kKeySeparator);
      } else if (next == kEscapedEscape) {
        components.back().push_back(kEscape);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("malformed key: escape byte at offset ", i,
                         " is not followed by 0x01 or 0x02"));
      }
      ++i;
    } else {
      components.back().push_back(c);
    }
  }
  return components;
}

std::string PrefixSuccessor(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last != 0xFF) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return end;
}

}  // namespace tessera
