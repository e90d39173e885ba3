#include "tools/quant/expert_caster.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "tools/quant/mxfp4_cast.h"
#include "tools/quant/output_dir.h"
#include "tools/quant/parallel.h"
#include "tools/quant/shard_file_writer.h"
#include "tools/quant/source_config.h"

namespace mneme::quant {
namespace {

namespace fs = std::filesystem;
using checkpoint::DType;

constexpr char kTool[] = "cast-experts";
constexpr int kGroupSize = 16;

// A routed expert weight of the source, checked.
struct ExpertWeight {
  std::string name;    // <P>.ffn.experts.<E>.w<i>.weight
  std::string base;    // <P>.ffn.experts.<E>.w<i>
  std::string expert;  // <P>.ffn.experts.<E>
  std::string layer;   // <P>
  int w = 0;
  checkpoint::TensorLocation weight;
  checkpoint::TensorLocation scale;
  int64_t out = 0;
  int64_t in = 0;
  std::string shard;
  int block_exponent = 0;  // k_max of this tensor alone
  int ws2_exponent = 0;
  float input_scale = 1.0f;
};

struct ExpertName {
  std::string base, expert, layer;
  int w = 0;
  std::string suffix;  // "weight", "scale", "weight_scale", ...
};

// Parses <P>.ffn.experts.<E>.w<1|2|3>.<suffix>.
std::optional<ExpertName> ParseExpertName(absl::string_view name) {
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  const size_t n = parts.size();
  if (n < 6) return std::nullopt;
  const absl::string_view w = parts[n - 2];
  if (parts[n - 5] != "ffn" || parts[n - 4] != "experts" ||
      parts[n - 3].empty() || w.size() != 2 || w[0] != 'w' || w[1] < '1' ||
      w[1] > '3') {
    return std::nullopt;
  }
  for (char c : parts[n - 3]) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  ExpertName e;
  e.layer = absl::StrJoin(parts.begin(), parts.begin() + (n - 5), ".");
  e.expert = absl::StrJoin(parts.begin(), parts.begin() + (n - 2), ".");
  e.base = absl::StrJoin(parts.begin(), parts.begin() + (n - 1), ".");
  e.w = w[1] - '0';
  e.suffix = std::string(parts[n - 1]);
  return e;
}

std::string Describe(const checkpoint::TensorLocation& t) {
  return absl::StrCat("safetensors file '", t.shard->path(), "', tensor ",
                      checkpoint::QuoteTensorName(t.info->name));
}

nlohmann::json StatsJson(const CastStats& s) {
  return {{"blocks", s.blocks},
          {"castable_blocks", s.castable_blocks},
          {"lossless_blocks", s.lossless_blocks},
          {"max_abs_error", s.max_abs_error}};
}

CastStats StatsFromJson(const nlohmann::json& j) {
  CastStats s;
  s.blocks = JsonFieldOr(j, "blocks", int64_t{0});
  s.castable_blocks = JsonFieldOr(j, "castable_blocks", int64_t{0});
  s.lossless_blocks = JsonFieldOr(j, "lossless_blocks", int64_t{0});
  s.max_abs_error = JsonFieldOr(j, "max_abs_error", 0.0);
  return s;
}

std::vector<uint8_t> FloatBytes(float value) {
  std::vector<uint8_t> bytes(4);
  std::memcpy(bytes.data(), &value, 4);  // Little-endian hosts only.
  return bytes;
}

absl::Status CheckOptions(const ExpertCastOptions& o) {
  if (o.input_scales == InputScales::kCalibrated &&
      o.calibration_path.empty()) {
    return absl::InvalidArgumentError(
        "--calibration FILE.json is required (activation input scales); pass "
        "--uncalibrated to write input_scale 1.0 instead");
  }
  if (o.input_scales == InputScales::kUncalibrated &&
      !o.calibration_path.empty()) {
    return absl::InvalidArgumentError(
        "--calibration and --uncalibrated exclude each other");
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError("threads must be >= 0");
  }
  if (o.max_listed_lossy_blocks < 0) {
    return absl::InvalidArgumentError("max_listed_lossy_blocks must be >= 0");
  }
  return absl::OkStatus();
}

// Finds and checks every routed expert weight.
absl::StatusOr<std::vector<ExpertWeight>> FindExperts(
    const checkpoint::ShardedCheckpoint& checkpoint) {
  for (const auto& [name, location] : checkpoint.tensors()) {
    std::optional<ExpertName> parsed = ParseExpertName(name);
    if (parsed.has_value() && (parsed->suffix == "weight_scale" ||
                               parsed->suffix == "weight_scale_2")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", checkpoint.dir(), "' already has NVFP4 experts (",
          name, "); nothing to cast"));
    }
  }
  std::vector<ExpertWeight> weights;
  for (const auto& [name, location] : checkpoint.tensors()) {
    std::optional<ExpertName> parsed = ParseExpertName(name);
    if (!parsed.has_value() || parsed->suffix != "weight") continue;
    ExpertWeight w;
    w.name = name;
    w.base = parsed->base;
    w.expert = parsed->expert;
    w.layer = parsed->layer;
    w.w = parsed->w;
    w.weight = location;
    w.shard = fs::path(location.shard->path()).filename().string();
    const checkpoint::TensorInfo& info = *location.info;
    if (info.dtype != DType::kU8 && info.dtype != DType::kI8) {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(location), ": is ", checkpoint::DTypeName(info.dtype),
          ", not MXFP4 (U8 bytes of two e2m1 values with an F8_E8M0 .scale)"));
    }
    ASSIGN_OR_RETURN(checkpoint::TensorLocation scale,
                     checkpoint.Find(absl::StrCat(w.base, ".scale")));
    w.scale = scale;
    if (scale.info->dtype != DType::kF8E8M0) {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(scale), ": is ", checkpoint::DTypeName(scale.info->dtype),
          ", not MXFP4 block scales (F8_E8M0)"));
    }
    if (info.shape.size() != 2 || info.shape[0] < 1 || info.shape[1] < 1 ||
        (2 * info.shape[1]) % kMxfp4Block != 0) {
      return absl::DataLossError(absl::StrCat(
          Describe(location), ": shape [", absl::StrJoin(info.shape, ", "),
          "] is not [out, in / 2] with in a multiple of 32"));
    }
    w.out = info.shape[0];
    w.in = 2 * info.shape[1];
    const std::vector<int64_t> want = {w.out, w.in / kMxfp4Block};
    if (scale.info->shape != want) {
      return absl::DataLossError(absl::StrCat(
          Describe(scale), ": shape [", absl::StrJoin(scale.info->shape, ", "),
          "] does not match ", checkpoint::QuoteTensorName(name), " [",
          absl::StrJoin(info.shape, ", "), "] (expected [",
          absl::StrJoin(want, ", "), "])"));
    }
    weights.push_back(std::move(w));
  }
  if (weights.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint '", checkpoint.dir(),
                     "' has no MXFP4 routed experts "
                     "(<layer>.ffn.experts.<E>.w1.weight ...)"));
  }
  return weights;
}

// Reads the calibration's input scales into `weights`; returns the number
// of entries that matched no expert weight.
absl::StatusOr<int64_t> ApplyCalibration(const std::string& path,
                                         std::vector<ExpertWeight>& weights) {
  absl::StatusOr<std::string> text = mneme::ReadSmallFile(path, 256u << 20);
  if (!text.ok()) return text.status();
  JsonParseOptions options;
  options.max_bytes = 256u << 20;
  options.reject_duplicate_keys = false;
  options.error_code = absl::StatusCode::kInvalidArgument;
  ASSIGN_OR_RETURN(
      const nlohmann::json json,
      ParseJsonDocument(*text, absl::StrCat("calibration '", path, "'"),
                        options));
  if (!json.is_object() || !json.contains("input_scale") ||
      !json["input_scale"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration '", path,
                     "' must be a JSON object with an \"input_scale\" object"));
  }
  const nlohmann::json& scales = json["input_scale"];
  std::set<std::string> used;
  for (ExpertWeight& w : weights) {
    auto it = scales.find(w.base);
    if (it == scales.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibration '", path, "' has no input_scale for '", w.base, "'"));
    }
    const double value = it->is_number() ? it->get<double>() : -1.0;
    const float f = static_cast<float>(value);
    if (!(f > 0.0f) || !std::isfinite(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration '", path, "': input_scale of '", w.base,
                       "' must be a finite positive number"));
    }
    w.input_scale = f;
    used.insert(w.base);
  }
  return static_cast<int64_t>(scales.size() - used.size());
}

// Block exponents: per tensor, then shared by w1 and w3 of each expert.
absl::Status ComputeScaleExponents(std::vector<ExpertWeight>& weights,
                                   int threads) {
  absl::Status status = ParallelFor(
      threads, static_cast<int64_t>(weights.size()), [&](int64_t i) {
        ExpertWeight& w = weights[i];
        ASSIGN_OR_RETURN(std::vector<uint8_t> scales,
                         w.scale.shard->ReadTensor(w.scale.info->name));
        absl::StatusOr<int> k = MaxBlockExponent(scales);
        if (!k.ok()) {
          return absl::Status(
              k.status().code(),
              absl::StrCat(Describe(w.scale), ": ", k.status().message()));
        }
        w.block_exponent = *k;
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  std::map<std::string, int> fused_max;  // expert -> k_max of w1 and w3
  for (const ExpertWeight& w : weights) {
    if (w.w == 2) continue;
    auto [it, inserted] = fused_max.emplace(w.expert, w.block_exponent);
    if (!inserted) it->second = std::max(it->second, w.block_exponent);
  }
  for (ExpertWeight& w : weights) {
    const int k_max = w.w == 2 ? w.block_exponent : fused_max.at(w.expert);
    w.ws2_exponent = WeightScale2Exponent(k_max);
  }
  return absl::OkStatus();
}

// The source config.json with the MoE quantization keys.
absl::StatusOr<std::string> CastConfigText(const std::string& source_dir) {
  return RewriteSourceConfig(source_dir, /*text_config_marker=*/"",
                             [](nlohmann::ordered_json& section) {
                               section["moe_quant_algo"] = "NVFP4";
                               section["moe_quant_group_size"] = kGroupSize;
                             });
}

nlohmann::json HfQuantConfig(const std::vector<ExpertWeight>& weights,
                             InputScales input_scales) {
  std::set<std::string> layers;
  for (const ExpertWeight& w : weights) {
    layers.insert(absl::StrCat(w.layer, ".ffn.experts.*"));
  }
  return {{"producer", {{"name", "mneme"}, {"version", "cast-experts 1"}}},
          {"quantization",
           {{"quant_algo", "NVFP4"},
            {"group_size", kGroupSize},
            {"kv_cache_quant_algo", nullptr},
            {"quantized_modules", layers},
            {"input_scales", input_scales == InputScales::kCalibrated
                                 ? "calibrated"
                                 : "uncalibrated"}}}};
}

// Declarations of a rewritten shard, in source file order.
std::vector<checkpoint::TensorDecl> ShardDecls(
    const checkpoint::SafetensorsReader& reader,
    const std::map<std::string, const ExpertWeight*>& by_weight,
    const std::set<std::string>& dropped) {
  std::vector<checkpoint::TensorDecl> decls;
  for (const checkpoint::TensorInfo* info :
       reader.header().TensorsInFileOrder()) {
    if (dropped.count(info->name) != 0) continue;
    auto it = by_weight.find(info->name);
    if (it == by_weight.end()) {
      decls.push_back({info->name, info->dtype, info->shape});
      continue;
    }
    const ExpertWeight& w = *it->second;
    decls.push_back({w.name, DType::kU8, {w.out, w.in / 2}});
    decls.push_back(
        {w.base + ".weight_scale", DType::kF8E4M3, {w.out, w.in / kGroupSize}});
    decls.push_back({w.base + ".weight_scale_2", DType::kF32, {}});
    decls.push_back({w.base + ".input_scale", DType::kF32, {}});
  }
  return decls;
}

struct WeightResult {
  CastStats stats;
  std::vector<LossyBlock> lossy;
};

absl::Status CastWeight(const ExpertWeight& w, const ShardFileWriter& writer,
                        size_t max_lossy, WeightResult* result) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> packed,
                   w.weight.shard->ReadTensor(w.name));
  ASSIGN_OR_RETURN(std::vector<uint8_t> scales,
                   w.scale.shard->ReadTensor(w.scale.info->name));
  std::vector<uint8_t> out_packed(packed.size());
  std::vector<uint8_t> out_scales(scales.size() * 2);
  if (absl::Status s = CastMxfp4Tensor(
          w.out, w.in, packed, scales, w.ws2_exponent,
          absl::MakeSpan(out_packed), absl::MakeSpan(out_scales),
          &result->stats, &result->lossy, max_lossy);
      !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(Describe(w.weight), ": ", s.message()));
  }
  for (auto [name, bytes] :
       {std::make_pair(w.name, out_packed),
        std::make_pair(w.base + ".weight_scale", out_scales),
        std::make_pair(w.base + ".weight_scale_2",
                       FloatBytes(std::ldexp(1.0f, w.ws2_exponent))),
        std::make_pair(w.base + ".input_scale", FloatBytes(w.input_scale))}) {
    if (absl::Status s = writer.Write(name, 0, bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<nlohmann::json> CastExpertsCheckpoint(
    const ExpertCastOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  RETURN_IF_ERROR(CheckOutputPaths(o.checkpoint_dir, o.out_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardedCheckpoint> checkpoint,
                   checkpoint::ShardedCheckpoint::Create(o.checkpoint_dir));
  ASSIGN_OR_RETURN(std::vector<ExpertWeight> weights, FindExperts(*checkpoint));
  int64_t unused_calibration = 0;
  if (o.input_scales == InputScales::kCalibrated) {
    ASSIGN_OR_RETURN(int64_t unused,
                     ApplyCalibration(o.calibration_path, weights));
    unused_calibration = unused;
  }
  RETURN_IF_ERROR(ComputeScaleExponents(weights, o.threads));

  std::error_code ec;
  const std::string canonical_source =
      fs::canonical(o.checkpoint_dir, ec).string();
  nlohmann::json input_scales = nlohmann::json::object();
  for (const ExpertWeight& w : weights) input_scales[w.base] = w.input_scale;
  const bool calibrated = o.input_scales == InputScales::kCalibrated;
  const nlohmann::json identity = {
      {"source", canonical_source},
      {"files", SourceFingerprint(o.checkpoint_dir)},
      {"calibrated", calibrated},
      {"input_scales", input_scales},
  };
  ASSIGN_OR_RETURN(std::unique_ptr<PartialOutputDir> out,
                   PartialOutputDir::Open({.source_dir = o.checkpoint_dir,
                                           .out_dir = o.out_dir,
                                           .tool = kTool,
                                           .identity = identity}));
  PartialOutputDir& dir = *out;
  nlohmann::json state = dir.state();
  if (!state["shards"].is_object()) state["shards"] = nlohmann::json::object();

  std::map<std::string, std::vector<const ExpertWeight*>> by_shard;
  std::map<std::string, const ExpertWeight*> by_weight;
  std::set<std::string> dropped;
  for (const ExpertWeight& w : weights) {
    by_shard[w.shard].push_back(&w);
    by_weight[w.name] = &w;
    dropped.insert(w.scale.info->name);
  }
  // A .scale in another shard than its weight is dropped there too.
  for (const ExpertWeight& w : weights) {
    by_shard.try_emplace(fs::path(w.scale.shard->path()).filename().string());
  }
  std::set<std::string> written = {std::string(checkpoint::kConfigFileName),
                                   kExpertReportFileName,
                                   kHfQuantConfigFileName};
  std::map<std::string, const checkpoint::SafetensorsReader*> readers;
  for (const auto& reader : checkpoint->shards()) {
    readers[fs::path(reader->path()).filename().string()] = reader.get();
  }
  int64_t done = 0;
  const int64_t total = static_cast<int64_t>(weights.size());
  for (const auto& [shard, shard_weights] : by_shard) {
    written.insert(shard);
    nlohmann::json& shard_state = state["shards"][shard];
    if (JsonFieldOr(shard_state, "done", false)) {
      done += static_cast<int64_t>(shard_weights.size());
      continue;
    }
    const checkpoint::SafetensorsReader& reader = *readers.at(shard);
    ASSIGN_OR_RETURN(
        std::unique_ptr<ShardFileWriter> writer,
        ShardFileWriter::Create(dir.PathOf(shard),
                                ShardDecls(reader, by_weight, dropped),
                                reader.metadata(), ShardOpenMode::kCreate));
    for (const checkpoint::TensorInfo& info : reader.tensors()) {
      if (by_weight.count(info.name) != 0 || dropped.count(info.name) != 0) {
        continue;
      }
      RETURN_IF_ERROR(writer->CopyTensor(reader, info.name, info.name));
    }
    std::vector<WeightResult> results(shard_weights.size());
    // Named, since clang before 16 cannot capture a structured binding.
    const std::vector<const ExpertWeight*>& to_cast = shard_weights;
    absl::Status status = ParallelFor(
        o.threads, static_cast<int64_t>(to_cast.size()), [&](int64_t i) {
          return CastWeight(*to_cast[i], *writer,
                            static_cast<size_t>(o.max_listed_lossy_blocks),
                            &results[i]);
        });
    if (!status.ok()) return status;
    RETURN_IF_ERROR(writer->Close());
    nlohmann::json layers = nlohmann::json::object();
    nlohmann::json lossy = nlohmann::json::array();
    for (size_t i = 0; i < shard_weights.size(); ++i) {
      const ExpertWeight& w = *shard_weights[i];
      CastStats layer = StatsFromJson(layers[w.layer]);
      layer.Add(results[i].stats);
      layers[w.layer] = StatsJson(layer);
      for (const LossyBlock& b : results[i].lossy) {
        lossy.push_back({{"tensor", w.name},
                         {"row", b.row},
                         {"block", b.block},
                         {"exponent", b.exponent},
                         {"power", b.power},
                         {"weight_scale_2_exponent", w.ws2_exponent},
                         {"max_abs_error", b.max_abs_error}});
      }
    }
    shard_state = {{"done", true}, {"layers", layers}, {"lossy", lossy}};
    RETURN_IF_ERROR(dir.SaveState(state));
    done += static_cast<int64_t>(shard_weights.size());
    if (o.progress) {
      RETURN_IF_ERROR(o.progress(done, total));
    }
  }

  // Index, config, quant config, report.
  const std::optional<checkpoint::CheckpointIndex>& index = checkpoint->index();
  if (index.has_value()) {
    checkpoint::CheckpointIndex new_index = *index;
    uint64_t total_size = 0;
    for (const auto& [name, location] : checkpoint->tensors()) {
      if (dropped.count(name) != 0) {
        new_index.weight_map.erase(name);
        continue;
      }
      total_size += location.info->byte_length;
    }
    for (const ExpertWeight& w : weights) {
      new_index.weight_map[w.base + ".weight_scale"] = w.shard;
      new_index.weight_map[w.base + ".weight_scale_2"] = w.shard;
      new_index.weight_map[w.base + ".input_scale"] = w.shard;
      total_size += static_cast<uint64_t>(w.out * w.in / kGroupSize) + 8;
    }
    new_index.total_size = total_size;
    RETURN_IF_ERROR(checkpoint::WriteCheckpointIndex(
        dir.PathOf(checkpoint::kIndexFileName), new_index));
    written.insert(std::string(checkpoint::kIndexFileName));
  }
  ASSIGN_OR_RETURN(std::string config, CastConfigText(o.checkpoint_dir));
  RETURN_IF_ERROR(dir.WriteFile(checkpoint::kConfigFileName, config));
  RETURN_IF_ERROR(dir.WriteFile(
      kHfQuantConfigFileName,
      JsonDump(HfQuantConfig(weights, o.input_scales), 2) + "\n"));

  std::map<std::string, CastStats> layers;
  std::map<std::string, std::set<std::string>> experts;
  std::map<std::string, int64_t> layer_weights;
  for (const ExpertWeight& w : weights) {
    experts[w.layer].insert(w.expert);
    ++layer_weights[w.layer];
  }
  nlohmann::json lossy = nlohmann::json::array();
  for (const auto& [shard, shard_state] : state["shards"].items()) {
    if (!shard_state.is_object()) continue;
    const auto shard_layers = shard_state.find("layers");
    if (shard_layers != shard_state.end() && shard_layers->is_object()) {
      for (const auto& [layer, stats] : shard_layers->items()) {
        layers[layer].Add(StatsFromJson(stats));
      }
    }
    const auto shard_lossy = shard_state.find("lossy");
    if (shard_lossy == shard_state.end() || !shard_lossy->is_array()) continue;
    for (const nlohmann::json& b : *shard_lossy) {
      if (lossy.size() < static_cast<size_t>(o.max_listed_lossy_blocks)) {
        lossy.push_back(b);
      }
    }
  }
  CastStats all;
  nlohmann::json layer_reports = nlohmann::json::array();
  for (const auto& [layer, stats] : layers) {
    all.Add(stats);
    nlohmann::json entry = StatsJson(stats);
    entry["layer"] = layer;
    entry["experts"] = experts[layer].size();
    entry["weights"] = layer_weights[layer];
    layer_reports.push_back(std::move(entry));
  }
  nlohmann::json report = {
      {"tool", "mneme cast-experts"},
      {"source", canonical_source},
      {"source_format", "MXFP4 (e2m1, UE8M0 per 32)"},
      {"target_format", "NVFP4 (e2m1, e4m3 per 16, fp32 weight_scale_2)"},
      {"input_scales", calibrated ? "calibrated" : "uncalibrated"},
      {"calibration", calibrated ? nlohmann::json(o.calibration_path)
                                 : nlohmann::json(nullptr)},
      {"calibration_entries_unused", unused_calibration},
      {"resumed", dir.resumed()},
      {"expert_weights", weights.size()},
      {"blocks", all.blocks},
      {"castable_blocks", all.castable_blocks},
      {"lossless_blocks", all.lossless_blocks},
      {"max_abs_error", all.max_abs_error},
      {"layers", layer_reports},
      {"lossy_blocks", lossy},
  };
  RETURN_IF_ERROR(
      dir.WriteFile(kExpertReportFileName, JsonDump(report, 2) + "\n"));
  RETURN_IF_ERROR(dir.LinkSourceFiles(written));
  RETURN_IF_ERROR(dir.Commit());
  return report;
}

}  // namespace mneme::quant
