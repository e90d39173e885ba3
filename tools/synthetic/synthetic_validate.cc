#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/engram_table.h"
#include "checkpoint/safetensors_writer.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/primes.h"
#include "formats/bf16.h"
#include "formats/block_pack/fp8_block.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "formats/ue8m0.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/synthetic_checkpoint.h"
#include "tools/synthetic/synthetic_internal.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic::synthetic_internal {

using formats::RowFormat;

namespace {}  // namespace

absl::Status Validate(const SyntheticCheckpointOptions& o) {
  if (o.out_dir.empty()) {
    return absl::InvalidArgumentError("--out is required");
  }
  if (o.engram_format != RowFormat::kFp8 &&
      o.engram_format != RowFormat::kNvfp4) {
    return absl::InvalidArgumentError("engram_format must be fp8 or nvfp4");
  }
  if (o.engram_vocab_size < 100 || o.engram_vocab_size >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram_vocab_size=", o.engram_vocab_size, " must be in [100, 2^31)"));
  }
  if (o.engram_layer_ids.empty()) {
    return absl::InvalidArgumentError("engram_layer_ids must not be empty");
  }
  for (size_t i = 0; i < o.engram_layer_ids.size(); ++i) {
    const int id = o.engram_layer_ids[i];
    if (id < 0 || id >= o.num_hidden_layers ||
        (i > 0 && id <= o.engram_layer_ids[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "engram_layer_ids must ascend within [0, num_hidden_layers=",
          o.num_hidden_layers, ")"));
    }
  }
  if (o.hidden_size <= 0 || o.hidden_size % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden_size=", o.hidden_size, " must be a positive multiple of 32"));
  }
  if (o.hc_mult < 1) return absl::InvalidArgumentError("hc_mult must be >= 1");
  if (o.threads < 0) return absl::InvalidArgumentError("threads must be >= 0");
  for (size_t i = 0; i < o.expert_layer_ids.size(); ++i) {
    const int id = o.expert_layer_ids[i];
    if (id < 0 || id >= o.num_hidden_layers ||
        (i > 0 && id <= o.expert_layer_ids[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert_layer_ids must ascend within [0, num_hidden_layers=",
          o.num_hidden_layers, ")"));
    }
  }
  if (o.draft_stages < 0) {
    return absl::InvalidArgumentError("draft_stages must be >= 0");
  }
  if (o.num_routed_experts < 1) {
    return absl::InvalidArgumentError("num_routed_experts must be >= 1");
  }
  if (o.moe_intermediate_size <= 0 || o.moe_intermediate_size % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe_intermediate_size=", o.moe_intermediate_size,
                     " must be a positive multiple of 32"));
  }
  if (o.wkv_kind != WkvKind::kIndependent &&
      o.wkv_kind != WkvKind::kCorrelated) {
    return absl::InvalidArgumentError("unknown wkv_kind");
  }
  return absl::OkStatus();
}

}  // namespace mneme::synthetic::synthetic_internal
