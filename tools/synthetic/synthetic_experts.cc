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

namespace {

// Names of the tensors of routed expert `expert` of `prefix` (e.g.
// "layers.2" or "mtp.0"), weight w (1..3).
std::string ExpertTensorName(const std::string& prefix, int expert, int w,
                             const char* suffix) {
  return absl::StrCat(prefix, ".ffn.experts.", expert, ".w", w, ".", suffix);
}

// Root mean square of random e2m1 codes (uniform over the 16) times a
// uniform block exponent offset in [-2, 2]:
// sqrt(68.5 / 8 * (1/16 + 1/4 + 1 + 4 + 16) / 5).
constexpr double kRandomMxfp4Rms = 6.04;

}  // namespace

// Declarations of the MXFP4 routed experts of `prefix`.
void AddExpertDecls(const SyntheticCheckpointOptions& o,
                    const std::string& prefix,
                    std::vector<checkpoint::TensorDecl>& decls) {
  const int64_t hidden = o.hidden_size;
  const int64_t inter = o.moe_intermediate_size;
  for (int e = 0; e < o.num_routed_experts; ++e) {
    for (int w = 1; w <= 3; ++w) {
      const int64_t out = w == 2 ? hidden : inter;
      const int64_t in = w == 2 ? inter : hidden;
      decls.push_back({ExpertTensorName(prefix, e, w, "weight"),
                       checkpoint::DType::kU8,
                       {out, in / 2}});
      decls.push_back({ExpertTensorName(prefix, e, w, "scale"),
                       checkpoint::DType::kF8E8M0,
                       {out, in / 32}});
    }
  }
}

// The exponent code that gives random MXFP4 weights with `in` inputs an rms
// near 1 / sqrt(in), so that y = W x keeps the scale of a normalized x.
int UnitGainExponent(int64_t in) {
  const double want =
      1.0 / (kRandomMxfp4Rms * std::sqrt(static_cast<double>(in)));
  return std::clamp(127 + static_cast<int>(std::lround(std::log2(want))), 3,
                    251);
}

// Random e2m1 nibbles and UE8M0 block exponents within +-2 of a base that
// differs by weight (w3 one above w1, so w1/w3 sharing matters).
absl::Status WriteExperts(const SyntheticCheckpointOptions& o,
                          const std::string& prefix, int seed_layer,
                          const ExpertExponents& exponents,
                          checkpoint::SafetensorsWriter& writer) {
  const int64_t hidden = o.hidden_size;
  const int64_t inter = o.moe_intermediate_size;
  for (int e = 0; e < o.num_routed_experts; ++e) {
    for (int w = 1; w <= 3; ++w) {
      SplitMix mix(RowSeed(o.seed, seed_layer, -(100 + 4 * e + w)));
      const int64_t out = w == 2 ? hidden : inter;
      const int64_t in = w == 2 ? inter : hidden;
      std::vector<uint8_t> packed(out * in / 2);
      for (uint8_t& b : packed) b = static_cast<uint8_t>(mix.Next() & 0xFF);
      const int base = w == 1   ? exponents.w1
                       : w == 3 ? exponents.w3
                                : exponents.w2;
      std::vector<uint8_t> scales(out * in / 32);
      for (uint8_t& s : scales) {
        s = static_cast<uint8_t>(base + static_cast<int>(mix.Next() % 5) - 2);
      }
      RETURN_IF_ERROR(
          writer.Append(ExpertTensorName(prefix, e, w, "weight"), packed));
      RETURN_IF_ERROR(
          writer.Append(ExpertTensorName(prefix, e, w, "scale"), scales));
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::synthetic::synthetic_internal
