// Key encoding for the coordinator's state store: composite keys whose byte order is the
// order of their parts, so that one ordered Scan walks a job's sessions by step, a session's
// chunks by rank, and so on.
//
//   KeyJoin({"job-a", "sessions", EncodeOrderedInt64(step)})
//
// A key is its components joined by kKeySeparator (0x00). Inside a component 0x00 is written
// as 0x01 0x01 and 0x01 as 0x01 0x02, so every component byte that follows the separator's
// position is >= 0x01 and components may hold any bytes (encoded integers, proto bytes). The
// escape keeps byte order, which gives, for any component lists a and b:
//
//   KeyJoin(a) < KeyJoin(b) (bytewise)  <=>  a < b (lexicographically, component by component)
//
// and KeyPrefix(a) is a prefix of KeyJoin(b) exactly when a is a leading part of b.
// Printable components stay readable in `ldb` dumps.
//
// Integers are fixed width (8 bytes) and big-endian; signed ones have their sign bit flipped,
// so that numeric order is byte order, negatives included.
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_SERVER_STORE_KEYS_H_
#define TESSERA_SERVER_STORE_KEYS_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

inline constexpr char kKeySeparator = '\0';

// 8 bytes, big-endian, sign bit flipped: order of the bytes == order of the values.
std::string EncodeOrderedInt64(int64_t value);
// 8 bytes, big-endian.
std::string EncodeOrderedUint64(uint64_t value);

// Errors: InvalidArgument if `bytes` is not exactly 8 bytes long.
absl::StatusOr<int64_t> DecodeOrderedInt64(absl::string_view bytes);
// Errors: InvalidArgument if `bytes` is not exactly 8 bytes long.
absl::StatusOr<uint64_t> DecodeOrderedUint64(absl::string_view bytes);

// The components, escaped and joined by kKeySeparator. KeyJoin({}) and KeyJoin({""}) are
// both the empty key, so give at least one component.
std::string KeyJoin(std::initializer_list<absl::string_view> components);
std::string KeyJoin(const std::vector<std::string>& components);

// KeyJoin(components) followed by kKeySeparator: the Scan prefix of every key whose leading
// components are `components` ("job", "s12" does not match "job", "s123").
std::string KeyPrefix(std::initializer_list<absl::string_view> components);
std::string KeyPrefix(const std::vector<std::string>& components);

// The components of a KeyJoin result. KeySplit("") is {""}.
// Errors: InvalidArgument if `key` holds an escape byte not followed by 0x01 or 0x02.
absl::StatusOr<std::vector<std::string>> KeySplit(absl::string_view key);

// The smallest key greater than every key that starts with `prefix`, or "" when there is
// none (the prefix is empty or all 0xFF): the exclusive end of a prefix range, where ""
// means "to the end of the table".
std::string PrefixSuccessor(absl::string_view prefix);

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_KEYS_H_
