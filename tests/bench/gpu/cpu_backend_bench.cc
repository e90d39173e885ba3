// CPU backend throughput, reported as items (tokens) per second.
//
//   bazel run //tests/bench/gpu:cpu_backend_bench -- --benchmark_min_time=0.05
//
// Linear: a [1024, 256] weight (out x in, the size of a small model's
// projections) in FP8 (32 x 32 blocks), MXFP4 and BF16, at 1 token (decode,
// quant_kernels on the packed weight) and 256 tokens (prefill: decoded
// panels through sgemm). quant_gemv_bench measures the decode path against
// memcpy and against fp32 copies of the weights.
// Attention: one query token, 8 heads of 64 over 1024 keys (decode with a
// long context), and 256 query tokens over the same keys.
// DecodeAttention: a decode step's attention at V4-Flash's sizes for 1 and
// 16 sequences, keys gathered per sequence (in_place 0) against read in
// place in one call (in_place 1), on 1 and 2 backend threads (the CPU
// backend spreads a call's queries over its threads, so one call of 16
// queries can use both where 16 calls of one query use one); see
// decode_attention_case.h.

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "benchmark/benchmark.h"
#include "formats/bf16.h"
#include "gpu/backend.h"
#include "gpu/cpu/cpu_backend.h"
#include "tests/bench/gpu/decode_attention_case.h"

namespace mneme::gpu {
namespace {

constexpr int64_t kOut = 1024;
constexpr int64_t kIn = 256;

template <typename T>
T ValueOrDie(absl::StatusOr<T> value) {
  if (!value.ok()) std::abort();  // programming error in the benchmark
  return std::move(*value);
}

// threads 0: every core.
std::unique_ptr<CpuBackend> MakeBackend(int threads = 0) {
  return ValueOrDie(CpuBackend::Create(CpuBackendOptions{.threads = threads}));
}

std::unique_ptr<Buffer> RandomBuffer(Backend& backend, int64_t n,
                                     std::mt19937& rng) {
  std::unique_ptr<Buffer> buffer = ValueOrDie(backend.Allocate(n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = u(rng);
  backend.CopyFromHost(values, buffer->data());
  return buffer;
}

// Random codes of a [kOut, kIn] weight in `format` (valid scales, no NaN).
std::unique_ptr<Weight> MakeWeight(Backend& backend, WeightFormat format,
                                   std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> data, scale;
  HostWeight host;
  host.format = format;
  host.rows = kOut;
  host.cols = kIn;
  switch (format) {
    case WeightFormat::kFp8Block:
      data.resize(kOut * kIn);
      for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng) & 0x77);
      scale.assign((kOut / 32) * (kIn / 32), 120);
      break;
    case WeightFormat::kMxfp4:
      data.resize(kOut * kIn / 2);
      for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
      scale.assign(kOut * kIn / 32, 122);
      break;
    default:  // kBf16
      for (int64_t i = 0; i < kOut * kIn; ++i) {
        const uint16_t bits = formats::FloatToBf16((byte(rng) - 128) / 1024.0f);
        data.push_back(static_cast<uint8_t>(bits & 0xFF));
        data.push_back(static_cast<uint8_t>(bits >> 8));
      }
      break;
  }
  host.data = data;
  host.scale = scale;
  return ValueOrDie(backend.UploadWeight(host));
}

void BM_Linear(benchmark::State& state, WeightFormat format) {
  const int64_t tokens = state.range(0);
  std::unique_ptr<CpuBackend> backend = MakeBackend();
  std::mt19937 rng(7);
  std::unique_ptr<Weight> w = MakeWeight(*backend, format, rng);
  std::unique_ptr<Buffer> x = RandomBuffer(*backend, tokens * kIn, rng);
  std::unique_ptr<Buffer> y = ValueOrDie(backend->Allocate(tokens * kOut));
  for (auto _ : state) {
    backend->Linear(x->view(tokens, kIn), *w, y->view(tokens, kOut),
                    Backend::Accumulate::kNo);
    benchmark::DoNotOptimize(y->data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * tokens * kOut * kIn * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.SetLabel(CpuBackend::SimdTargetName());
}

BENCHMARK_CAPTURE(BM_Linear, fp8, WeightFormat::kFp8Block)
    ->Arg(1)
    ->Arg(256)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, mxfp4, WeightFormat::kMxfp4)
    ->Arg(1)
    ->Arg(256)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Linear, bf16, WeightFormat::kBf16)
    ->Arg(1)
    ->Arg(256)
    ->UseRealTime();

// `tokens` queries, each seeing all kKeys keys.
void BM_Attention(benchmark::State& state) {
  constexpr int kHeads = 8;
  constexpr int64_t kHeadDim = 64;
  constexpr int32_t kKeys = 1024;
  const int64_t tokens = state.range(0);
  std::unique_ptr<CpuBackend> backend = MakeBackend();
  std::mt19937 rng(11);
  std::unique_ptr<Buffer> q =
      RandomBuffer(*backend, tokens * kHeads * kHeadDim, rng);
  std::unique_ptr<Buffer> kv = RandomBuffer(*backend, kKeys * kHeadDim, rng);
  std::unique_ptr<Buffer> sink = RandomBuffer(*backend, kHeads, rng);
  std::unique_ptr<Buffer> out =
      ValueOrDie(backend->Allocate(tokens * kHeads * kHeadDim));
  std::unique_ptr<Buffer> lse = ValueOrDie(backend->Allocate(tokens * kHeads));
  // Every query attends every key.
  std::vector<int32_t> idx(tokens * kKeys);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int32_t j = 0; j < kKeys; ++j) idx[t * kKeys + j] = j;
  }
  for (auto _ : state) {
    backend->SparseAttention(
        q->view(tokens, kHeads * kHeadDim), kv->view(kKeys, kHeadDim), kHeads,
        idx, kKeys, 0.125f, sink->data(), out->view(tokens, kHeads * kHeadDim),
        lse->view(tokens, kHeads));
    benchmark::DoNotOptimize(out->data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetLabel(CpuBackend::SimdTargetName());
}

BENCHMARK(BM_Attention)->Arg(1)->Arg(256)->UseRealTime();

// Items: the sequences' decode tokens.
void BM_DecodeAttention(benchmark::State& state) {
  const bool in_place = state.range(0) != 0;
  const int sequences = static_cast<int>(state.range(1));
  std::unique_ptr<CpuBackend> backend =
      MakeBackend(static_cast<int>(state.range(2)));
  std::unique_ptr<bench::DecodeAttentionCase> c =
      ValueOrDie(bench::DecodeAttentionCase::Create(*backend, sequences, 5));
  if (!c->Matches(1e-5f).ok()) std::abort();
  for (auto _ : state) {
    if (in_place) {
      c->InPlace();
    } else {
      c->Gathered();
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * sequences);
  state.SetBytesProcessed(state.iterations() * c->key_bytes());
  state.SetLabel(in_place ? "in_place" : "gathered");
}

BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{0, 1}, {1, 16}, {1, 2}})
    ->ArgNames({"in_place", "sequences", "threads"})
    ->UseRealTime();

}  // namespace
}  // namespace mneme::gpu
