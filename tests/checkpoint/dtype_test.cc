#include "checkpoint/dtype.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace mneme::checkpoint {
namespace {

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::kBf16), "BF16");
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(DTypeName(DType::kF8E8M0), "F8_E8M0");
  EXPECT_EQ(DTypeSize(DType::kBf16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E8M0), 1u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(DType::kI8), 1u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kI16), 2u);
}

TEST(DTypeTest, ParseInvertsName) {
  std::set<std::string> names;
  for (DType dtype : kAllDTypes) {
    names.insert(std::string(DTypeName(dtype)));
    std::optional<DType> parsed = ParseDTypeName(DTypeName(dtype));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(names.size(), 10u);
  for (const char* unsupported :
       {"F64", "BOOL", "U16", "bf16", "", "F8_E5M2"}) {
    EXPECT_FALSE(ParseDTypeName(unsupported).has_value()) << unsupported;
  }
}

}  // namespace
}  // namespace mneme::checkpoint
