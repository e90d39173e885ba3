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
#include "tools/quant/engram_quantizer.h"
#include "tools/quant/engram_source.h"
#include "tools/quant/output_dir.h"
#include "tools/quant/parallel.h"
#include "tools/quant/shard_file_writer.h"
#include "tools/quant/source_config.h"
#include "tools/quant/wkv_hessian.h"

namespace mneme::quant {
namespace {

using engram_internal::kBlocksPerRow;
using engram_internal::kFp8Scale;
using engram_internal::kFp8Weight;
using engram_internal::kN;
using engram_internal::kNvScale;
using engram_internal::kNvWeight;
using engram_internal::kScanTaskRows;
using engram_internal::Notify;
using engram_internal::OpenSource;
using engram_internal::ReadJsonFile;
using engram_internal::ReadRows;
using engram_internal::RelativeRoot;
using engram_internal::Source;
using engram_internal::SplitStep;
using engram_internal::TableJob;
using engram_internal::Task;
using formats::RowFormat;

// Relative tolerances of VerifyEngramCheckpoint: the raw error sums the
// same fp32 values in another order; the error through wkv is fp32 products
// in the conversion and double ones in the verification.
constexpr double kVerifyRawTolerance = 1e-9;
constexpr double kVerifyWkvTolerance = 1e-4;

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
  ASSIGN_OR_RETURN(Source source, OpenSource(o.checkpoint_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<engram::EngramCheckpoint> output,
                   engram::EngramCheckpoint::Open(o.out_dir));
  if (output->config().format != RowFormat::kNvfp4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verify: the Engram tables of '", o.out_dir, "' are not NVFP4"));
  }
  ASSIGN_OR_RETURN(
      nlohmann::json report,
      ReadJsonFile(absl::StrCat(o.out_dir, "/", kEngramReportFileName)));
  const nlohmann::json tables = report.is_object() && report.contains("tables")
                                    ? report["tables"]
                                    : nlohmann::json();
  if (!tables.is_array() || tables.size() != source.tables.size()) {
    return absl::DataLossError(absl::StrCat("verify: the report of '",
                                            o.out_dir, "' does not list ",
                                            source.tables.size(), " tables"));
  }
  nlohmann::json result = {{"tables", nlohmann::json::array()}};
  for (size_t ti = 0; ti < source.tables.size(); ++ti) {
    const TableJob& t = source.tables[ti];
    const nlohmann::json& reported = tables[ti];
    if (JsonFieldOr(reported, "layer", -1) != t.layer) {
      return absl::DataLossError(
          absl::StrCat("verify: report table ", ti, " is not layer ", t.layer));
    }
    ASSIGN_OR_RETURN(const checkpoint::EngramTableLocation* out_table,
                     output->Table(t.layer));
    const float gs = out_table->global_scale;
    const checkpoint::TensorLocation out_w = *output->checkpoint().FindOrNull(
        checkpoint::EngramWeightTensorName(t.layer));
    const checkpoint::TensorLocation out_s = *output->checkpoint().FindOrNull(
        checkpoint::EngramScaleTensorName(t.layer));
    ASSIGN_OR_RETURN(WkvTensors wkv, LocateWkv(output->checkpoint(), t.layer,
                                               output->config().NumColumns()));
    ASSIGN_OR_RETURN(std::vector<std::vector<double>> hessians,
                     ComputeWkvHessians(wkv, o.threads));
    const int64_t stride =
        JsonFieldOr(reported, "wkv_sample_stride", int64_t{1});
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
        RETURN_IF_ERROR(ReadRows(*loc, bytes, first, n, buffer));
      }
      const std::vector<Task> tasks = SplitStep(t, first, n, kScanTaskRows);
      std::vector<Recomputed> parts(tasks.size());
      absl::Status status = ParallelFor(
          o.threads, static_cast<int64_t>(tasks.size()),
          [&](int64_t ti2) -> absl::Status {
            const Task& task = tasks[ti2];
            const int64_t a = task.first, k = task.count;
            std::vector<float> x(k * kN), q(k * kN);
            RETURN_IF_ERROR(formats::DecodeRowsF32(
                {.format = RowFormat::kFp8},
                absl::MakeConstSpan(src_w.data() + a * kFp8Weight,
                                    k * kFp8Weight),
                absl::MakeConstSpan(src_s.data() + a * kFp8Scale,
                                    k * kFp8Scale),
                absl::MakeSpan(x)));
            RETURN_IF_ERROR(formats::DecodeRowsF32(
                {.format = RowFormat::kNvfp4, .global_scale = gs},
                absl::MakeConstSpan(nv_w.data() + a * kNvWeight, k * kNvWeight),
                absl::MakeConstSpan(nv_s.data() + a * kNvScale, k * kNvScale),
                absl::MakeSpan(q)));
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
                  nonzero |= x[r * kN + int64_t{b} * kBlock + j] != 0.0f;
                }
                const float step_value =
                    formats::E4m3ToFloat(nv_s[(a + r) * kNvScale + b]) * gs;
                if (nonzero && step_value == 0.0f) ++part.sums.scale_underflows;
              }
              if ((first + a + r) % stride == 0) {
                const std::vector<double>& h = hessians[task.column];
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
      RETURN_IF_ERROR(Notify(
          o.progress, {.layer = t.layer,
                       .phase = EngramProgress::Phase::kVerify,
                       .rows_done = first + n,
                       .rows_total = t.rows,
                       .rows_this_run = first + n,
                       .seconds = absl::ToDoubleSeconds(absl::Now() - start)}));
    }
    const double rms =
        RelativeRoot(total.sums.error_squares, total.sums.reference_squares);
    const double wkv_rms = RelativeRoot(total.sums.wkv_error_squares,
                                        total.sums.wkv_reference_squares);
    // Checks against the report.
    if (JsonFieldOr(reported, "rows", int64_t{-1}) != t.rows) {
      return Mismatch(t.layer, "rows", JsonFieldOr(reported, "rows", -1.0),
                      static_cast<double>(t.rows));
    }
    const float reported_amax = JsonFieldOr(reported, "amax", -1.0f);
    if (reported_amax != total.amax) {
      return Mismatch(t.layer, "amax", reported_amax, total.amax);
    }
    if (JsonFieldOr(reported, "global_scale", -1.0f) != gs ||
        gs != formats::Nvfp4GlobalScale(total.amax)) {
      return Mismatch(t.layer, "global_scale",
                      JsonFieldOr(reported, "global_scale", -1.0), gs);
    }
    for (auto [name, value, tolerance] :
         {std::make_tuple("relative_rms", rms, kVerifyRawTolerance),
          std::make_tuple("wkv_relative_rms", wkv_rms, kVerifyWkvTolerance)}) {
      const double want = JsonFieldOr(reported, name, -1.0);
      if (!(std::fabs(want - value) <=
            tolerance * std::max(std::fabs(value), 1e-12))) {
        return Mismatch(t.layer, name, want, value);
      }
    }
    for (auto [name, value] :
         {std::make_pair("scale_underflows", total.sums.scale_underflows),
          std::make_pair("wkv_rows", total.sums.wkv_rows)}) {
      const int64_t want = JsonFieldOr(reported, name, int64_t{-1});
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
