// Decode throughput of Engram rows, reported as output bytes per second
// (bytes_per_second) next to a memcpy of the same number of output bytes, so
// that the ratio to memcpy is visible in one run.
//
//   bazel run //tests/bench/engram_store:row_decode_bench --
//       --benchmark_min_time=0.05
// (the default configuration already compiles with -O2, see .bazelrc)
//
// Row counts: 48 is one token's rows (24 per Engram layer, two layers),
// 4096 a prefill chunk whose output (4 MiB fp32) leaves the L2 cache.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "formats/row_format.h"

namespace mneme::engram {
namespace {

constexpr int kRowCounts[] = {48, 4096};
constexpr float kGlobalScale = 0.004092f;  // V4.1 NVFP4 layer 1

// `num_rows` encoded rows of heavy-tailed values (as real tables hold).
std::vector<uint8_t> MakeRows(formats::RowFormat format, size_t num_rows) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(formats::kRowDim);
  std::vector<uint8_t> rows(num_rows * formats::RowBytes(format));
  for (size_t r = 0; r < num_rows; ++r) {
    for (float& v : values) v = 0.05f * normal(rng) * std::exp(normal(rng));
    const absl::Span<uint8_t> row = absl::MakeSpan(rows).subspan(
        r * formats::RowBytes(format), formats::RowBytes(format));
    const absl::Status status =
        format == formats::RowFormat::kFp8
            ? formats::EncodeFp8Row(values, row)
            : formats::EncodeNvfp4Row(values, kGlobalScale, row);
    if (!status.ok()) std::abort();  // programming error in the benchmark
  }
  return rows;
}

template <typename Out>
void BM_Decode(benchmark::State& state, formats::RowFormat format,
               formats::DecodeImpl impl) {
  const size_t num_rows = static_cast<size_t>(state.range(0));
  const std::vector<uint8_t> rows = MakeRows(format, num_rows);
  std::vector<Out> out(num_rows * formats::kRowDim);
  const formats::RowDecodeOptions options{
      .format = format, .global_scale = kGlobalScale, .impl = impl};
  for (auto _ : state) {
    absl::Status status;
    if constexpr (std::is_same_v<Out, float>) {
      status = formats::DecodeRowsF32(options, rows, absl::MakeSpan(out));
    } else {
      status = formats::DecodeRowsBf16(options, rows, absl::MakeSpan(out));
    }
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * out.size() * sizeof(Out));
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * num_rows,
                         benchmark::Counter::kIsRate);
  if (impl != formats::DecodeImpl::kScalar)
    state.SetLabel(formats::DecodeSimdTargetName());
}

// memcpy of the bytes that decoding `rows` rows to Out writes.
template <typename Out>
void BM_Memcpy(benchmark::State& state) {
  const size_t num_rows = static_cast<size_t>(state.range(0));
  const size_t bytes = num_rows * formats::kRowDim * sizeof(Out);
  std::vector<uint8_t> source(bytes, 0x5A);
  std::vector<uint8_t> destination(bytes);
  for (auto _ : state) {
    std::memcpy(destination.data(), source.data(), bytes);
    benchmark::DoNotOptimize(destination.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * num_rows,
                         benchmark::Counter::kIsRate);
}

// Registers the benchmark for every row count. Names read
// Decode/<format>/<output>/<impl>/rows:<n> and Memcpy/<output>/rows:<n>.
template <typename... Args>
void Register(const std::string& name, Args&&... args) {
  benchmark::internal::Benchmark* benchmark =
      benchmark::RegisterBenchmark(name.c_str(), std::forward<Args>(args)...);
  benchmark->ArgName("rows");
  for (const int rows : kRowCounts) benchmark->Arg(rows);
}

[[maybe_unused]] const bool kRegistered = [] {
  for (const formats::RowFormat format :
       {formats::RowFormat::kFp8, formats::RowFormat::kNvfp4}) {
    for (const formats::DecodeImpl impl :
         {formats::DecodeImpl::kScalar, formats::DecodeImpl::kSimd}) {
      const std::string prefix =
          absl::StrCat("Decode/", formats::RowFormatName(format), "/");
      const char* impl_name =
          impl == formats::DecodeImpl::kScalar ? "scalar" : "simd";
      Register(absl::StrCat(prefix, "f32/", impl_name), BM_Decode<float>,
               format, impl);
      Register(absl::StrCat(prefix, "bf16/", impl_name), BM_Decode<uint16_t>,
               format, impl);
    }
  }
  Register("Memcpy/f32", BM_Memcpy<float>);
  Register("Memcpy/bf16", BM_Memcpy<uint16_t>);
  return true;
}();

}  // namespace
}  // namespace mneme::engram
