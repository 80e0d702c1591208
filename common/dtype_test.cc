#include "common/dtype.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(DType, EveryEnumValue_HasSizeAndRoundTrippingName) {
  const google::protobuf::EnumDescriptor* desc = v1::DType_descriptor();
  std::set<std::string> names;
  for (int i = 0; i < desc->value_count(); ++i) {
    auto dtype = static_cast<v1::DType>(desc->value(i)->number());
    if (dtype == v1::DTYPE_UNSPECIFIED) continue;
    SCOPED_TRACE(desc->value(i)->name());
    EXPECT_TRUE(IsKnownDType(dtype));
    size_t size = DTypeSize(dtype);
    EXPECT_TRUE(size == 1 || size == 2 || size == 4 || size == 8) << size;
    std::string name(DTypeName(dtype));
    ASSERT_FALSE(name.empty());
    // The safetensors name is the enum name without its prefix.
    EXPECT_EQ("DTYPE_" + name, desc->value(i)->name());
    EXPECT_TRUE(names.insert(name).second) << "duplicate name " << name;
    absl::StatusOr<v1::DType> back = DTypeFromName(name);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, dtype);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(desc->value_count() - 1));
}

TEST(DType, Sizes_MatchElementWidths) {
  EXPECT_EQ(DTypeSize(v1::DTYPE_BOOL), 1u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_U8), 1u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_I8), 1u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_I16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_U16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_I32), 4u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_U32), 4u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_I64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_U64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_F16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BF16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_F32), 4u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_F64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_F8_E4M3), 1u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_F8_E5M2), 1u);
}

TEST(DType, SafetensorsNames) {
  EXPECT_EQ(DTypeName(v1::DTYPE_F32), "F32");
  EXPECT_EQ(DTypeName(v1::DTYPE_BF16), "BF16");
  EXPECT_EQ(DTypeName(v1::DTYPE_F8_E4M3), "F8_E4M3");
  EXPECT_EQ(DTypeName(v1::DTYPE_BOOL), "BOOL");
}

TEST(DType, Unspecified_IsUnknown) {
  EXPECT_FALSE(IsKnownDType(v1::DTYPE_UNSPECIFIED));
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_TRUE(DTypeName(v1::DTYPE_UNSPECIFIED).empty());
}

TEST(DType, OutOfEnumValues_AreUnknown) {
  for (int v : {-1, 16, 99, 1 << 20}) {
    auto dtype = static_cast<v1::DType>(v);
    EXPECT_FALSE(IsKnownDType(dtype)) << v;
    EXPECT_EQ(DTypeSize(dtype), 0u) << v;
    EXPECT_TRUE(DTypeName(dtype).empty()) << v;
  }
}

TEST(DType, UnknownNames_Rejected) {
  for (const char* name : {"", "f32", "FLOAT", "F32 ", " F32", "DTYPE_F32", "UNSPECIFIED",
                           "F8", "BF16\n"}) {
    absl::StatusOr<v1::DType> got = DTypeFromName(name);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << '"' << name << '"';
  }
  absl::StatusOr<v1::DType> got = DTypeFromName("Q4_K");
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("Q4_K"), absl::string_view::npos);
}

}  // namespace
}  // namespace tessera
