#ifndef MNEME_CHECKPOINT_DTYPE_H_
#define MNEME_CHECKPOINT_DTYPE_H_

#include <cstddef>
#include <optional>

#include "absl/strings/string_view.h"

namespace mneme::checkpoint {

// Element types of safetensors tensors that Mneme reads and writes. The
// spelling of each in a safetensors header is given by DTypeName().
enum class DType {
  kBf16,    // "BF16"
  kF16,     // "F16"
  kF32,     // "F32"
  kF8E4M3,  // "F8_E4M3" (the "fn" variant: no infinities)
  kF8E8M0,  // "F8_E8M0" (UE8M0 power-of-two scales)
  kU8,      // "U8"
  kI8,      // "I8"
  kI32,     // "I32"
  kI64,     // "I64"
  kI16,     // "I16" (EXL3 trellis words and packed signs)
};

// Every DType, in declaration order (for tests and tools).
inline constexpr DType kAllDTypes[] = {
    DType::kBf16, DType::kF16, DType::kF32, DType::kF8E4M3, DType::kF8E8M0,
    DType::kU8,   DType::kI8,  DType::kI32, DType::kI64,    DType::kI16,
};

// Bytes per element.
constexpr size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
    case DType::kF16:
    case DType::kI16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF8E4M3:
    case DType::kF8E8M0:
    case DType::kU8:
    case DType::kI8:
      return 1;
    case DType::kI64:
      return 8;
  }
  return 0;
}

// The safetensors spelling, e.g. "F8_E4M3".
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName(); nullopt for a spelling Mneme does not support
// (including valid safetensors dtypes such as "F64" or "BOOL").
std::optional<DType> ParseDTypeName(absl::string_view name);

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_DTYPE_H_
