#include "checkpoint/dtype.h"

namespace mneme::checkpoint {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kI16:
      return "I16";
  }
  return "INVALID";
}

std::optional<DType> ParseDTypeName(absl::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (DTypeName(dtype) == name) return dtype;
  }
  return std::nullopt;
}

}  // namespace mneme::checkpoint
