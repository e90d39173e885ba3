#ifndef MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_MANIFEST_H_
#define MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_MANIFEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/hashing/column_split.h"
#include "engram_store/hashing/hash_layout.h"
#include "formats/row_format.h"

namespace mneme::engram {

// A sparse local copy of Engram tables is a directory holding, per Engram
// layer, one data file with the raw rows (weight bytes then scale bytes,
// RowBytes(format) each) of exactly the row ranges some tensor-parallel
// rank(s) serve, packed in ascending row order, and a manifest
// (kLocalCopyManifestFileName, JSON) describing them. The manifest is written
// last and atomically: a directory without one is an unfinished copy and is
// never served. This header holds the manifest's data model, its JSON form
// and the pure functions that plan a copy and check a manifest against what
// a store expects; local_copy_writer.h makes copies, local_copy.h reads them.

inline constexpr char kLocalCopyManifestFileName[] = "manifest.json";
// Progress of an unfinished copy (see local_copy_writer.h).
inline constexpr char kLocalCopyJournalFileName[] = "localize.journal";
// Version of the directory layout and manifest; a reader refuses others.
inline constexpr int kLocalCopyFormatVersion = 1;
// The "kind" value that marks a manifest as one of ours.
inline constexpr char kLocalCopyManifestKind[] = "mneme-engram-local-copy";

// "engram_layer_<layer>.rows": the data file of one layer.
std::string LocalCopyDataFileName(int layer);

// One checkpoint shard holding Engram table tensors, as stat() saw it. The
// file name (not the directory) is recorded so that a checkpoint reached
// under another mount point still matches.
struct SourceShardIdentity {
  // File name inside the checkpoint directory.
  std::string file;
  uint64_t size_bytes = 0;
  // Modification time in nanoseconds since the epoch.
  int64_t mtime_ns = 0;

  bool operator==(const SourceShardIdentity&) const = default;
};

// What a copy was made from: the Engram config keys that decide which rows
// exist and what they hold, and the shards holding the tables. Rewriting or
// replacing a shard changes its size or mtime, so a copy of the old tables is
// then refused instead of serving stale rows (an in-place rewrite keeping
// both is not noticed; the contents are not hashed, which would mean reading
// ~200 GB at every start).
struct SourceIdentity {
  std::vector<int> layer_ids;
  std::vector<int64_t> num_embeddings;
  int max_ngram_size = 0;
  int n_heads = 0;
  int head_dim = 0;
  int64_t vocab_size = 0;
  formats::RowFormat format = formats::RowFormat::kUnspecified;
  // engram_quant_block_size; recorded for NVFP4 only (0 for FP8).
  int quant_block_size = 0;
  // NVFP4 global scales by layer id; empty for FP8.
  std::map<int, float> global_scales;
  // The distinct shards of every table's weight and scale tensors, sorted by
  // file name.
  std::vector<SourceShardIdentity> shards;
};

// The identity of `checkpoint` now (stats its Engram shards). NotFound if a
// shard disappeared, errno-derived codes if it cannot be stat'ed.
absl::StatusOr<SourceIdentity> IdentifySource(
    const EngramCheckpoint& checkpoint);

// A description of the first difference between the identity a copy was made
// from and `current` ("shard model-00002-of-00002.safetensors: size 631 bytes
// in the manifest, 640 now"); nullopt when they are equal.
std::optional<std::string> DescribeSourceMismatch(
    const SourceIdentity& recorded, const SourceIdentity& current);

// Which rows a copy holds: the union of the rows that ranks `ranks` of a
// `tp_size`-way tensor-parallel group serve with column split `split`.
struct LocalCopyTarget {
  // Tensor-parallel size. Default: 1.
  int tp_size = 1;
  // The ranks, ascending and distinct, each in [0, tp_size) (usually one: a
  // node's rank). Required.
  std::vector<int> ranks;
  // How ranks share the hash columns. Default: kStrided.
  ColumnSplit split = ColumnSplit::kStrided;

  bool operator==(const LocalCopyTarget&) const = default;
};

// "tp 4, rank 1, strided split" (or "ranks 0,1").
std::string DescribeTarget(const LocalCopyTarget& target);

// InvalidArgument naming the field unless tp_size >= 1, ranks is non-empty,
// ascending, distinct and within [0, tp_size), and split is specified.
absl::Status ValidateTarget(const LocalCopyTarget& target);

// Per layer of `layout` (same order), the rows `target` covers: the union of
// its ranks' column ranges, coalesced (sorted, disjoint, non-touching).
// Errors as ValidateTarget() and AssignRank().
absl::StatusOr<std::vector<std::vector<RowRange>>> TargetRowRanges(
    const HashLayout& layout, const LocalCopyTarget& target);

// Rows [first_row, first_row + count) of a layer's table, stored at byte
// `offset` of the layer's data file.
struct LocalCopyRange {
  int64_t first_row = 0;
  int64_t count = 0;
  uint64_t offset = 0;
  // CRC-32C of the range's count * row_bytes bytes (crc32c.h).
  uint32_t crc32c = 0;

  int64_t end_row() const { return first_row + count; }
  bool operator==(const LocalCopyRange&) const = default;
};

// One layer of a copy.
struct LocalCopyLayer {
  int layer = 0;
  formats::RowFormat format = formats::RowFormat::kUnspecified;
  // Rows of the whole source table (not of the copy).
  int64_t table_rows = 0;
  uint64_t weight_row_bytes = 0;
  uint64_t scale_row_bytes = 0;
  // The table's global scale (NVFP4; 1 for FP8).
  float global_scale = 1.0f;
  // Name of the data file inside the copy's directory (no '/').
  std::string data_file;
  // Ascending, disjoint; packed back to back from offset 0 (a range's offset
  // is the end of the previous one's bytes). Coalesced ranges of the target
  // may be split into several entries (copies and checksums are per entry).
  std::vector<LocalCopyRange> ranges;

  uint64_t row_bytes() const { return weight_row_bytes + scale_row_bytes; }
  // Rows held: the sum of the ranges' counts.
  int64_t covered_rows() const;
  // Size of the data file: covered_rows() * row_bytes().
  uint64_t data_bytes() const;
};

// A whole manifest.
struct LocalCopyManifest {
  int version = kLocalCopyFormatVersion;
  SourceIdentity source;
  LocalCopyTarget target;
  // One per Engram layer of the source, in config order.
  std::vector<LocalCopyLayer> layers;

  // The layer whose id is `layer`; nullptr if absent.
  const LocalCopyLayer* FindLayer(int layer) const;
};

// The copy of `target` from `checkpoint` (whose identity is `source`) that a
// localize run makes, checksums zero: per layer the target's coalesced row
// ranges split into entries of at most max(1, max_range_bytes / row bytes)
// rows. InvalidArgument for an invalid target or max_range_bytes == 0.
absl::StatusOr<LocalCopyManifest> PlanLocalCopy(
    const EngramCheckpoint& checkpoint, const SourceIdentity& source,
    const LocalCopyTarget& target, uint64_t max_range_bytes);

// The manifest as JSON (pretty-printed, ends with a newline).
std::string ManifestToJson(const LocalCopyManifest& manifest);
// The same on one line (no newline inside).
std::string ManifestToCompactJson(const LocalCopyManifest& manifest);

// Parses and checks the structure of a manifest read from `origin` (a path,
// for messages). DataLoss naming origin and the field for invalid JSON, a
// missing or mistyped field, or a structure violating the invariants above
// (ranges unsorted, overlapping, empty, past the table, not packed; a data
// file name with '/'); FailedPrecondition for another kind or version.
absl::StatusOr<LocalCopyManifest> ParseManifest(absl::string_view json,
                                                absl::string_view origin);

// Checks that the copy described by `recorded` (read from directory `dir`)
// is usable where `expected` (a PlanLocalCopy() result for the current
// source and the store's target) is wanted: same source identity, same
// target, the same layers with the same format, row sizes, global scale and
// table size, and covering exactly the same rows (how the rows are split into
// entries does not matter). FailedPrecondition naming dir and the first
// difference otherwise.
absl::Status CheckManifestMatches(const LocalCopyManifest& recorded,
                                  const LocalCopyManifest& expected,
                                  absl::string_view dir);

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_MANIFEST_H_
