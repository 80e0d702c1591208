// Element types: sizes and safetensors names.
//
// Thread-safety: free functions over constant tables.
#ifndef TESSERA_COMMON_DTYPE_H_
#define TESSERA_COMMON_DTYPE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Bytes per element; 0 for DTYPE_UNSPECIFIED and values outside the enum.
size_t DTypeSize(v1::DType dtype);

// True for every enum value except UNSPECIFIED.
bool IsKnownDType(v1::DType dtype);

// The safetensors dtype string ("F32", "BF16", "F8_E4M3", ...). Empty for unknown dtypes.
absl::string_view DTypeName(v1::DType dtype);

// Inverse of DTypeName. Errors: InvalidArgument naming `name` if it is not a known dtype.
absl::StatusOr<v1::DType> DTypeFromName(absl::string_view name);

}  // namespace tessera

#endif  // TESSERA_COMMON_DTYPE_H_
