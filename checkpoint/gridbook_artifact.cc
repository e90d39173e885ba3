#include "checkpoint/gridbook_artifact.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "formats/fp16.h"

namespace mneme::checkpoint {
namespace {

namespace gb = formats::gridbook;
using nlohmann::json;

constexpr uint64_t kMaxConfigBytes = uint64_t{64} << 20;
constexpr char kDefaultCodebookFile[] = "cb_codebooks.pqcb";

// The wire ids of source_passthrough version 1 Mneme serves.
constexpr const char* kPassthroughWires[] = {"fp8_e4m3_ue8m0_block128",
                                             "mxfp4_e2m1_ue8m0_g32"};

absl::Status Invalid(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("GridBook artifact: ", where, ": ", what));
}

// A file name inside the checkpoint directory (no separators, not . or ..).
absl::StatusOr<std::string> LocalFile(const std::string& dir, const json& value,
                                      absl::string_view key) {
  if (!value.is_string()) return Invalid(key, "must be a file name");
  const std::string name = value.get<std::string>();
  if (name.empty() || name == "." || name == ".." ||
      name.find('/') != std::string::npos) {
    return Invalid(
        key,
        absl::StrCat("\"", name, "\" is not a file name in the checkpoint"));
  }
  return dir + "/" + name;
}

absl::StatusOr<json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text,
                   ReadSmallFile(path, kMaxConfigBytes));
  return ParseJsonDocument(text, absl::StrCat("'", path, "'"));
}

// The scheme of a codebook group, from its scheme's own fields (gridbook
// reads grid, k, n_sub and type_size; signed mode is n_sub 1 on fp4; the
// format name, when given, must agree).
absl::StatusOr<GridbookGroup> ParseGroup(const std::string& name,
                                         const json& group) {
  const std::string where = absl::StrCat("config group \"", name, "\"");
  GridbookGroup out;
  out.name = name;
  const json& scheme = group["scheme"];
  if (!scheme.is_object()) return Invalid(where, "scheme is not an object");
  const auto required_int = [&](const char* key) -> absl::StatusOr<int> {
    const auto it = scheme.find(key);
    const std::optional<int64_t> value =
        it == scheme.end() ? std::nullopt : JsonToIntInRange(*it, 1, 1 << 16);
    if (!value) {
      return Invalid(
          where, absl::StrCat("scheme.", key, " must be a positive integer"));
    }
    return static_cast<int>(*value);
  };
  const std::string grid = JsonFieldOr(scheme, "grid", std::string());
  if (grid != "fp4" && grid != "fp8") {
    return Invalid(
        where, absl::StrCat("scheme.grid \"", grid, "\" is not fp4 or fp8"));
  }
  gb::Scheme& s = out.scheme;
  s.grid = grid == "fp4" ? gb::Grid::kFp4 : gb::Grid::kFp8;
  ASSIGN_OR_RETURN(s.k, required_int("k"));
  ASSIGN_OR_RETURN(s.n_sub, required_int("n_sub"));
  ASSIGN_OR_RETURN(const int type_size, required_int("type_size"));
  s.mode = s.grid == gb::Grid::kFp4 && s.n_sub == 1 ? gb::Mode::kSigned
                                                    : gb::Mode::kProduct;
  if (const std::string mode = JsonFieldOr(scheme, "mode", std::string());
      !mode.empty() &&
      mode != (s.mode == gb::Mode::kSigned ? "signed" : "product")) {
    return Invalid(where,
                   absl::StrCat("scheme.mode \"", mode,
                                "\" is not served with n_sub ", s.n_sub));
  }
  // Scale coding (fp4): absent or null = v1; {"kind": "two_tier", ...} or
  // the bare string "two_tier" = v2 with its table (default T4_2oct8m) and
  // gridbook's fixed exponent bias 127; another kind is refused (SPEC
  // section 8; gridbook itself would fall back to v1).
  s.scale_coding = s.grid == gb::Grid::kFp4 ? gb::ScaleCoding::kE4m3
                                            : gb::ScaleCoding::kNone;
  s.two_tier_table = gb::DefaultTwoTierTable();
  if (const auto it = scheme.find("scale_coding");
      it != scheme.end() && !it->is_null()) {
    if (s.grid == gb::Grid::kFp8) {
      return Invalid(where, "scale_coding is fp4-only");
    }
    std::string kind;
    if (it->is_string()) {
      kind = it->get<std::string>();
    } else if (it->is_object()) {
      kind = JsonFieldOr(*it, "kind", std::string());
      if (const auto t = it->find("table"); t != it->end()) {
        if (!t->is_array() || t->size() != 16) {
          return Invalid(where, "scale_coding.table must hold 16 numbers");
        }
        for (size_t i = 0; i < 16; ++i) {
          if (!(*t)[i].is_number()) {
            return Invalid(where, "scale_coding.table must hold 16 numbers");
          }
          s.two_tier_table[i] = (*t)[i].get<float>();
        }
      }
    } else {
      return Invalid(where, "scale_coding must be an object or a string");
    }
    if (kind != "two_tier") {
      return Invalid(where, absl::StrCat("unknown scale_coding kind \"", kind,
                                         "\" (two_tier, or none for v1)"));
    }
    s.scale_coding = gb::ScaleCoding::kTwoTier;
  }
  if (absl::Status status = gb::ValidateScheme(s); !status.ok()) {
    return Invalid(where, status.message());
  }
  if (type_size != gb::TypeSize(s)) {
    return Invalid(where, absl::StrCat("scheme.type_size ", type_size,
                                       " does not match the scheme's ",
                                       gb::TypeSize(s), " bytes"));
  }
  // The format name is informational in gridbook; when given it must agree.
  out.format = JsonFieldOr(group, "format", std::string());
  if (!out.format.empty()) {
    absl::StatusOr<gb::Scheme> named =
        gb::SchemeForFormat(out.format, s.scale_coding);
    if (!named.ok() || named->grid != s.grid || named->k != s.k ||
        named->n_sub != s.n_sub) {
      return Invalid(where, absl::StrCat("format \"", out.format,
                                         "\" does not match its scheme"));
    }
  } else {
    out.format =
        absl::StrCat(s.grid == gb::Grid::kFp4 ? "NVFP4_CB_" : "FP8_CB_",
                     s.mode == gb::Mode::kSigned ? "S" : "K", s.k);
  }
  if (const auto it = scheme.find("activation_contract");
      it != scheme.end() && !it->is_null()) {
    if (*it != "nvfp4_w4a4" || s.grid != gb::Grid::kFp4) {
      return Invalid(where, absl::StrCat("activation_contract ", it->dump(),
                                         " is not served (nvfp4_w4a4 on fp4)"));
    }
    out.w4a4 = true;
  }
  return out;
}

// The names of a group's tables, in sub-table order.
absl::StatusOr<std::vector<std::string>> CodebookNames(const std::string& where,
                                                       const json& scheme,
                                                       const gb::Scheme& s) {
  const json* ref =
      scheme.contains("codebook_ref") ? &scheme["codebook_ref"] : nullptr;
  std::vector<std::string> names;
  if (ref != nullptr && ref->is_string()) {
    names.push_back(ref->get<std::string>());
  } else if (ref != nullptr && ref->is_array()) {
    for (const json& n : *ref) {
      if (!n.is_string())
        return Invalid(where, "codebook_ref holds a non-string");
      names.push_back(n.get<std::string>());
    }
  } else {
    return Invalid(where, "has no codebook_ref");
  }
  if (static_cast<int>(names.size()) != s.n_sub) {
    return Invalid(where, absl::StrCat("codebook_ref names ", names.size(),
                                       " tables; the scheme has ", s.n_sub));
  }
  return names;
}

// Reads and checks a group's tables from the sidecar.
absl::StatusOr<std::shared_ptr<const gb::Codebooks>> ReadBooks(
    const std::string& where, const SafetensorsReader& sidecar,
    const std::vector<std::string>& names, const gb::Scheme& scheme) {
  auto books = std::make_shared<gb::Codebooks>();
  for (int sub = 0; sub < scheme.n_sub; ++sub) {
    const std::string& name = names[sub];
    const TensorInfo* info = sidecar.FindOrNull(name);
    if (info == nullptr) {
      return Invalid(where, absl::StrCat("codebook_ref \"", name,
                                         "\" is not a table of the sidecar"));
    }
    const std::vector<int64_t> shape = {gb::SubTableRows(scheme, sub),
                                        gb::SubTableColumns(scheme)};
    if (info->dtype != DType::kF16 || info->shape != shape) {
      return Invalid(where, absl::StrCat("table \"", name, "\" is ",
                                         DTypeName(info->dtype), " [",
                                         absl::StrJoin(info->shape, ", "),
                                         "], the scheme needs F16 [", shape[0],
                                         ", ", shape[1], "]"));
    }
    ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes,
                     sidecar.ReadTensor(name));
    for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
      const uint16_t half =
          static_cast<uint16_t>(bytes[i] | (uint16_t{bytes[i + 1]} << 8));
      books->tables[sub].push_back(formats::Fp16ToFloat(half));
    }
  }
  if (absl::Status status = gb::ValidateCodebooks(scheme, *books);
      !status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("GridBook artifact: ", where, ": ", status.message()));
  }
  return std::shared_ptr<const gb::Codebooks>(std::move(books));
}

// provenance.codebook_sha256 covers the sidecar's tables exactly and every
// digest matches (DataLoss otherwise).
absl::Status CheckDigests(const json& digests,
                          const SafetensorsReader& sidecar) {
  if (!digests.is_object() || digests.empty()) {
    return Invalid("provenance.codebook_sha256",
                   "must be an object naming every sidecar table");
  }
  std::set<std::string> tables;
  for (const TensorInfo& t : sidecar.tensors()) tables.insert(t.name);
  std::set<std::string> covered;
  for (const auto& [name, digest] : digests.items()) covered.insert(name);
  if (covered != tables) {
    return absl::DataLossError(
        absl::StrCat("GridBook artifact: provenance.codebook_sha256 names {",
                     absl::StrJoin(covered, ", "), "} but the sidecar holds {",
                     absl::StrJoin(tables, ", "), "}"));
  }
  for (const auto& [name, digest] : digests.items()) {
    ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes,
                     sidecar.ReadTensor(name));
    if (!digest.is_string() || Sha256Hex(bytes) != digest.get<std::string>()) {
      return absl::DataLossError(absl::StrCat(
          "GridBook artifact: codebook table \"", name,
          "\" does not match its provenance.codebook_sha256 digest"));
    }
  }
  return absl::OkStatus();
}

// "<prefix>.experts.<E>.w<1|2|3>" split into its parts.
bool SplitExpert(absl::string_view name, std::string* prefix, int64_t* expert,
                 std::string* projection) {
  const size_t last = name.rfind('.');
  if (last == absl::string_view::npos) return false;
  const absl::string_view proj = name.substr(last + 1);
  if (proj != "w1" && proj != "w2" && proj != "w3") return false;
  const absl::string_view head = name.substr(0, last);
  const size_t dot = head.rfind('.');
  if (dot == absl::string_view::npos) return false;
  if (!absl::SimpleAtoi(head.substr(dot + 1), expert)) return false;
  const absl::string_view experts = head.substr(0, dot);
  if (!absl::EndsWith(experts, ".experts")) return false;
  *prefix = std::string(experts);
  *projection = std::string(proj);
  return true;
}

}  // namespace

std::string GridbookContractDigest(
    absl::string_view policy,
    std::vector<std::pair<std::string, float>> targets) {
  std::sort(targets.begin(), targets.end());
  Sha256 hash;
  const auto prefixed = [&hash](absl::string_view text) {
    const auto length = static_cast<uint32_t>(text.size());
    const uint8_t bytes[4] = {
        static_cast<uint8_t>(length), static_cast<uint8_t>(length >> 8),
        static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 24)};
    hash.Update(absl::MakeConstSpan(bytes, 4));
    hash.Update(text);
  };
  prefixed("prismaquant.nvfp4_w4a4_activation.v1");
  prefixed(policy);
  for (const auto& [name, value] : targets) {
    prefixed(name);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const uint8_t bytes[4] = {
        static_cast<uint8_t>(bits), static_cast<uint8_t>(bits >> 8),
        static_cast<uint8_t>(bits >> 16), static_cast<uint8_t>(bits >> 24)};
    hash.Update(absl::MakeConstSpan(bytes, 4));
  }
  return DigestHex(hash.Finish());
}

std::string CheckpointSpelling(absl::string_view name) {
  std::string out(name);
  for (const char* prefix :
       {"model.language_model.", "language_model.", "model."}) {
    if (absl::StartsWith(out, prefix)) {
      out = out.substr(std::strlen(prefix));
      break;
    }
  }
  std::vector<std::string> parts = absl::StrSplit(out, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "self_attn") parts[i] = "attn";
    if (parts[i] == "mlp") parts[i] = "ffn";
    if (i > 0 && parts[i - 1] == "shared_experts") {
      if (parts[i] == "gate_proj") parts[i] = "w1";
      if (parts[i] == "up_proj") parts[i] = "w3";
      if (parts[i] == "down_proj") parts[i] = "w2";
    }
  }
  return absl::StrJoin(parts, ".");
}

absl::StatusOr<std::unique_ptr<GridbookArtifact>> GridbookArtifact::Open(
    const std::string& dir) {
  ASSIGN_OR_RETURN(const json config, ReadJsonFile(dir + "/config.json"));
  const json* qc = nullptr;
  if (config.contains("quantization_config")) {
    qc = &config["quantization_config"];
  } else if (config.contains("text_config") &&
             config["text_config"].is_object() &&
             config["text_config"].contains("quantization_config")) {
    qc = &config["text_config"]["quantization_config"];
  }
  if (qc == nullptr || !qc->is_object()) return nullptr;
  const std::string method = JsonFieldOr(*qc, "quant_method", std::string());
  if (method != "gridbook" && method != "prismaquant") return nullptr;

  // The pointer stub names the config and the sidecar; the inline form is
  // the config itself.
  json quant;
  if (qc->contains("config_file")) {
    ASSIGN_OR_RETURN(const std::string path,
                     LocalFile(dir, (*qc)["config_file"], "config_file"));
    ASSIGN_OR_RETURN(quant, ReadJsonFile(path));
  } else if (qc->contains("config_groups")) {
    quant = *qc;
  } else {
    return Invalid("quantization_config",
                   "has neither config_file nor config_groups");
  }
  if (!quant.is_object()) return Invalid("quant_config", "is not an object");
  std::string codebook_path = dir + "/" + kDefaultCodebookFile;
  if (qc->contains("codebook_file")) {
    ASSIGN_OR_RETURN(codebook_path,
                     LocalFile(dir, (*qc)["codebook_file"], "codebook_file"));
  }
  for (const char* refused :
       {"per_expert_format_groups", "dspark_target_bridge"}) {
    if (quant.contains(refused) && !quant[refused].is_null() &&
        !quant[refused].empty()) {
      return Invalid(refused, "is not served");
    }
  }
  if (!quant.contains("config_groups") || !quant["config_groups"].is_object()) {
    return Invalid("quant_config", "has no config_groups object");
  }

  auto artifact = std::unique_ptr<GridbookArtifact>(new GridbookArtifact());
  std::unique_ptr<SafetensorsReader> sidecar;
  for (const auto& [name, group] : quant["config_groups"].items()) {
    if (!group.is_object()) {
      return Invalid(absl::StrCat("config group \"", name, "\""),
                     "is not an object");
    }
    if (!group.contains("scheme")) {
      const bool passthrough =
          JsonFieldOr(group, "format", std::string()) == "source-passthrough" ||
          (group.contains("weights") &&
           JsonFieldOr(group["weights"], "source_passthrough", false));
      if (passthrough) continue;  // Metadata of the passthrough units.
      return Invalid(absl::StrCat("config group \"", name, "\""),
                     "is a compressed-tensors group without a codebook "
                     "scheme (not served)");
    }
    ASSIGN_OR_RETURN(GridbookGroup parsed, ParseGroup(name, group));
    const std::string where = absl::StrCat("config group \"", name, "\"");
    if (sidecar == nullptr) {
      absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
          SafetensorsReader::Create(codebook_path);
      if (!reader.ok()) {
        return absl::Status(
            reader.status().code(),
            absl::StrCat("GridBook artifact: codebook sidecar: ",
                         reader.status().message()));
      }
      sidecar = *std::move(reader);
    }
    ASSIGN_OR_RETURN(const std::vector<std::string> names,
                     CodebookNames(where, group["scheme"], parsed.scheme));
    ASSIGN_OR_RETURN(std::shared_ptr<const gb::Codebooks> books,
                     ReadBooks(where, *sidecar, names, parsed.scheme));
    if (!group.contains("targets") || !group["targets"].is_array() ||
        group["targets"].empty()) {
      return Invalid(where, "has no targets");
    }
    artifact->groups_.push_back(
        std::make_unique<GridbookGroup>(std::move(parsed)));
    const GridbookGroup* stored = artifact->groups_.back().get();
    for (const json& target : group["targets"]) {
      if (!target.is_string()) return Invalid(where, "has a non-string target");
      const std::string canonical =
          CheckpointSpelling(target.get<std::string>());
      if (!artifact->targets_.emplace(canonical, Target{stored, books})
               .second) {
        return Invalid(where, absl::StrCat("target \"", canonical,
                                           "\" is claimed by two groups"));
      }
    }
  }
  // Per-role expert books: both roles or neither, not with the fused target,
  // and the same scheme and contract for both.
  for (const auto& [target, entry] : artifact->targets_) {
    if (!absl::EndsWith(target, ".experts.gate_proj") &&
        !absl::EndsWith(target, ".experts.up_proj")) {
      continue;
    }
    const std::string experts = target.substr(0, target.rfind('.'));
    const auto gate = artifact->targets_.find(experts + ".gate_proj");
    const auto up = artifact->targets_.find(experts + ".up_proj");
    if (gate == artifact->targets_.end() || up == artifact->targets_.end()) {
      return Invalid(experts, "has one of the gate_proj / up_proj roles only");
    }
    if (artifact->targets_.contains(experts + ".gate_up_proj")) {
      return Invalid(experts, "claims gate_up_proj both fused and per role");
    }
    const GridbookGroup& g = *gate->second.group;
    const GridbookGroup& u = *up->second.group;
    if (g.scheme.grid != gb::Grid::kFp8 || g.scheme.n_sub != 4) {
      // gridbook decodes per-role routed books for FP8 rungs only.
      return Invalid(experts,
                     "per-role gate_proj / up_proj books on an fp4 scheme");
    }
    if (g.scheme.grid != u.scheme.grid || g.scheme.mode != u.scheme.mode ||
        g.scheme.k != u.scheme.k || g.scheme.n_sub != u.scheme.n_sub ||
        g.scheme.scale_coding != u.scheme.scale_coding || g.w4a4 != u.w4a4) {
      return Invalid(experts,
                     "the gate_proj and up_proj roles disagree on the scheme "
                     "or the activation contract");
    }
  }
  if (const auto it = quant.find("provenance"); it != quant.end()) {
    if (!it->is_object()) return Invalid("provenance", "must be an object");
  }
  if (const auto it = quant.find("provenance");
      it != quant.end() && it->contains("codebook_sha256")) {
    if (sidecar == nullptr) {
      ASSIGN_OR_RETURN(sidecar, SafetensorsReader::Create(codebook_path));
    }
    RETURN_IF_ERROR(CheckDigests((*it)["codebook_sha256"], *sidecar));
  }
  if (const auto it = quant.find("source_passthrough");
      it != quant.end() && !it->is_null()) {
    if (!it->is_object() || JsonFieldOr(*it, "version", int64_t{0}) != 1 ||
        !it->contains("units") || !(*it)["units"].is_object() ||
        (*it)["units"].empty()) {
      return Invalid("source_passthrough",
                     "must be {\"version\": 1, \"units\": {...}}");
    }
    for (const auto& [unit, wire] : (*it)["units"].items()) {
      const std::string canonical = CheckpointSpelling(unit);
      bool known = false;
      for (const char* w : kPassthroughWires) known |= wire == w;
      if (!known) {
        return Invalid(
            absl::StrCat("source_passthrough unit \"", unit, "\""),
            absl::StrCat("wire id ", wire.dump(), " is not served (",
                         absl::StrJoin(kPassthroughWires, ", "), ")"));
      }
      bool claimed = artifact->targets_.contains(canonical);
      for (const auto& [target, entry] : artifact->targets_) {
        claimed |= absl::StartsWith(target, canonical + ".");
      }
      if (claimed) {
        return Invalid(absl::StrCat("source_passthrough unit \"", unit, "\""),
                       "is also a codebook target");
      }
      const auto [at, added] =
          artifact->passthrough_.emplace(canonical, wire.get<std::string>());
      if (!added && at->second != wire.get<std::string>()) {
        return Invalid(absl::StrCat("source_passthrough unit \"", unit, "\""),
                       "is declared twice with different wire ids");
      }
    }
  }
  RETURN_IF_ERROR(CheckActivationContract(dir, quant, *artifact));
  return artifact;
}

absl::Status GridbookArtifact::CheckActivationContract(
    const std::string& dir, const json& quant,
    const GridbookArtifact& artifact) {
  const json* record = nullptr;
  if (const auto it = quant.find("execution_contracts");
      it != quant.end() && it->is_object() && it->contains("nvfp4_w4a4")) {
    record = &(*it)["nvfp4_w4a4"];
  }
  if (record == nullptr) return absl::OkStatus();
  const char* where = "execution_contracts.nvfp4_w4a4";
  for (const auto& group : artifact.groups_) {
    if (group->scheme.grid == gb::Grid::kFp4 && !group->w4a4) {
      return Invalid(where, absl::StrCat("fp4 config group \"", group->name,
                                         "\" does not carry the contract"));
    }
  }
  const std::string schema = JsonFieldOr(*record, "schema", std::string());
  if (schema != "prismaquant.nvfp4_w4a4_activation.v1" &&
      schema != "prismaquant.nvfp4_w4a4_activation.v2") {
    return Invalid(where, absl::StrCat("unknown schema \"", schema, "\""));
  }
  if (JsonFieldOr(*record, "contract", std::string()) !=
          "e2m1_group16_ue4m3_static" ||
      JsonFieldOr(*record, "group_size", int64_t{0}) != 16 ||
      JsonFieldOr(*record, "tensor_suffix", std::string()) !=
          "input_global_scale" ||
      JsonFieldOr(*record, "value_dtype", std::string()) != "float32") {
    return Invalid(where,
                   "is not the e2m1_group16_ue4m3_static contract with float32 "
                   "input_global_scale tensors per 16 values");
  }
  const std::string policy =
      JsonFieldOr(*record, "input_global_scale_policy", std::string());
  if (!record->contains("target_names") ||
      !(*record)["target_names"].is_array()) {
    return Invalid(where, "has no target_names");
  }
  std::vector<std::string> names;
  for (const json& n : (*record)["target_names"]) {
    if (!n.is_string())
      return Invalid(where, "target_names holds a non-string");
    names.push_back(n.get<std::string>());
  }
  if (!std::is_sorted(names.begin(), names.end()) ||
      std::adjacent_find(names.begin(), names.end()) != names.end() ||
      JsonFieldOr(*record, "target_count", int64_t{-1}) !=
          static_cast<int64_t>(names.size())) {
    return Invalid(where,
                   "target_names must be sorted, unique and target_count long");
  }
  // The scale tensors present are exactly the record's targets, and their
  // values hash to target_values_sha256: SHA-256 over the <I-length-prefixed
  // v1 schema literal and the policy, then per target its prefixed name and
  // <f value (nvfp4_activation_contract.py).
  ASSIGN_OR_RETURN(std::unique_ptr<ShardedCheckpoint> ckpt,
                   ShardedCheckpoint::Create(dir));
  std::vector<std::string> present;
  constexpr absl::string_view kSuffix = ".input_global_scale";
  for (const std::string& tensor : ckpt->TensorNames()) {
    if (absl::EndsWith(tensor, kSuffix)) {
      present.push_back(tensor.substr(0, tensor.size() - kSuffix.size()));
    }
  }
  if (present != names) {
    return absl::DataLossError(absl::StrCat(
        "GridBook artifact: ", where, " names {", absl::StrJoin(names, ", "),
        "} but the checkpoint's input_global_scale tensors are {",
        absl::StrJoin(present, ", "), "}"));
  }
  std::vector<std::pair<std::string, float>> values;
  for (const std::string& name : names) {
    const std::string tensor = absl::StrCat(name, kSuffix);
    ASSIGN_OR_RETURN(const TensorSpec spec, ckpt->GetTensorSpec(tensor));
    if (spec.dtype != DType::kF32 || spec.byte_length != 4) {
      return Invalid(tensor, "must be F32 [1]");
    }
    ASSIGN_OR_RETURN(const std::vector<uint8_t> value,
                     ckpt->ReadTensorBytes(tensor));
    float scale;
    std::memcpy(&scale, value.data(), 4);
    if (!std::isfinite(scale) || scale <= 0.0f) {
      return absl::DataLossError(absl::StrCat(
          "GridBook artifact: ", tensor, " is not a positive finite scale"));
    }
    values.emplace_back(name, scale);
  }
  const std::string hex = GridbookContractDigest(policy, std::move(values));
  if (JsonFieldOr(*record, "target_values_sha256", std::string()) != hex) {
    return absl::DataLossError(absl::StrCat(
        "GridBook artifact: ", where,
        ".target_values_sha256 does not match the input_global_scale values"));
  }
  return absl::OkStatus();
}

std::optional<GridbookPlacement> GridbookArtifact::Find(
    absl::string_view name) const {
  const std::string canonical = CheckpointSpelling(name);
  std::string experts;
  int64_t expert = 0;
  std::string projection;
  if (SplitExpert(canonical, &experts, &expert, &projection)) {
    GridbookPlacement p;
    p.expert = expert;
    const char* role = projection == "w1"   ? ".gate_proj"
                       : projection == "w3" ? ".up_proj"
                                            : ".down_proj";
    const std::string physical =
        experts + (projection == "w2" ? ".down_proj" : ".gate_up_proj");
    p.tensor = physical;
    p.rows = projection == "w1"   ? GridbookPlacement::Rows::kFirstHalf
             : projection == "w3" ? GridbookPlacement::Rows::kSecondHalf
                                  : GridbookPlacement::Rows::kAll;
    auto it = targets_.find(experts + role);
    if (it == targets_.end()) it = targets_.find(physical);
    if (it == targets_.end()) return std::nullopt;
    p.group = it->second.group;
    p.books = it->second.books;
    return p;
  }
  // Dense: targets are exact module names.
  const auto it = targets_.find(canonical);
  if (it == targets_.end()) return std::nullopt;
  return GridbookPlacement{.group = it->second.group,
                           .tensor = canonical,
                           .expert = -1,
                           .rows = GridbookPlacement::Rows::kAll,
                           .books = it->second.books};
}

}  // namespace mneme::checkpoint
