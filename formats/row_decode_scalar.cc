// Scalar reference decoders (see row_decode_kernels.h for the contract).

#include <cstddef>
#include <cstdint>

#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/row_decode_kernels.h"
#include "formats/row_format.h"
#include "formats/ue8m0.h"

namespace mneme::formats::row_decode_internal {
namespace {

// Calls store(index, fp32 value) for every value of every row, in order.
template <typename Store>
void ForEachFp8Value(const EncodedRows& rows, Store store) {
  for (size_t r = 0; r < rows.num_rows; ++r) {
    const uint8_t* weights = rows.weights + r * rows.weight_stride;
    const uint8_t* scales = rows.scales + r * rows.scale_stride;
    size_t index = r * kRowDim;
    for (size_t block = 0; block < kFp8ScaleBytes; ++block) {
      const float scale = Ue8m0ToFloat(scales[block]);
      const uint8_t* codes = weights + block * kFp8BlockSize;
      for (int j = 0; j < kFp8BlockSize; ++j) {
        store(index++, E4m3ToFloat(codes[j]) * scale);
      }
    }
  }
}

template <typename Store>
void ForEachNvfp4Value(const EncodedRows& rows, float global_scale,
                       Store store) {
  for (size_t r = 0; r < rows.num_rows; ++r) {
    const uint8_t* weights = rows.weights + r * rows.weight_stride;
    const uint8_t* scales = rows.scales + r * rows.scale_stride;
    size_t index = r * kRowDim;
    for (size_t block = 0; block < kNvfp4ScaleBytes; ++block) {
      const float scale = E4m3ToFloat(scales[block]);
      const uint8_t* packed = weights + block * (kNvfp4BlockSize / 2);
      for (int j = 0; j < kNvfp4BlockSize / 2; ++j) {
        // Low nibble = even element. Product order: see the header.
        store(index++, (E2m1ToFloat(packed[j] & 0xF) * scale) * global_scale);
        store(index++, (E2m1ToFloat(packed[j] >> 4) * scale) * global_scale);
      }
    }
  }
}

}  // namespace

void DecodeFp8ToF32Scalar(const EncodedRows& rows, float* out) {
  ForEachFp8Value(rows, [out](size_t i, float v) { out[i] = v; });
}

void DecodeFp8ToBf16Scalar(const EncodedRows& rows, uint16_t* out) {
  ForEachFp8Value(rows, [out](size_t i, float v) { out[i] = FloatToBf16(v); });
}

void DecodeNvfp4ToF32Scalar(const EncodedRows& rows, float global_scale,
                            float* out) {
  ForEachNvfp4Value(rows, global_scale,
                    [out](size_t i, float v) { out[i] = v; });
}

void DecodeNvfp4ToBf16Scalar(const EncodedRows& rows, float global_scale,
                             uint16_t* out) {
  ForEachNvfp4Value(rows, global_scale,
                    [out](size_t i, float v) { out[i] = FloatToBf16(v); });
}

}  // namespace mneme::formats::row_decode_internal
