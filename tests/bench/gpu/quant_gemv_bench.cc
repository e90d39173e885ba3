// Decode-step matrix-vector products on weights in their checkpoint formats
// (quant_kernels through CpuBackend::Linear, one token) against two
// yardsticks in the same run: a memcpy of the same number of bytes (what
// reading the weight once costs), and the fp32 copies of the same weights
// (CpuBackendOptions.dequantize_weights, OpenBLAS sgemv: the previous path).
// Also the resident memory a loaded weight adds, against its checkpoint
// bytes.
//
//   bazel run //tests/bench/gpu:quant_gemv_bench -- --benchmark_min_time=0.2
//
// The weight is [8192, 4096] (out x in): 16 to 64 MiB in the checkpoint
// formats, more than the last-level cache, so each product reads it from
// memory. Counters: "weight_B/s" = checkpoint bytes of the weight per second
// (for memcpy: bytes copied per second); "resident/bytes" = RSS growth of
// UploadWeight over the checkpoint bytes.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "benchmark/benchmark.h"
#include "common/process_memory.h"
#include "formats/exl3/exl3.h"
#include "formats/gridbook/gridbook.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"

namespace mneme::gpu {
namespace {

constexpr int64_t kOut = 8192;
constexpr int64_t kIn = 4096;

template <typename T>
T ValueOrDie(absl::StatusOr<T> value) {
  if (!value.ok()) std::abort();  // programming error in the benchmark
  return std::move(*value);
}

// The checkpoint bytes of a random [kOut, kIn] weight (valid codes, scales
// near 1).
struct Bytes {
  std::vector<uint8_t> data, scale;
  HostWeight host;
};

// The codebook formats' variants.
enum class Variant {
  kNone,
  kExl3K3Mcg,
  kExl3K4Mul1,
  kGridbookFp4,
  kGridbookFp4W4a4,
  kGridbookFp8
};

Bytes MakeBytes(WeightFormat format, Variant variant = Variant::kNone) {
  std::mt19937 rng(5);
  Bytes b;
  b.host.format = format;
  b.host.rows = kOut;
  b.host.cols = kIn;
  if (format == WeightFormat::kExl3) {
    const int bits = variant == Variant::kExl3K3Mcg ? 3 : 4;
    b.host.exl3_bits = bits;
    b.host.exl3_codebook = variant == Variant::kExl3K3Mcg
                               ? formats::exl3::Codebook::kMcg
                               : formats::exl3::Codebook::kMul1;
    b.data.resize(kOut * kIn * bits / 8);
    for (uint8_t& v : b.data) v = static_cast<uint8_t>(rng());
    b.scale.resize(2 * (kOut + kIn));
    for (size_t i = 0; i < b.scale.size(); i += 2) {
      b.scale[i] = 0;
      b.scale[i + 1] = static_cast<uint8_t>(0x24 | (rng() % 2 ? 0x80 : 0));
    }
    b.host.data = b.data;
    b.host.scale = b.scale;
    return b;
  }
  if (format == WeightFormat::kGridbook) {
    namespace gb = formats::gridbook;
    const bool fp8 = variant == Variant::kGridbookFp8;
    b.host.gridbook_scheme = *gb::SchemeForFormat(
        fp8 ? "FP8_CB_K36" : "NVFP4_CB_K16",
        fp8 ? gb::ScaleCoding::kNone : gb::ScaleCoding::kTwoTier);
    const gb::Scheme& scheme = b.host.gridbook_scheme;
    auto books = std::make_shared<gb::Codebooks>();
    for (int sub = 0; sub < scheme.n_sub; ++sub) {
      for (int64_t i = 0;
           i < gb::SubTableRows(scheme, sub) * gb::SubTableColumns(scheme);
           ++i) {
        books->tables[sub].push_back(static_cast<float>(rng() % 7) - 3.0f);
      }
    }
    b.host.gridbook_books = books;
    const int64_t type_size = gb::TypeSize(scheme);
    b.data.resize(kOut * kIn / gb::kSuperblock * type_size);
    for (uint8_t& v : b.data) v = static_cast<uint8_t>(rng());
    if (fp8) {
      b.scale.resize(kOut * 4);
      const float row_scale = 0.01f;
      for (int64_t r = 0; r < kOut; ++r) {
        std::memcpy(b.scale.data() + 4 * r, &row_scale, 4);
      }
    } else {
      for (size_t i = size_t{4} * scheme.k; i < b.data.size(); i += type_size) {
        b.data[i] = 120;  // two-tier exponent: 2^-7
      }
      if (variant == Variant::kGridbookFp4W4a4) {
        b.host.gridbook_input_scale = 128.0f;
      }
    }
    b.host.data = b.data;
    b.host.scale = b.scale;
    return b;
  }
  switch (format) {
    case WeightFormat::kBf16:
      b.data.resize(kOut * kIn * 2);
      for (size_t i = 0; i < b.data.size(); i += 2) {
        b.data[i] = static_cast<uint8_t>(rng());
        b.data[i + 1] = static_cast<uint8_t>(0x3C + rng() % 3);  // ~1e-2..1
      }
      break;
    case WeightFormat::kFp8Block:
      b.data.resize(kOut * kIn);
      for (uint8_t& v : b.data) v = static_cast<uint8_t>(rng() & 0xF7);
      b.host.block_rows = b.host.block_cols = 128;
      b.scale.assign((kOut / 128) * (kIn / 128), 120);
      break;
    case WeightFormat::kMxfp4:
      b.data.resize(kOut * kIn / 2);
      for (uint8_t& v : b.data) v = static_cast<uint8_t>(rng());
      b.scale.assign(kOut * kIn / 32, 122);
      break;
    default:  // kNvfp4
      b.data.resize(kOut * kIn / 2);
      for (uint8_t& v : b.data) v = static_cast<uint8_t>(rng());
      b.scale.assign(kOut * kIn / 16, 0x30);
      b.host.global_scale = 0.01f;
      break;
  }
  b.host.data = b.data;
  b.host.scale = b.scale;
  return b;
}

// threads: 1 or 0 (every core).
void BM_Gemv(benchmark::State& state, WeightFormat format, bool fp32,
             Variant variant = Variant::kNone) {
  const int threads = static_cast<int>(state.range(0));
  std::unique_ptr<CpuBackend> backend = ValueOrDie(CpuBackend::Create(
      CpuBackendOptions{.threads = threads, .dequantize_weights = fp32}));
  const Bytes bytes = MakeBytes(format, variant);
  const int64_t checkpoint_bytes =
      static_cast<int64_t>(bytes.data.size() + bytes.scale.size());
  const int64_t before = ResidentBytes().value_or(0);
  std::unique_ptr<Weight> w = ValueOrDie(backend->UploadWeight(bytes.host));
  const int64_t resident = ResidentBytes().value_or(0) - before;
  std::unique_ptr<Buffer> x = ValueOrDie(backend->Allocate(kIn));
  std::unique_ptr<Buffer> y = ValueOrDie(backend->Allocate(kOut));
  std::vector<float> xs(kIn, 0.5f);
  backend->CopyFromHost(xs, x->data());
  for (auto _ : state) {
    backend->Linear(x->view(1, kIn), *w, y->view(1, kOut),
                    Backend::Accumulate::kNo);
    benchmark::DoNotOptimize(y->data());
    benchmark::ClobberMemory();
  }
  state.counters["weight_B/s"] = benchmark::Counter(
      static_cast<double>(checkpoint_bytes) *
          static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.counters["resident/bytes"] =
      static_cast<double>(resident) / static_cast<double>(checkpoint_bytes);
  state.SetLabel(CpuBackend::SimdTargetName());
}

// A memcpy of `bytes` (range 1), on 1 thread or split over every core
// (range 0 = 0).
void BM_Memcpy(benchmark::State& state) {
  const int64_t bytes = state.range(1);
  const int threads =
      state.range(0) == 1
          ? 1
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<uint8_t> src(static_cast<size_t>(bytes), 1);
  std::vector<uint8_t> dst(static_cast<size_t>(bytes), 0);
  const int64_t chunk = bytes / threads;
  for (auto _ : state) {
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::memcpy(
            dst.data() + t * chunk, src.data() + t * chunk,
            static_cast<size_t>(t + 1 == threads ? bytes - t * chunk : chunk));
      });
    }
    std::memcpy(dst.data(), src.data(),
                static_cast<size_t>(threads == 1 ? bytes : chunk));
    for (std::thread& w : workers) w.join();
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.counters["weight_B/s"] = benchmark::Counter(
      static_cast<double>(bytes) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

BENCHMARK_CAPTURE(BM_Gemv, bf16, WeightFormat::kBf16, false)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, bf16_as_fp32, WeightFormat::kBf16, true)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, fp8, WeightFormat::kFp8Block, false)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, fp8_as_fp32, WeightFormat::kFp8Block, true)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, mxfp4, WeightFormat::kMxfp4, false)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, nvfp4, WeightFormat::kNvfp4, false)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, nvfp4_as_fp32, WeightFormat::kNvfp4, true)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, exl3_k3_mcg, WeightFormat::kExl3, false,
                  Variant::kExl3K3Mcg)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, exl3_k4_mul1, WeightFormat::kExl3, false,
                  Variant::kExl3K4Mul1)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, gridbook_nvfp4_k16, WeightFormat::kGridbook, false,
                  Variant::kGridbookFp4)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, gridbook_nvfp4_k16_w4a4, WeightFormat::kGridbook,
                  false, Variant::kGridbookFp4W4a4)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemv, gridbook_fp8_k36, WeightFormat::kGridbook, false,
                  Variant::kGridbookFp8)
    ->Arg(1)
    ->Arg(0)
    ->UseRealTime();
// The codebook formats' bytes: EXL3 K3 / K4 (+ 48 KiB of scales), GridBook
// NVFP4_CB_K16 (73 B per 256) and FP8_CB_K36 (144 B per 256).
BENCHMARK(BM_Memcpy)
    ->Args({1, kOut* kIn * 3 / 8})
    ->Args({0, kOut* kIn * 3 / 8})
    ->Args({1, kOut* kIn * 73 / 256})
    ->Args({0, kOut* kIn * 73 / 256})
    ->Args({1, kOut* kIn * 144 / 256})
    ->Args({0, kOut* kIn * 144 / 256})
    ->UseRealTime();
// The checkpoint bytes of the weights above: bf16, fp8, fp4 (+ scales are
// under 2%).
BENCHMARK(BM_Memcpy)
    ->Args({1, kOut* kIn * 2})
    ->Args({0, kOut* kIn * 2})
    ->Args({1, kOut* kIn})
    ->Args({0, kOut* kIn})
    ->Args({1, kOut* kIn / 2})
    ->Args({0, kOut* kIn / 2})
    ->UseRealTime();

}  // namespace
}  // namespace mneme::gpu
