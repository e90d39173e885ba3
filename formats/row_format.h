#ifndef MNEME_FORMATS_ROW_FORMAT_H_
#define MNEME_FORMATS_ROW_FORMAT_H_

#include <cstddef>
#include <cstdint>

namespace mneme::formats {

// How the rows of an Engram table are stored (ENGRAM.md, "Checkpoint layout").
enum class RowFormat {
  kUnspecified = 0,
  // 256 x e4m3 values + 8 x UE8M0 scales (one per 32 values): 264 bytes.
  kFp8 = 1,
  // 128 bytes of packed e2m1 pairs (low nibble = even element) + 16 x e4m3
  // scales (one per 16 values), times one fp32 global scale per table:
  // 144 bytes.
  kNvfp4 = 2,
};

// Values per row (engram_head_dim).
inline constexpr int kRowDim = 256;

inline constexpr size_t kFp8WeightBytes = 256;
inline constexpr size_t kFp8ScaleBytes = 8;
inline constexpr int kFp8BlockSize = 32;
inline constexpr size_t kNvfp4WeightBytes = 128;
inline constexpr size_t kNvfp4ScaleBytes = 16;
inline constexpr int kNvfp4BlockSize = 16;

// Bytes of the weight part of one row.
constexpr size_t RowWeightBytes(RowFormat format) {
  return format == RowFormat::kFp8     ? kFp8WeightBytes
         : format == RowFormat::kNvfp4 ? kNvfp4WeightBytes
                                       : 0;
}

// Bytes of the scale part of one row.
constexpr size_t RowScaleBytes(RowFormat format) {
  return format == RowFormat::kFp8     ? kFp8ScaleBytes
         : format == RowFormat::kNvfp4 ? kNvfp4ScaleBytes
                                       : 0;
}

// Bytes of one encoded row: weight bytes immediately followed by scale bytes
// (the "raw" row the store caches and serves).
constexpr size_t RowBytes(RowFormat format) {
  return RowWeightBytes(format) + RowScaleBytes(format);
}

// "fp8" / "nvfp4" / "unspecified".
constexpr const char* RowFormatName(RowFormat format) {
  return format == RowFormat::kFp8     ? "fp8"
         : format == RowFormat::kNvfp4 ? "nvfp4"
                                       : "unspecified";
}

}  // namespace mneme::formats

#endif  // MNEME_FORMATS_ROW_FORMAT_H_
