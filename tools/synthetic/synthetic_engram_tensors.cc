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

// Encodes rows [first, first + count) of one table into `weights`/`scales`.
absl::Status EncodeRows(const SyntheticCheckpointOptions& o, int layer,
                        int layer_index, float global_scale, int64_t first,
                        int64_t count, uint8_t* weights, uint8_t* scales) {
  const RowFormat format = o.engram_format;
  const size_t wb = formats::RowWeightBytes(format);
  const size_t sb = formats::RowScaleBytes(format);
  std::vector<float> values(formats::kRowDim);
  std::vector<uint8_t> fp8(formats::RowBytes(RowFormat::kFp8));
  const formats::RowDecodeOptions fp8_decode{.format = RowFormat::kFp8};
  (void)layer_index;
  for (int64_t i = 0; i < count; ++i) {
    SyntheticRowValues(o.seed, layer, first + i, absl::MakeSpan(values));
    absl::Span<uint8_t> w(weights + i * wb, wb);
    absl::Span<uint8_t> s(scales + i * sb, sb);
    if (format == RowFormat::kFp8) {
      RETURN_IF_ERROR(formats::EncodeFp8Row(values, w, s));
      continue;
    }
    // NVFP4 tables are made from the FP8 table, as the real variant is.
    RETURN_IF_ERROR(formats::EncodeFp8Row(values, absl::MakeSpan(fp8)));
    RETURN_IF_ERROR(
        formats::DecodeRowsF32(fp8_decode, fp8, absl::MakeSpan(values)));
    RETURN_IF_ERROR(formats::EncodeNvfp4Row(values, global_scale, w, s));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTable(const SyntheticCheckpointOptions& o, int layer,
                        int layer_index, int64_t rows, float global_scale,
                        checkpoint::SafetensorsWriter& writer) {
  const size_t wb = formats::RowWeightBytes(o.engram_format);
  const size_t sb = formats::RowScaleBytes(o.engram_format);
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1u, std::thread::hardware_concurrency());
  const int64_t batch_rows = kRowsPerTask * threads;
  std::vector<uint8_t> weights(batch_rows * wb);
  std::vector<uint8_t> scales(batch_rows * sb);
  const std::string weight_name = checkpoint::EngramWeightTensorName(layer);
  const std::string scale_name = checkpoint::EngramScaleTensorName(layer);
  const absl::Time start = absl::Now();
  absl::Time last_report = start;
  for (int64_t first = 0; first < rows; first += batch_rows) {
    const int64_t count = std::min(batch_rows, rows - first);
    std::vector<absl::Status> results(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      const int64_t begin = t * kRowsPerTask;
      if (begin >= count) break;
      const int64_t n = std::min(kRowsPerTask, count - begin);
      pool.emplace_back([&, t, begin, n] {
        results[t] =
            EncodeRows(o, layer, layer_index, global_scale, first + begin, n,
                       weights.data() + begin * wb, scales.data() + begin * sb);
      });
    }
    for (std::thread& t : pool) t.join();
    for (const absl::Status& st : results) {
      if (!st.ok()) return st;
    }
    RETURN_IF_ERROR(writer.Append(
        weight_name, absl::MakeConstSpan(weights.data(), count * wb)));
    RETURN_IF_ERROR(writer.Append(
        scale_name, absl::MakeConstSpan(scales.data(), count * sb)));
    if (rows > o.progress_min_rows &&
        absl::Now() - last_report > absl::Seconds(2)) {
      last_report = absl::Now();
      const double done = static_cast<double>(first + count);
      const double secs = absl::ToDoubleSeconds(last_report - start);
      std::fprintf(stderr, "\rlayer %d: %.0f / %lld rows (%.0f rows/s)", layer,
                   done, static_cast<long long>(rows), done / secs);
    }
  }
  if (rows > o.progress_min_rows) std::fprintf(stderr, "\n");
  return absl::OkStatus();
}

// wkv.weight: FP8 e4m3 [5 * hidden, 6144] with UE8M0 scales per 32 x 32.
absl::Status WriteWkv(const SyntheticCheckpointOptions& o, int layer,
                      int64_t out_dim, checkpoint::SafetensorsWriter& writer) {
  const int64_t in_dim = int64_t{kColumns} * formats::kRowDim;
  SplitMix mix(RowSeed(o.seed, layer, -1));
  std::vector<uint8_t> row(in_dim);
  const std::string prefix = absl::StrCat("layers.", layer, ".engram.wkv.");
  for (int64_t r = 0; r < out_dim; ++r) {
    for (int64_t c = 0; c < in_dim; ++c) {
      // Roughly N(0, 1)-sized e4m3 codes: sum of uniforms.
      const float v =
          (mix.Uniform() + mix.Uniform() + mix.Uniform() - 1.5f) * 2.0f;
      row[c] = formats::FloatToE4m3(v);
    }
    RETURN_IF_ERROR(writer.Append(prefix + "weight", row));
  }
  // Scale 2^-7 (code 120) with some spread, so wkv x has unit-ish outputs.
  std::vector<uint8_t> scales((out_dim / 32) * (in_dim / 32));
  for (uint8_t& s : scales) s = static_cast<uint8_t>(118 + (mix.Next() % 4));
  return writer.Append(prefix + "scale", scales);
}

// wkv.weight with correlated inputs (WkvKind::kCorrelated): bands of 32
// rows are generated in fp32, then encoded with one UE8M0 scale per 32 x 32
// block from the block's amax.
absl::Status WriteCorrelatedWkv(const SyntheticCheckpointOptions& o, int layer,
                                int64_t out_dim,
                                checkpoint::SafetensorsWriter& writer) {
  constexpr float kRho = 0.5f;
  const float innovation = std::sqrt(1.0f - kRho * kRho);
  const int64_t in_dim = int64_t{kColumns} * formats::kRowDim;
  SplitMix mix(RowSeed(o.seed, layer, -4));
  // Per-input scale in [0.5, 2), fixed for the layer.
  std::vector<float> input_scale(in_dim);
  for (float& s : input_scale) s = 0.5f + 1.5f * mix.Uniform();
  const std::string prefix = absl::StrCat("layers.", layer, ".engram.wkv.");
  std::vector<uint8_t> scales;
  std::vector<float> band;
  std::vector<uint8_t> codes;
  for (int64_t first = 0; first < out_dim; first += kFp8Block) {
    const int64_t rows = std::min(kFp8Block, out_dim - first);
    band.assign(rows * in_dim, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float a = 0.0f;
      for (int64_t c = 0; c < in_dim; ++c) {
        const float z =
            (mix.Uniform() + mix.Uniform() + mix.Uniform() - 1.5f) * 2.0f;
        a = c % formats::kRowDim == 0 ? z : kRho * a + innovation * z;
        band[r * in_dim + c] = input_scale[c] * a;
      }
    }
    codes.resize(rows * in_dim);
    formats::EncodeFp8BlockMatrix(band, in_dim, absl::MakeSpan(codes), &scales);
    RETURN_IF_ERROR(writer.Append(prefix + "weight", codes));
  }
  return writer.Append(prefix + "scale", scales);
}

absl::Status WriteBf16(const std::string& name, int64_t count, uint64_t seed,
                       checkpoint::SafetensorsWriter& writer) {
  SplitMix mix(seed);
  std::vector<uint8_t> bytes(count * 2);
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t v =
        formats::FloatToBf16(1.0f + (mix.Uniform() - 0.5f) * 0.2f);
    bytes[2 * i] = static_cast<uint8_t>(v & 0xFF);
    bytes[2 * i + 1] = static_cast<uint8_t>(v >> 8);
  }
  return writer.Append(name, bytes);
}

}  // namespace mneme::synthetic::synthetic_internal
