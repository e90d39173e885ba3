#ifndef MNEME_TOOLS_SYNTHETIC_RELEASE_CHECKPOINT_H_
#define MNEME_TOOLS_SYNTHETIC_RELEASE_CHECKPOINT_H_

// Synthetic checkpoints in the layouts of the released DeepSeek models:
// every tensor the release has, with its name, dtype, block size and shape
// relations, and config.json with the release's keys. Tiny models have
// random but healthy values; --full-shapes writes the release's exact config
// and shapes as sparse files (headers and index real, data left as holes).
//

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/row_format.h"

namespace mneme::synthetic {

enum class ReleaseArch {
  // DeepSeek-V4-Flash: model_type deepseek_v4, config keys at the top level,
  // FP8 128 x 128 blocks, hash-routed layers 0..2, one MTP block mtp.0.
  kV4Flash = 0,
  // DeepSeek-V4.1-Flash: model_type deepseek_v41, keys under text_config,
  // FP8 32 x 32 blocks, shared compressed KV (kv / index source layers),
  // Engram layers, three DSpark draft stages mtp.0..2, image_* and bias_vl.
  kV41Flash = 1,
  // DeepSeek-V4-Flash-0731: the V4-Flash architecture with three DSpark
  // draft stages (mtp.0..2) in place of the MTP block.
  kV4Flash0731 = 2,
};

// "v4-flash", "v4.1-flash", "v4-flash-0731"; InvalidArgument listing the
// choices otherwise.
absl::StatusOr<ReleaseArch> ParseReleaseArch(absl::string_view name);
// The inverse of ParseReleaseArch.
std::string ReleaseArchName(ReleaseArch arch);

// How the tiny models' routed and shared experts are stored.
enum class ExpertsFormat {
  // The release's: MXFP4 routed experts, FP8 shared experts.
  kMxfp4 = 0,
  // exllamav3's EXL3 (formats/exl3): every expert projection a trellis of
  // random bits (any bit pattern is a valid trellis) with fp16 input / output
  // scales sized for unit gain; the codebook cycles mcg / mul1 / 3inst and
  // the bits per weight 2..5 over the experts and projections. config.json's
  // quantization_config becomes exllamav3's, with the release's kept under
  // original_quantization_config.
  kExl3 = 1,
  // A GridBook / PrismaQuant artifact (formats/gridbook,
  // checkpoint/gridbook_artifact.h): the main layers' routed experts stacked
  // as NVFP4_CB_K16 (two-tier scales, the static W4A4 activation contract
  // with input_global_scale 128), the shared experts as FP8_CB_K36 with
  // per-row weight_scale, the attention projections and the draft stages'
  // experts kept as the release's FP8 / MXFP4 (source passthrough), random
  // codewords over random grid-valued tables; quant_config.json,
  // cb_codebooks.pqcb and the config.json pointer stub. The intermediate size
  // becomes 256 (down_proj's input must hold whole superblocks).
  kGridbook = 2,
};

// "mxfp4", "exl3", "gridbook"; InvalidArgument listing the choices
// otherwise.
absl::StatusOr<ExpertsFormat> ParseExpertsFormat(absl::string_view name);

struct ReleaseCheckpointOptions {
  // Directory to create; must not exist or be empty. Written under
  // OUT.partial and renamed at the end. Required.
  std::string out_dir;
  ReleaseArch arch = ReleaseArch::kV41Flash;
  // Seed of every value (tiny models only). Default 0.
  uint64_t seed = 0;
  // Write the release's exact config and shapes as sparse files (no data).
  bool full_shapes = false;
  // Tiny V4.1 only: start of the Engram prime search, as
  // SyntheticCheckpointOptions::engram_vocab_size; range [100, 2^31).
  int64_t engram_vocab_size = 1000;
  // Format of the tiny V4.1 Engram tables (as SyntheticCheckpointOptions:
  // an NVFP4 table is the round-to-nearest quantization of the FP8 table of
  // the same seed, with the global scale from its amax). Default kFp8.
  formats::RowFormat engram_format = formats::RowFormat::kFp8;
  // Threads generating the Engram tables; 0 = all cores. Range [0, 1024].
  int threads = 0;
  // Tiny V4.1 only: a model whose DSpark drafter agrees well with the
  // target, so that speculative decoding accepts many drafts (benchmarks,
  // demos). The embedding uses only the Markov rank's columns (with a
  // gain), the main layers' output projections are small (the target is
  // then close to a bigram model: head . norm(embed)), the last stage's
  // norm is ~0 and its Markov head is that bigram (markov embed = embed *
  // final norm, markov head = head, over those columns). Still the real
  // layout and a real forward pass; the drafts then follow the target's
  // bigram, and what the layers add decides the rejections.
  bool aligned_draft = false;
  // Tiny models only: the experts' storage. Default: kMxfp4.
  ExpertsFormat experts_format = ExpertsFormat::kMxfp4;
};

// Writes the checkpoint: config.json, tokenizer.json, tokenizer_config.json
// (the synthetic tokenizer of synthetic_tokenizer.h), the shards and
// model.safetensors.index.json. Shards as the release groups them: embed,
// one per main layer, the final norm / head (+ hc_head or image_*), one per
// MTP / DSpark stage, and for V4.1 one per Engram layer.
//
// Tiny models (docs/MODEL_LAYOUT.md, "Synthetic checkpoints of the released
// layouts"): vocab_size = the synthetic tokenizer's, hidden 256. Values are
// deterministic per seed: linear weights ~ N(0, 1 / fan_in) encoded as the
// release stores them (FP8 with UE8M0 block scales, MXFP4 experts), norms
// 1 + 0.05 N(0, 1), hyper-connection bases favouring the identity, head
// giving logits of std ~2, experts e = 3 (mod 8) with 4x larger w1 / w3 so
// the SwiGLU clamp is hit. The V4.1 Engram tables are those of
// MakeSyntheticCheckpoint for the same seed and engram_vocab_size.
//
// Full shapes: every shard is its real header followed by a hole of the
// data's size (ftruncate); nothing else is written, so it takes seconds.
//
// InvalidArgument for bad options, FailedPrecondition when out_dir exists
// and is not an empty directory, I/O errors otherwise.
absl::Status MakeReleaseCheckpoint(const ReleaseCheckpointOptions& options);

}  // namespace mneme::synthetic

#endif  // MNEME_TOOLS_SYNTHETIC_RELEASE_CHECKPOINT_H_
