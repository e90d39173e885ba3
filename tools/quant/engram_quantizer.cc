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
#include "engram_store/engram_checkpoint.h"
#include "engram_store/hashing/hash_layout.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "formats/row_format.h"
#include "formats/ue8m0.h"
#include "tools/quant/blas.h"
#include "tools/quant/json_field.h"
#include "tools/quant/output_dir.h"
#include "tools/quant/parallel.h"
#include "tools/quant/shard_file_writer.h"
#include "tools/quant/source_config.h"
#include "tools/quant/wkv_hessian.h"

namespace mneme::quant {
namespace {

namespace fs = std::filesystem;
using formats::RowFormat;

constexpr int kN = formats::kRowDim;
constexpr int kBlocksPerRow = kN / kBlock;
constexpr int64_t kFp8Weight = formats::kFp8WeightBytes;
constexpr int64_t kFp8Scale = formats::kFp8ScaleBytes;
constexpr int64_t kNvWeight = formats::kNvfp4WeightBytes;
constexpr int64_t kNvScale = formats::kNvfp4ScaleBytes;
// Rows per task of pass 2 (all of one hash column) and of the other passes.
constexpr int64_t kTaskRows = 256;
constexpr int64_t kScanTaskRows = 16384;
// Relative tolerances of VerifyEngramCheckpoint: the raw error sums the
// same fp32 values in another order; the error through wkv is fp32 products
// in the conversion and double ones in the verification.
constexpr double kVerifyRawTolerance = 1e-9;
constexpr double kVerifyWkvTolerance = 1e-4;
constexpr char kTool[] = "quantize-engram";

// One Engram table of the source.
struct TableJob {
  int layer = 0;
  int64_t rows = 0;
  checkpoint::TensorLocation weight;
  checkpoint::TensorLocation scale;
  // File names (relative to the checkpoint) of the shards holding them.
  std::string weight_shard;
  std::string scale_shard;
  WkvTensors wkv;
  // First row of each hash column, then the row count.
  std::vector<int64_t> offsets;

  int ColumnOf(int64_t row) const {
    return static_cast<int>(
        std::upper_bound(offsets.begin(), offsets.end(), row) -
        offsets.begin() - 1);
  }
};

// The source checkpoint, opened and checked.
struct Source {
  std::string dir;
  checkpoint::EngramConfig config;
  std::unique_ptr<checkpoint::ShardedCheckpoint> checkpoint;
  std::vector<TableJob> tables;
};

std::string FileName(const std::string& path) {
  return fs::path(path).filename().string();
}

absl::StatusOr<Source> OpenSource(const std::string& dir) {
  Source source;
  source.dir = dir;
  absl::StatusOr<checkpoint::EngramConfig> config =
      checkpoint::LoadEngramConfig(
          absl::StrCat(dir, "/", checkpoint::kConfigFileName));
  if (!config.ok()) return config.status();
  source.config = *std::move(config);
  if (source.config.format != RowFormat::kFp8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Engram tables of '", dir, "' are ",
        formats::RowFormatName(source.config.format),
        " (engram_quant in config.json), not FP8: quantize-engram converts "
        "FP8 tables only"));
  }
  absl::StatusOr<std::unique_ptr<checkpoint::ShardedCheckpoint>> checkpoint =
      checkpoint::ShardedCheckpoint::Create(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  source.checkpoint = *std::move(checkpoint);
  absl::StatusOr<std::vector<checkpoint::EngramTableLocation>> located =
      checkpoint::LocateEngramTables(*source.checkpoint, source.config);
  if (!located.ok()) return located.status();
  absl::StatusOr<engram::HashLayout> layout =
      engram::HashLayout::Create(source.config);
  if (!layout.ok()) return layout.status();
  for (size_t i = 0; i < located->size(); ++i) {
    const checkpoint::EngramTableLocation& loc = (*located)[i];
    TableJob job;
    job.layer = loc.layer;
    job.rows = loc.rows;
    job.weight = *source.checkpoint->FindOrNull(
        checkpoint::EngramWeightTensorName(loc.layer));
    job.scale = *source.checkpoint->FindOrNull(
        checkpoint::EngramScaleTensorName(loc.layer));
    job.weight_shard = FileName(loc.shard_path);
    job.scale_shard = FileName(loc.scale_shard_path);
    absl::StatusOr<WkvTensors> wkv =
        LocateWkv(*source.checkpoint, loc.layer, source.config.NumColumns());
    if (!wkv.ok()) return wkv.status();
    job.wkv = *wkv;
    job.offsets = layout->layers()[i].offsets;
    job.offsets.push_back(job.rows);
    source.tables.push_back(std::move(job));
  }
  return source;
}

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

// Reads rows [first, first + count) of a table tensor with `row_bytes`
// bytes per row.
absl::Status ReadRows(const checkpoint::TensorLocation& t, int64_t row_bytes,
                      int64_t first, int64_t count, uint8_t* out) {
  return t.shard->ReadTensorRange(t.info->name, first * row_bytes,
                                  absl::MakeSpan(out, count * row_bytes));
}

absl::Status NanError(int layer, int64_t row) {
  return absl::DataLossError(absl::StrCat(
      "Engram table of layer ", layer, ", row ", row,
      ": NaN or a value beyond fp32 (e4m3 code 0x7F/0xFF or UE8M0 255)"));
}

// Largest |value| of FP8 rows (codes and UE8M0 scales of `count` rows).
// DataLoss for NaN codes or scales and for values beyond fp32.
absl::StatusOr<float> Fp8RowsAmax(int layer, int64_t first_row,
                                  const uint8_t* weights, const uint8_t* scales,
                                  int64_t count) {
  float amax = 0.0f;
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t b = 0; b < kFp8Scale; ++b) {
      const uint8_t e = scales[r * kFp8Scale + b];
      const uint8_t* codes = weights + r * kFp8Weight + b * 32;
      uint8_t m = 0;
      for (int j = 0; j < 32; ++j) m = std::max<uint8_t>(m, codes[j] & 0x7F);
      if (m == 0x7F || e == 255) return NanError(layer, first_row + r);
      const float v = formats::E4m3ToFloat(m) * formats::Ue8m0ToFloat(e);
      if (!std::isfinite(v)) return NanError(layer, first_row + r);
      amax = std::max(amax, v);
    }
  }
  return amax;
}

// The tasks of one step: runs of at most kTaskRows rows of one hash column.
struct Task {
  int64_t first = 0;  // Row index within the step.
  int64_t count = 0;
  int column = 0;
};

std::vector<Task> SplitStep(const TableJob& t, int64_t step_first,
                            int64_t step_rows, int64_t task_rows) {
  std::vector<Task> tasks;
  for (int64_t a = 0; a < step_rows;) {
    const int column = t.ColumnOf(step_first + a);
    const int64_t column_end = t.offsets[column + 1] - step_first;
    const int64_t count = std::min({task_rows, step_rows - a, column_end - a});
    tasks.push_back({a, count, column});
    a += count;
  }
  return tasks;
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
  if (absl::Status s = formats::DecodeRowsF32(
          {.format = RowFormat::kFp8},
          absl::MakeConstSpan(src_w + a * kFp8Weight, k * kFp8Weight),
          absl::MakeConstSpan(src_s + a * kFp8Scale, k * kFp8Scale),
          absl::MakeSpan(x));
      !s.ok()) {
    return s;
  }
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
    std::vector<float> work(kN * R);
    std::vector<uint8_t> codes(R * kN);
    std::vector<uint8_t> scales(R * kBlocksPerRow);
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
  if (absl::Status s = formats::DecodeRowsF32(
          {.format = RowFormat::kNvfp4, .global_scale = gs},
          absl::MakeConstSpan(out_w + a * kNvWeight, k * kNvWeight),
          absl::MakeConstSpan(out_s + a * kNvScale, k * kNvScale),
          absl::MakeSpan(deq));
      !s.ok()) {
    return s;
  }
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

std::string LayerKey(int layer) { return absl::StrCat(layer); }

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
  std::vector<const checkpoint::TensorInfo*> infos;
  for (const checkpoint::TensorInfo& info : shard.tensors())
    infos.push_back(&info);
  std::sort(
      infos.begin(), infos.end(),
      [](const checkpoint::TensorInfo* x, const checkpoint::TensorInfo* y) {
        return x->offset < y->offset ||
               (x->offset == y->offset && x->name < y->name);
      });
  std::vector<checkpoint::TensorDecl> decls;
  for (const checkpoint::TensorInfo* info : infos) {
    auto it = replaced.find(info->name);
    decls.push_back(
        it != replaced.end()
            ? it->second
            : checkpoint::TensorDecl{info->name, info->dtype, info->shape});
  }
  return decls;
}

absl::Status Notify(const EngramProgressCallback& progress,
                    const EngramProgress& update) {
  return progress ? progress(update) : absl::OkStatus();
}

// Reads a (small) JSON file.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  absl::StatusOr<std::string> text =
      mneme::ReadSmallFile(path, uint64_t{64} << 20);
  if (!text.ok()) return text.status();
  nlohmann::json json = nlohmann::json::parse(*text, nullptr, false);
  if (json.is_discarded()) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not valid JSON"));
  }
  return json;
}

double RelativeRoot(double error, double reference) {
  return reference > 0.0 ? std::sqrt(error / reference) : 0.0;
}

}  // namespace

void EngramErrorSums::Add(const EngramErrorSums& o) {
  rows += o.rows;
  blocks += o.blocks;
  error_squares += o.error_squares;
  reference_squares += o.reference_squares;
  wkv_rows += o.wkv_rows;
  wkv_error_squares += o.wkv_error_squares;
  wkv_reference_squares += o.wkv_reference_squares;
  scale_underflows += o.scale_underflows;
  smaller_scale_blocks += o.smaller_scale_blocks;
}

nlohmann::json EngramErrorSums::ToJson() const {
  return {{"rows", rows},
          {"blocks", blocks},
          {"error_squares", error_squares},
          {"reference_squares", reference_squares},
          {"wkv_rows", wkv_rows},
          {"wkv_error_squares", wkv_error_squares},
          {"wkv_reference_squares", wkv_reference_squares},
          {"scale_underflows", scale_underflows},
          {"smaller_scale_blocks", smaller_scale_blocks}};
}

EngramErrorSums EngramErrorSums::FromJson(const nlohmann::json& json) {
  EngramErrorSums s;
  if (!json.is_object()) return s;
  s.rows = JsonField(json, "rows", int64_t{0});
  s.blocks = JsonField(json, "blocks", int64_t{0});
  s.error_squares = JsonField(json, "error_squares", 0.0);
  s.reference_squares = JsonField(json, "reference_squares", 0.0);
  s.wkv_rows = JsonField(json, "wkv_rows", int64_t{0});
  s.wkv_error_squares = JsonField(json, "wkv_error_squares", 0.0);
  s.wkv_reference_squares = JsonField(json, "wkv_reference_squares", 0.0);
  s.scale_underflows = JsonField(json, "scale_underflows", int64_t{0});
  s.smaller_scale_blocks = JsonField(json, "smaller_scale_blocks", int64_t{0});
  return s;
}

double EngramTableReport::RelativeRms() const {
  return RelativeRoot(sums.error_squares, sums.reference_squares);
}

double EngramTableReport::WkvRelativeRms() const {
  return RelativeRoot(sums.wkv_error_squares, sums.wkv_reference_squares);
}

nlohmann::json EngramTableReport::ToJson() const {
  return {{"layer", layer},
          {"method", method},
          {"shard", shard},
          {"rows", rows},
          {"blocks", sums.blocks},
          {"amax", amax},
          {"global_scale", global_scale},
          {"relative_rms", RelativeRms()},
          {"wkv_relative_rms", WkvRelativeRms()},
          {"wkv_rows", sums.wkv_rows},
          {"wkv_sample_stride", wkv_sample_stride},
          {"scale_underflows", sums.scale_underflows},
          {"smaller_scale_blocks", sums.smaller_scale_blocks},
          {"seconds", seconds}};
}

nlohmann::json EngramQuantReport::ToJson() const {
  nlohmann::json json = {{"tool", "mneme quantize-engram"},
                         {"source", source},
                         {"method", method},
                         {"resumed", resumed},
                         {"blas_core", blas_core},
                         {"source_shard_bytes", source_shard_bytes},
                         {"output_shard_bytes", output_shard_bytes},
                         {"tables", nlohmann::json::array()}};
  for (const EngramTableReport& t : tables)
    json["tables"].push_back(t.ToJson());
  if (verify.has_value()) json["verify"] = *verify;
  return json;
}

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
    if (absl::Status st = ReadRows(t.weight, kFp8Weight, first, n, w.data());
        !st.ok()) {
      return st;
    }
    if (absl::Status st = ReadRows(t.scale, kFp8Scale, first, n, s.data());
        !st.ok()) {
      return st;
    }
    const int64_t tasks = (n + kScanTaskRows - 1) / kScanTaskRows;
    std::vector<float> maxima(tasks, 0.0f);
    absl::Status st = ParallelFor(o.threads, tasks, [&](int64_t i) {
      const int64_t a = i * kScanTaskRows;
      const int64_t k = std::min(kScanTaskRows, n - a);
      absl::StatusOr<float> m =
          Fp8RowsAmax(t.layer, first + a, w.data() + a * kFp8Weight,
                      s.data() + a * kFp8Scale, k);
      if (!m.ok()) return m.status();
      maxima[i] = *m;
      return absl::OkStatus();
    });
    if (!st.ok()) return st;
    for (float m : maxima) amax = std::max(amax, m);
    if (absl::Status p =
            Notify(o.progress,
                   {.layer = t.layer,
                    .phase = EngramProgress::Phase::kAmax,
                    .rows_done = first + n,
                    .rows_total = t.rows,
                    .rows_this_run = first + n,
                    .seconds = absl::ToDoubleSeconds(absl::Now() - start)});
        !p.ok()) {
      return p;
    }
  }
  return amax;
}

}  // namespace

absl::StatusOr<EngramQuantReport> QuantizeEngramCheckpoint(
    const EngramQuantizeOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  if (absl::Status s = CheckOutputPaths(o.checkpoint_dir, o.out_dir); !s.ok()) {
    return s;
  }
  absl::StatusOr<Source> source = OpenSource(o.checkpoint_dir);
  if (!source.ok()) return source.status();
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
  absl::StatusOr<std::unique_ptr<PartialOutputDir>> out =
      PartialOutputDir::Open({.source_dir = o.checkpoint_dir,
                              .out_dir = o.out_dir,
                              .tool = kTool,
                              .identity = identity});
  if (!out.ok()) return out.status();
  PartialOutputDir& dir = **out;
  nlohmann::json state = dir.state();
  for (const char* key : {"tables", "shards"}) {
    if (!state[key].is_object()) state[key] = nlohmann::json::object();
  }

  // The shards to rewrite and their NVFP4 table tensors.
  std::map<std::string, const checkpoint::SafetensorsReader*> shard_readers;
  std::map<std::string, checkpoint::TensorDecl> replaced;
  for (const TableJob& t : source->tables) {
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
    absl::StatusOr<std::unique_ptr<ShardFileWriter>> writer =
        ShardFileWriter::Create(
            dir.PathOf(name), RewrittenShardDecls(*reader, replaced),
            reader->metadata(),
            started ? ShardOpenMode::kReopen : ShardOpenMode::kCreate);
    if (!writer.ok()) return writer.status();
    if (!started) {
      shard_state = {{"copied", false}};
      if (absl::Status s = dir.SaveState(state); !s.ok()) return s;
    }
    if (!JsonField(shard_state, "copied", false)) {
      for (const checkpoint::TensorInfo& info : reader->tensors()) {
        if (replaced.count(info.name) != 0) continue;
        if (absl::Status s =
                (*writer)->CopyTensor(*reader, info.name, info.name);
            !s.ok()) {
          return s;
        }
      }
      if (absl::Status s = (*writer)->Sync(); !s.ok()) return s;
      shard_state["copied"] = true;
      if (absl::Status s = dir.SaveState(state); !s.ok()) return s;
    }
    report.source_shard_bytes += reader->file_size();
    report.output_shard_bytes += (*writer)->file_size();
    writers.by_shard[name] = *std::move(writer);
  }

  std::map<int, float> global_scales;
  for (const TableJob& t : source->tables) {
    nlohmann::json& ts = state["tables"][LayerKey(t.layer)];
    if (!ts.is_object()) ts = nlohmann::json::object();
    const absl::Time table_start = absl::Now();
    const double seconds_before = JsonField(ts, "seconds", 0.0);
    auto save = [&]() {
      ts["seconds"] =
          seconds_before + absl::ToDoubleSeconds(absl::Now() - table_start);
      return dir.SaveState(state);
    };

    if (!ts.contains("amax")) {
      absl::StatusOr<float> amax = RunAmaxPass(t, o);
      if (!amax.ok()) return amax.status();
      ts["amax"] = *amax;
      ts["global_scale"] = formats::Nvfp4GlobalScale(*amax);
      ts["rows_done"] = 0;
      ts["sums"] = EngramErrorSums().ToJson();
      if (absl::Status s = save(); !s.ok()) return s;
    }
    EngramTableReport table;
    table.layer = t.layer;
    table.method = method;
    table.shard = t.weight_shard;
    table.rows = t.rows;
    table.amax = JsonField(ts, "amax", 0.0f);
    table.global_scale = JsonField(ts, "global_scale", 0.0f);
    if (!(table.global_scale > 0.0f)) {
      return absl::DataLossError(
          absl::StrCat("the journal of '", dir.path(),
                       "' has no valid global scale for layer ", t.layer,
                       "; remove '", dir.path(), "' to start over"));
    }
    table.wkv_sample_stride = WkvStride(t.rows, o.wkv_error_rows);
    table.sums = EngramErrorSums::FromJson(ts["sums"]);
    global_scales[t.layer] = table.global_scale;
    int64_t rows_done = JsonField(ts, "rows_done", int64_t{0});

    if (rows_done < t.rows) {
      absl::StatusOr<std::vector<ColumnFactor>> factors =
          MakeFactors(t.wkv, o.damp_fraction, o.threads);
      if (!factors.ok()) return factors.status();
      Pass2Context ctx;
      ctx.table = &t;
      ctx.method = o.method;
      ctx.gptq = {.global_scale = table.global_scale,
                  .scale = o.method.scale,
                  .batch_columns = o.gptq_batch_columns};
      ctx.global_scale = table.global_scale;
      ctx.wkv_stride = table.wkv_sample_stride;
      ctx.factors = &*factors;
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
        if (absl::Status s =
                ReadRows(t.weight, kFp8Weight, first, n, src_w.data());
            !s.ok()) {
          return s;
        }
        if (absl::Status s =
                ReadRows(t.scale, kFp8Scale, first, n, src_s.data());
            !s.ok()) {
          return s;
        }
        const std::vector<Task> tasks = SplitStep(t, first, n, kTaskRows);
        std::vector<EngramErrorSums> task_sums(tasks.size());
        absl::Status status = ParallelFor(
            o.threads, static_cast<int64_t>(tasks.size()), [&](int64_t i) {
              return RunTask(ctx, first, tasks[i], src_w.data(), src_s.data(),
                             out_w.data(), out_s.data(), &task_sums[i]);
            });
        if (!status.ok()) return status;
        for (const EngramErrorSums& s : task_sums) table.sums.Add(s);
        if (absl::Status s = weight_writer.Write(
                t.weight.info->name, first * kNvWeight,
                absl::MakeConstSpan(out_w.data(), n * kNvWeight));
            !s.ok()) {
          return s;
        }
        if (absl::Status s = scale_writer.Write(
                t.scale.info->name, first * kNvScale,
                absl::MakeConstSpan(out_s.data(), n * kNvScale));
            !s.ok()) {
          return s;
        }
        if (absl::Status s = weight_writer.Sync(); !s.ok()) return s;
        if (&scale_writer != &weight_writer) {
          if (absl::Status s = scale_writer.Sync(); !s.ok()) return s;
        }
        rows_done = first + n;
        ts["rows_done"] = rows_done;
        ts["sums"] = table.sums.ToJson();
        if (absl::Status s = save(); !s.ok()) return s;
        if (absl::Status p = Notify(
                o.progress,
                {.layer = t.layer,
                 .phase = EngramProgress::Phase::kQuantize,
                 .rows_done = rows_done,
                 .rows_total = t.rows,
                 .rows_this_run = rows_done - rows_at_start,
                 .seconds = absl::ToDoubleSeconds(absl::Now() - pass_start)});
            !p.ok()) {
          return p;
        }
      }
    }
    table.seconds = JsonField(ts, "seconds", 0.0);
    report.tables.push_back(std::move(table));
  }

  // Close the shards, then the small files.
  std::set<std::string> written = {std::string(checkpoint::kConfigFileName),
                                   kEngramReportFileName};
  for (auto& [name, writer] : writers.by_shard) {
    if (absl::Status s = writer->Close(); !s.ok()) return s;
    written.insert(name);
  }
  const std::optional<checkpoint::CheckpointIndex>& index =
      source->checkpoint->index();
  if (index.has_value()) {
    checkpoint::CheckpointIndex new_index = *index;
    uint64_t total = 0;
    for (const auto& [name, location] : source->checkpoint->tensors()) {
      auto it = replaced.find(name);
      if (it == replaced.end()) {
        total += location.info->byte_length;
      } else {
        total += static_cast<uint64_t>(it->second.shape[0]) *
                 static_cast<uint64_t>(it->second.shape[1]);
      }
    }
    new_index.total_size = total;
    if (absl::Status s = checkpoint::WriteCheckpointIndex(
            dir.PathOf(checkpoint::kIndexFileName), new_index);
        !s.ok()) {
      return s;
    }
    written.insert(std::string(checkpoint::kIndexFileName));
  }
  absl::StatusOr<std::string> config =
      QuantizedConfigText(o.checkpoint_dir, method, global_scales);
  if (!config.ok()) return config.status();
  if (absl::Status s = dir.WriteFile(checkpoint::kConfigFileName, *config);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          dir.WriteFile(kEngramReportFileName, JsonText(report.ToJson()));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = dir.LinkSourceFiles(written); !s.ok()) return s;

  if (o.verify == VerifyOutput::kYes) {
    absl::StatusOr<nlohmann::json> verified =
        VerifyEngramCheckpoint({.checkpoint_dir = o.checkpoint_dir,
                                .out_dir = dir.path(),
                                .rows_per_step = o.rows_per_step,
                                .threads = o.threads,
                                .progress = o.progress});
    if (!verified.ok()) return verified.status();
    report.verify = *verified;
    if (absl::Status s =
            dir.WriteFile(kEngramReportFileName, JsonText(report.ToJson()));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = dir.Commit(); !s.ok()) return s;
  return report;
}

namespace {

// Recomputed numbers of one table (VerifyEngramCheckpoint).
struct Recomputed {
  float amax = 0.0f;
  EngramErrorSums sums;
};

// e^T H e in double, H symmetric (upper triangle read).
double QuadraticForm(const std::vector<double>& h, const float* e) {
  double total = 0.0;
  for (int i = 0; i < kN; ++i) {
    const double ei = e[i];
    double row = 0.5 * h[i * kN + i] * ei;
    for (int j = i + 1; j < kN; ++j) row += h[i * kN + j] * e[j];
    total += ei * row;
  }
  return 2.0 * total;
}

absl::Status Mismatch(int layer, absl::string_view what, double reported,
                      double recomputed) {
  return absl::DataLossError(absl::StrFormat(
      "verify: layer %d: %s is %.9g in the report but %.9g recomputed from "
      "the output",
      layer, what, reported, recomputed));
}

}  // namespace

absl::StatusOr<nlohmann::json> VerifyEngramCheckpoint(
    const EngramVerifyOptions& o) {
  if (o.rows_per_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows_per_step=", o.rows_per_step, " must be >= 1"));
  }
  absl::StatusOr<Source> source = OpenSource(o.checkpoint_dir);
  if (!source.ok()) return source.status();
  absl::StatusOr<std::unique_ptr<engram::EngramCheckpoint>> output =
      engram::EngramCheckpoint::Open(o.out_dir);
  if (!output.ok()) return output.status();
  if ((*output)->config().format != RowFormat::kNvfp4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verify: the Engram tables of '", o.out_dir, "' are not NVFP4"));
  }
  absl::StatusOr<nlohmann::json> report =
      ReadJsonFile(absl::StrCat(o.out_dir, "/", kEngramReportFileName));
  if (!report.ok()) return report.status();
  const nlohmann::json tables =
      report->is_object() && report->contains("tables") ? (*report)["tables"]
                                                        : nlohmann::json();
  if (!tables.is_array() || tables.size() != source->tables.size()) {
    return absl::DataLossError(absl::StrCat("verify: the report of '",
                                            o.out_dir, "' does not list ",
                                            source->tables.size(), " tables"));
  }
  nlohmann::json result = {{"tables", nlohmann::json::array()}};
  for (size_t ti = 0; ti < source->tables.size(); ++ti) {
    const TableJob& t = source->tables[ti];
    const nlohmann::json& reported = tables[ti];
    if (JsonField(reported, "layer", -1) != t.layer) {
      return absl::DataLossError(
          absl::StrCat("verify: report table ", ti, " is not layer ", t.layer));
    }
    absl::StatusOr<const checkpoint::EngramTableLocation*> out_table =
        (*output)->Table(t.layer);
    if (!out_table.ok()) return out_table.status();
    const float gs = (*out_table)->global_scale;
    const checkpoint::TensorLocation out_w =
        *(*output)->checkpoint().FindOrNull(
            checkpoint::EngramWeightTensorName(t.layer));
    const checkpoint::TensorLocation out_s =
        *(*output)->checkpoint().FindOrNull(
            checkpoint::EngramScaleTensorName(t.layer));
    absl::StatusOr<WkvTensors> wkv = LocateWkv(
        (*output)->checkpoint(), t.layer, (*output)->config().NumColumns());
    if (!wkv.ok()) return wkv.status();
    absl::StatusOr<std::vector<std::vector<double>>> hessians =
        ComputeWkvHessians(*wkv, o.threads);
    if (!hessians.ok()) return hessians.status();
    const int64_t stride = JsonField(reported, "wkv_sample_stride", int64_t{1});
    if (stride < 1) {
      return absl::DataLossError("verify: wkv_sample_stride must be >= 1");
    }

    Recomputed total;
    const int64_t step = std::min(o.rows_per_step, t.rows);
    std::vector<uint8_t> src_w(step * kFp8Weight), src_s(step * kFp8Scale);
    std::vector<uint8_t> nv_w(step * kNvWeight), nv_s(step * kNvScale);
    const absl::Time start = absl::Now();
    for (int64_t first = 0; first < t.rows; first += step) {
      const int64_t n = std::min(step, t.rows - first);
      for (auto [loc, bytes, buffer] :
           {std::make_tuple(&t.weight, kFp8Weight, src_w.data()),
            std::make_tuple(&t.scale, kFp8Scale, src_s.data()),
            std::make_tuple(&out_w, kNvWeight, nv_w.data()),
            std::make_tuple(&out_s, kNvScale, nv_s.data())}) {
        if (absl::Status s = ReadRows(*loc, bytes, first, n, buffer); !s.ok()) {
          return s;
        }
      }
      const std::vector<Task> tasks = SplitStep(t, first, n, kScanTaskRows);
      std::vector<Recomputed> parts(tasks.size());
      absl::Status status = ParallelFor(
          o.threads, static_cast<int64_t>(tasks.size()),
          [&](int64_t ti2) -> absl::Status {
            const Task& task = tasks[ti2];
            const int64_t a = task.first, k = task.count;
            std::vector<float> x(k * kN), q(k * kN);
            if (absl::Status s = formats::DecodeRowsF32(
                    {.format = RowFormat::kFp8},
                    absl::MakeConstSpan(src_w.data() + a * kFp8Weight,
                                        k * kFp8Weight),
                    absl::MakeConstSpan(src_s.data() + a * kFp8Scale,
                                        k * kFp8Scale),
                    absl::MakeSpan(x));
                !s.ok()) {
              return s;
            }
            if (absl::Status s = formats::DecodeRowsF32(
                    {.format = RowFormat::kNvfp4, .global_scale = gs},
                    absl::MakeConstSpan(nv_w.data() + a * kNvWeight,
                                        k * kNvWeight),
                    absl::MakeConstSpan(nv_s.data() + a * kNvScale,
                                        k * kNvScale),
                    absl::MakeSpan(q));
                !s.ok()) {
              return s;
            }
            Recomputed& part = parts[ti2];
            std::vector<float> e(kN);
            for (int64_t r = 0; r < k; ++r) {
              for (int i = 0; i < kN; ++i) {
                const float xv = x[r * kN + i];
                part.amax = std::max(part.amax, std::fabs(xv));
                e[i] = q[r * kN + i] - xv;
                part.sums.error_squares += static_cast<double>(e[i]) * e[i];
                part.sums.reference_squares += static_cast<double>(xv) * xv;
              }
              for (int b = 0; b < kBlocksPerRow; ++b) {
                bool nonzero = false;
                for (int j = 0; j < kBlock; ++j) {
                  nonzero |= x[r * kN + b * kBlock + j] != 0.0f;
                }
                const float step_value =
                    formats::E4m3ToFloat(nv_s[(a + r) * kNvScale + b]) * gs;
                if (nonzero && step_value == 0.0f) ++part.sums.scale_underflows;
              }
              if ((first + a + r) % stride == 0) {
                const std::vector<double>& h = (*hessians)[task.column];
                part.sums.wkv_error_squares += QuadraticForm(h, e.data());
                part.sums.wkv_reference_squares +=
                    QuadraticForm(h, x.data() + r * kN);
                ++part.sums.wkv_rows;
              }
            }
            part.sums.rows = k;
            part.sums.blocks = k * kBlocksPerRow;
            return absl::OkStatus();
          });
      if (!status.ok()) return status;
      for (const Recomputed& part : parts) {
        total.amax = std::max(total.amax, part.amax);
        total.sums.Add(part.sums);
      }
      if (absl::Status p =
              Notify(o.progress,
                     {.layer = t.layer,
                      .phase = EngramProgress::Phase::kVerify,
                      .rows_done = first + n,
                      .rows_total = t.rows,
                      .rows_this_run = first + n,
                      .seconds = absl::ToDoubleSeconds(absl::Now() - start)});
          !p.ok()) {
        return p;
      }
    }
    const double rms =
        RelativeRoot(total.sums.error_squares, total.sums.reference_squares);
    const double wkv_rms = RelativeRoot(total.sums.wkv_error_squares,
                                        total.sums.wkv_reference_squares);
    // Checks against the report.
    if (JsonField(reported, "rows", int64_t{-1}) != t.rows) {
      return Mismatch(t.layer, "rows", JsonField(reported, "rows", -1.0),
                      static_cast<double>(t.rows));
    }
    const float reported_amax = JsonField(reported, "amax", -1.0f);
    if (reported_amax != total.amax) {
      return Mismatch(t.layer, "amax", reported_amax, total.amax);
    }
    if (JsonField(reported, "global_scale", -1.0f) != gs ||
        gs != formats::Nvfp4GlobalScale(total.amax)) {
      return Mismatch(t.layer, "global_scale",
                      JsonField(reported, "global_scale", -1.0), gs);
    }
    for (auto [name, value, tolerance] :
         {std::make_tuple("relative_rms", rms, kVerifyRawTolerance),
          std::make_tuple("wkv_relative_rms", wkv_rms, kVerifyWkvTolerance)}) {
      const double want = JsonField(reported, name, -1.0);
      if (!(std::fabs(want - value) <=
            tolerance * std::max(std::fabs(value), 1e-12))) {
        return Mismatch(t.layer, name, want, value);
      }
    }
    for (auto [name, value] :
         {std::make_pair("scale_underflows", total.sums.scale_underflows),
          std::make_pair("wkv_rows", total.sums.wkv_rows)}) {
      const int64_t want = JsonField(reported, name, int64_t{-1});
      if (want != value) {
        return Mismatch(t.layer, name, static_cast<double>(want),
                        static_cast<double>(value));
      }
    }
    result["tables"].push_back(
        {{"layer", t.layer},
         {"rows", t.rows},
         {"amax", total.amax},
         {"global_scale", gs},
         {"relative_rms", rms},
         {"wkv_relative_rms", wkv_rms},
         {"wkv_rows", total.sums.wkv_rows},
         {"scale_underflows", total.sums.scale_underflows}});
  }
  result["ok"] = true;
  return result;
}

}  // namespace mneme::quant
