#include "tools/quant/engram_quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/engram_config.h"
#include "checkpoint/engram_config_loader.h"
#include "checkpoint/engram_table.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/hashing/hash_layout.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "formats/row_format.h"
#include "tools/quant/blas.h"
#include "tools/quant/engram_source.h"
#include "tools/quant/output_dir.h"
#include "tools/quant/parallel.h"
#include "tools/quant/shard_file_writer.h"
#include "tools/quant/source_config.h"
#include "tools/quant/wkv_hessian.h"

namespace mneme::quant {
namespace {

namespace fs = std::filesystem;
using engram_internal::Fp8RowsAmax;
using engram_internal::kBlocksPerRow;
using engram_internal::kFp8Scale;
using engram_internal::kFp8Weight;
using engram_internal::kN;
using engram_internal::kNvScale;
using engram_internal::kNvWeight;
using engram_internal::kScanTaskRows;
using engram_internal::kTaskRows;
using engram_internal::LayerKey;
using engram_internal::NanError;
using engram_internal::Notify;
using engram_internal::OpenSource;
using engram_internal::ReadRows;
using engram_internal::Source;
using engram_internal::SplitStep;
using engram_internal::TableJob;
using engram_internal::Task;
using formats::RowFormat;

constexpr char kTool[] = "quantize-engram";

absl::Status CheckOptions(const EngramQuantizeOptions& o) {
  if (o.rows_per_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows_per_step=", o.rows_per_step, " must be >= 1"));
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads=", o.threads, " must be >= 0"));
  }
  if (o.wkv_error_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("wkv_error_rows=", o.wkv_error_rows, " must be >= 1"));
  }
  if (o.gptq_batch_columns < kBlock || o.gptq_batch_columns % kBlock != 0 ||
      kN % o.gptq_batch_columns != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gptq_batch_columns=", o.gptq_batch_columns,
                     " must be a multiple of 16 that divides 256"));
  }
  if (!(o.damp_fraction >= 0.0) || !std::isfinite(o.damp_fraction)) {
    return absl::InvalidArgumentError(
        absl::StrCat("damp_fraction=", o.damp_fraction, " must be >= 0"));
  }
  return absl::OkStatus();
}

// Adds ||W_c e||^2 (with H) for the rows of `e` and `x` (m rows each) to
// the wkv sums, through one fp32 product.
void AddWkvErrors(const ColumnFactor& factor, const std::vector<float>& e,
                  const std::vector<float>& x, int64_t m,
                  EngramErrorSums* sums) {
  if (m == 0) return;
  std::vector<float> both(2 * m * kN);
  std::copy(e.begin(), e.begin() + m * kN, both.begin());
  std::copy(x.begin(), x.begin() + m * kN, both.begin() + m * kN);
  std::vector<float> y(2 * m * kN);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
              static_cast<int>(2 * m), kN, kN, 1.0f, both.data(), kN,
              factor.hessian.data(), kN, 0.0f, y.data(), kN);
  for (int64_t r = 0; r < 2 * m; ++r) {
    double dot = 0.0;
    for (int i = 0; i < kN; ++i) {
      dot += static_cast<double>(y[r * kN + i]) * both[r * kN + i];
    }
    if (r < m) {
      sums->wkv_error_squares += dot;
    } else {
      sums->wkv_reference_squares += dot;
    }
  }
  sums->wkv_rows += m;
}

// What pass 2 needs besides the rows.
struct Pass2Context {
  const TableJob* table = nullptr;
  QuantMethod method;
  GptqOptions gptq;
  float global_scale = 0.0f;
  int64_t wkv_stride = 1;
  const std::vector<ColumnFactor>* factors = nullptr;
};

// Quantizes one task's rows of a step and accounts for them.
absl::Status RunTask(const Pass2Context& ctx, int64_t step_first,
                     const Task& task, const uint8_t* src_w,
                     const uint8_t* src_s, uint8_t* out_w, uint8_t* out_s,
                     EngramErrorSums* sums) {
  const int64_t k = task.count;
  const int64_t a = task.first;
  const float gs = ctx.global_scale;
  std::vector<float> x(k * kN);
  RETURN_IF_ERROR(formats::DecodeRowsF32(
      {.format = RowFormat::kFp8},
      absl::MakeConstSpan(src_w + a * kFp8Weight, k * kFp8Weight),
      absl::MakeConstSpan(src_s + a * kFp8Scale, k * kFp8Scale),
      absl::MakeSpan(x)));
  for (int64_t i = 0; i < k * kN; ++i) {
    if (!std::isfinite(x[i])) {
      return NanError(ctx.table->layer, step_first + a + i / kN);
    }
  }
  RowQuantStats stats;
  if (ctx.method.feedback == ErrorFeedback::kNone) {
    for (int64_t r = 0; r < k; ++r) {
      QuantizeRowRtn(x.data() + r * kN, gs, ctx.method.scale,
                     out_w + (a + r) * kNvWeight, out_s + (a + r) * kNvScale,
                     &stats);
    }
  } else {
    constexpr int R = kGptqChunkRows;
    std::vector<float> work(size_t{kN} * R);
    std::vector<uint8_t> codes(size_t{R} * kN);
    std::vector<uint8_t> scales(size_t{R} * kBlocksPerRow);
    const ColumnFactor& factor = (*ctx.factors)[task.column];
    for (int64_t sub = 0; sub < k; sub += R) {
      const int64_t m = std::min<int64_t>(R, k - sub);
      for (int i = 0; i < kN; ++i) {
        for (int r = 0; r < R; ++r) {
          work[i * R + r] = r < m ? x[(sub + r) * kN + i] : 0.0f;
        }
      }
      GptqQuantizeChunk(factor, ctx.gptq, work.data(), codes.data(),
                        scales.data(), &stats);
      for (int64_t r = 0; r < m; ++r) {
        PackCodes(codes.data() + r * kN, out_w + (a + sub + r) * kNvWeight);
        std::memcpy(out_s + (a + sub + r) * kNvScale,
                    scales.data() + r * kBlocksPerRow, kNvScale);
      }
    }
  }
  sums->smaller_scale_blocks += stats.smaller_scale_blocks;

  std::vector<float> deq(k * kN);
  RETURN_IF_ERROR(formats::DecodeRowsF32(
      {.format = RowFormat::kNvfp4, .global_scale = gs},
      absl::MakeConstSpan(out_w + a * kNvWeight, k * kNvWeight),
      absl::MakeConstSpan(out_s + a * kNvScale, k * kNvScale),
      absl::MakeSpan(deq)));
  std::vector<float> e_rows;
  std::vector<float> x_rows;
  int64_t sampled = 0;
  for (int64_t r = 0; r < k; ++r) {
    const float* xr = x.data() + r * kN;
    const float* dr = deq.data() + r * kN;
    for (int i = 0; i < kN; ++i) {
      const double d = static_cast<double>(dr[i]) - xr[i];
      sums->error_squares += d * d;
      sums->reference_squares += static_cast<double>(xr[i]) * xr[i];
    }
    for (int b = 0; b < kBlocksPerRow; ++b) {
      bool nonzero = false;
      for (int j = 0; j < kBlock; ++j) nonzero |= xr[b * kBlock + j] != 0.0f;
      const uint8_t scale = out_s[(a + r) * kNvScale + b];
      if (nonzero && formats::E4m3ToFloat(scale) * gs == 0.0f) {
        ++sums->scale_underflows;
      }
    }
    if ((step_first + a + r) % ctx.wkv_stride == 0) {
      e_rows.resize((sampled + 1) * kN);
      x_rows.resize((sampled + 1) * kN);
      for (int i = 0; i < kN; ++i) {
        e_rows[sampled * kN + i] = dr[i] - xr[i];
        x_rows[sampled * kN + i] = xr[i];
      }
      ++sampled;
    }
  }
  AddWkvErrors((*ctx.factors)[task.column], e_rows, x_rows, sampled, sums);
  sums->rows += k;
  sums->blocks += k * kBlocksPerRow;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ColumnFactor>> MakeFactors(const WkvTensors& wkv,
                                                      double damp_fraction,
                                                      int threads) {
  absl::StatusOr<std::vector<std::vector<double>>> hessians =
      ComputeWkvHessians(wkv, threads);
  if (!hessians.ok()) return hessians.status();
  std::vector<ColumnFactor> factors(hessians->size());
  absl::Status status =
      ParallelFor(threads, static_cast<int64_t>(factors.size()),
                  [&](int64_t c) -> absl::Status {
                    absl::StatusOr<ColumnFactor> f =
                        MakeColumnFactor((*hessians)[c], damp_fraction);
                    if (!f.ok()) {
                      return absl::InvalidArgumentError(
                          absl::StrCat("layer ", wkv.layer, ", hash column ", c,
                                       ": ", f.status().message()));
                    }
                    factors[c] = *std::move(f);
                    return absl::OkStatus();
                  });
  if (!status.ok()) return status;
  return factors;
}

int64_t WkvStride(int64_t rows, int64_t sample_rows) {
  return std::max<int64_t>(1, (rows + sample_rows - 1) / sample_rows);
}

// The source config.json with the NVFP4 Engram keys added where the Engram
// keys are (text_config or the top level).
absl::StatusOr<std::string> QuantizedConfigText(
    const std::string& source_dir, const std::string& method,
    const std::map<int, float>& global_scales) {
  return RewriteSourceConfig(
      source_dir, "engram_layer_ids", [&](nlohmann::ordered_json& section) {
        nlohmann::ordered_json scales = nlohmann::ordered_json::object();
        for (const auto& [layer, scale] : global_scales) {
          scales[LayerKey(layer)] = scale;
        }
        section["engram_quant"] = "nvfp4";
        section["engram_quant_block_size"] = formats::kNvfp4BlockSize;
        section["engram_quant_method"] = method;
        section["engram_quant_global_scale"] = std::move(scales);
      });
}

// The declarations of a rewritten shard: its source tensors in file order,
// the Engram table tensors in their NVFP4 form.
std::vector<checkpoint::TensorDecl> RewrittenShardDecls(
    const checkpoint::SafetensorsReader& shard,
    const std::map<std::string, checkpoint::TensorDecl>& replaced) {
  std::vector<checkpoint::TensorDecl> decls;
  for (const checkpoint::TensorInfo* info :
       shard.header().TensorsInFileOrder()) {
    auto it = replaced.find(info->name);
    decls.push_back(
        it != replaced.end()
            ? it->second
            : checkpoint::TensorDecl{info->name, info->dtype, info->shape});
  }
  return decls;
}

}  // namespace

namespace {

// Everything one table's conversion shares with its steps.
struct Writers {
  std::map<std::string, std::unique_ptr<ShardFileWriter>> by_shard;
};

// Pass 1, or the amax saved by an interrupted run.
absl::StatusOr<float> RunAmaxPass(const TableJob& t,
                                  const EngramQuantizeOptions& o) {
  const int64_t step = std::min(o.rows_per_step, t.rows);
  std::vector<uint8_t> w(step * kFp8Weight);
  std::vector<uint8_t> s(step * kFp8Scale);
  float amax = 0.0f;
  const absl::Time start = absl::Now();
  for (int64_t first = 0; first < t.rows; first += step) {
    const int64_t n = std::min(step, t.rows - first);
    RETURN_IF_ERROR(ReadRows(t.weight, kFp8Weight, first, n, w.data()));
    RETURN_IF_ERROR(ReadRows(t.scale, kFp8Scale, first, n, s.data()));
    const int64_t tasks = (n + kScanTaskRows - 1) / kScanTaskRows;
    std::vector<float> maxima(tasks, 0.0f);
    absl::Status st = ParallelFor(o.threads, tasks, [&](int64_t i) {
      const int64_t a = i * kScanTaskRows;
      const int64_t k = std::min(kScanTaskRows, n - a);
      ASSIGN_OR_RETURN(
          float m, Fp8RowsAmax(t.layer, first + a, w.data() + a * kFp8Weight,
                               s.data() + a * kFp8Scale, k));
      maxima[i] = m;
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    for (float m : maxima) amax = std::max(amax, m);
    RETURN_IF_ERROR(Notify(
        o.progress, {.layer = t.layer,
                     .phase = EngramProgress::Phase::kAmax,
                     .rows_done = first + n,
                     .rows_total = t.rows,
                     .rows_this_run = first + n,
                     .seconds = absl::ToDoubleSeconds(absl::Now() - start)}));
  }
  return amax;
}

}  // namespace

absl::StatusOr<EngramQuantReport> QuantizeEngramCheckpoint(
    const EngramQuantizeOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  RETURN_IF_ERROR(CheckOutputPaths(o.checkpoint_dir, o.out_dir));
  ASSIGN_OR_RETURN(Source source, OpenSource(o.checkpoint_dir));
  EnsureSingleThreadedBlas();

  std::error_code ec;
  const std::string canonical_source =
      fs::canonical(o.checkpoint_dir, ec).string();
  const std::string method = QuantMethodName(o.method);
  const nlohmann::json identity = {
      {"source", canonical_source},
      {"files", SourceFingerprint(o.checkpoint_dir)},
      {"method", method},
      {"wkv_error_rows", o.wkv_error_rows},
      {"gptq_batch_columns", o.gptq_batch_columns},
      {"damp_fraction", o.damp_fraction},
  };
  ASSIGN_OR_RETURN(std::unique_ptr<PartialOutputDir> out,
                   PartialOutputDir::Open({.source_dir = o.checkpoint_dir,
                                           .out_dir = o.out_dir,
                                           .tool = kTool,
                                           .identity = identity}));
  PartialOutputDir& dir = *out;
  nlohmann::json state = dir.state();
  for (const char* key : {"tables", "shards"}) {
    if (!state[key].is_object()) state[key] = nlohmann::json::object();
  }

  // The shards to rewrite and their NVFP4 table tensors.
  std::map<std::string, const checkpoint::SafetensorsReader*> shard_readers;
  std::map<std::string, checkpoint::TensorDecl> replaced;
  for (const TableJob& t : source.tables) {
    shard_readers[t.weight_shard] = t.weight.shard;
    shard_readers[t.scale_shard] = t.scale.shard;
    replaced[t.weight.info->name] = {
        t.weight.info->name, checkpoint::DType::kU8, {t.rows, kNvWeight}};
    replaced[t.scale.info->name] = {
        t.scale.info->name, checkpoint::DType::kF8E4M3, {t.rows, kNvScale}};
  }
  Writers writers;
  EngramQuantReport report;
  report.source = canonical_source;
  report.method = method;
  report.resumed = dir.resumed();
  report.blas_core = BlasCoreName();
  for (const auto& [name, reader] : shard_readers) {
    nlohmann::json& shard_state = state["shards"][name];
    const bool started = shard_state.is_object();
    ASSIGN_OR_RETURN(
        std::unique_ptr<ShardFileWriter> writer,
        ShardFileWriter::Create(
            dir.PathOf(name), RewrittenShardDecls(*reader, replaced),
            reader->metadata(),
            started ? ShardOpenMode::kReopen : ShardOpenMode::kCreate));
    if (!started) {
      shard_state = {{"copied", false}};
      RETURN_IF_ERROR(dir.SaveState(state));
    }
    if (!JsonFieldOr(shard_state, "copied", false)) {
      for (const checkpoint::TensorInfo& info : reader->tensors()) {
        if (replaced.count(info.name) != 0) continue;
        RETURN_IF_ERROR(writer->CopyTensor(*reader, info.name, info.name));
      }
      RETURN_IF_ERROR(writer->Sync());
      shard_state["copied"] = true;
      RETURN_IF_ERROR(dir.SaveState(state));
    }
    report.source_shard_bytes += reader->file_size();
    report.output_shard_bytes += writer->file_size();
    writers.by_shard[name] = std::move(writer);
  }

  std::map<int, float> global_scales;
  for (const TableJob& t : source.tables) {
    nlohmann::json& ts = state["tables"][LayerKey(t.layer)];
    if (!ts.is_object()) ts = nlohmann::json::object();
    const absl::Time table_start = absl::Now();
    const double seconds_before = JsonFieldOr(ts, "seconds", 0.0);
    auto save = [&]() {
      ts["seconds"] =
          seconds_before + absl::ToDoubleSeconds(absl::Now() - table_start);
      return dir.SaveState(state);
    };

    if (!ts.contains("amax")) {
      ASSIGN_OR_RETURN(float amax, RunAmaxPass(t, o));
      ts["amax"] = amax;
      ts["global_scale"] = formats::Nvfp4GlobalScale(amax);
      ts["rows_done"] = 0;
      ts["sums"] = EngramErrorSums().ToJson();
      RETURN_IF_ERROR(save());
    }
    EngramTableReport table;
    table.layer = t.layer;
    table.method = method;
    table.shard = t.weight_shard;
    table.rows = t.rows;
    table.amax = JsonFieldOr(ts, "amax", 0.0f);
    table.global_scale = JsonFieldOr(ts, "global_scale", 0.0f);
    if (!(table.global_scale > 0.0f)) {
      return absl::DataLossError(
          absl::StrCat("the journal of '", dir.path(),
                       "' has no valid global scale for layer ", t.layer,
                       "; remove '", dir.path(), "' to start over"));
    }
    table.wkv_sample_stride = WkvStride(t.rows, o.wkv_error_rows);
    table.sums = EngramErrorSums::FromJson(ts["sums"]);
    global_scales[t.layer] = table.global_scale;
    int64_t rows_done = JsonFieldOr(ts, "rows_done", int64_t{0});

    if (rows_done < t.rows) {
      ASSIGN_OR_RETURN(std::vector<ColumnFactor> factors,
                       MakeFactors(t.wkv, o.damp_fraction, o.threads));
      Pass2Context ctx;
      ctx.table = &t;
      ctx.method = o.method;
      ctx.gptq = {.global_scale = table.global_scale,
                  .scale = o.method.scale,
                  .batch_columns = o.gptq_batch_columns};
      ctx.global_scale = table.global_scale;
      ctx.wkv_stride = table.wkv_sample_stride;
      ctx.factors = &factors;
      const int64_t step = std::min(o.rows_per_step, t.rows);
      std::vector<uint8_t> src_w(step * kFp8Weight);
      std::vector<uint8_t> src_s(step * kFp8Scale);
      std::vector<uint8_t> out_w(step * kNvWeight);
      std::vector<uint8_t> out_s(step * kNvScale);
      ShardFileWriter& weight_writer = *writers.by_shard.at(t.weight_shard);
      ShardFileWriter& scale_writer = *writers.by_shard.at(t.scale_shard);
      const int64_t rows_at_start = rows_done;
      const absl::Time pass_start = absl::Now();
      while (rows_done < t.rows) {
        const int64_t first = rows_done;
        const int64_t n = std::min(step, t.rows - first);
        RETURN_IF_ERROR(ReadRows(t.weight, kFp8Weight, first, n, src_w.data()));
        RETURN_IF_ERROR(ReadRows(t.scale, kFp8Scale, first, n, src_s.data()));
        const std::vector<Task> tasks = SplitStep(t, first, n, kTaskRows);
        std::vector<EngramErrorSums> task_sums(tasks.size());
        absl::Status status = ParallelFor(
            o.threads, static_cast<int64_t>(tasks.size()), [&](int64_t i) {
              return RunTask(ctx, first, tasks[i], src_w.data(), src_s.data(),
                             out_w.data(), out_s.data(), &task_sums[i]);
            });
        if (!status.ok()) return status;
        for (const EngramErrorSums& s : task_sums) table.sums.Add(s);
        RETURN_IF_ERROR(weight_writer.Write(
            t.weight.info->name, first * kNvWeight,
            absl::MakeConstSpan(out_w.data(), n * kNvWeight)));
        RETURN_IF_ERROR(scale_writer.Write(
            t.scale.info->name, first * kNvScale,
            absl::MakeConstSpan(out_s.data(), n * kNvScale)));
        RETURN_IF_ERROR(weight_writer.Sync());
        if (&scale_writer != &weight_writer) {
          RETURN_IF_ERROR(scale_writer.Sync());
        }
        rows_done = first + n;
        ts["rows_done"] = rows_done;
        ts["sums"] = table.sums.ToJson();
        RETURN_IF_ERROR(save());
        RETURN_IF_ERROR(Notify(
            o.progress,
            {.layer = t.layer,
             .phase = EngramProgress::Phase::kQuantize,
             .rows_done = rows_done,
             .rows_total = t.rows,
             .rows_this_run = rows_done - rows_at_start,
             .seconds = absl::ToDoubleSeconds(absl::Now() - pass_start)}));
      }
    }
    table.seconds = JsonFieldOr(ts, "seconds", 0.0);
    report.tables.push_back(std::move(table));
  }

  // Close the shards, then the small files.
  std::set<std::string> written = {std::string(checkpoint::kConfigFileName),
                                   kEngramReportFileName};
  for (auto& [name, writer] : writers.by_shard) {
    RETURN_IF_ERROR(writer->Close());
    written.insert(name);
  }
  const std::optional<checkpoint::CheckpointIndex>& index =
      source.checkpoint->index();
  if (index.has_value()) {
    checkpoint::CheckpointIndex new_index = *index;
    uint64_t total = 0;
    for (const auto& [name, location] : source.checkpoint->tensors()) {
      auto it = replaced.find(name);
      if (it == replaced.end()) {
        total += location.info->byte_length;
      } else {
        total += static_cast<uint64_t>(it->second.shape[0]) *
                 static_cast<uint64_t>(it->second.shape[1]);
      }
    }
    new_index.total_size = total;
    RETURN_IF_ERROR(checkpoint::WriteCheckpointIndex(
        dir.PathOf(checkpoint::kIndexFileName), new_index));
    written.insert(std::string(checkpoint::kIndexFileName));
  }
  ASSIGN_OR_RETURN(
      std::string config,
      QuantizedConfigText(o.checkpoint_dir, method, global_scales));
  RETURN_IF_ERROR(dir.WriteFile(checkpoint::kConfigFileName, config));
  RETURN_IF_ERROR(dir.WriteFile(kEngramReportFileName,
                                JsonDump(report.ToJson(), 2) + "\n"));
  RETURN_IF_ERROR(dir.LinkSourceFiles(written));

  if (o.verify == VerifyOutput::kYes) {
    ASSIGN_OR_RETURN(nlohmann::json verified,
                     VerifyEngramCheckpoint({.checkpoint_dir = o.checkpoint_dir,
                                             .out_dir = dir.path(),
                                             .rows_per_step = o.rows_per_step,
                                             .threads = o.threads,
                                             .progress = o.progress}));
    report.verify = verified;
    RETURN_IF_ERROR(dir.WriteFile(kEngramReportFileName,
                                  JsonDump(report.ToJson(), 2) + "\n"));
  }
  RETURN_IF_ERROR(dir.Commit());
  return report;
}

}  // namespace mneme::quant
