#ifndef MNEME_TOOLS_SYNTHETIC_SYNTHETIC_INTERNAL_H_
#define MNEME_TOOLS_SYNTHETIC_SYNTHETIC_INTERNAL_H_

// Internal to the synthetic_checkpoint library: the pieces of
// MakeSyntheticCheckpoint (synthetic_checkpoint.cc) by what they generate:
// option checks (synthetic_validate.cc), the Engram layers' tensors
// (synthetic_engram_tensors.cc), the MXFP4 routed experts
// (synthetic_experts.cc) and the rest of a full model
// (synthetic_model_tensors.cc).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/safetensors_writer.h"
#include "formats/block_pack/fp8_block.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::synthetic::synthetic_internal {

inline constexpr int kMaxNgramSize = 4;
inline constexpr int kHeads = 8;
inline constexpr int kColumns = (kMaxNgramSize - 1) * kHeads;
// hc_eps of the full model's config.json.
inline constexpr double kHcEps = 1e-6;
// Rows generated per task.
inline constexpr int64_t kRowsPerTask = 4096;
// Side of the square blocks that share one UE8M0 scale in FP8 matrices.
inline constexpr int64_t kFp8Block = formats::kFp8MatrixBlock;

// splitmix64: a well-mixed 64-bit stream from any seed.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float Uniform() { return static_cast<float>(Next() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

// The seed of row `row` of layer `layer` (negative rows seed the layer's
// other tensors).
inline uint64_t RowSeed(uint64_t seed, int layer, int64_t row) {
  SplitMix mix(seed ^ (static_cast<uint64_t>(layer) << 56));
  return mix.Next() ^ (static_cast<uint64_t>(row) * 0xD1B54A32D192ED03ULL);
}

// InvalidArgument naming the first option out of range.
absl::Status Validate(const SyntheticCheckpointOptions& o);

// Writes embed.weight and embed.scale of the Engram table of `layer` (the
// `layer_index`-th table, `rows` rows) to `writer`, on o.threads threads.
absl::Status WriteTable(const SyntheticCheckpointOptions& o, int layer,
                        int layer_index, int64_t rows, float global_scale,
                        checkpoint::SafetensorsWriter& writer);

// wkv.weight / wkv.scale of the Engram layer `layer` ([out_dim, 6144] FP8):
// independent random codes, or correlated inputs (WkvKind::kCorrelated).
absl::Status WriteWkv(const SyntheticCheckpointOptions& o, int layer,
                      int64_t out_dim, checkpoint::SafetensorsWriter& writer);
absl::Status WriteCorrelatedWkv(const SyntheticCheckpointOptions& o, int layer,
                                int64_t out_dim,
                                checkpoint::SafetensorsWriter& writer);

// A BF16 tensor of `count` values near 1 drawn from `seed`.
absl::Status WriteBf16(const std::string& name, int64_t count, uint64_t seed,
                       checkpoint::SafetensorsWriter& writer);

// Declarations of the MXFP4 routed experts of `prefix` (e.g. "layers.2").
void AddExpertDecls(const SyntheticCheckpointOptions& o,
                    const std::string& prefix,
                    std::vector<checkpoint::TensorDecl>& decls);

// The UE8M0 exponent codes around which the block scales of w1, w2 and w3
// of the routed experts are drawn.
struct ExpertExponents {
  int w1 = 0;
  int w2 = 0;
  int w3 = 0;
};

// The experts of the Engram-only checkpoints: near 2^-7 (w3 one above w1).
inline constexpr ExpertExponents kEngramOnlyExpertExponents = {
    .w1 = 120, .w2 = 119, .w3 = 121};

// The exponent code that gives random MXFP4 weights with `in` inputs an rms
// near 1 / sqrt(in), so that y = W x keeps the scale of a normalized x.
int UnitGainExponent(int64_t in);

// Random e2m1 nibbles and UE8M0 block exponents within +-2 of a base that
// differs by weight (w3 one above w1, so w1/w3 sharing matters).
absl::Status WriteExperts(const SyntheticCheckpointOptions& o,
                          const std::string& prefix, int seed_layer,
                          const ExpertExponents& exponents,
                          checkpoint::SafetensorsWriter& writer);

// "model-00001-of-00003.safetensors" for index 0 of 3.
std::string ShardName(int index, int count);

}  // namespace mneme::synthetic::synthetic_internal

#endif  // MNEME_TOOLS_SYNTHETIC_SYNTHETIC_INTERNAL_H_
