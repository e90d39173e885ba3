#ifndef MNEME_GPU_CUDA_KERNEL_OPS_H_
#define MNEME_GPU_CUDA_KERNEL_OPS_H_

// The device kernels of the CUDA backend, written once as "ops": a plain
// struct of pointers and sizes whose operator()(item) computes one
// independent item of the output. nvcc runs an op as a grid-stride kernel
// (gpu/cuda/cuda_kernels.cu); the host executor (gpu/cuda/host_executor.h)
// runs the same code in a loop, so every op's index and number logic is
// tested on machines without a GPU, against the CPU backend's results.
//
// Items never write what another item of the same op reads or writes, so
// they run in any order. Pointers are device memory (host memory under the
// host executor). Plain C++ (no library calls beyond math), so that it
// compiles in both worlds.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MNEME_HD __host__ __device__
#else
#define MNEME_HD
#endif

namespace mneme::gpu::kernels {

// ---- math that compiles on both sides ----------------------------------

MNEME_HD inline float Expf(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
MNEME_HD inline double ExpD(double x) {
#if defined(__CUDA_ARCH__)
  return exp(x);
#else
  return std::exp(x);
#endif
}
MNEME_HD inline float Logf(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}
MNEME_HD inline float Sqrtf(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
MNEME_HD inline double SqrtD(double x) {
#if defined(__CUDA_ARCH__)
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}
MNEME_HD inline double LogD(double x) {
#if defined(__CUDA_ARCH__)
  return log(x);
#else
  return std::log(x);
#endif
}
MNEME_HD inline float Log1pf(float x) {
#if defined(__CUDA_ARCH__)
  return log1pf(x);
#else
  return std::log1p(x);
#endif
}
MNEME_HD inline double Log1pD(double x) {
#if defined(__CUDA_ARCH__)
  return log1p(x);
#else
  return std::log1p(x);
#endif
}
MNEME_HD inline double CosD(double x) {
#if defined(__CUDA_ARCH__)
  return cos(x);
#else
  return std::cos(x);
#endif
}
MNEME_HD inline double SinD(double x) {
#if defined(__CUDA_ARCH__)
  return sin(x);
#else
  return std::sin(x);
#endif
}
MNEME_HD inline float Fabsf(float x) { return x < 0.0f ? -x : x; }
MNEME_HD inline float Minf(float a, float b) { return b < a ? b : a; }
MNEME_HD inline float Maxf(float a, float b) { return a < b ? b : a; }
MNEME_HD inline float Rsqrtf(float x) { return 1.0f / Sqrtf(x); }
MNEME_HD inline float Sigmoidf(float x) { return 1.0f / (1.0f + Expf(-x)); }
MNEME_HD inline float Siluf(float x) { return x / (1.0f + Expf(-x)); }
MNEME_HD inline bool IsNanf(float x) { return x != x; }
MNEME_HD inline bool IsInfD(double x) { return x - x != x - x && x == x; }

MNEME_HD inline float BitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}
MNEME_HD inline uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
#endif
}

MNEME_HD inline double BitsToDouble(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
#endif
}

// x * 2^e rounded once to fp32, as std::ldexp: a normal power of two in
// fp32, otherwise the exact product in double rounded to fp32 (exact there
// for any product that does not round to 0 in fp32).
MNEME_HD inline float Ldexpf(float x, int e) {
  if (e >= -126 && e <= 127) {
    return x * BitsToFloat(static_cast<uint32_t>(e + 127) << 23);
  }
  const int clamped = e < -1000 ? -1000 : (e > 1000 ? 1000 : e);
  const double power =
      BitsToDouble(static_cast<uint64_t>(clamped + 1023) << 52);
  return static_cast<float>(static_cast<double>(x) * power);
}

// ---- the checkpoint number formats (formats/*.h, bit for bit) ------------

MNEME_HD inline float Bf16Value(uint16_t bits) {
  return BitsToFloat(static_cast<uint32_t>(bits) << 16);
}

// value rounded to bf16 (nearest even; a NaN stays a quiet NaN), as fp32:
// formats/bf16.h FloatToBf16 then Bf16ToFloat.
MNEME_HD inline float RoundBf16(float value) {
  const uint32_t bits = FloatToBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return BitsToFloat(((bits >> 16) | 0x0040u) << 16);
  }
  return BitsToFloat(((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) << 16);
}

// fp16 (formats/fp16.h Fp16ToFloat / FloatToFp16, bit for bit).
MNEME_HD inline float Fp16Value(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1Fu) {
    return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}
MNEME_HD inline uint16_t Fp16Code(float value) {
  const uint32_t bits = FloatToBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  if (magnitude >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (magnitude < 0x38800000u) {
    const uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return static_cast<uint16_t>(sign);
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;
    const uint32_t truncated = significand >> shift;
    const uint32_t remainder = significand & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    const bool up = remainder > half || (remainder == half && (truncated & 1u));
    return static_cast<uint16_t>(sign | (truncated + (up ? 1u : 0u)));
  }
  const uint32_t rebased = magnitude - ((127u - 15u) << 23);
  return static_cast<uint16_t>(
      sign | ((rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13));
}

// ---- EXL3 (formats/exl3/exl3.h, bit for bit) -----------------------------

// The codebooks (formats/exl3 CodebookValue): 3INST = 0, MCG = 1, MUL1 = 2,
// as formats::exl3::Codebook.
MNEME_HD inline float Exl3McgTail(uint32_t x) {
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  return Fp16Value(Fp16Code(Fp16Value(static_cast<uint16_t>(x & 0xFFFFu)) +
                            Fp16Value(static_cast<uint16_t>(x >> 16))));
}
MNEME_HD inline float Exl3CodebookValue(int32_t codebook, uint32_t state) {
  if (codebook == 0) return Exl3McgTail(state * 89226354u + 64248484u);
  if (codebook == 1) return Exl3McgTail(state * 0xCBAC1FEDu);
  const uint32_t x = state * 0x83DCD12Du;
  const uint32_t byte_sum =
      (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
  // Exact in fp32 (formats/exl3 Mul1Value), so one rounding to fp16.
  const float h = 1024.0f + static_cast<float>(byte_sum);
  return Fp16Value(Fp16Code(h * Fp16Value(0x1EEEu) + Fp16Value(0xC931u)));
}

// Where element (row, column) of a 16 x 16 tile sits in the tile's stream:
// the inverse of formats/exl3 TilePermutation (the tensor-core fragment
// order: stream position 8 t + 4 half + i holds row r0 + {0, 1, 8, 9}[i],
// column t / 4 + 8 half, r0 = 2 (t % 4)).
MNEME_HD inline int Exl3StreamPosition(int row, int column) {
  const int half = column / 8;
  const int t = 4 * (column % 8) + (row % 8) / 2;
  const int i = row % 2 + 2 * (row / 8);
  return 8 * t + 4 * half + i;
}

// The 16-bit state of stream position j of a tile of `bits` bits per
// weight: the 16 bits ending at bit (j + 1) bits of the circular MSB-first
// stream whose 32-bit words are the little-endian reads of the int16 pairs.
MNEME_HD inline uint32_t Exl3State(const uint16_t* words, int bits, int j) {
  const int num_words = 8 * bits;
  int start = (j + 1) * bits - 16;
  if (start < 0) start += 256 * bits;
  const int word = start >> 5;
  const int next = word + 1 == num_words ? 0 : word + 1;
  const uint64_t window =
      (static_cast<uint64_t>(words[2 * word] |
                             (static_cast<uint32_t>(words[2 * word + 1]) << 16))
       << 32) |
      (words[2 * next] | (static_cast<uint32_t>(words[2 * next + 1]) << 16));
  return static_cast<uint32_t>((window >> (48 - (start & 31))) & 0xFFFFu);
}

// e4m3 (fn): 0x7F / 0xFF are NaN, no infinities.
MNEME_HD inline float E4m3Value(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exponent = (code >> 3) & 0xFu;
  const uint32_t mantissa = code & 0x7u;
  if ((code & 0x7Fu) == 0x7Fu) return BitsToFloat(0x7FC00000u);
  if (exponent == 0) {
    const float m = static_cast<float>(mantissa) * 0.001953125f;  // 2^-9
    return sign != 0 ? -m : m;
  }
  return BitsToFloat(sign | ((exponent + 127 - 7) << 23) | (mantissa << 20));
}

// 2^(code - 127); 0 -> 2^-127, 255 -> NaN.
MNEME_HD inline float Ue8m0Value(uint8_t code) {
  const uint32_t bits = code == 255 ? 0x7FC00000u
                        : code == 0 ? 0x00400000u
                                    : static_cast<uint32_t>(code) << 23;
  return BitsToFloat(bits);
}

// The low nibble of `code`.
MNEME_HD inline float E2m1Value(uint8_t code) {
  const uint32_t magnitude = code & 0x7u;
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  const float value = magnitude < 4
                          ? 0.5f * static_cast<float>(magnitude)
                          : 0.5f * static_cast<float>(1u << (magnitude >> 1)) *
                                ((magnitude & 1u) != 0 ? 1.5f : 1.0f);
  return (code & 0x8u) != 0 ? -value : value;
}

// Round to nearest, ties to even; saturating to 448; NaN -> 0x7F.
MNEME_HD inline uint8_t E4m3Code(float value) {
  const uint32_t bits = FloatToBits(value);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0x7F;
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t exponent = magnitude >> 23;
  uint32_t code;
  if (exponent >= 127 - 6) {
    const uint32_t rounded =
        (magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u)) >> 20;
    code = rounded - ((127 - 7) << 3);
    if (code > 0x7E) code = 0x7E;
  } else if (exponent == 0) {
    code = 0;
  } else {
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 141 - exponent;
    if (shift >= 32) {
      code = 0;
    } else {
      const uint32_t quotient = significand >> shift;
      const uint32_t remainder = significand & ((1u << shift) - 1);
      const uint32_t half = 1u << (shift - 1);
      code = quotient +
             ((remainder > half || (remainder == half && (quotient & 1u) != 0))
                  ? 1u
                  : 0u);
    }
  }
  return static_cast<uint8_t>(sign | code);
}

// Round to nearest, ties to even; saturating to 6; NaN -> 0.
MNEME_HD inline uint8_t E2m1Code(float value) {
  if (value != value) return 0;
  const uint8_t sign = (FloatToBits(value) >> 31) != 0 ? 0x8 : 0x0;
  const float m = Fabsf(value);
  uint8_t code;
  if (m <= 0.25f) {
    code = 0;
  } else if (m < 0.75f) {
    code = 1;
  } else if (m <= 1.25f) {
    code = 2;
  } else if (m < 1.75f) {
    code = 3;
  } else if (m <= 2.5f) {
    code = 4;
  } else if (m < 3.5f) {
    code = 5;
  } else if (m <= 5.0f) {
    code = 6;
  } else {
    code = 7;
  }
  return static_cast<uint8_t>(sign | code);
}

// ---- weights -------------------------------------------------------------

// The storage formats a device weight keeps (gpu/backend.h WeightFormat
// values; EXL3 and GridBook weights are stored as kF32 for now).
enum class Format : int32_t {
  kF32 = 1,
  kBf16 = 2,
  kFp8Block = 3,
  kMxfp4 = 4,
  kNvfp4 = 5,
  kExl3 = 6,
  kGridbook = 7,
};

// A GridBook scheme as the kernels decode it (formats/gridbook/gridbook.h
// is the reference: DecodeSuperblock, bit for bit). The weight's `tables`
// hold the n_sub sub-tables (table_offset[i] is sub-table i's first value),
// then the 16 values of the two-tier table at two_tier_offset.
inline constexpr int kGridbookSuperblock = 256;
struct GridbookScheme {
  int32_t k = 0;          // bits per codeword (8 weights)
  int32_t n_sub = 1;      // sub-tables (product mode)
  int32_t type_size = 0;  // bytes per superblock
  int32_t super_bias = 127;
  bool is_signed = false;  // signed mode: 8 sign bits, one table
  bool fp8 = false;        // fp8 grid: a per-row fp32 scale in `scale`
  bool two_tier = false;   // fp4: two-tier scale plane, else e4m3 scales
  int32_t width[4] = {};   // bits of each sub-index, sub 0 lowest
  int32_t shift[4] = {};   // the sub-index's first bit in the codeword
  int32_t table_offset[4] = {};
  int32_t two_tier_offset = 0;
};

// a[i] by constant indices only: a kernel parameter indexed at run time
// would be copied to the thread's stack.
MNEME_HD inline int32_t Pick4(const int32_t (&a)[4], int i) {
  return i == 0 ? a[0] : (i == 1 ? a[1] : (i == 2 ? a[2] : a[3]));
}

inline constexpr int kWarpLanes = 32;

// ---- wide loads -----------------------------------------------------------

// 16 and 8 bytes a lane loads at once (aligned, so that nvcc issues one
// vector load), and 4 floats.
struct alignas(16) Load16 {
  uint32_t w[4];
};
struct alignas(8) Load8 {
  uint32_t w[2];
};
struct alignas(16) Floats4 {
  float v[4];
};

// *p as T; p is aligned to alignof(T).
template <typename T>
MNEME_HD inline T LoadAligned(const void* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const T*>(p);
#else
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
#endif
}

// Byte k of words loaded from little-endian memory.
MNEME_HD inline uint8_t ByteOf(const uint32_t* w, int k) {
  return static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
}

// The columns of a weight row one wide load holds in `format`, a slice
// (WeightView::DecodeSlice): 16 bytes of f32, bf16 or fp8, 8 of fp4; 0 for
// the formats decoded an element at a time (EXL3, GridBook).
MNEME_HD constexpr int SliceColumns(Format format) {
  switch (format) {
    case Format::kF32:
      return 4;
    case Format::kBf16:
      return 8;
    case Format::kFp8Block:
    case Format::kMxfp4:
    case Format::kNvfp4:
      return 16;
    default:
      return 0;
  }
}

// A weight's bytes on the device, decoded an element at a time (At) or a
// slice at a time (DecodeSlice).
struct WeightView {
  Format format = Format::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;
  int32_t block_rows = 32;
  int32_t block_cols = 32;
  float global_scale = 1.0f;
  // kGridbook: the scheme and its tables (device memory).
  GridbookScheme gridbook = {};
  const float* tables = nullptr;
  // kExl3: At(r, c) is What[c][r] (input feature c, output feature r) of
  // the trellis in `data`; `scale` holds suh [cols] then svh [rows] as fp32
  // (applied by Hadamard128Op around the product).
  int32_t exl3_bits = 0;
  int32_t exl3_codebook = 0;

  // Element (r, c) as fp32: the values of gpu/host_weight.h DequantizeRows.
  MNEME_HD float At(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    switch (format) {
      case Format::kF32:
        return reinterpret_cast<const float*>(data)[i];
      case Format::kBf16:
        return Bf16Value(reinterpret_cast<const uint16_t*>(data)[i]);
      case Format::kFp8Block: {
        const int64_t per_row = (cols + block_cols - 1) / block_cols;
        return E4m3Value(data[i]) *
               Ue8m0Value(scale[(r / block_rows) * per_row + c / block_cols]);
      }
      case Format::kMxfp4: {
        const uint8_t pair = data[i / 2];
        return E2m1Value((c & 1) != 0 ? pair >> 4 : pair) *
               Ue8m0Value(scale[r * (cols / 32) + c / 32]);
      }
      case Format::kNvfp4: {
        const uint8_t pair = data[i / 2];
        return (E2m1Value((c & 1) != 0 ? pair >> 4 : pair) *
                E4m3Value(scale[r * (cols / 16) + c / 16])) *
               global_scale;
      }
      case Format::kGridbook:
        return GridbookAt(r, c);
      case Format::kExl3: {
        // Tile (c / 16, r / 16) of [cols / 16, rows / 16] tiles of 16 bits
        // words each; inside it, row c % 16 (input), column r % 16.
        const auto* words =
            reinterpret_cast<const uint16_t*>(data) +
            (c / 16 * (rows / 16) + r / 16) * int64_t{16} * exl3_bits;
        const int j = Exl3StreamPosition(static_cast<int>(c % 16),
                                         static_cast<int>(r % 16));
        return Exl3CodebookValue(exl3_codebook, Exl3State(words, exl3_bits, j));
      }
    }
    return 0.0f;
  }

  // Whether DecodeSlice serves this weight: a format with slices, rows of
  // whole slices, the bytes 16-byte aligned (so every slice's load is
  // aligned), and for FP8 scale blocks of whole slices (one scale a slice).
  MNEME_HD bool Sliceable() const {
    const int n = SliceColumns(format);
    if (n == 0 || cols % n != 0) return false;
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
    return format != Format::kFp8Block ||
           (block_cols > 0 && block_cols % n == 0);
  }

  // Columns [c, c + SliceColumns(F)) of row r from one wide load and one
  // scale: bit for bit At(r, c + k). F == format, Sliceable(), and c a
  // multiple of SliceColumns(F).
  template <Format F>
  MNEME_HD void DecodeSlice(int64_t r, int64_t c,
                            float (&v)[SliceColumns(F)]) const {
    const int64_t i = r * cols + c;
    if constexpr (F == Format::kF32) {
      const Load16 l = LoadAligned<Load16>(data + 4 * i);
      for (int k = 0; k < 4; ++k) v[k] = BitsToFloat(l.w[k]);
    } else if constexpr (F == Format::kBf16) {
      const Load16 l = LoadAligned<Load16>(data + 2 * i);
      for (int k = 0; k < 8; ++k) {
        v[k] = Bf16Value(static_cast<uint16_t>(l.w[k / 2] >> (16 * (k % 2))));
      }
    } else if constexpr (F == Format::kFp8Block) {
      const Load16 l = LoadAligned<Load16>(data + i);
      const int64_t per_row = (cols + block_cols - 1) / block_cols;
      const float s =
          Ue8m0Value(scale[(r / block_rows) * per_row + c / block_cols]);
      for (int k = 0; k < 16; ++k) v[k] = E4m3Value(ByteOf(l.w, k)) * s;
    } else if constexpr (F == Format::kMxfp4) {
      const Load8 l = LoadAligned<Load8>(data + i / 2);
      const float s = Ue8m0Value(scale[r * (cols / 32) + c / 32]);
      for (int k = 0; k < 16; ++k) {
        const uint8_t pair = ByteOf(l.w, k / 2);
        v[k] = E2m1Value((k & 1) != 0 ? pair >> 4 : pair) * s;
      }
    } else if constexpr (F == Format::kNvfp4) {
      const Load8 l = LoadAligned<Load8>(data + i / 2);
      const float s = E4m3Value(scale[r * (cols / 16) + c / 16]);
      for (int k = 0; k < 16; ++k) {
        const uint8_t pair = ByteOf(l.w, k / 2);
        v[k] = (E2m1Value((k & 1) != 0 ? pair >> 4 : pair) * s) * global_scale;
      }
    }
  }

  // A GridBook element: codeword (c % 256) / 8 of the row's superblock c /
  // 256 (k bits, LSB-first from the superblock's first byte), its value
  // (c % 8) through the tables, times the group's or the row's scale,
  // rounded to bf16.
  MNEME_HD float GridbookAt(int64_t r, int64_t c) const {
    const GridbookScheme& g = gridbook;
    const uint8_t* block =
        data + (r * (cols / kGridbookSuperblock) + c / kGridbookSuperblock) *
                   g.type_size;
    const int i = static_cast<int>(c % kGridbookSuperblock);
    const int j = i % 8;
    const int first = i / 8 * g.k;
    // The bytes holding bits [first, first + k): at most 7 (k <= 48), all
    // inside the 4 k index bytes.
    const int bytes = (first % 8 + g.k + 7) / 8;
    uint64_t window = 0;
    for (int b = 0; b < bytes; ++b) {
      window |= static_cast<uint64_t>(block[first / 8 + b]) << (8 * b);
    }
    const uint64_t code = (window >> (first % 8)) & ((uint64_t{1} << g.k) - 1);
    float value;
    if (g.is_signed) {
      const float magnitude = tables[(code >> 8) * 8 + j];
      value = ((code >> j) & 1u) != 0 ? -magnitude : magnitude;
    } else {
      const int columns = 8 / g.n_sub;
      const int sub = j / columns;
      const uint64_t index = (code >> Pick4(g.shift, sub)) &
                             ((uint64_t{1} << Pick4(g.width, sub)) - 1);
      value = tables[Pick4(g.table_offset, sub) +
                     static_cast<int64_t>(index) * columns + j % columns];
    }
    float factor;
    if (g.fp8) {
      factor = reinterpret_cast<const float*>(scale)[r];
    } else {
      const uint8_t* plane = block + 4 * g.k;
      const int group = i / 16;
      if (g.two_tier) {
        const int index = (plane[1 + group / 2] >> (4 * (group % 2))) & 0xF;
        factor = Ldexpf(tables[g.two_tier_offset + index],
                        static_cast<int>(plane[0]) - g.super_bias);
      } else {
        factor = E4m3Value(plane[group]);
      }
    }
    return RoundBf16(value * factor);
  }
};

// ---- ops: one item each ------------------------------------------------

// The tokens one LinearOp item computes (a decode batch's GEMV); larger
// calls take several items per weight row, or tiles (LinearTiledOp).
inline constexpr int kLinearRowTokens = 16;

// y[t, r] (= or +=) sum_c x[t, c] * w(r, c) for t < tokens; item = r *
// Chunks() + chunk: weight row r for the chunk's tokens [chunk *
// kLinearRowTokens, + kLinearRowTokens) (a row's chunks are neighbours, so
// its later reads find it in cache). Each weight is decoded once per chunk;
// each output is summed over the columns in ascending order.
struct LinearOp {
  WeightView w;
  const float* x = nullptr;
  float* y = nullptr;
  bool accumulate = false;
  int64_t tokens = 1;
  MNEME_HD int64_t Chunks() const {
    return (tokens + kLinearRowTokens - 1) / kLinearRowTokens;
  }
  MNEME_HD int64_t Items() const { return Chunks() * w.rows; }
  MNEME_HD int64_t Row(int64_t item) const { return item / Chunks(); }
  // The chunk's first token and how many it has.
  MNEME_HD int64_t FirstToken(int64_t item) const {
    return item % Chunks() * kLinearRowTokens;
  }
  MNEME_HD int ChunkTokens(int64_t item) const {
    const int64_t left = tokens - FirstToken(item);
    return static_cast<int>(left < kLinearRowTokens ? left : kLinearRowTokens);
  }
  MNEME_HD void operator()(int64_t item) const {
    const int64_t r = Row(item);
    const int64_t t0 = FirstToken(item);
    const int n = ChunkTokens(item);
    float sum[kLinearRowTokens] = {};
    for (int64_t c = 0; c < w.cols; ++c) {
      const float wv = w.At(r, c);
      for (int t = 0; t < n; ++t) sum[t] += x[(t0 + t) * w.cols + c] * wv;
    }
    for (int t = 0; t < n; ++t) {
      float* out = y + (t0 + t) * w.rows + r;
      *out = accumulate ? *out + sum[t] : sum[t];
    }
  }
};

// What the device's warp Linear does for a LinearOp item whose weight is
// Sliceable (cuda_kernels.cu): lane `lane` takes slices lane, lane + 32, ...
// of the item's weight row, decodes each once (DecodeSlice, one wide load)
// and adds it to sum[t] for the chunk's tokens [t0, t0 + m), m <= kTokens,
// columns ascending inside a slice; the warp then adds its lanes' sums by
// a shuffle-down tree. x must be 16-byte aligned too (Fit).
struct LinearSlices {
  const LinearOp& op;

  MNEME_HD static bool Fit(const LinearOp& op) {
    return op.w.Sliceable() && reinterpret_cast<uintptr_t>(op.x) % 16 == 0;
  }

  template <Format F, int kTokens>
  MNEME_HD void Partial(int64_t item, int t0, int m, int lane,
                        float (&sum)[kTokens]) const {
    constexpr int kColumns = SliceColumns(F);
    static_assert(kColumns % 4 == 0);
    const int64_t cols = op.w.cols;
    const int64_t r = op.Row(item);
    const float* xs = op.x + (op.FirstToken(item) + t0) * cols;
    for (int64_t c = int64_t{lane} * kColumns; c < cols;
         c += int64_t{kWarpLanes} * kColumns) {
      float wv[kColumns];
      op.w.DecodeSlice<F>(r, c, wv);
      for (int t = 0; t < kTokens; ++t) {
        if (t >= m) break;
        const float* xt = xs + t * cols + c;
        for (int q = 0; q < kColumns; q += 4) {
          const Floats4 xv = LoadAligned<Floats4>(xt + q);
          for (int k = 0; k < 4; ++k) sum[t] += xv.v[k] * wv[q + k];
        }
      }
    }
  }
};

// Linear of many tokens by tiles (the prefill GEMM). One item is a tile of
// kTileRows weight rows x kTileTokens tokens, computed by a block of
// kTileThreads threads that step through the columns kTileCols at a time:
// each step the block decodes its weight tile once into shared memory
// (LoadTile) and each thread adds its kTileRowsPerThread x
// kTileTokensPerThread outputs from it (AccumulateTile), so a decoded weight
// serves kTileTokens tokens instead of one (LinearOp decodes it per token).
// The CUDA kernel runs the phases with a barrier between them; operator()
// runs them thread after thread on the host, so the host executor checks
// the index math. Each output is summed over the columns in ascending
// order, as in LinearOp.
inline constexpr int kTileRows = 64;
inline constexpr int kTileTokens = 32;
inline constexpr int kTileCols = 32;
inline constexpr int kTileThreads = 256;
inline constexpr int kTileRowsPerThread = 4;
inline constexpr int kTileTokensPerThread = 2;
// Threads side by side along the rows (the rest go along the tokens).
inline constexpr int kTileRowThreads = kTileRows / kTileRowsPerThread;
static_assert(kTileRowThreads * (kTileTokens / kTileTokensPerThread) ==
              kTileThreads);

// A block's shared memory: one step's decoded weights and activations,
// column-major; the padding column keeps the threads of a warp, which store
// neighbouring columns of one row, in different banks.
struct LinearTile {
  float w[kTileCols][kTileRows + 1];
  float x[kTileCols][kTileTokens + 1];
};

// One thread's running sums: rows r0 + tr + kTileRowThreads * i, tokens
// t0 + tt + (kTileThreads / kTileRowThreads) * j.
struct LinearTileSums {
  float v[kTileRowsPerThread][kTileTokensPerThread];
};

// y[t, r] (= or +=) sum_c x[t, c] * w(r, c) for t < tokens; item = a tile.
struct LinearTiledOp {
  LinearOp args;  // what the row op would take

  MNEME_HD int64_t TokenTiles() const {
    return (args.tokens + kTileTokens - 1) / kTileTokens;
  }
  MNEME_HD int64_t Tiles() const {
    return (args.w.rows + kTileRows - 1) / kTileRows * TokenTiles();
  }
  // The tiles of the same weight rows are neighbours (in L2 together).
  MNEME_HD int64_t FirstRow(int64_t tile) const {
    return tile / TokenTiles() * kTileRows;
  }
  MNEME_HD int64_t FirstToken(int64_t tile) const {
    return tile % TokenTiles() * kTileTokens;
  }

  // Thread `thread`'s share of columns [c0, c0 + kTileCols) of the tile's
  // weight rows and tokens into `s`; 0 outside the matrices. Neighbouring
  // threads read neighbouring columns of one row.
  MNEME_HD void LoadTile(int64_t tile, int64_t c0, int thread,
                         LinearTile& s) const {
    const int64_t r0 = FirstRow(tile);
    const int64_t t0 = FirstToken(tile);
    for (int i = thread; i < kTileRows * kTileCols; i += kTileThreads) {
      const int r = i / kTileCols;
      const int c = i % kTileCols;
      const int64_t row = r0 + r;
      const int64_t col = c0 + c;
      s.w[c][r] =
          row < args.w.rows && col < args.w.cols ? args.w.At(row, col) : 0.0f;
    }
    for (int i = thread; i < kTileTokens * kTileCols; i += kTileThreads) {
      const int t = i / kTileCols;
      const int c = i % kTileCols;
      const int64_t token = t0 + t;
      const int64_t col = c0 + c;
      s.x[c][t] = token < args.tokens && col < args.w.cols
                      ? args.x[token * args.w.cols + col]
                      : 0.0f;
    }
  }

  // Adds one step's columns to thread `thread`'s sums.
  MNEME_HD void AccumulateTile(int thread, const LinearTile& s,
                               LinearTileSums& sums) const {
    const int tr = thread % kTileRowThreads;
    const int tt = thread / kTileRowThreads;
    constexpr int kTokenThreads = kTileThreads / kTileRowThreads;
    for (int c = 0; c < kTileCols; ++c) {
      float wv[kTileRowsPerThread];
      float xv[kTileTokensPerThread];
      for (int i = 0; i < kTileRowsPerThread; ++i) {
        wv[i] = s.w[c][tr + kTileRowThreads * i];
      }
      for (int j = 0; j < kTileTokensPerThread; ++j) {
        xv[j] = s.x[c][tt + kTokenThreads * j];
      }
      for (int i = 0; i < kTileRowsPerThread; ++i) {
        for (int j = 0; j < kTileTokensPerThread; ++j) {
          sums.v[i][j] += xv[j] * wv[i];
        }
      }
    }
  }

  // Writes thread `thread`'s outputs that lie inside y.
  MNEME_HD void StoreTile(int64_t tile, int thread,
                          const LinearTileSums& sums) const {
    const int tr = thread % kTileRowThreads;
    const int tt = thread / kTileRowThreads;
    constexpr int kTokenThreads = kTileThreads / kTileRowThreads;
    for (int i = 0; i < kTileRowsPerThread; ++i) {
      const int64_t row = FirstRow(tile) + tr + kTileRowThreads * i;
      for (int j = 0; j < kTileTokensPerThread; ++j) {
        const int64_t token = FirstToken(tile) + tt + kTokenThreads * j;
        if (row >= args.w.rows || token >= args.tokens) continue;
        float* out = args.y + token * args.w.rows + row;
        *out = args.accumulate ? *out + sums.v[i][j] : sums.v[i][j];
      }
    }
  }

  // The block of `tile` on the host: each phase for every thread in turn
  // (on a device, cuda_kernels.cu's tiled kernel runs the phases).
  void operator()(int64_t tile) const {
    LinearTile s{};
    LinearTileSums sums[kTileThreads] = {};
    for (int64_t c0 = 0; c0 < args.w.cols; c0 += kTileCols) {
      for (int t = 0; t < kTileThreads; ++t) LoadTile(tile, c0, t, s);
      for (int t = 0; t < kTileThreads; ++t) AccumulateTile(t, s, sums[t]);
    }
    for (int t = 0; t < kTileThreads; ++t) StoreTile(tile, t, sums[t]);
  }
};

// Whether a Linear of `tokens` tokens over a weight of `rows` rows runs by
// tiles (LinearTiledOp) rather than by the row op (LinearOp): the kernel
// backend's rule for Linear and for each expert of a grouped Linear.
inline constexpr int64_t kTiledLinearTokens = 64;
inline constexpr int64_t kTiledLinearRows = 128;
MNEME_HD inline bool TakesTiles(int64_t tokens, int64_t rows) {
  return tokens >= kTiledLinearTokens && rows >= kTiledLinearRows;
}

// ---- grouped Linear (a MoE layer's routed experts in one launch) ----------

// One group of a grouped Linear: a weight and its run of tokens, rows
// [first_token, first_token + tokens) of the grouped op's x and y.
// first_item: the group's first item in the grouped op (the items of the
// groups before it). input_scale > 0: the weight takes the static
// W4A4-quantized activations (GroupedQuantizeW4A4Op's per-token scales).
// A group without tokens has no items; the items a launch has past the
// last group's are skipped when that group has no tokens (a launch sized
// to an upper bound ends its table with such a group).
struct LinearGroup {
  WeightView w;
  int64_t first_token = 0;
  int64_t tokens = 0;
  int64_t first_item = 0;
  float input_scale = 0.0f;
};

// The group an item belongs to: the last of groups[0, count) (ascending
// first_item, groups[0].first_item == 0) whose first_item <= item.
MNEME_HD inline int64_t FindGroup(const LinearGroup* groups, int64_t count,
                                  int64_t item) {
  int64_t lo = 0;
  int64_t hi = count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (groups[mid].first_item <= item) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Linear of several weights, each over its own run of tokens: y[t, r] (= or
// +=) sum_c x[t, c] * w_g(r, c) for the tokens t of group g. x rows have
// w.cols values and y rows w.rows (every group's weight of one shape). Item
// = group g's LinearOp item i at groups[g].first_item + i: group g computes
// what LinearOp (Args(g)) computes, in the same order of additions.
struct GroupedLinearOp {
  const LinearGroup* groups = nullptr;
  int64_t count = 0;
  const float* x = nullptr;
  float* y = nullptr;
  bool accumulate = false;
  // The most tokens a group can have (a hint: the CUDA kernel keeps that
  // many sums of a weight row, up to kLinearRowTokens, and takes more in
  // passes).
  int64_t most_tokens = kLinearRowTokens;

  MNEME_HD int64_t Group(int64_t item) const {
    return FindGroup(groups, count, item);
  }
  // Group g as the one-weight op.
  MNEME_HD LinearOp Args(int64_t g) const {
    const LinearGroup& group = groups[g];
    return LinearOp{.w = group.w,
                    .x = x + group.first_token * group.w.cols,
                    .y = y + group.first_token * group.w.rows,
                    .accumulate = accumulate,
                    .tokens = group.tokens};
  }
  MNEME_HD void operator()(int64_t item) const {
    const int64_t g = Group(item);
    if (groups[g].tokens == 0) return;
    Args(g)(item - groups[g].first_item);
  }
};

// The same by tiles: item = group g's LinearTiledOp tile i at
// groups[g].first_item + i (first_item counts tiles).
struct GroupedLinearTiledOp {
  GroupedLinearOp args;
  MNEME_HD LinearTiledOp Tiled(int64_t g) const {
    return LinearTiledOp{.args = args.Args(g)};
  }
  // The block of `tile` on the host (cuda_kernels.cu runs its phases).
  void operator()(int64_t tile) const {
    const int64_t g = args.Group(tile);
    if (args.groups[g].tokens == 0) return;
    Tiled(g)(tile - args.groups[g].first_item);
  }
};

// out[i] = w(i / cols, i % cols): a weight decoded to fp32.
struct DequantizeOp {
  WeightView w;
  float* out = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    out[item] = w.At(item / w.cols, item % w.cols);
  }
};

// The orthonormal Hadamard transform of blocks of 128 values (H128 /
// sqrt(128), natural order; formats/exl3 Hadamard128, the same operations)
// of a [rows, cols] matrix: along each row (blocks of 128 columns) or,
// across_rows, down each column (blocks of 128 rows). Value i of a block,
// at position p = first + i along the transformed axis, is multiplied by
// pre[p] before and post[p] after (either may be null); dst (= or +=) the
// result (dst may be src). item = a block: (row, column block) or (row
// block, column). A block is a warp's: lane l holds values 4 l .. 4 l + 3,
// takes the butterflies of spans 1 and 2 itself and those of spans 4 .. 64
// with the lane span / 4 away (Cross); the CUDA kernel exchanges by
// shuffles, operator() runs the lanes in turn on the host.
inline constexpr int kHadamardLaneValues = 4;
struct Hadamard128Op {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  bool across_rows = false;
  const float* pre = nullptr;
  const float* post = nullptr;
  bool accumulate = false;

  MNEME_HD int64_t Items() const { return rows * cols / 128; }
  // Value i of block `item` is at base + i * step, position first + i.
  MNEME_HD void Block(int64_t item, int64_t& base, int64_t& step,
                      int64_t& first) const {
    if (across_rows) {
      first = item / cols * 128;
      base = first * cols + item % cols;
      step = cols;
    } else {
      first = item % (cols / 128) * 128;
      base = item / (cols / 128) * cols + first;
      step = 1;
    }
  }
  // Lane `lane`'s values, scaled, after the spans inside the lane.
  MNEME_HD void Load(int64_t item, int lane,
                     float (&v)[kHadamardLaneValues]) const {
    int64_t base, step, first;
    Block(item, base, step, first);
    for (int i = 0; i < kHadamardLaneValues; ++i) {
      const int64_t p = int64_t{lane} * kHadamardLaneValues + i;
      v[i] = src[base + p * step] * (pre != nullptr ? pre[first + p] : 1.0f);
    }
    for (int h = 1; h < kHadamardLaneValues; h *= 2) {
      for (int i = 0; i < kHadamardLaneValues; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float a = v[j];
          const float b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
      }
    }
  }
  // The butterfly of span h (4 .. 64) for a value of lane `lane`, whose
  // partner lane lane ^ (h / 4) holds `partner` at the same index: the
  // lower lane keeps a + b, the upper a - b.
  MNEME_HD static float Cross(float mine, float partner, int lane, int h) {
    return (lane & (h / kHadamardLaneValues)) == 0 ? mine + partner
                                                   : partner - mine;
  }
  MNEME_HD void Store(int64_t item, int lane,
                      const float (&v)[kHadamardLaneValues]) const {
    int64_t base, step, first;
    Block(item, base, step, first);
    const float norm = 1.0f / Sqrtf(128.0f);
    for (int i = 0; i < kHadamardLaneValues; ++i) {
      const int64_t p = int64_t{lane} * kHadamardLaneValues + i;
      float value = v[i] * norm;
      if (post != nullptr) value *= post[first + p];
      float* out = dst + base + p * step;
      *out = accumulate ? *out + value : value;
    }
  }
  // The warp of block `item` on the host, lane after lane.
  void operator()(int64_t item) const {
    constexpr int kLanes = 128 / kHadamardLaneValues;
    float v[kLanes][kHadamardLaneValues];
    for (int lane = 0; lane < kLanes; ++lane) Load(item, lane, v[lane]);
    for (int h = kHadamardLaneValues; h < 128; h *= 2) {
      float next[kLanes][kHadamardLaneValues];
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int i = 0; i < kHadamardLaneValues; ++i) {
          next[lane][i] = Cross(
              v[lane][i], v[lane ^ (h / kHadamardLaneValues)][i], lane, h);
        }
      }
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int i = 0; i < kHadamardLaneValues; ++i)
          v[lane][i] = next[lane][i];
      }
    }
    for (int lane = 0; lane < kLanes; ++lane) Store(item, lane, v[lane]);
  }
};

// gridbook's static W4A4 activation contract
// (formats/gridbook/gridbook.h QuantizeActivationsW4A4); item = a group of
// 16 values.
struct QuantizeW4A4Op {
  const float* x = nullptr;
  float* xq = nullptr;
  float global_scale = 1.0f;
  MNEME_HD void operator()(int64_t group) const {
    const float inverse = 1.0f / global_scale;
    float xs[16];
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) {
      xs[i] = x[group * 16 + i] * global_scale;
      amax = Maxf(amax, Fabsf(xs[i]));
    }
    const float sf = E4m3Value(E4m3Code(Minf(amax / 6.0f, 448.0f)));
    for (int i = 0; i < 16; ++i) {
      uint8_t code;
      if (sf == 0.0f) {
        code = (FloatToBits(xs[i]) >> 31) != 0 ? 0x8 : 0x0;
      } else {
        code = E2m1Code(Maxf(-6.0f, Minf(xs[i] / sf, 6.0f)));
      }
      xq[group * 16 + i] = (E2m1Value(code) * sf) * inverse;
    }
  }
};

// The static W4A4 contract for tokens of several weights: token t's values
// quantized with scales[t] (QuantizeW4A4Op), or copied when scales[t] <= 0;
// rows of `cols` values (a multiple of 16); item = a group of 16 values.
struct GroupedQuantizeW4A4Op {
  const float* x = nullptr;
  float* xq = nullptr;
  const float* scales = nullptr;
  int64_t cols = 0;
  MNEME_HD void operator()(int64_t group) const {
    const float scale = scales[group * 16 / cols];
    if (scale > 0.0f) {
      QuantizeW4A4Op{.x = x, .xq = xq, .global_scale = scale}(group);
      return;
    }
    for (int i = 0; i < 16; ++i) xq[group * 16 + i] = x[group * 16 + i];
  }
};

// ---- row reductions by the lanes of a warp ------------------------------

// v[l] for every lane l becomes the sum over the lanes, added as the
// device's xor butterfly adds it (v[l] + v[l ^ offset], offsets 16 to 1),
// so every lane holds the same bits, on the device and here.
template <typename T>
MNEME_HD inline void ButterflySum(T (&v)[kWarpLanes]) {
  for (int offset = kWarpLanes / 2; offset > 0; offset >>= 1) {
    T next[kWarpLanes];
    for (int l = 0; l < kWarpLanes; ++l) next[l] = v[l] + v[l ^ offset];
    for (int l = 0; l < kWarpLanes; ++l) v[l] = next[l];
  }
}

// v[l] for every lane l becomes the sum of v[0..l], as the device's
// shuffle-up scan takes it (v[l] + v[l - offset] for l >= offset, offsets
// 1 to 16).
template <typename T>
MNEME_HD inline void WarpInclusiveScan(T (&v)[kWarpLanes]) {
  for (int offset = 1; offset < kWarpLanes; offset <<= 1) {
    T next[kWarpLanes];
    for (int l = 0; l < kWarpLanes; ++l) {
      next[l] = l >= offset ? v[l] + v[l - offset] : v[l];
    }
    for (int l = 0; l < kWarpLanes; ++l) v[l] = next[l];
  }
}

// Lane `lane`'s share of the sum of squares of row[0, width): columns
// lane, lane + kWarpLanes, ... in ascending order.
MNEME_HD inline float LaneSquares(const float* row, int64_t width, int lane) {
  float sum = 0.0f;
  for (int64_t c = lane; c < width; c += kWarpLanes) sum += row[c] * row[c];
  return sum;
}

// A row warp op's item on the host: every lane's Partial, their butterfly
// sum, then every lane's Finish with it (cuda_kernels.cu's RowWarpKernel
// runs the same phases on a warp, the sum by shuffles, for every op tagged
// kRowWarp). A row's sums are
// then spread over 32 lanes instead of one thread reading the whole row.
// Partial returns a float, or a struct of sums with an operator+ adding
// them member by member (RowWarpKernel adds each member's shuffle: an
// AddPartner overload per struct).
template <typename Op>
MNEME_HD inline void RowWarpRun(const Op& op, int64_t item) {
  using Sum = decltype(op.Partial(item, 0));
  Sum v[kWarpLanes];
  for (int l = 0; l < kWarpLanes; ++l) v[l] = op.Partial(item, l);
  ButterflySum(v);
  for (int l = 0; l < kWarpLanes; ++l) op.Finish(item, l, v[l]);
}

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight; item = row.
struct RmsNormOp {
  // Run by a warp per item (RowWarpRun; the CUDA launch picks the warp
  // kernel by this tag).
  static constexpr bool kRowWarp = true;
  const float* x = nullptr;
  const float* weight = nullptr;  // null: no scale
  float* y = nullptr;
  int64_t cols = 0;
  float eps = 0.0f;
  // A row warp op (RowWarpRun): lane `lane`'s sum of squares, then, given
  // the row's, its outputs.
  MNEME_HD float Partial(int64_t r, int lane) const {
    return LaneSquares(x + r * cols, cols, lane);
  }
  MNEME_HD void Finish(int64_t r, int lane, float sum) const {
    const float* row = x + r * cols;
    const float s = Rsqrtf(sum / static_cast<float>(cols) + eps);
    float* out = y + r * cols;
    for (int64_t c = lane; c < cols; c += kWarpLanes) {
      out[c] = weight != nullptr ? row[c] * s * weight[c] : row[c] * s;
    }
  }
  MNEME_HD void operator()(int64_t r) const { RowWarpRun(*this, r); }
};

// Interleaved rotary pairs of the last rope_dim values of each head; item =
// (t * heads + h) * (rope_dim / 2) + i.
struct RopeOp {
  float* x = nullptr;
  int64_t cols = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  const double* inv_freq = nullptr;
  const int32_t* positions = nullptr;
  double sign = 1.0;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t half = rope_dim / 2;
    const int64_t heads = cols / head_dim;
    const int64_t i = item % half;
    const int64_t h = (item / half) % heads;
    const int64_t t = item / half / heads;
    const double angle = sign * positions[t] * inv_freq[i];
    const float cosine = static_cast<float>(CosD(angle));
    const float sine = static_cast<float>(SinD(angle));
    float* v = x + t * cols + h * head_dim + head_dim - rope_dim;
    const float a = v[2 * i];
    const float b = v[2 * i + 1];
    v[2 * i] = a * cosine - b * sine;
    v[2 * i + 1] = a * sine + b * cosine;
  }
};

// y = a + b; item = element.
struct AddOp {
  const float* a = nullptr;
  const float* b = nullptr;
  float* y = nullptr;
  MNEME_HD void operator()(int64_t i) const { y[i] = a[i] + b[i]; }
};

// dst[r, dst_col + c] = src[r, src_col + c] for c < width; item = r * width
// + c. Source and destination do not overlap.
struct CopyBlockOp {
  const float* src = nullptr;
  int64_t src_cols = 0;
  int64_t src_col = 0;
  float* dst = nullptr;
  int64_t dst_cols = 0;
  int64_t dst_col = 0;
  int64_t width = 0;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t r = item / width;
    const int64_t c = item % width;
    dst[r * dst_cols + dst_col + c] = src[r * src_cols + src_col + c];
  }
};

// dst[dst_rows ? dst_rows[i] : i, c] = src[src_rows ? src_rows[i] : i, c]
// (0 for a negative source row); item = i * cols + c. Destination rows are
// distinct.
struct MoveRowsOp {
  const float* src = nullptr;
  const int32_t* src_rows = nullptr;
  float* dst = nullptr;
  const int32_t* dst_rows = nullptr;
  int64_t cols = 0;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t i = item / cols;
    const int64_t c = item % cols;
    const int64_t s = src_rows != nullptr ? src_rows[i] : i;
    const int64_t d = dst_rows != nullptr ? dst_rows[i] : i;
    dst[d * cols + c] = s >= 0 ? src[s * cols + c] : 0.0f;
  }
};

// y[t, j] = x[t, cols[j]]; item = t * y_cols + j.
struct GatherColumnsOp {
  const float* x = nullptr;
  int64_t x_cols = 0;
  const int32_t* cols = nullptr;
  float* y = nullptr;
  int64_t y_cols = 0;
  MNEME_HD void operator()(int64_t item) const {
    y[item] = x[item / y_cols * x_cols + cols[item % y_cols]];
  }
};

// y[t, c] = table(ids[t] - first_id, c), zero outside the table; item = t *
// cols + c.
struct EmbeddingOp {
  WeightView table;
  const int32_t* ids = nullptr;
  int64_t first_id = 0;
  float* y = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / table.cols;
    const int64_t c = item % table.cols;
    const int64_t row = static_cast<int64_t>(ids[t]) - first_id;
    y[item] = row >= 0 && row < table.rows ? table.At(row, c) : 0.0f;
  }
};

// out[t, h * hd + e] *= sigmoid(lse[t, h] - sink[h]); item = element.
struct ApplySinkOp {
  const float* lse = nullptr;
  const float* sink = nullptr;
  float* out = nullptr;
  int64_t heads = 0;
  int64_t hd = 0;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / (heads * hd);
    const int64_t h = (item / hd) % heads;
    out[item] *= Sigmoidf(lse[t * heads + h] - sink[h]);
  }
};

// Backend::WeighDcpParts, the global log-sum-exp of each (token, head)
// into global [T * heads] (and of this rank's heads into global_own [T,
// heads / ranks]); item = t * heads + h.
struct DcpGlobalLseOp {
  const float* lses = nullptr;  // [ranks, T * heads]
  int64_t ranks = 1;
  int64_t th = 0;
  int64_t heads = 1;
  int64_t rank = 0;
  float* global = nullptr;
  float* global_own = nullptr;
  MNEME_HD void operator()(int64_t i) const {
    float m = -INFINITY;
    for (int64_t q = 0; q < ranks; ++q) m = Maxf(m, lses[q * th + i]);
    const bool finite = m - m == 0.0f;
    double sum = 0.0;
    if (finite) {
      for (int64_t q = 0; q < ranks; ++q) sum += Expf(lses[q * th + i] - m);
    }
    const float g = finite ? m + static_cast<float>(LogD(sum)) : m;
    global[i] = g;
    const int64_t hl = heads / ranks;
    const int64_t h = i % heads;
    if (h / hl == rank) global_own[i / heads * hl + h % hl] = g;
  }
};

// Backend::WeighDcpParts' send rows: item = ((owner * T + t) * hl + local
// head) * hd + c, the value w * part[t, (owner * hl + local head) * hd + c].
struct DcpWeighOp {
  const float* lses = nullptr;
  const float* global = nullptr;
  const float* part = nullptr;  // [T, heads * hd]
  int64_t ranks = 1;
  int64_t tokens = 0;
  int64_t heads = 1;
  int64_t hd = 0;
  int64_t rank = 0;
  float* send = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t hl = heads / ranks;
    const int64_t row = item / (hl * hd);
    const int64_t col = item % (hl * hd);
    const int64_t t = row % tokens;
    const int64_t h = row / tokens * hl + col / hd;
    const float l = lses[rank * tokens * heads + t * heads + h];
    const float w = l - l == 0.0f ? Expf(l - global[t * heads + h]) : 0.0f;
    send[item] = w * part[t * heads * hd + h * hd + col % hd];
  }
};

// Backend::SparseAttention for one (query, head); item = t * heads + h.
// Online softmax over the listed keys (-1 = none). One thread per item:
// the kernel backend runs it only for heads above kAttentionWarpMaxDim
// dimensions (SparseAttentionWarpOp below takes the others).
struct SparseAttentionOp {
  const float* q = nullptr;   // [T, heads * hd]
  const float* kv = nullptr;  // [K, hd]
  const int32_t* idx = nullptr;
  int64_t width = 0;
  int64_t heads = 0;
  int64_t hd = 0;
  float scale = 1.0f;
  const float* sink = nullptr;  // null: none
  float* out = nullptr;         // [T, heads * hd]
  float* lse = nullptr;         // [T, heads]
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / heads;
    const int64_t h = item % heads;
    const float* qh = q + t * heads * hd + h * hd;
    float* o = out + t * heads * hd + h * hd;
    for (int64_t e = 0; e < hd; ++e) o[e] = 0.0f;
    float max = 0.0f;
    float denominator = 0.0f;
    bool any = false;
    for (int64_t j = 0; j < width; ++j) {
      const int32_t row = idx[t * width + j];
      if (row < 0) continue;
      const float* key = kv + static_cast<int64_t>(row) * hd;
      float s = 0.0f;
      for (int64_t e = 0; e < hd; ++e) s += qh[e] * key[e];
      s *= scale;
      if (!any || s > max) {
        const float correction = any ? Expf(max - s) : 0.0f;
        denominator *= correction;
        for (int64_t e = 0; e < hd; ++e) o[e] *= correction;
        max = s;
        any = true;
      }
      const float p = Expf(s - max);
      denominator += p;
      for (int64_t e = 0; e < hd; ++e) o[e] += p * key[e];
    }
    if (!any) {
      lse[t * heads + h] = -INFINITY;
      return;
    }
    const float l = max + Logf(denominator);
    lse[t * heads + h] = l;
    // Two roundings, as normalising and then ApplySink: both routes agree
    // bit for bit.
    const float inverse = 1.0f / denominator;
    for (int64_t e = 0; e < hd; ++e) o[e] *= inverse;
    if (sink != nullptr) {
      const float gate = Sigmoidf(l - sink[h]);
      for (int64_t e = 0; e < hd; ++e) o[e] *= gate;
    }
  }
};

// ---- attention by the lanes of a warp ------------------------------------

// Head dimensions each lane holds: SparseAttentionWarpOp takes heads of up
// to kWarpLanes * kAttentionLaneDims = 512 dimensions (V4's), in registers.
inline constexpr int kAttentionLaneDims = 16;
inline constexpr int64_t kAttentionWarpMaxDim =
    int64_t{kWarpLanes} * kAttentionLaneDims;

// One lane's part of a (query, head): dimensions lane + kWarpLanes * i of
// the query and of the output, and the online softmax's running maximum and
// denominator (every lane keeps the same copy).
struct AttentionLane {
  float q[kAttentionLaneDims];
  float k[kAttentionLaneDims];  // the current key's dimensions
  float o[kAttentionLaneDims];
  float max;
  float denominator;
  bool any;
};

// Backend::SparseAttention for one (query, head) by the 32 lanes of a warp
// (heads of up to kAttentionWarpMaxDim dimensions); item = t * heads + h.
// Neighbouring lanes hold neighbouring dimensions, so a key row is read
// once, coalesced, and the output stays in registers until the end. Per
// listed key: each lane's part of the dot product (PartialDot), their
// butterfly sum, then the online-softmax step on each lane's dimensions
// (Step); Finish normalises and writes. operator() runs the phases lane
// after lane here; SparseAttentionBlockOp runs them by the warps of a
// block, with the keys read once for several heads. The same rules as
// SparseAttentionOp (which keeps larger heads).
struct SparseAttentionWarpOp {
  SparseAttentionOp args;  // what the one-item op would take

  MNEME_HD void Begin(int64_t item, int lane, AttentionLane& s) const {
    const float* qh =
        args.q + item * args.hd;  // (t * args.heads + h) * args.hd
    for (int i = 0; i < kAttentionLaneDims; ++i) {
      const int64_t e = lane + int64_t{kWarpLanes} * i;
      s.q[i] = e < args.hd ? qh[e] : 0.0f;
      s.o[i] = 0.0f;
    }
    s.max = 0.0f;
    s.denominator = 0.0f;
    s.any = false;
  }
  // The j-th listed key of the item's query (-1: none).
  MNEME_HD int32_t Key(int64_t item, int64_t j) const {
    return args.idx[item / args.heads * args.width + j];
  }
  // Reads the lane's dimensions of key `row` (kept for Step) and returns
  // the lane's part of the dot product.
  MNEME_HD float PartialDot(int32_t row, int lane, AttentionLane& s) const {
    return PartialDotOf(args.kv + static_cast<int64_t>(row) * args.hd, lane, s);
  }
  // The same for a key whose values are at `key` (its first hd read).
  MNEME_HD float PartialDotOf(const float* key, int lane,
                              AttentionLane& s) const {
    float dot = 0.0f;
    for (int i = 0; i < kAttentionLaneDims; ++i) {
      const int64_t e = lane + int64_t{kWarpLanes} * i;
      s.k[i] = e < args.hd ? key[e] : 0.0f;
      dot += s.q[i] * s.k[i];
    }
    return dot;
  }
  // The online-softmax step of the key PartialDot read; `dot` is the whole
  // dot product.
  MNEME_HD void Step(float dot, AttentionLane& s) const {
    const float score = dot * args.scale;
    if (!s.any || score > s.max) {
      const float correction = s.any ? Expf(s.max - score) : 0.0f;
      s.denominator *= correction;
      for (int i = 0; i < kAttentionLaneDims; ++i) s.o[i] *= correction;
      s.max = score;
      s.any = true;
    }
    const float p = Expf(score - s.max);
    s.denominator += p;
    for (int i = 0; i < kAttentionLaneDims; ++i) s.o[i] += p * s.k[i];
  }
  MNEME_HD void Finish(int64_t item, int lane, const AttentionLane& s) const {
    float* o = args.out + item * args.hd;
    if (!s.any) {
      for (int i = 0; i < kAttentionLaneDims; ++i) {
        const int64_t e = lane + int64_t{kWarpLanes} * i;
        if (e < args.hd) o[e] = 0.0f;
      }
      if (lane == 0) args.lse[item] = -INFINITY;
      return;
    }
    const float l = s.max + Logf(s.denominator);
    if (lane == 0) args.lse[item] = l;
    // Two roundings, as normalising and then ApplySink: both routes agree
    // bit for bit.
    const float inverse = 1.0f / s.denominator;
    const float gate = args.sink != nullptr
                           ? Sigmoidf(l - args.sink[item % args.heads])
                           : 1.0f;
    for (int i = 0; i < kAttentionLaneDims; ++i) {
      const int64_t e = lane + int64_t{kWarpLanes} * i;
      if (e >= args.hd) continue;
      const float v = s.o[i] * inverse;
      o[e] = args.sink != nullptr ? v * gate : v;
    }
  }

  // The warp of `item` on the host: each phase for every lane in turn (on a
  // device, cuda_kernels.cu's warp kernel runs the phases).
  void operator()(int64_t item) const {
    AttentionLane lanes[kWarpLanes];
    for (int l = 0; l < kWarpLanes; ++l) Begin(item, l, lanes[l]);
    for (int64_t j = 0; j < args.width; ++j) {
      const int32_t row = Key(item, j);
      if (row < 0) continue;
      float dot[kWarpLanes];
      for (int l = 0; l < kWarpLanes; ++l) {
        dot[l] = PartialDot(row, l, lanes[l]);
      }
      ButterflySum(dot);
      for (int l = 0; l < kWarpLanes; ++l) Step(dot[l], lanes[l]);
    }
    for (int l = 0; l < kWarpLanes; ++l) Finish(item, l, lanes[l]);
  }
};

// The most heads a block of SparseAttentionBlockOp attends with (a warp
// each), and the listed keys it reads into shared memory at a time.
inline constexpr int kAttentionBlockHeads = 8;
inline constexpr int kAttentionTileKeys = 8;
inline constexpr int kAttentionBlockThreads = kAttentionBlockHeads * kWarpLanes;

// A tile of listed keys in a block's shared memory (16 KiB): row k's first
// hd values, and its row in kv (-1: none, or past the list).
struct AttentionKeyTile {
  float keys[kAttentionTileKeys][kAttentionWarpMaxDim];
  int32_t rows[kAttentionTileKeys];
};

// Backend::SparseAttention (heads of up to kAttentionWarpMaxDim
// dimensions) by blocks of `block_heads` warps, each warp one head of the
// same query as SparseAttentionWarpOp: every tile of kAttentionTileKeys
// listed keys is read into shared memory once by all the block's threads
// (LoadTile: neighbouring threads read neighbouring values of a row) and
// serves every head of the block. The query's keys are the same for all
// its heads (one key / value head), so a step of H heads reads each key
// ceil(H / block_heads) times instead of H times. A group item t *
// Groups() + g is query t's heads g * block_heads + w (warp w; none past
// heads).
//
// With splits == 1 a block (item) is a group item and attends over the
// whole list, the same arithmetic as SparseAttentionWarpOp, bit for bit.
// With splits > 1 (decode: few queries, long lists; ChooseAttentionSplit)
// block b is group item b / splits over listed keys [FirstKey(b),
// EndKey(b)), a range of split_keys, so that more blocks share a query's
// keys; each warp writes its range's normalised output and log-sum-exp,
// without the sink, into part_out / part_lse at (t * heads + h) * splits +
// b % splits, and SparseAttentionMergeOp combines the ranges.
struct SparseAttentionBlockOp {
  SparseAttentionWarpOp warp;
  int32_t block_heads = kAttentionBlockHeads;  // 1..kAttentionBlockHeads
  int32_t splits = 1;
  int64_t split_keys = 0;     // a multiple of kAttentionTileKeys
  float* part_out = nullptr;  // [T * heads * splits, hd]
  float* part_lse = nullptr;  // [T * heads * splits]

  MNEME_HD int64_t Groups() const {
    return (warp.args.heads + block_heads - 1) / block_heads;
  }
  MNEME_HD int64_t Blocks(int64_t tokens) const {
    return tokens * Groups() * splits;
  }
  MNEME_HD int64_t GroupItem(int64_t block) const { return block / splits; }
  // The block's listed keys: [FirstKey, EndKey).
  MNEME_HD int64_t FirstKey(int64_t block) const {
    return splits > 1 ? block % splits * split_keys : 0;
  }
  MNEME_HD int64_t EndKey(int64_t block) const {
    if (splits <= 1) return warp.args.width;
    const int64_t end = FirstKey(block) + split_keys;
    return end < warp.args.width ? end : warp.args.width;
  }
  // Warp w's result: the output (one range) or its range's part.
  MNEME_HD void Finish(int64_t block, int w, int lane,
                       const AttentionLane& s) const {
    const int64_t item = Item(GroupItem(block), w);
    if (splits <= 1) {
      warp.Finish(item, lane, s);
      return;
    }
    SparseAttentionWarpOp part = warp;
    part.args.out = part_out;
    part.args.lse = part_lse;
    part.args.sink = nullptr;
    part.Finish(item * splits + block % splits, lane, s);
  }
  // Warp w's (query, head) item of SparseAttentionWarpOp (-1: none).
  MNEME_HD int64_t Item(int64_t group_item, int w) const {
    const int64_t t = group_item / Groups();
    const int64_t h = group_item % Groups() * block_heads + w;
    return h < warp.args.heads ? t * warp.args.heads + h : -1;
  }
  // Thread `thread`'s share of reading the listed keys [j0, j0 +
  // kAttentionTileKeys) of the item's query into `tile`.
  MNEME_HD void LoadTile(int64_t group_item, int64_t j0, int thread,
                         AttentionKeyTile& tile) const {
    const SparseAttentionOp& a = warp.args;
    const int32_t* list = a.idx + group_item / Groups() * a.width;
    if (thread < kAttentionTileKeys) {
      const int64_t j = j0 + thread;
      tile.rows[thread] = j < a.width ? list[j] : -1;
    }
    const int threads = block_heads * kWarpLanes;
    for (int k = 0; k < kAttentionTileKeys; ++k) {
      const int32_t row = j0 + k < a.width ? list[j0 + k] : -1;
      if (row < 0) continue;
      const float* key = a.kv + static_cast<int64_t>(row) * a.hd;
      for (int e = thread; e < a.hd; e += threads) tile.keys[k][e] = key[e];
    }
  }

  // Block `block` on the host: each phase for every thread (or every
  // warp's lanes) in turn; on a device, cuda_kernels.cu's kernel runs them
  // with a barrier around each tile's load.
  void operator()(int64_t block) const {
    const int64_t group_item = GroupItem(block);
    // NaN where nothing is loaded: a read of a missing key or of a value
    // past hd shows in the output.
    AttentionKeyTile tile;
    for (auto& key : tile.keys) {
      for (float& v : key) v = NAN;
    }
    AttentionLane lanes[kAttentionBlockHeads][kWarpLanes];
    for (int w = 0; w < block_heads; ++w) {
      const int64_t item = Item(group_item, w);
      if (item < 0) continue;
      for (int l = 0; l < kWarpLanes; ++l) warp.Begin(item, l, lanes[w][l]);
    }
    for (int64_t j0 = FirstKey(block); j0 < EndKey(block);
         j0 += kAttentionTileKeys) {
      for (int t = 0; t < block_heads * kWarpLanes; ++t) {
        LoadTile(group_item, j0, t, tile);
      }
      for (int w = 0; w < block_heads; ++w) {
        if (Item(group_item, w) < 0) continue;
        for (int k = 0; k < kAttentionTileKeys; ++k) {
          if (tile.rows[k] < 0) continue;
          float dot[kWarpLanes];
          for (int l = 0; l < kWarpLanes; ++l) {
            dot[l] = warp.PartialDotOf(tile.keys[k], l, lanes[w][l]);
          }
          ButterflySum(dot);
          for (int l = 0; l < kWarpLanes; ++l) warp.Step(dot[l], lanes[w][l]);
        }
      }
    }
    for (int w = 0; w < block_heads; ++w) {
      if (Item(group_item, w) < 0) continue;
      for (int l = 0; l < kWarpLanes; ++l) Finish(block, w, l, lanes[w][l]);
    }
  }
};

// The split of SparseAttentionBlockOp's lists over the keys: below
// kAttentionSplitBlocks blocks (a GPU's multiprocessors each want one or
// two), lists of at least 2 * kAttentionSplitMinKeys keys go in ranges of
// at least kAttentionSplitMinKeys (whole tiles), as many as bring the
// blocks up to kAttentionSplitBlocks. splits == 1: no split.
inline constexpr int64_t kAttentionSplitBlocks = 128;
inline constexpr int64_t kAttentionSplitMinKeys = 64;
struct AttentionSplit {
  int32_t splits = 1;
  int64_t split_keys = 0;
};
MNEME_HD inline AttentionSplit ChooseAttentionSplit(int64_t blocks,
                                                    int64_t width) {
  AttentionSplit split;
  if (blocks <= 0 || blocks >= kAttentionSplitBlocks ||
      width < 2 * kAttentionSplitMinKeys) {
    return split;
  }
  int64_t n = (kAttentionSplitBlocks + blocks - 1) / blocks;
  if (n > width / kAttentionSplitMinKeys) n = width / kAttentionSplitMinKeys;
  int64_t keys = (width + n - 1) / n;
  keys =
      (keys + kAttentionTileKeys - 1) / kAttentionTileKeys * kAttentionTileKeys;
  n = (width + keys - 1) / keys;
  if (n < 2) return split;
  split.splits = static_cast<int32_t>(n);
  split.split_keys = keys;
  return split;
}

// The ranges of a split SparseAttentionBlockOp into the output, per
// (query, head): lse[t, h] the log-sum-exp of its ranges' (-inf when no
// range has a key, the output then 0; NaN when a range's is NaN, the
// output then NaN) and out = sum over ranges of exp(lse_range - lse) * the
// range's output, times the sink's gate as SparseAttentionOp applies it.
// item = (t * heads + h) * hd + e.
struct SparseAttentionMergeOp {
  const float* part_out = nullptr;  // [T * heads * splits, hd]
  const float* part_lse = nullptr;  // [T * heads * splits]
  int32_t splits = 1;
  int64_t heads = 0;
  int64_t hd = 0;
  const float* sink = nullptr;  // null: none
  float* out = nullptr;         // [T, heads * hd]
  float* lse = nullptr;         // [T, heads]
  MNEME_HD void operator()(int64_t item) const {
    const int64_t th = item / hd;
    const int64_t e = item % hd;
    const float* l = part_lse + th * splits;
    // A NaN range (a NaN score) makes the whole (query, head) NaN, as the
    // unsplit op's online softmax does.
    float m = -INFINITY;
    bool nan = false;
    for (int s = 0; s < splits; ++s) {
      nan = nan || IsNanf(l[s]);
      m = Maxf(m, l[s]);
    }
    if (nan) {
      out[item] = NAN;
      if (e == 0) lse[th] = NAN;
      return;
    }
    if (m == -INFINITY) {
      out[item] = 0.0f;
      if (e == 0) lse[th] = -INFINITY;
      return;
    }
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (l[s] != -INFINITY) sum += Expf(l[s] - m);
    }
    const float total = m + Logf(sum);
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (l[s] != -INFINITY) {
        v += Expf(l[s] - total) * part_out[(th * splits + s) * hd + e];
      }
    }
    if (e == 0) lse[th] = total;
    out[item] = sink != nullptr ? v * Sigmoidf(total - sink[th % heads]) : v;
  }
};

// out[t, j] = sum_h w[t, h] * max(0, q[t, h] . keys[Row(t, j), :d]), 0
// where Row(t, j) is -1; item = t * n + j. One thread per item: the kernel
// backend runs it only for index heads above kScoreMaxDim dimensions
// (IndexScoresTiledOp takes the others).
struct IndexScoresOp {
  const float* q = nullptr;
  const float* w = nullptr;
  const float* keys = nullptr;
  int64_t key_cols = 0;
  const int32_t* rows = nullptr;
  // 0: every query the rows [0, n); n: query t its own, [t n, (t + 1) n).
  int64_t rows_stride = 0;
  int64_t n = 0;
  int64_t heads = 0;
  int64_t d = 0;
  float* out = nullptr;
  MNEME_HD int32_t Row(int64_t t, int64_t j) const {
    return rows[t * rows_stride + j];
  }
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / n;
    const int64_t j = item % n;
    const int32_t row = Row(t, j);
    if (row < 0) {
      out[item] = 0.0f;
      return;
    }
    const float* key = keys + static_cast<int64_t>(row) * key_cols;
    float score = 0.0f;
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q + t * heads * d + h * d;
      float dot = 0.0f;
      for (int64_t e = 0; e < d; ++e) dot += qh[e] * key[e];
      score += w[t * heads + h] * Maxf(dot, 0.0f);
    }
    out[item] = score;
  }
};

// ---- the indexer's scores by tiles ------------------------------------

// IndexScoresTiledOp: a block of kScoreThreads threads scores one query
// against kScoreEntries entries, index heads of up to kScoreMaxDim
// dimensions. Threads are kScoreEntryThreads across the entries (each
// kScoreEntriesPerThread of them) by kScoreHeadThreads across the heads
// (each kScoreHeadsPerThread heads a round, rounds until every head).
inline constexpr int kScoreEntries = 64;
inline constexpr int kScoreMaxDim = 128;
inline constexpr int kScoreThreads = 256;
inline constexpr int kScoreEntryThreads = 16;
inline constexpr int kScoreHeadThreads = kScoreThreads / kScoreEntryThreads;
inline constexpr int kScoreEntriesPerThread =
    kScoreEntries / kScoreEntryThreads;
inline constexpr int kScoreHeadsPerThread = 4;

// A block's shared memory: the tile's key rows (the padding column puts
// neighbouring entries in different banks) and each head thread's sums.
struct ScoreTile {
  float key[kScoreEntries][kScoreMaxDim + 1];
  float partial[kScoreHeadThreads][kScoreEntries];
};

// out[t, j] = sum_h w[t, h] * max(0, q[t, h] . keys[Row(t, j), :d]), 0 for
// a -1 row (as IndexScoresOp, d <= kScoreMaxDim); item = a tile, t *
// EntryTiles() + the tile of entries [kScoreEntries * tile, + kScoreEntries).
// The keys are read once into shared memory for every head (LoadKeys); each
// thread takes its heads' dot products with its entries from there (a query
// value and a key value serve several products), sums w * relu(dot) over its
// heads (ScoreHeads), and the block adds the head threads' sums
// (Reduce). The CUDA kernel runs the phases with barriers between them;
// operator() runs them thread after thread on the host. Equal to
// IndexScoresOp up to the order of the sum over the heads (so also where
// that sum overflows in one order and not in the other).
struct IndexScoresTiledOp {
  IndexScoresOp args;  // what the one-item op would take

  MNEME_HD int64_t EntryTiles() const {
    return (args.n + kScoreEntries - 1) / kScoreEntries;
  }
  MNEME_HD void LoadKeys(int64_t tile, int thread, ScoreTile& s) const {
    const int64_t t = tile / EntryTiles();
    const int64_t j0 = tile % EntryTiles() * kScoreEntries;
    for (int64_t i = thread; i < kScoreEntries * args.d; i += kScoreThreads) {
      const int64_t e = i / args.d;
      const int64_t c = i % args.d;
      const int64_t j = j0 + e;
      const int32_t row = j < args.n ? args.Row(t, j) : -1;
      s.key[e][c] =
          row >= 0 ? args.keys[static_cast<int64_t>(row) * args.key_cols + c]
                   : 0.0f;
    }
  }
  MNEME_HD void ScoreHeads(int64_t tile, int thread, ScoreTile& s) const {
    const int64_t t = tile / EntryTiles();
    const int te = thread % kScoreEntryThreads;
    const int th = thread / kScoreEntryThreads;
    float sums[kScoreEntriesPerThread] = {};
    for (int64_t h0 = 0; h0 < args.heads;
         h0 += int64_t{kScoreHeadThreads} * kScoreHeadsPerThread) {
      float dots[kScoreHeadsPerThread][kScoreEntriesPerThread] = {};
      for (int64_t c = 0; c < args.d; ++c) {
        float qv[kScoreHeadsPerThread];
        float kv[kScoreEntriesPerThread];
        for (int b = 0; b < kScoreHeadsPerThread; ++b) {
          const int64_t h = h0 + th + int64_t{kScoreHeadThreads} * b;
          qv[b] =
              h < args.heads ? args.q[(t * args.heads + h) * args.d + c] : 0.0f;
        }
        for (int a = 0; a < kScoreEntriesPerThread; ++a) {
          kv[a] = s.key[te + kScoreEntryThreads * a][c];
        }
        for (int b = 0; b < kScoreHeadsPerThread; ++b) {
          for (int a = 0; a < kScoreEntriesPerThread; ++a) {
            dots[b][a] += qv[b] * kv[a];
          }
        }
      }
      for (int b = 0; b < kScoreHeadsPerThread; ++b) {
        const int64_t h = h0 + th + int64_t{kScoreHeadThreads} * b;
        if (h >= args.heads) continue;
        const float weight = args.w[t * args.heads + h];
        for (int a = 0; a < kScoreEntriesPerThread; ++a) {
          sums[a] += weight * Maxf(dots[b][a], 0.0f);
        }
      }
    }
    for (int a = 0; a < kScoreEntriesPerThread; ++a) {
      s.partial[th][te + kScoreEntryThreads * a] = sums[a];
    }
  }
  MNEME_HD void Reduce(int64_t tile, int thread, const ScoreTile& s) const {
    if (thread >= kScoreEntries) return;
    const int64_t t = tile / EntryTiles();
    const int64_t j = tile % EntryTiles() * kScoreEntries + thread;
    if (j >= args.n) return;
    float score = 0.0f;
    if (args.Row(t, j) >= 0) {
      for (int g = 0; g < kScoreHeadThreads; ++g) score += s.partial[g][thread];
    }
    args.out[t * args.n + j] = score;
  }

  // The block of `tile` on the host: each phase for every thread in turn
  // (on a device, cuda_kernels.cu's kernel runs the phases).
  void operator()(int64_t tile) const {
    ScoreTile s{};
    for (int t = 0; t < kScoreThreads; ++t) LoadKeys(tile, t, s);
    for (int t = 0; t < kScoreThreads; ++t) ScoreHeads(tile, t, s);
    for (int t = 0; t < kScoreThreads; ++t) Reduce(tile, t, s);
  }
};

// out[e, c] = sum_i softmax_i(score[e r + i, c] + ape[i, c]) * kv[e r + i,
// c] (Backend::SoftmaxPool).
struct SoftmaxPoolOp {
  const float* kv = nullptr;
  const float* score = nullptr;
  const float* ape = nullptr;  // [r, d], shared by every entry
  int64_t r = 0;
  int64_t d = 0;
  float* out = nullptr;
  // item = e * d + c: column c of entry e (rows [e * r, (e + 1) * r)).
  MNEME_HD void operator()(int64_t item) const {
    const int64_t c = item % d;
    const float* s = score + (item - c) * r;
    const float* v = kv + (item - c) * r;
    float max = -INFINITY;
    for (int64_t i = 0; i < r; ++i) {
      max = Maxf(max, s[i * d + c] + ape[i * d + c]);
    }
    float denominator = 0.0f;
    float numerator = 0.0f;
    for (int64_t i = 0; i < r; ++i) {
      const float e = Expf(s[i * d + c] + ape[i * d + c] - max);
      denominator += e;
      numerator += e * v[i * d + c];
    }
    out[item] = numerator / denominator;
  }
};

// The largest hyper-connection count the ops keep on the stack.
inline constexpr int kMaxHc = 16;

// norm[t] = rsqrt(mean(x[t, :]^2) + eps) for rows of `width`; item = t (a
// row warp op).
struct RowRsqrtOp {
  // Run by a warp per item (RowWarpRun; the CUDA launch picks the warp
  // kernel by this tag).
  static constexpr bool kRowWarp = true;
  const float* x = nullptr;
  int64_t width = 0;
  float eps = 0.0f;
  float* norm = nullptr;
  MNEME_HD float Partial(int64_t t, int lane) const {
    return LaneSquares(x + t * width, width, lane);
  }
  MNEME_HD void Finish(int64_t t, int lane, float sum) const {
    if (lane == 0) norm[t] = Rsqrtf(sum / static_cast<float>(width) + eps);
  }
  MNEME_HD void operator()(int64_t t) const { RowWarpRun(*this, t); }
};

// Backend::HcMix after the mix product: item = token (a row warp op: the
// stream's sum of squares by the lanes, the rest by lane 0).
struct HcMixOp {
  // Run by a warp per item (RowWarpRun; the CUDA launch picks the warp
  // kernel by this tag).
  static constexpr bool kRowWarp = true;
  const float* x_stream = nullptr;
  int64_t width = 0;
  const float* mix = nullptr;  // [T, (2 + hc) * hc]
  const float* base = nullptr;
  const float* scale = nullptr;
  int32_t hc = 0;
  int32_t sinkhorn_iters = 1;
  float hc_eps = 0.0f;
  float norm_eps = 0.0f;
  float* pre = nullptr;
  float* post = nullptr;
  float* comb = nullptr;
  MNEME_HD float Partial(int64_t t, int lane) const {
    return LaneSquares(x_stream + t * width, width, lane);
  }
  MNEME_HD void operator()(int64_t t) const { RowWarpRun(*this, t); }
  MNEME_HD void Finish(int64_t t, int lane, float sum) const {
    if (lane != 0) return;
    const double norm =
        1.0 /
        SqrtD(static_cast<double>(sum) / static_cast<double>(width) + norm_eps);
    const float* m = mix + t * (2 + hc) * hc;
    for (int h = 0; h < hc; ++h) {
      pre[t * hc + h] =
          Sigmoidf(static_cast<float>(m[h] * norm) * scale[0] + base[h]) +
          hc_eps;
      post[t * hc + h] =
          2.0f * Sigmoidf(static_cast<float>(m[hc + h] * norm) * scale[1] +
                          base[hc + h]);
    }
    double c[kMaxHc * kMaxHc];
    for (int i = 0; i < hc * hc; ++i) {
      c[i] = static_cast<double>(static_cast<float>(m[2 * hc + i] * norm) *
                                     scale[2] +
                                 base[2 * hc + i]);
    }
    for (int i = 0; i < hc; ++i) {
      double row_max = c[i * hc];
      for (int j = 1; j < hc; ++j) {
        row_max = c[i * hc + j] > row_max ? c[i * hc + j] : row_max;
      }
      double row_sum = 0.0;
      for (int j = 0; j < hc; ++j) {
        c[i * hc + j] = ExpD(c[i * hc + j] - row_max);
        row_sum += c[i * hc + j];
      }
      for (int j = 0; j < hc; ++j)
        c[i * hc + j] = c[i * hc + j] / row_sum + hc_eps;
    }
    for (int iter = 0; iter < sinkhorn_iters; ++iter) {
      if (iter > 0) {
        for (int i = 0; i < hc; ++i) {
          double s = 0.0;
          for (int j = 0; j < hc; ++j) s += c[i * hc + j];
          for (int j = 0; j < hc; ++j) c[i * hc + j] /= s + hc_eps;
        }
      }
      for (int j = 0; j < hc; ++j) {
        double s = 0.0;
        for (int i = 0; i < hc; ++i) s += c[i * hc + j];
        for (int i = 0; i < hc; ++i) c[i * hc + j] /= s + hc_eps;
      }
    }
    for (int i = 0; i < hc * hc; ++i) {
      comb[t * hc * hc + i] = static_cast<float>(c[i]);
    }
  }
};

// x[t, c] = sum_h weight(t, h) * x_stream[t, h * d + c] where weight is
// pre[t, h] (HcCollapse) or sigmoid(mix[t, h] * norm[t] * scale + base[h]) +
// eps (HcHead, with mix set); item = t * d + c.
struct HcCombineOp {
  const float* x_stream = nullptr;
  int32_t hc = 0;
  int64_t d = 0;
  const float* pre = nullptr;
  const float* mix = nullptr;
  const float* norm = nullptr;
  const float* base = nullptr;
  const float* scale = nullptr;
  float eps = 0.0f;
  float* x = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / d;
    const int64_t c = item % d;
    float sum = 0.0f;
    for (int h = 0; h < hc; ++h) {
      const float w =
          mix != nullptr
              ? Sigmoidf(mix[t * hc + h] * norm[t] * scale[0] + base[h]) + eps
              : pre[t * hc + h];
      sum += w * x_stream[t * hc * d + h * d + c];
    }
    x[item] = sum;
  }
};

// x_stream[t, j, c] = post[t, j] * a[t, c] + sum_i comb[t, i, j] *
// x_stream[t, i, c] for every j (in place); item = t * d + c.
struct HcPostOp {
  const float* a = nullptr;
  const float* post = nullptr;
  const float* comb = nullptr;
  int32_t hc = 0;
  int64_t d = 0;
  float* x_stream = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / d;
    const int64_t c = item % d;
    float* stream = x_stream + t * hc * d + c;
    float old[kMaxHc];
    for (int i = 0; i < hc; ++i) old[i] = stream[i * d];
    const float* cm = comb + t * hc * hc;
    for (int j = 0; j < hc; ++j) {
      float v = a[t * d + c] * post[t * hc + j];
      for (int i = 0; i < hc; ++i) v += cm[i * hc + j] * old[i];
      stream[j * d] = v;
    }
  }
};

// Backend::EngramGate for one copy h of token t; item = t * hc + h.
struct EngramGateOp {
  // Run by a warp per item (RowWarpRun; the CUDA launch picks the warp
  // kernel by this tag).
  static constexpr bool kRowWarp = true;
  const float* kv = nullptr;
  const float* q_w = nullptr;
  const float* k_w = nullptr;
  int32_t hc = 0;
  int64_t d = 0;
  float eps = 0.0f;
  float* x_stream = nullptr;

  // A row warp op over item = t * hc + h: each lane's share of the three
  // sums (values lane, lane + kWarpLanes, ...), then the gate and each
  // lane's values of the copy.
  struct Sums {
    float dot = 0.0f;
    float xx = 0.0f;
    float kk = 0.0f;
    MNEME_HD Sums operator+(const Sums& o) const {
      return Sums{.dot = dot + o.dot, .xx = xx + o.xx, .kk = kk + o.kk};
    }
  };
  MNEME_HD const float* Copy(int64_t item) const {
    return x_stream + item * d;  // (t * hc + h) * d
  }
  MNEME_HD const float* Row(int64_t item) const {
    return kv + item / hc * (hc + 1) * d;
  }
  MNEME_HD Sums Partial(int64_t item, int lane) const {
    const int64_t h = item % hc;
    const float* x_h = Copy(item);
    const float* key = Row(item) + h * d;
    Sums sums;
    for (int64_t i = lane; i < d; i += kWarpLanes) {
      sums.dot += x_h[i] * q_w[h * d + i] * k_w[h * d + i] * key[i];
      sums.xx += x_h[i] * x_h[i];
      sums.kk += key[i] * key[i];
    }
    return sums;
  }
  MNEME_HD void Finish(int64_t item, int lane, const Sums& sums) const {
    const float inv_d = 1.0f / static_cast<float>(d);
    const float g = sums.dot * Rsqrtf(sums.xx * inv_d + eps) *
                    Rsqrtf(sums.kk * inv_d + eps) *
                    Rsqrtf(static_cast<float>(d));
    const float magnitude = Sqrtf(Maxf(Fabsf(g), 1e-6f));
    const float root = g > 0.0f ? magnitude : g < 0.0f ? -magnitude : 0.0f;
    const float gate = Sigmoidf(root);
    const float* value = Row(item) + hc * d;
    float* x_h = x_stream + item * d;
    for (int64_t i = lane; i < d; i += kWarpLanes) x_h[i] += gate * value[i];
  }
  MNEME_HD void operator()(int64_t item) const { RowWarpRun(*this, item); }
};

// Backend::UnpackBf16Rows for one value; item = (q * rows + r) * row_dim + k
// with r = t * cols_per_block + i.
struct UnpackBf16RowsOp {
  const float* packed = nullptr;
  int64_t block_floats = 0;
  const int32_t* columns = nullptr;
  int64_t cols_per_block = 0;
  int64_t rows = 0;  // Rows of a block: tokens * cols_per_block.
  int64_t row_dim = 0;
  float* y = nullptr;
  int64_t y_cols = 0;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t k = item % row_dim;
    const int64_t qr = item / row_dim;
    const int64_t q = qr / rows;
    const int64_t r = qr % rows;
    const int64_t t = r / cols_per_block;
    const int64_t c = columns[q * cols_per_block + r % cols_per_block];
    const auto* block =
        reinterpret_cast<const uint16_t*>(packed + q * block_floats);
    y[t * y_cols + c * row_dim + k] = Bf16Value(block[r * row_dim + k]);
  }
};

// h1 = silu(min(h1, limit)) * clamp(h3, -limit, limit) (limit <= 0: no
// clamp); item = element.
struct SwiGluOp {
  float* h1 = nullptr;
  const float* h3 = nullptr;
  float limit = 0.0f;
  MNEME_HD void operator()(int64_t i) const {
    float a = h1[i];
    float b = h3[i];
    if (limit > 0.0f) {
      a = Minf(a, limit);
      b = Maxf(-limit, Minf(b, limit));
    }
    h1[i] = Siluf(a) * b;
  }
};

// y[rows[i], c] += weights[i] * src[i, c] for i < n in order (rows may
// repeat; a negative row is skipped); item = c.
struct ScatterAddOp {
  const float* src = nullptr;
  const int32_t* rows = nullptr;
  const float* weights = nullptr;
  int64_t n = 0;
  int64_t cols = 0;
  float* y = nullptr;
  MNEME_HD void operator()(int64_t c) const {
    for (int64_t i = 0; i < n; ++i) {
      if (rows[i] < 0) continue;
      y[static_cast<int64_t>(rows[i]) * cols + c] +=
          weights[i] * src[i * cols + c];
    }
  }
};

// ---- row reductions (sampling, log-probs) ------------------------------

// Values of a row (at most) one item of a partial row reduction reads. A
// row of `cols` values is read by lanes = ceil(cols / kRowLane) items;
// lane c reads the values c, c + lanes, c + 2 * lanes, ..., so neighbouring
// items read neighbouring addresses (coalesced on a GPU).
inline constexpr int64_t kRowLane = 256;

// The end of a row's contiguous segment c of kRowLane values: [c *
// kRowLane, RowSegmentEnd(c, cols)).
MNEME_HD inline int64_t RowSegmentEnd(int64_t c, int64_t cols) {
  return (c + 1) * kRowLane < cols ? (c + 1) * kRowLane : cols;
}

// Per lane of a row: the largest value and the lowest index holding it,
// such that RowMaxOp finds what std::max_element finds over the whole row:
// the row's first value is taken even when it is NaN; any other value only
// when larger than the one before (so a later NaN never is). arg -1: a lane
// of NaNs only. item = t * lanes + c.
struct RowMaxPartialOp {
  const float* x = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  float* max = nullptr;
  int32_t* arg = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t c = item % lanes;
    const float* row = x + (item / lanes) * cols;
    int64_t best = -1;
    float best_value = 0.0f;
    for (int64_t i = c; i < cols; i += lanes) {
      const float v = row[i];
      if (best < 0 ? (i == 0 || !IsNanf(v)) : best_value < v) {
        best = i;
        best_value = v;
      }
    }
    max[item] = best_value;
    arg[item] = static_cast<int32_t>(best);
  }
};

// A row's largest value and its lowest index from RowMaxPartialOp's lanes
// (lane 0 holds index 0, so a NaN there stays the row's maximum, as in a
// sequential scan); item = t.
struct RowMaxOp {
  const float* lane_max = nullptr;
  const int32_t* lane_arg = nullptr;
  int64_t lanes = 0;
  float* max = nullptr;
  int32_t* arg = nullptr;
  MNEME_HD void operator()(int64_t t) const {
    int32_t best = -1;
    float best_value = 0.0f;
    for (int64_t c = 0; c < lanes; ++c) {
      const int32_t a = lane_arg[t * lanes + c];
      const float v = lane_max[t * lanes + c];
      if (a >= 0 &&
          (best < 0 || best_value < v || (best_value == v && a < best))) {
        best = a;
        best_value = v;
      }
    }
    max[t] = best_value;
    arg[t] = best;
  }
};

// sum exp(x - max[t]) over each lane of a row (RowMaxPartialOp), in double;
// item = t * lanes + c.
struct RowExpSumPartialOp {
  const float* x = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  const float* max = nullptr;
  double* sum = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / lanes;
    const float* row = x + t * cols;
    const double m = max[t];
    double s = 0.0;
    for (int64_t i = item % lanes; i < cols; i += lanes) {
      s += ExpD(double{row[i]} - m);
    }
    sum[item] = s;
  }
};

// log_softmax(x[t])[id] with id = ids[t] (ids null: arg[t]): x[t, id] -
// (max + log(sum of the lane sums)), or x[t, id] - max when max is
// infinite; item = t.
struct RowLogProbOp {
  const float* x = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  const float* max = nullptr;
  const double* lane_sum = nullptr;
  const int32_t* ids = nullptr;
  const int32_t* arg = nullptr;
  float* logprob = nullptr;
  // Each row's log-sum-exp (null: not kept), so that the log-probability
  // of another token of the row is x - lse without reading the row again.
  double* row_lse = nullptr;
  MNEME_HD void operator()(int64_t t) const {
    const double m = max[t];
    double lse = m;
    if (!IsInfD(m)) {
      double s = 0.0;
      for (int64_t c = 0; c < lanes; ++c) s += lane_sum[t * lanes + c];
      lse = m + LogD(s);
    }
    const int64_t id = ids != nullptr ? ids[t] : arg[t];
    logprob[t] = static_cast<float>(x[t * cols + id] - lse);
    if (row_lse != nullptr) row_lse[t] = lse;
  }
};

// ---- draws at a temperature (Backend::Sample) ----------------------------

// gpu/sampling.h's draw for a batch of drawn rows (temperature > 0, a
// finite largest logit), one SampleRow each. Token i of a row weighs w =
// exp((x_i - max) * inv_temperature) in double (a NaN logit: 0), kept in
// weights [rows, cols]; its key is w's bits, which order as the weights
// (w >= 0). The ranking is by weight, then the lower id. Top-k and top-p
// each end in a SampleCut of that ranking, found by a radix select over the
// keys kSampleDigitBits at a time from the top (SampleHistOp and
// SamplePickOp per digit; top-k counts tokens, top-p adds weights), then
// the ties of the last key in id order (SampleTieCountOp, SampleCutOp).
// Last min-p, and the draw in id order (SampleMassOp, SampleDrawOp).
// Partial sums go lane by lane (strided lanes of kRowLane for the
// histograms, contiguous segments of kRowLane tokens in id order for the
// ties and the draw), so they equal the host's sequential sums only within
// rounding: a draw differs from SampleToken's only where the uniform or a
// top-p target falls within rounding of a cumulative boundary.
inline constexpr int kSampleDigitBits = 4;
inline constexpr int kSampleBins = 1 << kSampleDigitBits;
inline constexpr int kSampleDigits = 64 / kSampleDigitBits;

MNEME_HD inline uint64_t DoubleToBits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  return bits;
#endif
}

// The digits above `shift` (none for the first digit).
MNEME_HD inline uint64_t SampleHighMask(int shift) {
  return shift + kSampleDigitBits >= 64
             ? uint64_t{0}
             : ~((uint64_t{1} << (shift + kSampleDigitBits)) - 1u);
}

// A cut of the ranking: the tokens with a key above `key`, and of those
// with that key the ids below `id`. {0, cols} keeps every token.
struct SampleCut {
  uint64_t key = 0;
  int64_t id = 0;
  MNEME_HD bool Keeps(uint64_t k, int64_t i) const {
    return k > key || (k == key && i < id);
  }
};

// One drawn row: its parameters (host-made), the cuts and the select in
// progress (device), and the token drawn (-1: the kept tokens weigh
// nothing; the caller takes the argmax).
struct SampleRow {
  int64_t row = 0;  // of the logits
  float max = 0.0f;
  double inv_temperature = 1.0;
  int64_t top_k = 0;   // 0: off, else 0 < top_k < cols
  float top_p = 1.0f;  // 1: off
  float min_p = 0.0f;
  double uniform = 0.0;  // in [0, 1)
  SampleCut k_cut;
  SampleCut p_cut;
  // The digits chosen so far; top-k: the tokens still to take; top-p: the
  // weight of the tokens ranked above the prefix, and the weight to reach.
  uint64_t prefix = 0;
  int64_t left = 0;
  double above = 0.0;
  double target = 0.0;
  int32_t id = -1;
  float logit = 0.0f;  // the drawn token's

  // Stage 0: top-k, 1: top-p.
  MNEME_HD bool Selects(int stage) const {
    return stage == 0 ? top_k > 0 : top_p < 1.0f;
  }
  // The tokens a stage ranks: top-p ranks those top-k kept.
  MNEME_HD bool Ranks(int stage, uint64_t key, int64_t i) const {
    return stage == 0 || k_cut.Keeps(key, i);
  }
  MNEME_HD bool Kept(uint64_t key, int64_t i, double w) const {
    return k_cut.Keeps(key, i) && p_cut.Keeps(key, i) && !(w < min_p);
  }
};

// weights[r, i] = token i's weight in row r; item = r * cols + i.
struct SampleWeightsOp {
  const float* x = nullptr;
  int64_t cols = 0;
  const SampleRow* rows = nullptr;
  double* weights = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const SampleRow& s = rows[item / cols];
    const double v =
        ExpD((double{x[s.row * cols + item % cols]} - double{s.max}) *
             s.inv_temperature);
    weights[item] = v == v ? v : 0.0;
  }
};

// One strided lane's histogram of the digit at `shift` over the ranked
// tokens whose keys match the prefix above it: counts and weights;
// item = r * lanes + c, [item][kSampleBins].
struct SampleHistOp {
  const double* weights = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  const SampleRow* rows = nullptr;
  int32_t stage = 0;
  int32_t shift = 0;
  int32_t* count = nullptr;
  double* mass = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    int32_t* n = count + item * kSampleBins;
    double* m = mass + item * kSampleBins;
    for (int b = 0; b < kSampleBins; ++b) {
      n[b] = 0;
      m[b] = 0.0;
    }
    const int64_t r = item / lanes;
    const SampleRow& s = rows[r];
    if (!s.Selects(stage)) return;
    const uint64_t mask = SampleHighMask(shift);
    const uint64_t want = s.prefix & mask;
    const double* w = weights + r * cols;
    for (int64_t i = item % lanes; i < cols; i += lanes) {
      const uint64_t key = DoubleToBits(w[i]);
      if ((key & mask) != want || !s.Ranks(stage, key, i)) continue;
      const auto bin = static_cast<int>((key >> shift) & (kSampleBins - 1));
      ++n[bin];
      m[bin] += w[i];
    }
  }
};

// The digit at `shift` of the cut's key from SampleHistOp's lanes, largest
// digit first; item = r. Top-k: the digit where the top_k-th token falls.
// Top-p: the first (non-empty) digit where the weight ranked above and at
// it reaches top_p times the top-k survivors' weight (the last non-empty
// digit when rounding leaves it short). The first digit starts the select.
// A row warp op (RowWarpRun): lane l sums every bin over the histogram
// lanes c = l, l + kWarpLanes, ... (Partial), the lanes' sums are added by
// the xor butterfly and one lane picks (Finish).
struct SamplePickOp {
  static constexpr bool kRowWarp = true;
  const int32_t* count = nullptr;
  const double* mass = nullptr;
  int64_t lanes = 0;
  int32_t stage = 0;
  int32_t shift = 0;
  SampleRow* rows = nullptr;

  // One lane's (then, summed, the row's) tokens and weight per bin.
  struct Bins {
    int64_t tokens[kSampleBins] = {};
    double weight[kSampleBins] = {};
    MNEME_HD Bins operator+(const Bins& o) const {
      Bins sum;
      for (int d = 0; d < kSampleBins; ++d) {
        sum.tokens[d] = tokens[d] + o.tokens[d];
        sum.weight[d] = weight[d] + o.weight[d];
      }
      return sum;
    }
  };

  MNEME_HD bool Selects(int64_t r) const { return rows[r].Selects(stage); }
  // Lane `lane`'s sums (none for a row this stage does not select).
  MNEME_HD Bins Partial(int64_t r, int lane) const {
    Bins b;
    if (!Selects(r)) return b;
    const int32_t* n = count + r * lanes * kSampleBins;
    const double* m = mass + r * lanes * kSampleBins;
    for (int64_t c = lane; c < lanes; c += kWarpLanes) {
      for (int d = 0; d < kSampleBins; ++d) {
        b.tokens[d] += n[c * kSampleBins + d];
        b.weight[d] += m[c * kSampleBins + d];
      }
    }
    return b;
  }
  // The digit from the row's bins (every lane's sums added).
  MNEME_HD void Pick(int64_t r, const Bins& b) const {
    SampleRow& s = rows[r];
    if (shift == 64 - kSampleDigitBits) {
      s.prefix = 0;
      s.left = s.top_k;
      s.above = 0.0;
      double total = 0.0;
      for (int d = 0; d < kSampleBins; ++d) total += b.weight[d];
      s.target = double{s.top_p} * total;
    }
    int chosen = -1;
    int last = -1;
    double above_last = 0.0;
    for (int d = kSampleBins - 1; d >= 0; --d) {
      const int64_t tokens = b.tokens[d];
      const double weight = b.weight[d];
      if (stage == 0) {
        if (s.left <= tokens) {
          chosen = d;
          break;
        }
        s.left -= tokens;
        continue;
      }
      if (tokens == 0) continue;
      if (s.above + weight >= s.target) {
        chosen = d;
        break;
      }
      last = d;
      above_last = s.above;
      s.above += weight;
    }
    if (chosen < 0) {
      chosen = last;
      s.above = above_last;
    }
    s.prefix |= static_cast<uint64_t>(chosen) << shift;
  }
  MNEME_HD void Finish(int64_t r, int lane, const Bins& b) const {
    if (lane == 0 && Selects(r)) Pick(r, b);
  }
  MNEME_HD void operator()(int64_t r) const { RowWarpRun(*this, r); }
};

// Per contiguous segment of kRowLane tokens: how many ranked tokens have
// the selected key; item = r * lanes + c.
struct SampleTieCountOp {
  const double* weights = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  const SampleRow* rows = nullptr;
  int32_t stage = 0;
  int32_t* ties = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t r = item / lanes;
    const int64_t c = item % lanes;
    const SampleRow& s = rows[r];
    int32_t q = 0;
    if (s.Selects(stage)) {
      const double* w = weights + r * cols;
      const int64_t end = RowSegmentEnd(c, cols);
      for (int64_t i = c * kRowLane; i < end; ++i) {
        const uint64_t key = DoubleToBits(w[i]);
        q += key == s.prefix && s.Ranks(stage, key, i) ? 1 : 0;
      }
    }
    ties[item] = q;
  }
};

// The stage's cut: the selected key, and the id after the last of its ties
// taken in id order. Top-k takes the ties left; top-p adds them one at a
// time to the weight ranked above until it reaches the target (all of them
// when rounding leaves it short). item = r.
struct SampleCutOp {
  const double* weights = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  const int32_t* ties = nullptr;
  int32_t stage = 0;
  SampleRow* rows = nullptr;
  MNEME_HD void operator()(int64_t r) const {
    SampleRow& s = rows[r];
    if (!s.Selects(stage)) return;
    const int32_t* q = ties + r * lanes;
    int64_t take = s.left;
    if (stage == 1) {
      int64_t all = 0;
      for (int64_t c = 0; c < lanes; ++c) all += q[c];
      const double w = BitsToDouble(s.prefix);
      double cumulative = s.above;
      take = 0;
      while (take < all) {
        cumulative += w;
        ++take;
        if (cumulative >= s.target) break;
      }
    }
    const double* w = weights + r * cols;
    int64_t seen = 0;
    int64_t id = cols;
    for (int64_t c = 0; c < lanes && id == cols; ++c) {
      if (seen + q[c] < take) {
        seen += q[c];
        continue;
      }
      const int64_t end = RowSegmentEnd(c, cols);
      for (int64_t i = c * kRowLane; i < end; ++i) {
        const uint64_t key = DoubleToBits(w[i]);
        if (key != s.prefix || !s.Ranks(stage, key, i)) continue;
        if (++seen == take) {
          id = i + 1;
          break;
        }
      }
    }
    SampleCut& cut = stage == 0 ? s.k_cut : s.p_cut;
    cut.key = s.prefix;
    cut.id = id;
  }
};

// Per contiguous segment of kRowLane tokens: the kept tokens' weight, in
// id order; item = r * lanes + c.
struct SampleMassOp {
  const double* weights = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  const SampleRow* rows = nullptr;
  double* mass = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t r = item / lanes;
    const int64_t c = item % lanes;
    const SampleRow& s = rows[r];
    const double* w = weights + r * cols;
    const int64_t end = RowSegmentEnd(c, cols);
    double sum = 0.0;
    for (int64_t i = c * kRowLane; i < end; ++i) {
      if (s.Kept(DoubleToBits(w[i]), i, w[i])) sum += w[i];
    }
    mass[item] = sum;
  }
};

// The draw: the kept token, in id order, where the cumulative weight first
// exceeds uniform times the kept weight (the last kept token of positive
// weight when rounding leaves it short); segments wholly below it are
// skipped by their sums. Its logit is kept beside it (the log-probability
// is then logit - the row's log-sum-exp). item = r.
struct SampleDrawOp {
  const float* x = nullptr;  // the logits
  const double* weights = nullptr;
  int64_t cols = 0;
  int64_t lanes = 0;
  const double* mass = nullptr;
  SampleRow* rows = nullptr;
  MNEME_HD void operator()(int64_t r) const {
    SampleRow& s = rows[r];
    s.id = Draw(r);
    if (s.id >= 0) s.logit = x[s.row * cols + s.id];
  }
  // Row r's drawn token (-1: none).
  MNEME_HD int32_t Draw(int64_t r) const {
    const SampleRow& s = rows[r];
    const double* m = mass + r * lanes;
    const double* w = weights + r * cols;
    double total = 0.0;
    for (int64_t c = 0; c < lanes; ++c) total += m[c];
    if (!(total > 0.0)) return -1;
    const double u = s.uniform * total;
    double cumulative = 0.0;
    int64_t last = -1;  // segment of the last positive weight
    for (int64_t c = 0; c < lanes; ++c) {
      if (m[c] > 0.0) last = c;
      if (!(cumulative + m[c] > u)) {
        cumulative += m[c];
        continue;
      }
      const int64_t end = RowSegmentEnd(c, cols);
      for (int64_t i = c * kRowLane; i < end; ++i) {
        if (!s.Kept(DoubleToBits(w[i]), i, w[i])) continue;
        cumulative += w[i];
        if (cumulative > u) return static_cast<int32_t>(i);
      }
    }
    const int64_t first = last * kRowLane;
    const int64_t end = RowSegmentEnd(last, cols);
    for (int64_t i = end - 1; i >= first; --i) {
      if (w[i] > 0.0 && s.Kept(DoubleToBits(w[i]), i, w[i])) {
        return static_cast<int32_t>(i);
      }
    }
    return -1;
  }
};

// ---- MoE routing ---------------------------------------------------------

// Whether biased score a (expert ia) ranks before b (expert ib): larger
// first, then the lower expert id; NaN after every number (a total order,
// so the top-k is always k distinct experts).
MNEME_HD inline bool RanksBefore(float a, int32_t ia, float b, int32_t ib) {
  const bool na = IsNanf(a);
  const bool nb = IsNanf(b);
  if (na != nb) return nb;
  if (!na && a != b) return a > b;
  return ia < ib;
}

MNEME_HD inline float RouteScore(float logit) {
  return Sqrtf(logit > 20.0f ? logit : Log1pf(Expf(logit)));
}

// The router's scores: score = sqrt(softplus(logit)) and biased = score +
// bias (bias null: none); item = t * experts + e.
struct RouteScoresOp {
  const float* logits = nullptr;
  const float* bias = nullptr;
  int64_t experts = 0;
  float* score = nullptr;
  float* biased = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const float s = RouteScore(logits[item]);
    score[item] = s;
    biased[item] = s + (bias != nullptr ? bias[item % experts] : 0.0f);
  }
};

// Backend::MoeRoute for one token from RouteScoresOp's scores; item = t.
// The k-th expert is the best of those ranking after the (k-1)-th, so no
// scratch is needed. One warp per token: each lane finds the best of its
// experts (lane, lane + kWarpLanes, ...; LaneBest), and an xor butterfly
// keeps the better of two lanes' (Better) until every lane holds the best
// of all. RanksBefore is a total order, so that is the same expert as one
// thread scanning them all, in any order of the pairings. operator() runs
// the lanes one after another here.
struct MoeRouteOp {
  const float* score = nullptr;
  const float* biased = nullptr;
  int64_t experts = 0;
  int32_t top_k = 0;
  float routed_scaling = 0.0f;
  int32_t* expert_ids = nullptr;
  float* weights = nullptr;

  // An expert and its biased score (id -1: none).
  struct Pick {
    int32_t id = -1;
    float value = 0.0f;
  };
  // a, or b where b ranks before it.
  MNEME_HD static Pick Better(const Pick& a, const Pick& b) {
    if (b.id < 0) return a;
    if (a.id < 0 || RanksBefore(b.value, b.id, a.value, a.id)) return b;
    return a;
  }
  // The best of lane `lane`'s experts that rank after `prev`.
  MNEME_HD Pick LaneBest(int64_t t, int lane, const Pick& prev) const {
    const float* b = biased + t * experts;
    Pick best;
    for (int64_t e = lane; e < experts; e += kWarpLanes) {
      const Pick candidate{.id = static_cast<int32_t>(e), .value = b[e]};
      if (prev.id >= 0 &&
          !RanksBefore(prev.value, prev.id, candidate.value, candidate.id)) {
        continue;
      }
      best = Better(best, candidate);
    }
    return best;
  }
  // The chosen experts' weights (every lane has the same choice; lane 0
  // writes).
  MNEME_HD void Finish(int64_t t, int lane, float sum) const {
    if (lane != 0) return;
    const float* s = score + t * experts;
    const int32_t* ids = expert_ids + t * top_k;
    float* w = weights + t * top_k;
    for (int32_t k = 0; k < top_k; ++k) {
      w[k] = sum > 0.0f ? s[ids[k]] / sum * routed_scaling
                        : routed_scaling / static_cast<float>(top_k);
    }
  }
  MNEME_HD void operator()(int64_t t) const {
    Pick prev;
    float sum = 0.0f;
    for (int32_t k = 0; k < top_k; ++k) {
      Pick lanes[kWarpLanes];
      for (int l = 0; l < kWarpLanes; ++l) lanes[l] = LaneBest(t, l, prev);
      for (int offset = kWarpLanes / 2; offset > 0; offset >>= 1) {
        Pick next[kWarpLanes];
        for (int l = 0; l < kWarpLanes; ++l) {
          next[l] = Better(lanes[l], lanes[l ^ offset]);
        }
        for (int l = 0; l < kWarpLanes; ++l) lanes[l] = next[l];
      }
      prev = lanes[0];
      expert_ids[t * top_k + k] = prev.id;
      sum += score[t * experts + prev.id];
    }
    Finish(t, 0, sum);
  }
};

// MoeRouting's hash routing (gpu/sampling.h HashRoute) of token t: its
// listed experts [T * top_k] weighed by their scores in double; a repeated
// listing's id becomes -1. item = t.
struct HashRouteOp {
  const float* logits = nullptr;
  int64_t experts = 0;
  const int32_t* listed = nullptr;
  int32_t top_k = 0;
  float routed_scaling = 0.0f;
  int32_t* expert_ids = nullptr;
  float* weights = nullptr;
  MNEME_HD void operator()(int64_t t) const {
    const int32_t* l = listed + t * top_k;
    int32_t* ids = expert_ids + t * top_k;
    float* w = weights + t * top_k;
    double sum = 0.0;
    for (int32_t i = 0; i < top_k; ++i) {
      const double x = logits[t * experts + l[i]];
      const double s = SqrtD(x > 20.0 ? x : Log1pD(ExpD(x)));
      bool repeated = false;
      for (int32_t j = 0; j < i; ++j) repeated = repeated || l[j] == l[i];
      ids[i] = repeated ? -1 : l[i];
      w[i] = static_cast<float>(s);
      sum += s;
    }
    for (int32_t i = 0; i < top_k; ++i) {
      w[i] = static_cast<float>(w[i] / sum * routed_scaling);
    }
  }
};

// ---- MoE assignments grouped on the device ------------------------------
//
// MoeExperts' grouping (gpu/sampling.h GroupByExpert) without the host: the
// assignments a < n (ids [n], a token's top_k side by side) of this rank's
// `experts` (global ids first_expert + e) are counted per chunk of
// kExpertChunk assignments (ExpertChunkCountOp), the counts turned into
// each chunk's start within its expert (ExpertChunkStartsOp), the experts'
// offsets and grouped GEMM tables laid out (ExpertPlanOp) and the tokens
// and weights placed expert by expert, each expert's in ascending order of
// a (ExpertScatterOp). The launches after it are sized for all n
// assignments (the most this rank can get): slots past the grouped ones
// are padding (ExpertScatterOp too) that the grouped GEMMs and ScatterAddOp
// skip.
inline constexpr int64_t kExpertChunk = 256;

// counts[e * chunks + c] = the assignments a of chunk c ([c *
// kExpertChunk, (c + 1) * kExpertChunk) within [0, n)) with ids[a] ==
// first_expert + e; item = e * chunks + c.
struct ExpertChunkCountOp {
  const int32_t* ids = nullptr;
  int64_t n = 0;
  int64_t first_expert = 0;
  int64_t chunks = 0;
  int32_t* counts = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t e = item / chunks;
    const int64_t begin = item % chunks * kExpertChunk;
    const int64_t end = begin + kExpertChunk < n ? begin + kExpertChunk : n;
    int32_t count = 0;
    for (int64_t a = begin; a < end; ++a) {
      count += ids[a] == first_expert + e ? 1 : 0;
    }
    counts[item] = count;
  }
};

// Per expert e: counts[e * chunks + c] becomes the expert's assignments in
// the chunks before c, totals[e] its assignments in all; item = e.
struct ExpertChunkStartsOp {
  int32_t* counts = nullptr;
  int64_t chunks = 0;
  int32_t* totals = nullptr;
  MNEME_HD void operator()(int64_t e) const {
    int32_t sum = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t count = counts[e * chunks + c];
      counts[e * chunks + c] = sum;
      sum += count;
    }
    totals[e] = sum;
  }
};

// A grouped GEMM table of `experts` experts (ExpertPlanOp): the row op's
// groups (one per expert, then a sentinel), then the tiles' (the same).
MNEME_HD inline int64_t ExpertTableGroups(int64_t experts) {
  return 2 * (experts + 1);
}

// The grouped layout: offsets[e] = the assignments of the experts before e
// (offsets[experts] = all of this rank's), and up to kExpertTables grouped
// GEMM tables (one per projection; their weights and input scales set by
// the host, ExpertTableGroups(experts) groups each). In table j, expert e's
// tokens [offsets[e], offsets[e + 1]) go to its tiles' group when
// TakesTiles(tokens, its weight's rows), else to its row op's group; its
// other group gets none. Each half's first_item counts the items of its
// groups before (LinearOp::Items, LinearTiledOp::Tiles); its sentinel (no
// tokens) starts at the half's item count, where a launch's surplus goes. item
// = table j (j == 0 also writes offsets).
//
// One warp per table: the experts go kWarpLanes at a time, lane l taking
// expert e0 + l (Of: its tokens and items), the counts of the experts
// before each found by a warp scan (WarpInclusiveScan; shuffles on the
// device) plus the carry of the rounds before, and each lane writes its
// expert's groups (Place). A decode step's MoE layer used to wait for one
// thread's serial walk over all the rank's experts (a memory round trip an
// expert) in each of its layers. operator() runs the lanes one after
// another here.
inline constexpr int kExpertTables = 3;
struct ExpertPlanOp {
  const int32_t* totals = nullptr;
  int64_t experts = 0;
  int64_t* offsets = nullptr;
  LinearGroup* tables[kExpertTables] = {};

  // An expert's (or, summed, a run of experts') tokens and the items it
  // takes in the row op's half and in the tiles' half.
  struct Counts {
    int64_t tokens = 0;
    int64_t row_items = 0;
    int64_t tile_items = 0;
    MNEME_HD Counts operator+(const Counts& o) const {
      return Counts{.tokens = tokens + o.tokens,
                    .row_items = row_items + o.row_items,
                    .tile_items = tile_items + o.tile_items};
    }
    MNEME_HD Counts operator-(const Counts& o) const {
      return Counts{.tokens = tokens - o.tokens,
                    .row_items = row_items - o.row_items,
                    .tile_items = tile_items - o.tile_items};
    }
  };
  // Expert e's counts in table j (none for e >= experts).
  MNEME_HD Counts Of(int64_t j, int64_t e) const {
    Counts c;
    if (e >= experts) return c;
    c.tokens = totals[e];
    const LinearOp op{.w = tables[j][e].w, .tokens = c.tokens};
    if (c.tokens > 0 && op.w.rows > 0 && TakesTiles(c.tokens, op.w.rows)) {
      c.tile_items = LinearTiledOp{.args = op}.Tiles();
    } else if (c.tokens > 0) {
      c.row_items = op.Items();
    }
    return c;
  }
  // Writes expert e's groups in table j (e == experts: the sentinels) from
  // the counts of the experts before it and its own.
  MNEME_HD void Place(int64_t j, int64_t e, const Counts& before,
                      const Counts& mine) const {
    LinearGroup& by_rows = tables[j][e];
    LinearGroup& by_tiles = tables[j][experts + 1 + e];
    if (j == 0) offsets[e] = before.tokens;
    by_rows.first_token = by_tiles.first_token = before.tokens;
    by_rows.first_item = before.row_items;
    by_tiles.first_item = before.tile_items;
    const bool tiles = mine.tile_items > 0;
    by_rows.tokens = tiles ? 0 : mine.tokens;
    by_tiles.tokens = tiles ? mine.tokens : 0;
  }

  // The warp of table j on the host: each round's lanes in turn, the scan
  // as the device's shuffles take it.
  void operator()(int64_t j) const {
    Counts carry;
    for (int64_t e0 = 0; e0 < experts; e0 += kWarpLanes) {
      Counts mine[kWarpLanes];
      Counts inclusive[kWarpLanes];
      for (int l = 0; l < kWarpLanes; ++l) {
        mine[l] = inclusive[l] = Of(j, e0 + l);
      }
      WarpInclusiveScan(inclusive);
      for (int l = 0; l < kWarpLanes; ++l) {
        if (e0 + l < experts) {
          Place(j, e0 + l, carry + (inclusive[l] - mine[l]), mine[l]);
        }
      }
      carry = carry + inclusive[kWarpLanes - 1];
    }
    Place(j, experts, carry, Counts{});
  }
};

// The assignments in the grouped order: slot offsets[e] + (e's assignments
// before a) gets a's token (a / top_k) in rows and its weight in weights;
// item = e * chunks + c < experts * chunks places chunk c's assignments of
// expert e (its start from ExpertChunkStartsOp). In the same launch (items
// = Items(): the two never write the same slot) item = slot < n pads the
// slots past the grouped assignments (slot >= offsets[experts]) of a layout
// sized for all n: row -1 (MoveRowsOp reads zeros for it, ScatterAddOp
// skips it), weight 0.
struct ExpertScatterOp {
  const int32_t* ids = nullptr;
  const float* assignment_weights = nullptr;
  int64_t n = 0;
  int32_t top_k = 0;
  int64_t first_expert = 0;
  int64_t experts = 0;
  int64_t chunks = 0;
  const int32_t* chunk_starts = nullptr;
  const int64_t* offsets = nullptr;
  int32_t* rows = nullptr;
  float* weights = nullptr;
  MNEME_HD int64_t Items() const {
    return experts * chunks > n ? experts * chunks : n;
  }
  MNEME_HD void operator()(int64_t item) const {
    if (item < n && item >= offsets[experts]) {
      rows[item] = -1;
      weights[item] = 0.0f;
    }
    if (item >= experts * chunks) return;
    const int64_t e = item / chunks;
    const int64_t begin = item % chunks * kExpertChunk;
    const int64_t end = begin + kExpertChunk < n ? begin + kExpertChunk : n;
    int64_t slot = offsets[e] + chunk_starts[item];
    for (int64_t a = begin; a < end; ++a) {
      if (ids[a] != first_expert + e) continue;
      rows[slot] = static_cast<int32_t>(a / top_k);
      weights[slot] = assignment_weights[a];
      ++slot;
    }
  }
};

// GroupedQuantizeW4A4Op's per-token scales of the grouped layout: slot p of
// expert e (offsets[e] <= p < offsets[e + 1]) takes groups[e].input_scale
// (a table's row op half), a slot past them 0 (copied); item = slot.
struct ExpertTokenScalesOp {
  const LinearGroup* groups = nullptr;
  const int64_t* offsets = nullptr;
  int64_t experts = 0;
  float* scales = nullptr;
  MNEME_HD void operator()(int64_t slot) const {
    // The last e <= experts with offsets[e] <= slot: slot's expert, or
    // experts when slot is past them all.
    int64_t lo = 0;
    int64_t hi = experts;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= slot) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    scales[slot] = lo < experts ? groups[lo].input_scale : 0.0f;
  }
};

// ---- indexer top-k -------------------------------------------------------

// Backend::SelectTopK as a radix select on keys that order the entries as
// the selection ranks them: a larger key ranks first, 0 = not eligible,
// 1 = NaN (after every number), numbers above (-0 as +0). The keys are
// read 4 bits at a time from the top (kTopKDigits passes of a histogram
// over the entries that match the digits chosen so far, then the pick of
// the next digit), which leaves per row the k-th largest key `prefix` and
// `rank`, how many entries equal to it are taken (the lowest ids). Rows are
// read by lanes = ceil(cols / kRowLane) items: strided for the histograms,
// contiguous segments of kRowLane entries for the ordered output.
inline constexpr int kTopKDigitBits = 4;
inline constexpr int kTopKBins = 1 << kTopKDigitBits;
inline constexpr int kTopKDigits = 32 / kTopKDigitBits;

// The order-preserving key of a number (not NaN): larger keys for larger
// values, -0 as +0, every key >= 2.
MNEME_HD inline uint32_t TopKKeyOf(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = FloatToBits(v);
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// The scores and the eligibility of Backend::SelectTopK, or (keys not null)
// keys made beforehand (BlockKeyOp).
struct TopKRows {
  const float* scores = nullptr;
  int64_t cols = 0;
  float scale = 1.0f;
  const int64_t* visible = nullptr;
  // [rows, blocks_per_row], ascending then -1; null when blocks_per_row is 0.
  const int32_t* blocks = nullptr;
  int32_t blocks_per_row = 0;
  int32_t block_size = 1;
  // [rows, cols]: used instead of scores, blocks and scale when not null.
  const uint32_t* keys = nullptr;

  // The end of contiguous segment c: [c * kRowLane, SegmentEnd(c)).
  MNEME_HD int64_t SegmentEnd(int64_t c) const {
    return RowSegmentEnd(c, cols);
  }

  MNEME_HD uint32_t Key(int64_t t, int64_t e) const {
    if (e >= visible[t]) return 0;
    if (keys != nullptr) return keys[t * cols + e];
    if (blocks_per_row > 0) {
      // Binary search of e's block among the row's (-1 padding is last).
      const int32_t* b = blocks + t * blocks_per_row;
      const int64_t want = e / block_size;
      int32_t lo = 0;
      int32_t hi = blocks_per_row;
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (b[mid] >= 0 && b[mid] < want) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      if (lo == blocks_per_row || b[lo] != want) return 0;
    }
    const float v = scores[t * cols + e] * scale;
    return IsNanf(v) ? 1 : TopKKeyOf(v);
  }
};

// Backend::SelectCandidateBlocks' block keys: block b of row t scores as the
// largest scores[t, e] * scale of its entries below visible[t] (NaN
// ignored), the block of entry visible[t] - 1 as +inf; key 0 (not
// eligible) for a block with no such entry or no number above -inf.
// item = t * blocks + b; keys [rows, blocks].
struct BlockKeyOp {
  const float* scores = nullptr;
  int64_t cols = 0;
  float scale = 1.0f;
  const int64_t* visible = nullptr;
  int32_t block_size = 1;
  int64_t blocks = 0;
  uint32_t* keys = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / blocks;
    const int64_t b = item % blocks;
    int64_t v = visible[t] < cols ? visible[t] : cols;
    v = v < 0 ? 0 : v;
    const int64_t first = b * block_size;
    const int64_t end = first + block_size < v ? first + block_size : v;
    float m = -BitsToFloat(0x7F800000u);  // -inf
    const float* row = scores + t * cols;
    for (int64_t e = first; e < end; ++e) {
      const float x = row[e] * scale;
      if (m < x) m = x;  // false for NaN
    }
    if (first >= v) {
      keys[item] = 0;
    } else if (b == (v - 1) / block_size) {
      keys[item] = TopKKeyOf(BitsToFloat(0x7F800000u));
    } else {
      keys[item] = m == -BitsToFloat(0x7F800000u) ? 0 : TopKKeyOf(m);
    }
  }
};

// The digits above `shift` (none in the first pass).
MNEME_HD inline uint32_t TopKHighMask(int shift) {
  return shift + kTopKDigitBits >= 32
             ? 0u
             : ~((uint32_t{1} << (shift + kTopKDigitBits)) - 1u);
}

// One lane's histogram of the digit at `shift` over the eligible entries
// matching prefix[t] above it; item = t * lanes + c, hist [item][kTopKBins].
struct TopKHistOp {
  TopKRows rows;
  int64_t lanes = 0;
  int32_t shift = 0;
  const uint32_t* prefix = nullptr;
  int32_t* hist = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / lanes;
    const int64_t c = item % lanes;
    int32_t* h = hist + item * kTopKBins;
    for (int b = 0; b < kTopKBins; ++b) h[b] = 0;
    const uint32_t mask = TopKHighMask(shift);
    const uint32_t want = prefix[t] & mask;
    const int64_t end =
        rows.visible[t] < rows.cols ? rows.visible[t] : rows.cols;
    for (int64_t e = c; e < end; e += lanes) {
      const uint32_t key = rows.Key(t, e);
      if (key == 0 || (key & mask) != want) continue;
      ++h[(key >> shift) & (kTopKBins - 1)];
    }
  }
};

// The next digit of row t's k-th largest key from TopKHistOp's lanes
// (largest digit first); item = t. The first pass (shift 28) also sets
// want[t] = min(k, eligible entries), counts[t] = want[t] and the -1
// padding of ids after it. A row warp op, as SamplePickOp: lane l sums
// every bin over the histogram lanes l, l + kWarpLanes, ... (Partial), the
// lanes' sums are added by the xor butterfly, and one lane picks (Finish).
struct TopKPickOp {
  static constexpr bool kRowWarp = true;
  const int32_t* hist = nullptr;
  int64_t lanes = 0;
  int32_t shift = 0;
  int32_t k = 0;
  uint32_t* prefix = nullptr;
  int32_t* rank = nullptr;
  int32_t* want = nullptr;
  int32_t* ids = nullptr;
  int32_t* counts = nullptr;

  // One lane's (then, summed, the row's) entries per bin.
  struct Bins {
    int32_t n[kTopKBins] = {};
    MNEME_HD Bins operator+(const Bins& o) const {
      Bins sum;
      for (int d = 0; d < kTopKBins; ++d) sum.n[d] = n[d] + o.n[d];
      return sum;
    }
  };

  MNEME_HD Bins Partial(int64_t t, int lane) const {
    const int32_t* h = hist + t * lanes * kTopKBins;
    Bins b;
    for (int64_t c = lane; c < lanes; c += kWarpLanes) {
      for (int d = 0; d < kTopKBins; ++d) b.n[d] += h[c * kTopKBins + d];
    }
    return b;
  }
  // The digit from the row's bins (every lane's sums added).
  MNEME_HD void Pick(int64_t t, const Bins& b) const {
    if (shift == 32 - kTopKDigitBits) {
      int64_t eligible = 0;
      for (int d = 0; d < kTopKBins; ++d) eligible += b.n[d];
      const int32_t w = eligible < k ? static_cast<int32_t>(eligible) : k;
      want[t] = w;
      counts[t] = w;
      for (int32_t i = w; i < k; ++i) ids[t * k + i] = -1;
      prefix[t] = 0;
      rank[t] = w;
    }
    if (want[t] == 0) return;
    int32_t left = rank[t];
    for (int d = kTopKBins - 1; d >= 0; --d) {
      if (left <= b.n[d]) {
        prefix[t] |= static_cast<uint32_t>(d) << shift;
        break;
      }
      left -= b.n[d];
    }
    rank[t] = left;
  }
  MNEME_HD void Finish(int64_t t, int lane, const Bins& b) const {
    if (lane == 0) Pick(t, b);
  }
  MNEME_HD void operator()(int64_t t) const { RowWarpRun(*this, t); }
};

// Per contiguous segment of kRowLane entries: how many keys are above the
// row's k-th largest key and how many equal it; item = t * lanes + c.
struct TopKCountOp {
  TopKRows rows;
  int64_t lanes = 0;
  const uint32_t* prefix = nullptr;
  const int32_t* want = nullptr;
  int32_t* above = nullptr;
  int32_t* equal = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / lanes;
    const int64_t c = item % lanes;
    int32_t a = 0;
    int32_t q = 0;
    if (want[t] > 0) {
      const int64_t end = rows.SegmentEnd(c);
      for (int64_t e = c * kRowLane; e < end; ++e) {
        const uint32_t key = rows.Key(t, e);
        a += key > prefix[t] ? 1 : 0;
        q += key == prefix[t] ? 1 : 0;
      }
    }
    above[item] = a;
    equal[item] = q;
  }
};

// Writes one segment's chosen entries in order: every key above the k-th
// largest, and of those equal to it the first rank[t] of the row; the
// segment's place in ids follows from the counts of the segments before
// it. item = t * lanes + c.
struct TopKEmitOp {
  TopKRows rows;
  int64_t lanes = 0;
  int32_t k = 0;
  const uint32_t* prefix = nullptr;
  const int32_t* rank = nullptr;
  const int32_t* want = nullptr;
  const int32_t* above = nullptr;
  const int32_t* equal = nullptr;
  int32_t* ids = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t t = item / lanes;
    const int64_t c = item % lanes;
    if (want[t] == 0) return;
    const int32_t ties = rank[t];
    int32_t at = 0;
    int32_t equal_before = 0;
    for (int64_t s = t * lanes; s < item; ++s) {
      const int32_t left = ties - equal_before;
      at += above[s] + (left <= 0 ? 0 : (left < equal[s] ? left : equal[s]));
      equal_before += equal[s];
    }
    const int64_t end = rows.SegmentEnd(c);
    int32_t* out = ids + t * k;
    for (int64_t e = c * kRowLane; e < end; ++e) {
      const uint32_t key = rows.Key(t, e);
      if (key > prefix[t]) {
        out[at++] = static_cast<int32_t>(e);
      } else if (key == prefix[t]) {
        if (equal_before < ties) out[at++] = static_cast<int32_t>(e);
        ++equal_before;
      }
    }
  }
};

// The key lists of queries whose compressed entries the indexer chose on
// the device (Backend::ChooseAndAttend): row t of idx [T, fixed_width + k]
// is row t of fixed [T, fixed_width], then for each of row t's chosen
// entries (ids [T, k], counts [T]: TopKPickOp / TopKEmitOp's) its row
// entry_rows[t * entries + e], then -1. One item per slot of idx.
struct ChosenKeysOp {
  const int32_t* fixed = nullptr;
  int64_t fixed_width = 0;
  const int32_t* ids = nullptr;
  const int32_t* counts = nullptr;
  int32_t k = 0;
  const int32_t* entry_rows = nullptr;
  int64_t entries = 0;
  int32_t* idx = nullptr;
  MNEME_HD void operator()(int64_t item) const {
    const int64_t width = fixed_width + k;
    const int64_t t = item / width;
    const int64_t j = item % width;
    int32_t row = -1;
    if (j < fixed_width) {
      row = fixed[t * fixed_width + j];
    } else if (j - fixed_width < counts[t]) {
      const int32_t e = ids[t * k + (j - fixed_width)];
      if (e >= 0) row = entry_rows[t * entries + e];
    }
    idx[item] = row;
  }
};

// Every op, for the executors' declarations and instantiations.
#define MNEME_KERNEL_OPS(X) \
  X(LinearOp)               \
  X(LinearTiledOp)          \
  X(GroupedLinearOp)        \
  X(GroupedLinearTiledOp)   \
  X(DequantizeOp)           \
  X(Hadamard128Op)          \
  X(QuantizeW4A4Op)         \
  X(GroupedQuantizeW4A4Op)  \
  X(RmsNormOp)              \
  X(RopeOp)                 \
  X(AddOp)                  \
  X(CopyBlockOp)            \
  X(MoveRowsOp)             \
  X(GatherColumnsOp)        \
  X(EmbeddingOp)            \
  X(ApplySinkOp)            \
  X(DcpGlobalLseOp)         \
  X(DcpWeighOp)             \
  X(SparseAttentionOp)      \
  X(SparseAttentionBlockOp) \
  X(SparseAttentionMergeOp) \
  X(IndexScoresOp)          \
  X(IndexScoresTiledOp)     \
  X(SoftmaxPoolOp)          \
  X(RowRsqrtOp)             \
  X(HcMixOp)                \
  X(HcCombineOp)            \
  X(HcPostOp)               \
  X(EngramGateOp)           \
  X(UnpackBf16RowsOp)       \
  X(SwiGluOp)               \
  X(ScatterAddOp)           \
  X(RowMaxPartialOp)        \
  X(RowMaxOp)               \
  X(RowExpSumPartialOp)     \
  X(RowLogProbOp)           \
  X(SampleWeightsOp)        \
  X(SampleHistOp)           \
  X(SamplePickOp)           \
  X(SampleTieCountOp)       \
  X(SampleCutOp)            \
  X(SampleMassOp)           \
  X(SampleDrawOp)           \
  X(RouteScoresOp)          \
  X(MoeRouteOp)             \
  X(HashRouteOp)            \
  X(ExpertChunkCountOp)     \
  X(ExpertChunkStartsOp)    \
  X(ExpertPlanOp)           \
  X(ExpertScatterOp)        \
  X(ExpertTokenScalesOp)    \
  X(BlockKeyOp)             \
  X(TopKHistOp)             \
  X(TopKPickOp)             \
  X(TopKCountOp)            \
  X(TopKEmitOp)             \
  X(ChosenKeysOp)

}  // namespace mneme::gpu::kernels

#endif  // MNEME_GPU_CUDA_KERNEL_OPS_H_
