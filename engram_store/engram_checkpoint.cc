#include "engram_store/engram_checkpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/engram_config_loader.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "engram_store/hashing/compressed_vocabulary.h"

namespace mneme::engram {

absl::StatusOr<std::unique_ptr<EngramCheckpoint>> EngramCheckpoint::Open(
    const std::string& dir) {
  auto result = std::unique_ptr<EngramCheckpoint>(new EngramCheckpoint());
  result->dir_ = dir;
  ASSIGN_OR_RETURN(checkpoint::EngramConfig config,
                   checkpoint::LoadEngramConfig(
                       absl::StrCat(dir, "/", checkpoint::kConfigFileName)));
  result->config_ = std::move(config);

  ASSIGN_OR_RETURN(result->checkpoint_,
                   checkpoint::ShardedCheckpoint::Create(dir));

  ASSIGN_OR_RETURN(
      std::unique_ptr<CompressedVocabulary> vocabulary,
      CompressedVocabulary::Create(
          {.tokenizer_json_path = absl::StrCat(dir, "/tokenizer.json")}));
  ASSIGN_OR_RETURN(std::unique_ptr<NgramHasher> hasher,
                   NgramHasher::Create(result->config_, std::move(vocabulary)));
  result->hasher_ = std::move(hasher);

  ASSIGN_OR_RETURN(
      std::vector<checkpoint::EngramTableLocation> tables,
      checkpoint::LocateEngramTables(*result->checkpoint_, result->config_));
  result->tables_ = std::move(tables);
  return result;
}

absl::StatusOr<const checkpoint::EngramTableLocation*> EngramCheckpoint::Table(
    int layer) const {
  for (const checkpoint::EngramTableLocation& table : tables_) {
    if (table.layer == layer) return &table;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("layer ", layer, " has no Engram table (Engram layers: ",
                   absl::StrJoin(config_.layer_ids, ", "), ")"));
}

absl::Status EngramCheckpoint::ReadRawRows(int layer,
                                           absl::Span<const int64_t> ids,
                                           absl::Span<uint8_t> out) const {
  ASSIGN_OR_RETURN(const checkpoint::EngramTableLocation* table, Table(layer));
  const checkpoint::EngramTableLocation& t = *table;
  const size_t row_bytes = t.weight_row_bytes + t.scale_row_bytes;
  if (out.size() != ids.size() * row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("output holds ", out.size(), " bytes, ", ids.size(),
                     " rows need ", ids.size() * row_bytes));
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= t.rows) {
      return absl::OutOfRangeError(absl::StrCat("row id ", id,
                                                " outside layer ", layer,
                                                "'s table [0, ", t.rows, ")"));
    }
  }
  ASSIGN_OR_RETURN(ScopedFd weights, OpenForRead(t.shard_path));
  ASSIGN_OR_RETURN(ScopedFd scales, OpenForRead(t.scale_shard_path));
  for (size_t i = 0; i < ids.size(); ++i) {
    uint8_t* row = out.data() + i * row_bytes;
    const uint64_t id = static_cast<uint64_t>(ids[i]);
    if (absl::Status s =
            PreadFully(weights.get(), t.weight_offset + id * t.weight_row_bytes,
                       absl::MakeSpan(row, t.weight_row_bytes), t.shard_path);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = PreadFully(
            scales.get(), t.scale_offset + id * t.scale_row_bytes,
            absl::MakeSpan(row + t.weight_row_bytes, t.scale_row_bytes),
            t.scale_shard_path);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::engram
