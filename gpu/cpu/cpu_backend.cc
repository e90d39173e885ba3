#include "gpu/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "formats/gridbook/gridbook.h"
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/backend_checks.h"
#include "gpu/cpu/codebook_kernels.h"
#include "gpu/cpu/cpu_backend_internal.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/cpu/quant_kernels.h"
#include "gpu/host_weight.h"

namespace mneme::gpu {
namespace {

namespace k = cpu_kernels;
using cpu_backend_internal::AlignedBytes;
using cpu_backend_internal::AlignedFloats;
using cpu_backend_internal::AsCpu;
using cpu_backend_internal::CpuWeight;
using cpu_backend_internal::Grain;
using cpu_backend_internal::kMinWorkPerTask;
using cpu_backend_internal::Rsqrt;

constexpr int64_t kAlignment = 64;
// Products with at most this many tokens run on packed weights directly
// (quant_kernels::DotRows); more tokens decode panels for OpenBLAS.
constexpr int64_t kMaxDecodeTokens = 16;
// Floats of one decoded panel of a packed weight (4 MiB).
constexpr int64_t kPanelFloats = int64_t{1} << 20;
// Requests above this many bytes are refused without asking the allocator
// (it could only fail, or overcommit what can never be backed).
constexpr int64_t kMaxAllocationBytes = int64_t{1} << 46;

// `elements` zero-filled floats aligned to kAlignment; null when out of
// memory. elements >= 0 and elements * 4 <= kMaxAllocationBytes.
AlignedFloats AllocateAligned(int64_t elements) {
  const int64_t bytes = std::max<int64_t>(
      kAlignment, (elements * 4 + kAlignment - 1) / kAlignment * kAlignment);
  void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(bytes));
  if (p == nullptr) return nullptr;
  std::memset(p, 0, static_cast<size_t>(bytes));
  return AlignedFloats(static_cast<float*>(p));
}

// `bytes` bytes aligned to kAlignment (rounded up; the padding zeroed); null
// when out of memory. 0 <= bytes <= kMaxAllocationBytes.
AlignedBytes AllocateAlignedBytes(int64_t bytes) {
  const int64_t rounded = std::max<int64_t>(
      kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
  if (p == nullptr) return nullptr;
  std::memset(static_cast<uint8_t*>(p) + bytes, 0,
              static_cast<size_t>(rounded - bytes));
  return AlignedBytes(static_cast<uint8_t*>(p));
}

// Rows [begin, end) of a packed weight as fp32 into out (EXL3: multiples of
// 128).
void DecodePackedRows(const quant_kernels::PackedMatrix& w, int64_t begin,
                      int64_t end, float* out) {
  switch (w.format) {
    case WeightFormat::kExl3:
      codebook_kernels::Exl3DecodeRows(w, begin, end, out);
      return;
    case WeightFormat::kGridbook:
      codebook_kernels::GridbookDecodeRows(w, begin, end, out);
      return;
    default:
      quant_kernels::DecodeRows(w, begin, end, out);
  }
}

class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(AlignedFloats data, int64_t size)
      : data_(std::move(data)), size_(size) {}
  int64_t size() const override { return size_; }
  float* data() override { return data_.get(); }
  const float* data() const override { return data_.get(); }

 private:
  AlignedFloats data_;
  int64_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    const CpuBackendOptions& options) {
  if (options.threads < 0 || options.threads > kMaxCpuBackendThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CpuBackendOptions.threads must be in [0, ", kMaxCpuBackendThreads,
        "] (0 = hardware concurrency), got ", options.threads));
  }
  int threads = options.threads;
  if (threads == 0) {
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()),
                         1, kMaxCpuBackendThreads);
  }
  openblas_set_num_threads(threads);
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(threads, options.dequantize_weights));
}

const char* CpuBackend::SimdTargetName() { return k::SimdTargetName(); }

absl::StatusOr<std::unique_ptr<Buffer>> CpuBackend::Allocate(int64_t elements) {
  CHECK_GE(elements, 0);
  if (elements > kMaxAllocationBytes / 4) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a buffer of ", elements, " floats exceeds the host allocation limit"));
  }
  AlignedFloats data = AllocateAligned(elements);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory for ", elements, " floats"));
  }
  return std::make_unique<CpuBuffer>(std::move(data), elements);
}

void CpuBackend::CopyFromHost(absl::Span<const float> src, float* dst) {
  if (!src.empty()) std::memcpy(dst, src.data(), src.size() * sizeof(float));
}

const float* CpuBackend::StageFromHost(HostStaging& staging, int64_t offset,
                                       int64_t floats, float* /*dst*/) {
  CheckStagingRange(staging, offset, floats);
  return staging.data() + offset;
}

void CpuBackend::CopyToHost(const float* src, absl::Span<float> dst) {
  if (!dst.empty()) std::memcpy(dst.data(), src, dst.size() * sizeof(float));
}

absl::StatusOr<std::unique_ptr<Weight>> CpuBackend::UploadWeight(
    const HostWeight& weight) {
  RETURN_IF_ERROR(ValidateHostWeight(weight));
  if (dequantize_weights_ || weight.format == WeightFormat::kF32) {
    AlignedFloats values = AllocateAligned(weight.rows * weight.cols);
    if (values == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory for a ", weight.rows, " x ",
                       weight.cols, " fp32 weight"));
    }
    float* out = values.get();
    pool_.ParallelFor(weight.rows, Grain(weight.cols),
                      [&](int64_t begin, int64_t end) {
                        DequantizeRows(weight, begin, end, out);
                      });
    return std::make_unique<CpuWeight>(weight.format, weight.rows, weight.cols,
                                       std::move(values),
                                       weight.gridbook_input_scale);
  }
  // The checkpoint's bytes as they are: codes, then the scales.
  const int64_t data_bytes = static_cast<int64_t>(weight.data.size());
  const int64_t total = data_bytes + static_cast<int64_t>(weight.scale.size());
  AlignedBytes bytes = AllocateAlignedBytes(total);
  if (bytes == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of host memory for a ", weight.rows, " x ", weight.cols, " ",
        WeightFormatName(weight.format), " weight (", total, " bytes)"));
  }
  std::memcpy(bytes.get(), weight.data.data(), weight.data.size());
  if (!weight.scale.empty()) {
    std::memcpy(bytes.get() + data_bytes, weight.scale.data(),
                weight.scale.size());
  }
  const quant_kernels::PackedMatrix packed{
      .format = weight.format,
      .rows = weight.rows,
      .cols = weight.cols,
      .data = bytes.get(),
      .scale = bytes.get() + data_bytes,
      .block_rows = weight.block_rows,
      .block_cols = weight.block_cols,
      .global_scale = weight.global_scale,
      .exl3_bits = weight.exl3_bits,
      .exl3_codebook = weight.exl3_codebook,
      .gridbook_scheme = weight.gridbook_scheme,
      .gridbook_books = weight.gridbook_books.get(),
      .gridbook_input_scale = weight.gridbook_input_scale};
  return std::make_unique<CpuWeight>(packed, std::move(bytes), total,
                                     weight.gridbook_books);
}

void CpuBackend::DequantizeWeight(const Weight& weight, absl::Span<float> out) {
  const CpuWeight& w = AsCpu(weight);
  CHECK_EQ(static_cast<int64_t>(out.size()), w.rows() * w.cols());
  if (w.values() != nullptr) {
    std::memcpy(out.data(), w.values(), out.size() * sizeof(float));
    return;
  }
  DecodePackedRows(w.packed(), 0, w.rows(), out.data());
}

void CpuBackend::Gemm(const float* x, int64_t tokens, const CpuWeight& w,
                      float* y, Accumulate accumulate) {
  const int64_t k = w.cols();
  const int64_t n = w.rows();
  if (tokens == 0 || n == 0) return;
  // OpenBLAS takes int sizes.
  CHECK_LE(k, std::numeric_limits<int>::max());
  CHECK_LE(n, std::numeric_limits<int>::max());
  CHECK_LE(tokens, std::numeric_limits<int>::max());
  const bool add = accumulate == Accumulate::kYes;
  if (const float g = w.input_scale(); g > 0.0f) {
    // The static W4A4 contract: the product takes the quantized activations
    // (each token's groups of 16), also when the weight was dequantized.
    if (static_cast<int64_t>(w4a4_input_.size()) < tokens * k) {
      w4a4_input_.resize(static_cast<size_t>(tokens * k));
    }
    float* const xq = w4a4_input_.data();
    pool_.ParallelFor(tokens, Grain(k), [&](int64_t begin, int64_t end) {
      formats::gridbook::QuantizeActivationsW4A4(
          x + begin * k, (end - begin) * k, g, xq + begin * k, nullptr,
          nullptr);
    });
    x = xq;
  }
  if (w.values() == nullptr) {
    const quant_kernels::PackedMatrix& packed = w.packed();
    if (packed.format == WeightFormat::kExl3 &&
        tokens <= codebook_kernels::kMaxExl3Tokens) {
      // exllamav3's route: the input transform once, then 128 outputs (the
      // Hadamard block) at a time, the tiles decoded on the stack.
      if (static_cast<int64_t>(exl3_input_.size()) < 2 * tokens * k) {
        exl3_input_.resize(static_cast<size_t>(2 * tokens * k));
      }
      float* const xp = exl3_input_.data();
      codebook_kernels::Exl3TransformInput(packed, x, tokens, xp);
      const int64_t blocks = n / formats::exl3::kHadamardSize;
      pool_.ParallelFor(blocks,
                        Grain(formats::exl3::kHadamardSize * k * tokens),
                        [&](int64_t begin, int64_t end) {
                          codebook_kernels::Exl3OutputBlocks(
                              packed, xp, tokens, begin, end, y, n, add);
                        });
      return;
    }
    if (tokens <= kMaxDecodeTokens && packed.format != WeightFormat::kExl3) {
      // Each row decoded once (a tile at a time) for all the tokens.
      pool_.ParallelFor(n, Grain(k * tokens), [&](int64_t begin, int64_t end) {
        if (packed.format == WeightFormat::kGridbook) {
          codebook_kernels::GridbookDotRows(packed, x, tokens, begin, end, y, n,
                                            add);
        } else {
          quant_kernels::DotRows(packed, x, tokens, begin, end, y, n, add);
        }
      });
      return;
    }
    // Many tokens (prefill): panels of rows decoded to fp32, each multiplied
    // by OpenBLAS, so the decoding is shared by all the tokens. EXL3 panels
    // are whole 128-row blocks.
    const int64_t granule =
        packed.format == WeightFormat::kExl3 ? formats::exl3::kHadamardSize : 1;
    const int64_t panel_rows =
        std::clamp<int64_t>(kPanelFloats / k / granule, 1, n / granule) *
        granule;
    // Reused by later calls (one caller at a time): grown, never zeroed per
    // call (every row is decoded before it is read).
    if (static_cast<int64_t>(panel_.size()) < panel_rows * k) {
      panel_.resize(static_cast<size_t>(panel_rows * k));
    }
    float* const panel = panel_.data();
    for (int64_t r0 = 0; r0 < n; r0 += panel_rows) {
      const int64_t rows = std::min(panel_rows, n - r0);
      pool_.ParallelFor(
          rows / granule, Grain(k * granule), [&](int64_t begin, int64_t end) {
            DecodePackedRows(packed, r0 + begin * granule, r0 + end * granule,
                             panel + begin * granule * k);
          });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
                  static_cast<int>(tokens), static_cast<int>(rows),
                  static_cast<int>(k), 1.0f, x, static_cast<int>(k), panel,
                  static_cast<int>(k), add ? 1.0f : 0.0f, y + r0,
                  static_cast<int>(n));
    }
    return;
  }
  const float* values = w.values();
  if (tokens == 1) {
    // Zeroed first rather than relying on beta = 0 ignoring y, so that
    // whatever the buffer held (NaN included) is not read.
    if (!add) std::fill(y, y + n, 0.0f);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n),
                static_cast<int>(k), 1.0f, values, static_cast<int>(k), x, 1,
                1.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tokens),
              static_cast<int>(n), static_cast<int>(k), 1.0f, x,
              static_cast<int>(k), values, static_cast<int>(k),
              add ? 1.0f : 0.0f, y, static_cast<int>(n));
}

void CpuBackend::Linear(ConstMatrixView x, const Weight& w, MatrixView y,
                        Accumulate accumulate) {
  const CpuWeight& weight = AsCpu(w);
  CHECK_EQ(x.cols, weight.cols());
  CHECK_EQ(y.rows, x.rows);
  CHECK_EQ(y.cols, weight.rows());
  Gemm(x.data, x.rows, weight, y.data, accumulate);
}

void CpuBackend::RmsNorm(ConstMatrixView x, const float* weight, float eps,
                         MatrixView y) {
  CHECK_EQ(y.rows, x.rows);
  CHECK_EQ(y.cols, x.cols);
  const int64_t cols = x.cols;
  if (cols == 0) return;
  pool_.ParallelFor(x.rows, Grain(2 * cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x.data + r * cols;
      const float mean_square =
          k::SumSquares(row, cols) / static_cast<float>(cols);
      k::ScaleRow(row, Rsqrt(mean_square + eps), weight, y.data + r * cols,
                  cols);
    }
  });
}

void CpuBackend::Rope(MatrixView x, int head_dim, int rope_dim,
                      absl::Span<const double> inv_freq,
                      absl::Span<const int32_t> positions,
                      RopeDirection direction) {
  CheckRopeShapes(x, head_dim, rope_dim, positions);
  if (rope_dim == 0) return;
  const int64_t heads = x.cols / head_dim;
  const int half = rope_dim / 2;
  CHECK_EQ(static_cast<int64_t>(inv_freq.size()), half);
  const double sign = direction == RopeDirection::kInverse ? -1.0 : 1.0;
  pool_.ParallelFor(
      x.rows, Grain(heads * rope_dim * 2 + int64_t{half} * 20),
      [&](int64_t begin, int64_t end) {
        std::vector<float> cosines(half), sines(half);
        for (int64_t t = begin; t < end; ++t) {
          for (int i = 0; i < half; ++i) {
            // The angle in double: positions reach 1e5 and more.
            const double angle = sign * positions[t] * inv_freq[i];
            cosines[i] = static_cast<float>(std::cos(angle));
            sines[i] = static_cast<float>(std::sin(angle));
          }
          for (int64_t h = 0; h < heads; ++h) {
            float* v = x.data + t * x.cols + h * head_dim + head_dim - rope_dim;
            for (int64_t i = 0; i < half; ++i) {
              const float a = v[2 * i];
              const float b = v[2 * i + 1];
              v[2 * i] = a * cosines[i] - b * sines[i];
              v[2 * i + 1] = a * sines[i] + b * cosines[i];
            }
          }
        }
      });
}

void CpuBackend::Add(ConstMatrixView a, ConstMatrixView b, MatrixView y) {
  CHECK_EQ(a.rows, y.rows);
  CHECK_EQ(a.cols, y.cols);
  CHECK_EQ(b.rows, y.rows);
  CHECK_EQ(b.cols, y.cols);
  pool_.ParallelFor(
      y.rows * y.cols, 4 * kMinWorkPerTask, [&](int64_t begin, int64_t end) {
        k::Add(a.data + begin, b.data + begin, y.data + begin, end - begin);
      });
}

void CpuBackend::PlaceColumns(ConstMatrixView x, MatrixView y,
                              int64_t dst_col) {
  CHECK_EQ(y.rows, x.rows);
  CHECK_GE(dst_col, 0);
  CHECK_LE(dst_col + x.cols, y.cols);
  if (x.cols == 0) return;
  for (int64_t r = 0; r < x.rows; ++r) {
    std::memcpy(y.data + r * y.cols + dst_col, x.data + r * x.cols,
                static_cast<size_t>(x.cols) * sizeof(float));
  }
}

void CpuBackend::CopyColumns(ConstMatrixView x, int64_t src_col, MatrixView y) {
  CHECK_EQ(y.rows, x.rows);
  CHECK_GE(src_col, 0);
  CHECK_LE(src_col + y.cols, x.cols);
  if (y.cols == 0) return;
  for (int64_t r = 0; r < x.rows; ++r) {
    std::memcpy(y.data + r * y.cols, x.data + r * x.cols + src_col,
                static_cast<size_t>(y.cols) * sizeof(float));
  }
}

void CpuBackend::GatherRows(ConstMatrixView x, absl::Span<const int32_t> rows,
                            MatrixView y) {
  CHECK_EQ(static_cast<int64_t>(rows.size()), y.rows);
  CHECK_EQ(y.cols, x.cols);
  if (x.cols == 0) return;
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i] >= 0 && rows[i] < x.rows) << "row " << rows[i];
    std::memcpy(y.data + i * y.cols, x.data + int64_t{rows[i]} * x.cols,
                static_cast<size_t>(x.cols) * sizeof(float));
  }
}

void CpuBackend::GatherColumns(ConstMatrixView x,
                               absl::Span<const int32_t> cols, MatrixView y) {
  CheckGatherColumnsShapes(x, cols, y);
  for (int64_t t = 0; t < y.rows; ++t) {
    for (int64_t j = 0; j < y.cols; ++j) {
      y.data[t * y.cols + j] = x.data[t * x.cols + cols[j]];
    }
  }
}

void CpuBackend::ScatterRows(ConstMatrixView src,
                             absl::Span<const int32_t> rows, MatrixView x) {
  CHECK_EQ(static_cast<int64_t>(rows.size()), src.rows);
  CHECK_EQ(src.cols, x.cols);
  if (x.cols == 0) return;
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i] >= 0 && rows[i] < x.rows) << "row " << rows[i];
    std::memcpy(x.data + int64_t{rows[i]} * x.cols, src.data + i * src.cols,
                static_cast<size_t>(x.cols) * sizeof(float));
  }
}

void CpuBackend::Embedding(absl::Span<const int32_t> ids, int64_t first_id,
                           const Weight& table, MatrixView y) {
  const CpuWeight& weight = AsCpu(table);
  CHECK(weight.format() == WeightFormat::kF32 ||
        weight.format() == WeightFormat::kBf16)
      << "embedding tables are f32 or bf16, got "
      << WeightFormatName(weight.format());
  CHECK_EQ(static_cast<int64_t>(ids.size()), y.rows);
  CHECK_EQ(y.cols, weight.cols());
  const size_t row_bytes = static_cast<size_t>(y.cols) * sizeof(float);
  for (size_t t = 0; t < ids.size(); ++t) {
    const int64_t row = int64_t{ids[t]} - first_id;
    float* dst = y.data + t * y.cols;
    if (row >= 0 && row < weight.rows() && weight.values() != nullptr) {
      std::memcpy(dst, weight.values() + row * weight.cols(), row_bytes);
    } else if (row >= 0 && row < weight.rows()) {
      DecodePackedRows(weight.packed(), row, row + 1, dst);
    } else {
      std::memset(dst, 0, row_bytes);
    }
  }
}

}  // namespace mneme::gpu
