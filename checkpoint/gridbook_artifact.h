#ifndef MNEME_CHECKPOINT_GRIDBOOK_ARTIFACT_H_
#define MNEME_CHECKPOINT_GRIDBOOK_ARTIFACT_H_

// A GridBook / PrismaQuant artifact's quantization plan: which modules are
// codebook-quantized (config groups of quant_config.json, the codebook
// sidecar cb_codebooks.pqcb), which keep the source's FP8 / MXFP4 bytes
// (source_passthrough) or BF16 (ignore), and where each model Linear's bytes
// are. docs/FORMATS_EXL3_GRIDBOOK.md section 2; gridbook's SPEC.md is the
// authority.
//
// What is refused, with the group or module named (InvalidArgument unless
// said otherwise): an unknown quant_method, format, grid, mode or
// scale_coding kind; a type_size that does not match the scheme; a
// codebook_ref that names no sidecar table or a table of the wrong shape or
// non-finite values (DataLoss); provenance.codebook_sha256 that does not
// cover the sidecar exactly or a digest that does not match (DataLoss);
// per_expert_format_groups and dspark_target_bridge (not served); a
// source_passthrough version or wire id other than version 1's, or a unit
// that is also a codebook target; per-role expert books that disagree on
// the scheme or the activation contract, or a role claimed twice or missing.
//
// Module names are the checkpoint's (layers.N.attn.wq_a,
// layers.N.ffn.shared_experts.w1, layers.N.ffn.experts.E.w1); targets and
// units may also use the Transformers spelling (model.layers.N.self_attn.*,
// mlp.*, gate_proj / up_proj / down_proj), which is mapped to it. Targets
// are exact module names (as in gridbook); routed experts are claimed by
// `<experts>.gate_up_proj` (w1 the first half of its rows, w3 the second),
// per role by `<experts>.gate_proj` / `up_proj` (FP8 rungs only, as
// gridbook), and `<experts>.down_proj` (w2).
//
// Thread-safe: immutable after Open().

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/gridbook/gridbook.h"
#include "nlohmann/json.hpp"

namespace mneme::checkpoint {

// One codebook config group.
struct GridbookGroup {
  std::string name;
  // The format name, e.g. "NVFP4_CB_K16".
  std::string format;
  formats::gridbook::Scheme scheme;
  // activation_contract "nvfp4_w4a4": activations take the static NVFP4
  // contract with each target's input_global_scale. Otherwise weight-only.
  bool w4a4 = false;
};

// Where a model Linear's codebook weight is.
struct GridbookPlacement {
  const GridbookGroup* group = nullptr;
  // The physical tensors' prefix: `<tensor>.cb_qweight`,
  // `<tensor>.weight_scale` (fp8 schemes), `<tensor>.input_global_scale`
  // (W4A4).
  std::string tensor;
  // Stacked routed experts: the expert (dim 0 of the physical tensors) and
  // which rows of its matrix are this module's: kAll, or the first / second
  // half (gate_up_proj holds w1's rows, then w3's).
  int64_t expert = -1;
  enum class Rows { kAll, kFirstHalf, kSecondHalf };
  Rows rows = Rows::kAll;
  std::shared_ptr<const formats::gridbook::Codebooks> books;
};

class GridbookArtifact {
 public:
  // The artifact of checkpoint `dir` when config.json's
  // quantization_config names GridBook (quant_method "gridbook" or
  // "prismaquant", pointing at a config file or inline); null otherwise.
  static absl::StatusOr<std::unique_ptr<GridbookArtifact>> Open(
      const std::string& dir);

  // The codebook placement of module `name`; nullopt when it is not a
  // codebook target (it is then stored as the source's or BF16).
  std::optional<GridbookPlacement> Find(absl::string_view name) const;

  const std::vector<std::unique_ptr<GridbookGroup>>& groups() const {
    return groups_;
  }
  // source_passthrough units (checkpoint spelling) -> wire id.
  const std::map<std::string, std::string>& passthrough() const {
    return passthrough_;
  }

 private:
  GridbookArtifact() = default;

  // execution_contracts.nvfp4_w4a4, when present: every fp4 group carries
  // the contract, the record is the static contract, and the checkpoint's
  // input_global_scale tensors are exactly its targets with values matching
  // target_values_sha256 (DataLoss otherwise).
  static absl::Status CheckActivationContract(const std::string& dir,
                                              const nlohmann::json& quant,
                                              const GridbookArtifact& artifact);

  struct Target {
    const GridbookGroup* group = nullptr;
    std::shared_ptr<const formats::gridbook::Codebooks> books;
  };

  std::vector<std::unique_ptr<GridbookGroup>> groups_;
  // Canonical target -> group and books.
  std::map<std::string, Target> targets_;
  std::map<std::string, std::string> passthrough_;
};

// execution_contracts.nvfp4_w4a4.target_values_sha256 of `targets` (name,
// input_global_scale): SHA-256 over the <I-length-prefixed v1 schema literal
// and `policy`, then per target (sorted by name) its prefixed name and <f
// value (gridbook nvfp4_activation_contract.py), lower-case hex.
std::string GridbookContractDigest(
    absl::string_view policy,
    std::vector<std::pair<std::string, float>> targets);

// A module or target name in the checkpoint's spelling: "model." dropped,
// self_attn -> attn, mlp -> ffn, shared_experts' gate_proj / up_proj /
// down_proj -> w1 / w3 / w2.
std::string CheckpointSpelling(absl::string_view name);

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_GRIDBOOK_ARTIFACT_H_
