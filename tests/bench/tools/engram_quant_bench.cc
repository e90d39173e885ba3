// FP8 -> NVFP4 Engram quantization: throughput of the four methods and
// their errors on a heavy-tailed synthetic table (QUANT.md section 1).
//
// BM_QuantizeRows/<method>: the per-row work of pass 2 on one core (RTN:
// QuantizeRowRtn per row; GPTQ: GptqQuantizeChunk on 64-row chunks of one
// hash column, including the transposition into its work layout and the
// packing), rows/s per core. The GPTQ/RTN cost ratio is the ratio of these.
//
// BM_QuantizeCheckpoint/<method>/<wkv kind>: the whole conversion of a
// synthetic checkpoint with one Engram table (engram_vocab_size 12,500:
// ~300K rows, the published sample size) and a V4.1-shaped wkv ([25600,
// 6144]: hidden 5120, hc_mult 4), on one thread; counters: rows/s of the
// whole run (both passes, Hessians, I/O, error accounting), relative RMS
// and error through wkv of the report (every row measured). The two
// synthetic sources (~0.5 GB) are made once under $TMPDIR/mneme-quant-bench
// and reused by later runs; delete that directory to remake them.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "tools/quant/engram_quantizer.h"
#include "tools/quant/gptq.h"
#include "tools/quant/nvfp4_quant.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::quant {
namespace {

namespace fs = std::filesystem;
constexpr int kN = 256;

// FP8-decoded heavy-tailed rows.
const std::vector<float>& Rows() {
  static const std::vector<float>* rows = [] {
    constexpr int64_t kRows = 4096;
    auto* values = new std::vector<float>(kRows * kN);
    std::vector<float> row(kN);
    std::vector<uint8_t> fp8(264);
    for (int64_t r = 0; r < kRows; ++r) {
      synthetic::SyntheticRowValues(1, 1, r, absl::MakeSpan(row));
      (void)formats::EncodeFp8Row(row, absl::MakeSpan(fp8));
      (void)formats::DecodeRowsF32({.format = formats::RowFormat::kFp8}, fp8,
                                   absl::MakeSpan(*values).subspan(r * kN, kN));
    }
    return values;
  }();
  return *rows;
}

// The factor of a [25600, 256] W_c with AR(1)-correlated inputs.
const ColumnFactor& Factor() {
  static const ColumnFactor* factor = [] {
    constexpr int kOut = 25600;
    std::vector<double> h(static_cast<size_t>(kN) * kN, 0.0);
    uint64_t s = 7;
    auto uniform = [&] {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<double>(s >> 11) * 0x1p-53;
    };
    std::vector<double> w(kN);
    for (int o = 0; o < kOut; ++o) {
      double a = 0;
      for (int j = 0; j < kN; ++j) {
        const double z = (uniform() + uniform() + uniform() - 1.5) * 2;
        a = j == 0 ? z : 0.5 * a + std::sqrt(0.75) * z;
        w[j] = a;
      }
      for (int i = 0; i < kN; ++i) {
        for (int j = i; j < kN; ++j) h[i * kN + j] += w[i] * w[j];
      }
    }
    for (int i = 0; i < kN; ++i) {
      for (int j = 0; j < i; ++j) h[i * kN + j] = h[j * kN + i];
    }
    return new ColumnFactor(*MakeColumnFactor(h));
  }();
  return *factor;
}

void BM_QuantizeRows(benchmark::State& state, const std::string& method_name) {
  const QuantMethod method = *ParseQuantMethod(method_name);
  const std::vector<float>& rows = Rows();
  const int64_t n = static_cast<int64_t>(rows.size()) / kN;
  const float gs = formats::Nvfp4GlobalScale(11.0f);
  const ColumnFactor& factor = Factor();
  const GptqOptions options{
      .global_scale = gs, .scale = method.scale, .batch_columns = 32};
  std::vector<uint8_t> weights(n * 128), scales(n * 16);
  std::vector<float> work(static_cast<size_t>(kN) * kGptqChunkRows);
  std::vector<uint8_t> codes(static_cast<size_t>(kGptqChunkRows) * kN),
      chunk_scales(static_cast<size_t>(kGptqChunkRows) * 16);
  for (auto _ : state) {
    if (method.feedback == ErrorFeedback::kNone) {
      for (int64_t r = 0; r < n; ++r) {
        QuantizeRowRtn(rows.data() + r * kN, gs, method.scale,
                       weights.data() + r * 128, scales.data() + r * 16);
      }
    } else {
      constexpr int R = kGptqChunkRows;
      for (int64_t first = 0; first < n; first += R) {
        for (int i = 0; i < kN; ++i) {
          for (int r = 0; r < R; ++r) {
            work[i * R + r] = rows[(first + r) * kN + i];
          }
        }
        GptqQuantizeChunk(factor, options, work.data(), codes.data(),
                          chunk_scales.data());
        for (int r = 0; r < R; ++r) {
          PackCodes(codes.data() + static_cast<std::ptrdiff_t>(r) * kN,
                    weights.data() + (first + r) * 128);
        }
      }
    }
    benchmark::DoNotOptimize(weights.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetLabel("rows/s per core");
}

BENCHMARK_CAPTURE(BM_QuantizeRows, rtn_amax, "rtn-amax");
BENCHMARK_CAPTURE(BM_QuantizeRows, rtn_mse, "rtn-mse");
BENCHMARK_CAPTURE(BM_QuantizeRows, gptq_amax, "gptq-amax");
BENCHMARK_CAPTURE(BM_QuantizeRows, gptq_mse, "gptq-mse");

// One synthetic source per wkv kind, made once, under $TMPDIR (or /tmp).
const std::string& Source(synthetic::WkvKind kind) {
  static std::map<synthetic::WkvKind, std::string>* sources =
      new std::map<synthetic::WkvKind, std::string>();
  auto it = sources->find(kind);
  if (it != sources->end()) return it->second;
  const char* tmp = std::getenv("TMPDIR");
  const std::string base =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/mneme-quant-bench";
  const std::string dir =
      base + (kind == synthetic::WkvKind::kCorrelated ? "/correlated"
                                                      : "/independent");
  if (!fs::exists(dir)) {
    synthetic::SyntheticCheckpointOptions o;
    o.out_dir = dir;
    o.engram_vocab_size = 12500;
    o.engram_layer_ids = {1};
    o.num_hidden_layers = 2;
    o.hidden_size = 5120;
    o.hc_mult = 4;
    o.wkv_kind = kind;
    if (absl::Status s = synthetic::MakeSyntheticCheckpoint(o); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      std::abort();
    }
  }
  return sources->emplace(kind, dir).first->second;
}

void BM_QuantizeCheckpoint(benchmark::State& state,
                           const std::string& method_name,
                           synthetic::WkvKind kind) {
  const std::string& source = Source(kind);
  EngramQuantizeOptions o;
  o.checkpoint_dir = source;
  o.method = *ParseQuantMethod(method_name);
  o.threads = 1;
  o.wkv_error_rows = int64_t{1} << 40;  // Every row.
  double rms = 0, wkv = 0, rows = 0, seconds = 0;
  int run = 0;
  for (auto _ : state) {
    o.out_dir = source;
    o.out_dir.append("-out-")
        .append(method_name)
        .append("-")
        .append(std::to_string(run++));
    fs::remove_all(o.out_dir);
    absl::StatusOr<EngramQuantReport> report = QuantizeEngramCheckpoint(o);
    if (!report.ok()) {
      state.SkipWithError(std::string(report.status().message()).c_str());
      return;
    }
    const EngramTableReport& t = report->tables[0];
    rms = t.RelativeRms();
    wkv = t.WkvRelativeRms();
    rows += static_cast<double>(t.rows);
    seconds += t.seconds;
    fs::remove_all(o.out_dir);
  }
  state.counters["rows_per_s"] = rows / seconds;
  state.counters["rms_pct"] = 100 * rms;
  state.counters["wkv_rms_pct"] = 100 * wkv;
}

BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, rtn_amax_independent, "rtn-amax",
                  synthetic::WkvKind::kIndependent)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, rtn_mse_independent, "rtn-mse",
                  synthetic::WkvKind::kIndependent)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, gptq_amax_independent, "gptq-amax",
                  synthetic::WkvKind::kIndependent)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, gptq_mse_independent, "gptq-mse",
                  synthetic::WkvKind::kIndependent)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, rtn_amax_correlated, "rtn-amax",
                  synthetic::WkvKind::kCorrelated)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, rtn_mse_correlated, "rtn-mse",
                  synthetic::WkvKind::kCorrelated)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, gptq_amax_correlated, "gptq-amax",
                  synthetic::WkvKind::kCorrelated)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_QuantizeCheckpoint, gptq_mse_correlated, "gptq-mse",
                  synthetic::WkvKind::kCorrelated)
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace mneme::quant
