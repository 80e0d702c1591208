#include "common/dtype.h"

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

struct DTypeInfo {
  v1::DType dtype;
  size_t size;
  absl::string_view name;
};

constexpr DTypeInfo kDTypes[] = {
    {v1::DTYPE_BOOL, 1, "BOOL"},       {v1::DTYPE_U8, 1, "U8"},
    {v1::DTYPE_I8, 1, "I8"},           {v1::DTYPE_I16, 2, "I16"},
    {v1::DTYPE_U16, 2, "U16"},         {v1::DTYPE_I32, 4, "I32"},
    {v1::DTYPE_U32, 4, "U32"},         {v1::DTYPE_I64, 8, "I64"},
    {v1::DTYPE_U64, 8, "U64"},         {v1::DTYPE_F16, 2, "F16"},
    {v1::DTYPE_BF16, 2, "BF16"},       {v1::DTYPE_F32, 4, "F32"},
    {v1::DTYPE_F64, 8, "F64"},         {v1::DTYPE_F8_E4M3, 1, "F8_E4M3"},
    {v1::DTYPE_F8_E5M2, 1, "F8_E5M2"},
};

const DTypeInfo* Find(v1::DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

size_t DTypeSize(v1::DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? 0 : info->size;
}

bool IsKnownDType(v1::DType dtype) { return Find(dtype) != nullptr; }

absl::string_view DTypeName(v1::DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? absl::string_view() : info->name;
}

absl::StatusOr<v1::DType> DTypeFromName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

}  // namespace tessera
