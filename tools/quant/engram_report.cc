#include <cmath>

#include "common/json.h"
#include "nlohmann/json.hpp"
#include "tools/quant/engram_quantizer.h"
#include "tools/quant/engram_source.h"

namespace mneme::quant {

using engram_internal::RelativeRoot;

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
  s.rows = JsonFieldOr(json, "rows", int64_t{0});
  s.blocks = JsonFieldOr(json, "blocks", int64_t{0});
  s.error_squares = JsonFieldOr(json, "error_squares", 0.0);
  s.reference_squares = JsonFieldOr(json, "reference_squares", 0.0);
  s.wkv_rows = JsonFieldOr(json, "wkv_rows", int64_t{0});
  s.wkv_error_squares = JsonFieldOr(json, "wkv_error_squares", 0.0);
  s.wkv_reference_squares = JsonFieldOr(json, "wkv_reference_squares", 0.0);
  s.scale_underflows = JsonFieldOr(json, "scale_underflows", int64_t{0});
  s.smaller_scale_blocks =
      JsonFieldOr(json, "smaller_scale_blocks", int64_t{0});
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

}  // namespace mneme::quant
