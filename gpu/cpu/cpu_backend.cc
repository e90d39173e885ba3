#include "gpu/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"
#include "glog/logging.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/host_weight.h"

namespace mneme::gpu {
namespace {

namespace k = cpu_kernels;

constexpr int64_t kAlignment = 64;
// Requests above this many bytes are refused without asking the allocator
// (it could only fail, or overcommit what can never be backed).
constexpr int64_t kMaxAllocationBytes = int64_t{1} << 46;
// Work (about one multiply-add per unit) below which a loop is not worth
// splitting over threads.
constexpr int64_t kMinWorkPerTask = int64_t{1} << 14;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Items per task so that each task does at least kMinWorkPerTask.
int64_t Grain(int64_t work_per_item) {
  return std::max<int64_t>(
      1, kMinWorkPerTask / std::max<int64_t>(1, work_per_item));
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float Rsqrt(float x) { return 1.0f / std::sqrt(x); }

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

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

// A weight dequantized to a row-major fp32 [rows, cols] matrix.
class CpuWeight final : public Weight {
 public:
  CpuWeight(WeightFormat format, int64_t rows, int64_t cols,
            AlignedFloats values)
      : format_(format), rows_(rows), cols_(cols), values_(std::move(values)) {}
  int64_t rows() const override { return rows_; }
  int64_t cols() const override { return cols_; }
  WeightFormat format() const override { return format_; }
  int64_t bytes() const override { return rows_ * cols_ * 4; }
  const float* values() const { return values_.get(); }

 private:
  const WeightFormat format_;
  const int64_t rows_;
  const int64_t cols_;
  const AlignedFloats values_;
};

const CpuWeight& AsCpu(const Weight& weight) {
  const auto* cpu = dynamic_cast<const CpuWeight*>(&weight);
  CHECK(cpu != nullptr) << "the weight was not made by a CpuBackend";
  return *cpu;
}

// The visible keys of one query: up to two disjoint ascending spans.
struct KeySpans {
  int32_t begin[2] = {0, 0};
  int32_t end[2] = {0, 0};
  int count = 0;
};

KeySpans MergeRanges(const KeyRanges& ranges, int64_t keys) {
  KeySpans spans;
  for (int i = 0; i < 2; ++i) {
    CHECK_LE(0, ranges.begin[i]);
    CHECK_LE(ranges.begin[i], ranges.end[i]);
    CHECK_LE(ranges.end[i], keys);
    if (ranges.begin[i] == ranges.end[i]) continue;
    spans.begin[spans.count] = ranges.begin[i];
    spans.end[spans.count] = ranges.end[i];
    ++spans.count;
  }
  if (spans.count == 2) {
    if (spans.begin[1] < spans.begin[0]) {
      std::swap(spans.begin[0], spans.begin[1]);
      std::swap(spans.end[0], spans.end[1]);
    }
    if (spans.begin[1] <= spans.end[0]) {  // overlapping or adjacent
      spans.end[0] = std::max(spans.end[0], spans.end[1]);
      spans.count = 1;
    }
  }
  return spans;
}

// Keys scored per step of the online softmax.
constexpr int kKeyChunk = 128;

// One (query, head): out[hd] and its lse over the keys in `spans`.
void AttendOne(const float* q, const float* kv, int64_t hd,
               const KeySpans& spans, float scale, float* out, float* lse) {
  float scores[kKeyChunk];
  float max = -kInf;
  float denominator = 0.0f;
  bool any = false;
  std::fill(out, out + hd, 0.0f);
  for (int s = 0; s < spans.count; ++s) {
    for (int64_t j = spans.begin[s]; j < spans.end[s]; j += kKeyChunk) {
      const int64_t n = std::min<int64_t>(kKeyChunk, spans.end[s] - j);
      const float* rows = kv + j * hd;
      k::DotRows(q, rows, n, hd, scale, scores);
      const float chunk_max = *std::max_element(scores, scores + n);
      if (!any || chunk_max > max) {
        // Rescale what was accumulated under the old maximum.
        if (any) {
          const float correction = std::exp(max - chunk_max);
          denominator *= correction;
          k::Scale(correction, out, hd);
        }
        max = chunk_max;
      }
      any = true;
      for (int64_t i = 0; i < n; ++i) {
        scores[i] = std::exp(scores[i] - max);
        denominator += scores[i];
      }
      k::WeightedRowSum(scores, rows, n, hd, out);
    }
  }
  if (!any) {
    *lse = -kInf;
    return;
  }
  k::Scale(1.0f / denominator, out, hd);
  *lse = max + std::log(denominator);
}

float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// log(sum_i exp(row[i])) in double.
double LogSumExp(const float* row, int64_t n) {
  const float max = *std::max_element(row, row + n);
  if (std::isinf(max)) return max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double{row[i]} - max);
  return max + std::log(sum);
}

// The lowest id of the largest logit.
int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// SplitMix64's first output for `seed`, as a double in [0, 1).
double UniformFromSeed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

// One sampled token of a row of logits (see the class comment).
int32_t SampleRow(const float* row, int64_t vocab, const SamplingParams& p) {
  if (!(p.temperature > 0.0f)) return Argmax(row, vocab);
  const float max_logit = *std::max_element(row, row + vocab);
  if (!std::isfinite(max_logit)) return Argmax(row, vocab);
  // Unnormalised probabilities after temperature; the largest is 1.
  std::vector<double> weight(static_cast<size_t>(vocab));
  const double inv_temperature = 1.0 / double{p.temperature};
  for (int64_t i = 0; i < vocab; ++i) {
    weight[i] = std::exp((double{row[i]} - max_logit) * inv_temperature);
  }
  std::vector<int32_t> kept(static_cast<size_t>(vocab));
  std::iota(kept.begin(), kept.end(), 0);
  const auto more_likely = [&weight](int32_t a, int32_t b) {
    return weight[a] > weight[b] || (weight[a] == weight[b] && a < b);
  };
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p < 1.0f;
  if (top_k || top_p) {
    const size_t n = top_k ? static_cast<size_t>(p.top_k) : kept.size();
    std::partial_sort(kept.begin(), kept.begin() + n, kept.end(), more_likely);
    kept.resize(n);
  }
  if (top_p) {
    double mass = 0.0;
    for (int32_t id : kept) mass += weight[id];
    const double target = double{p.top_p} * mass;
    double cumulative = 0.0;
    size_t n = 0;
    while (n < kept.size()) {
      cumulative += weight[kept[n++]];
      if (cumulative >= target) break;
    }
    kept.resize(std::max<size_t>(n, 1));
  }
  if (p.min_p > 0.0f) {
    // The most likely token is always kept (its weight is 1).
    const double floor = double{p.min_p};
    kept.erase(std::remove_if(kept.begin(), kept.end(),
                              [&](int32_t id) { return weight[id] < floor; }),
               kept.end());
  }
  double mass = 0.0;
  for (int32_t id : kept) mass += weight[id];
  const double u = UniformFromSeed(p.seed) * mass;
  double cumulative = 0.0;
  for (int32_t id : kept) {
    cumulative += weight[id];
    if (cumulative > u) return id;
  }
  return kept.back();
}

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
  return std::unique_ptr<CpuBackend>(new CpuBackend(threads));
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

void CpuBackend::CopyToHost(const float* src, absl::Span<float> dst) {
  if (!dst.empty()) std::memcpy(dst.data(), src, dst.size() * sizeof(float));
}

absl::StatusOr<std::unique_ptr<Weight>> CpuBackend::UploadWeight(
    const HostWeight& weight) {
  if (absl::Status status = ValidateHostWeight(weight); !status.ok()) {
    return status;
  }
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
                                     std::move(values));
}

void CpuBackend::Gemm(const float* x, int64_t tokens, int64_t k, const float* w,
                      int64_t n, float* y, Accumulate accumulate) {
  if (tokens == 0 || n == 0) return;
  const bool add = accumulate == Accumulate::kYes;
  if (k == 0) {
    if (!add) std::fill(y, y + tokens * n, 0.0f);
    return;
  }
  if (tokens == 1) {
    // Zeroed first rather than relying on beta = 0 ignoring y, so that
    // whatever the buffer held (NaN included) is not read.
    if (!add) std::fill(y, y + n, 0.0f);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n),
                static_cast<int>(k), 1.0f, w, static_cast<int>(k), x, 1, 1.0f,
                y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tokens),
              static_cast<int>(n), static_cast<int>(k), 1.0f, x,
              static_cast<int>(k), w, static_cast<int>(k), add ? 1.0f : 0.0f, y,
              static_cast<int>(n));
}

void CpuBackend::Linear(ConstMatrixView x, const Weight& w, MatrixView y,
                        Accumulate accumulate) {
  const CpuWeight& weight = AsCpu(w);
  CHECK_EQ(x.cols, weight.cols());
  CHECK_EQ(y.rows, x.rows);
  CHECK_EQ(y.cols, weight.rows());
  Gemm(x.data, x.rows, x.cols, weight.values(), weight.rows(), y.data,
       accumulate);
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

void CpuBackend::Rope(MatrixView x, int head_dim, int rope_dim, float theta,
                      absl::Span<const int32_t> positions,
                      RopeDirection direction) {
  CHECK_GT(head_dim, 0);
  CHECK_GE(rope_dim, 0);
  CHECK_LE(rope_dim, head_dim);
  CHECK_EQ(rope_dim % 2, 0);
  CHECK_EQ(x.cols % head_dim, 0);
  CHECK_EQ(static_cast<int64_t>(positions.size()), x.rows);
  if (rope_dim == 0) return;
  const int64_t heads = x.cols / head_dim;
  const int half = rope_dim / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(double{theta}, -2.0 * i / rope_dim);
  }
  const double sign = direction == RopeDirection::kInverse ? -1.0 : 1.0;
  pool_.ParallelFor(
      x.rows, Grain(heads * rope_dim * 2 + half * 20),
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
            for (int i = 0; i < half; ++i) {
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
    if (row >= 0 && row < weight.rows()) {
      std::memcpy(dst, weight.values() + row * weight.cols(), row_bytes);
    } else {
      std::memset(dst, 0, row_bytes);
    }
  }
}

void CpuBackend::Attention(ConstMatrixView q, ConstMatrixView kv, int heads,
                           absl::Span<const KeyRanges> ranges, float scale,
                           const float* sink, MatrixView out, MatrixView lse) {
  CHECK_GT(heads, 0);
  const int64_t hd = kv.cols;
  const int64_t tokens = q.rows;
  CHECK_EQ(q.cols, heads * hd);
  CHECK_EQ(out.rows, tokens);
  CHECK_EQ(out.cols, q.cols);
  CHECK_EQ(lse.rows, tokens);
  CHECK_EQ(lse.cols, heads);
  CHECK_EQ(static_cast<int64_t>(ranges.size()), tokens);
  std::vector<KeySpans> spans(ranges.size());
  int64_t total_keys = 0;
  for (size_t t = 0; t < ranges.size(); ++t) {
    spans[t] = MergeRanges(ranges[t], kv.rows);
    for (int s = 0; s < spans[t].count; ++s) {
      total_keys += spans[t].end[s] - spans[t].begin[s];
    }
  }
  const int64_t items = tokens * heads;
  if (items == 0) return;
  const int64_t work_per_item = std::max<int64_t>(
      1,
      2 * hd * std::max<int64_t>(1, total_keys / std::max<int64_t>(1, tokens)));
  pool_.ParallelFor(items, Grain(work_per_item),
                    [&](int64_t begin, int64_t end) {
                      for (int64_t item = begin; item < end; ++item) {
                        const int64_t t = item / heads;
                        const int64_t h = item % heads;
                        float* o = out.data + t * out.cols + h * hd;
                        float* l = lse.data + t * lse.cols + h;
                        AttendOne(q.data + t * q.cols + h * hd, kv.data, hd,
                                  spans[t], scale, o, l);
                        if (sink != nullptr)
                          k::Scale(Sigmoid(*l - sink[h]), o, hd);
                      }
                    });
}

void CpuBackend::ApplySink(ConstMatrixView lse, const float* sink,
                           MatrixView out) {
  CHECK_EQ(lse.rows, out.rows);
  CHECK_GT(lse.cols, 0);
  CHECK_EQ(out.cols % lse.cols, 0);
  const int64_t heads = lse.cols;
  const int64_t hd = out.cols / heads;
  for (int64_t t = 0; t < out.rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      k::Scale(Sigmoid(lse.data[t * heads + h] - sink[h]),
               out.data + t * out.cols + h * hd, hd);
    }
  }
}

void CpuBackend::SoftmaxPool(ConstMatrixView kv, ConstMatrixView score,
                             ConstMatrixView ape, MatrixView out) {
  const int64_t r = kv.rows;
  const int64_t d = kv.cols;
  CHECK_GT(r, 0);
  CHECK_EQ(score.rows, r);
  CHECK_EQ(score.cols, d);
  CHECK_EQ(ape.rows, r);
  CHECK_EQ(ape.cols, d);
  CHECK_EQ(out.rows, 1);
  CHECK_EQ(out.cols, d);
  std::vector<float> max(d, -kInf), denominator(d, 0.0f), numerator(d, 0.0f);
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      max[c] = std::max(max[c], score.data[i * d + c] + ape.data[i * d + c]);
    }
  }
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      const float e =
          std::exp(score.data[i * d + c] + ape.data[i * d + c] - max[c]);
      denominator[c] += e;
      numerator[c] += e * kv.data[i * d + c];
    }
  }
  for (int64_t c = 0; c < d; ++c) out.data[c] = numerator[c] / denominator[c];
}

void CpuBackend::HcPre(ConstMatrixView x_stream, const Weight& fn,
                       const float* base, const float* scale, int hc,
                       int sinkhorn_iters, float eps, MatrixView x,
                       MatrixView post, MatrixView comb) {
  const CpuWeight& weight = AsCpu(fn);
  CHECK_GE(hc, 1);
  CHECK_GE(sinkhorn_iters, 0);
  const int64_t tokens = x_stream.rows;
  const int64_t d = x.cols;
  const int64_t width = hc * d;
  const int64_t num_mix = (2 + hc) * hc;
  CHECK_EQ(x_stream.cols, width);
  CHECK_EQ(x.rows, tokens);
  CHECK_EQ(weight.rows(), num_mix);
  CHECK_EQ(weight.cols(), width);
  CHECK_EQ(post.rows, tokens);
  CHECK_EQ(post.cols, hc);
  CHECK_EQ(comb.rows, tokens);
  CHECK_EQ(comb.cols, hc * hc);
  if (tokens == 0) return;
  std::vector<float> mix(tokens * num_mix);
  Gemm(x_stream.data, tokens, width, weight.values(), num_mix, mix.data(),
       Accumulate::kNo);
  pool_.ParallelFor(tokens, Grain(3 * width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* stream = x_stream.data + t * width;
      const float norm =
          Rsqrt(k::SumSquares(stream, width) / static_cast<float>(width) + eps);
      const float* m = mix.data() + t * num_mix;
      float* x_row = x.data + t * d;
      std::fill(x_row, x_row + d, 0.0f);
      for (int h = 0; h < hc; ++h) {
        const float pre = Sigmoid(m[h] * norm * scale[0] + base[h]) + eps;
        k::Axpy(pre, stream + h * d, x_row, d);
        post.data[t * hc + h] =
            2.0f * Sigmoid(m[hc + h] * norm * scale[1] + base[hc + h]);
      }
      float* c = comb.data + t * hc * hc;
      for (int i = 0; i < hc * hc; ++i) {
        c[i] = m[2 * hc + i] * norm * scale[2] + base[2 * hc + i];
      }
      if (sinkhorn_iters > 0) {
        // The first row normalisation cancels a per-row shift: taking each
        // row's maximum out keeps exp from overflowing.
        for (int i = 0; i < hc; ++i) {
          const float row_max = *std::max_element(c + i * hc, c + (i + 1) * hc);
          for (int j = 0; j < hc; ++j) c[i * hc + j] -= row_max;
        }
      }
      for (int i = 0; i < hc * hc; ++i) c[i] = std::exp(c[i]);
      for (int iter = 0; iter < sinkhorn_iters; ++iter) {
        for (int i = 0; i < hc; ++i) {
          float sum = 0.0f;
          for (int j = 0; j < hc; ++j) sum += c[i * hc + j];
          for (int j = 0; j < hc; ++j) c[i * hc + j] /= sum;
        }
        for (int j = 0; j < hc; ++j) {
          float sum = 0.0f;
          for (int i = 0; i < hc; ++i) sum += c[i * hc + j];
          for (int i = 0; i < hc; ++i) c[i * hc + j] /= sum;
        }
      }
    }
  });
}

void CpuBackend::HcPost(ConstMatrixView a, ConstMatrixView post,
                        ConstMatrixView comb, int hc, MatrixView x_stream) {
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  const int64_t d = a.cols;
  const int64_t width = hc * d;
  CHECK_EQ(x_stream.cols, width);
  CHECK_EQ(a.rows, tokens);
  CHECK_EQ(post.rows, tokens);
  CHECK_EQ(post.cols, hc);
  CHECK_EQ(comb.rows, tokens);
  CHECK_EQ(comb.cols, hc * hc);
  pool_.ParallelFor(
      tokens, Grain(2 * hc * width), [&](int64_t begin, int64_t end) {
        std::vector<float> old(width);
        for (int64_t t = begin; t < end; ++t) {
          float* stream = x_stream.data + t * width;
          std::copy(stream, stream + width, old.begin());
          const float* c = comb.data + t * hc * hc;
          for (int j = 0; j < hc; ++j) {
            float* dst = stream + j * d;
            k::ScaleRow(a.data + t * d, post.data[t * hc + j], nullptr, dst, d);
            for (int i = 0; i < hc; ++i) {
              k::Axpy(c[i * hc + j], old.data() + i * d, dst, d);
            }
          }
        }
      });
}

void CpuBackend::HcHead(ConstMatrixView x_stream, const Weight& fn,
                        const float* base, const float* scale, int hc,
                        float eps, MatrixView x) {
  const CpuWeight& weight = AsCpu(fn);
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  const int64_t d = x.cols;
  const int64_t width = hc * d;
  CHECK_EQ(x_stream.cols, width);
  CHECK_EQ(x.rows, tokens);
  CHECK_EQ(weight.rows(), hc);
  CHECK_EQ(weight.cols(), width);
  if (tokens == 0) return;
  std::vector<float> mix(tokens * hc);
  Gemm(x_stream.data, tokens, width, weight.values(), hc, mix.data(),
       Accumulate::kNo);
  pool_.ParallelFor(tokens, Grain(2 * width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* stream = x_stream.data + t * width;
      const float norm =
          Rsqrt(k::SumSquares(stream, width) / static_cast<float>(width) + eps);
      float* x_row = x.data + t * d;
      std::fill(x_row, x_row + d, 0.0f);
      for (int h = 0; h < hc; ++h) {
        const float w =
            Sigmoid(mix[t * hc + h] * norm * scale[0] + base[h]) + eps;
        k::Axpy(w, stream + h * d, x_row, d);
      }
    }
  });
}

void CpuBackend::EngramGate(ConstMatrixView kv, const float* q_w,
                            const float* k_w, int hc, float eps,
                            MatrixView x_stream) {
  CHECK_GE(hc, 1);
  const int64_t tokens = x_stream.rows;
  CHECK_EQ(x_stream.cols % hc, 0);
  const int64_t d = x_stream.cols / hc;
  CHECK_EQ(kv.rows, tokens);
  CHECK_EQ(kv.cols, (hc + 1) * d);
  if (d == 0) return;
  const float inv_d = 1.0f / static_cast<float>(d);
  const float inv_sqrt_d = Rsqrt(static_cast<float>(d));
  pool_.ParallelFor(tokens * hc, Grain(6 * d), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / hc;
      const int64_t h = item % hc;
      float* x_h = x_stream.data + t * x_stream.cols + h * d;
      const float* kv_row = kv.data + t * kv.cols;
      const k::EngramSums sums =
          k::EngramDot(x_h, q_w + h * d, k_w + h * d, kv_row + h * d, d);
      const float dot = sums.dot * Rsqrt(sums.xx * inv_d + eps) *
                        Rsqrt(sums.kk * inv_d + eps) * inv_sqrt_d;
      const float magnitude = std::sqrt(std::max(std::fabs(dot), 1e-6f));
      const float signed_root = dot > 0.0f   ? magnitude
                                : dot < 0.0f ? -magnitude
                                             : 0.0f;
      k::Axpy(Sigmoid(signed_root), kv_row + hc * d, x_h, d);
    }
  });
}

void CpuBackend::MoeRoute(ConstMatrixView logits, const float* bias, int top_k,
                          float routed_scaling, absl::Span<int32_t> expert_ids,
                          absl::Span<float> weights) {
  const int64_t tokens = logits.rows;
  const int64_t experts = logits.cols;
  CHECK_GE(top_k, 1);
  CHECK_LE(top_k, experts);
  CHECK_EQ(static_cast<int64_t>(expert_ids.size()), tokens * top_k);
  CHECK_EQ(static_cast<int64_t>(weights.size()), tokens * top_k);
  pool_.ParallelFor(
      tokens, Grain(experts * 40), [&](int64_t begin, int64_t end) {
        std::vector<float> score(experts), biased(experts);
        std::vector<int32_t> order(experts);
        for (int64_t t = begin; t < end; ++t) {
          const float* row = logits.data + t * experts;
          for (int64_t e = 0; e < experts; ++e) {
            score[e] = std::sqrt(Softplus(row[e]));
            biased[e] = score[e] + (bias != nullptr ? bias[e] : 0.0f);
          }
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                            [&](int32_t a, int32_t b) {
                              return biased[a] > biased[b] ||
                                     (biased[a] == biased[b] && a < b);
                            });
          float sum = 0.0f;
          for (int i = 0; i < top_k; ++i) sum += score[order[i]];
          for (int i = 0; i < top_k; ++i) {
            expert_ids[t * top_k + i] = order[i];
            weights[t * top_k + i] =
                sum > 0.0f ? score[order[i]] / sum * routed_scaling
                           : routed_scaling / static_cast<float>(top_k);
          }
        }
      });
}

void CpuBackend::ExpertForward(ConstMatrixView x_all,
                               absl::Span<const int32_t> rows,
                               absl::Span<const float> weights,
                               const Weight& w1, const Weight& w2,
                               const Weight& w3, float limit,
                               MatrixView y_all) {
  const CpuWeight& up1 = AsCpu(w1);
  const CpuWeight& down = AsCpu(w2);
  const CpuWeight& up3 = AsCpu(w3);
  const int64_t d = x_all.cols;
  const int64_t inter = up1.rows();
  CHECK_EQ(up1.cols(), d);
  CHECK_EQ(up3.rows(), inter);
  CHECK_EQ(up3.cols(), d);
  CHECK_EQ(down.rows(), d);
  CHECK_EQ(down.cols(), inter);
  CHECK_EQ(y_all.cols, d);
  CHECK_EQ(rows.size(), weights.size());
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return;
  std::vector<float> x(n * d);
  for (int64_t i = 0; i < n; ++i) {
    CHECK(rows[i] >= 0 && rows[i] < x_all.rows && rows[i] < y_all.rows)
        << "row " << rows[i];
    std::copy_n(x_all.data + int64_t{rows[i]} * d, d, x.data() + i * d);
  }
  std::vector<float> h1(n * inter), h3(n * inter);
  Gemm(x.data(), n, d, up1.values(), inter, h1.data(), Accumulate::kNo);
  Gemm(x.data(), n, d, up3.values(), inter, h3.data(), Accumulate::kNo);
  const bool clamp = limit > 0.0f;
  for (int64_t i = 0; i < n * inter; ++i) {
    float a = h1[i];
    float b = h3[i];
    if (clamp) {
      a = std::min(a, limit);
      b = std::clamp(b, -limit, limit);
    }
    h1[i] = Silu(a) * b;
  }
  std::vector<float> out(n * d);
  Gemm(h1.data(), n, inter, down.values(), d, out.data(), Accumulate::kNo);
  // Sequential: rows may repeat.
  for (int64_t i = 0; i < n; ++i) {
    k::Axpy(weights[i], out.data() + i * d, y_all.data + int64_t{rows[i]} * d,
            d);
  }
}

void CpuBackend::Sample(ConstMatrixView logits,
                        absl::Span<const SamplingParams> params,
                        absl::Span<int32_t> ids, absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_GT(vocab, 0);
  CHECK_EQ(static_cast<int64_t>(params.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  pool_.ParallelFor(tokens, Grain(vocab * 20), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = logits.data + t * vocab;
      const int32_t id = SampleRow(row, vocab, params[t]);
      ids[t] = id;
      logprobs[t] = static_cast<float>(row[id] - LogSumExp(row, vocab));
    }
  });
}

void CpuBackend::LogProbs(ConstMatrixView logits, absl::Span<const int32_t> ids,
                          absl::Span<float> logprobs) {
  const int64_t tokens = logits.rows;
  const int64_t vocab = logits.cols;
  CHECK_EQ(static_cast<int64_t>(ids.size()), tokens);
  CHECK_EQ(static_cast<int64_t>(logprobs.size()), tokens);
  pool_.ParallelFor(tokens, Grain(vocab * 10), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      CHECK(ids[t] >= 0 && ids[t] < vocab) << "id " << ids[t];
      const float* row = logits.data + t * vocab;
      logprobs[t] = static_cast<float>(row[ids[t]] - LogSumExp(row, vocab));
    }
  });
}

}  // namespace mneme::gpu
