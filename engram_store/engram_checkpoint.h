#ifndef MNEME_ENGRAM_STORE_ENGRAM_CHECKPOINT_H_
#define MNEME_ENGRAM_STORE_ENGRAM_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "checkpoint/engram_config.h"
#include "checkpoint/engram_table.h"
#include "checkpoint/sharded_checkpoint.h"
#include "engram_store/hashing/ngram_hasher.h"

namespace mneme::engram {

// The Engram side of a checkpoint directory, opened and cross-checked:
// config.json's Engram keys, the shards, the compressed vocabulary from
// tokenizer.json (its size must match engram_compressed_vocab_size), the
// hashing constants (engram_num_embeddings must match the primes) and every
// Engram table's location (dtype, shape and row count checked).
//
// ReadRawRows() is the plain, direct way to fetch rows (one pread per row
// part): the reference every faster path of the store is tested against,
// and what the CLI uses. Immutable after Open(); thread-safe.
class EngramCheckpoint {
 public:
  // Errors name the file and key or tensor: NotFound for a missing
  // config.json / tokenizer.json / shard, DataLoss for corrupt files,
  // InvalidArgument for inconsistent config values.
  static absl::StatusOr<std::unique_ptr<EngramCheckpoint>> Open(
      const std::string& dir);

  const std::string& dir() const { return dir_; }
  const checkpoint::EngramConfig& config() const { return config_; }
  const checkpoint::ShardedCheckpoint& checkpoint() const {
    return *checkpoint_;
  }
  const NgramHasher& hasher() const { return *hasher_; }
  const std::vector<checkpoint::EngramTableLocation>& tables() const {
    return tables_;
  }

  // The table of Engram layer `layer`; InvalidArgument naming the layer and
  // the Engram layers when it has none.
  absl::StatusOr<const checkpoint::EngramTableLocation*> Table(int layer) const;

  // Reads rows `ids` of layer `layer` into `out` (ids.size() *
  // RowBytes(format) bytes; each row its weight bytes then its scale bytes).
  // OutOfRange naming the id for an id outside [0, rows); InvalidArgument
  // for a wrong output size; DataLoss if a shard became shorter.
  absl::Status ReadRawRows(int layer, absl::Span<const int64_t> ids,
                           absl::Span<uint8_t> out) const;

 private:
  EngramCheckpoint() = default;

  std::string dir_;
  checkpoint::EngramConfig config_;
  std::unique_ptr<checkpoint::ShardedCheckpoint> checkpoint_;
  std::unique_ptr<NgramHasher> hasher_;
  std::vector<checkpoint::EngramTableLocation> tables_;
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_ENGRAM_CHECKPOINT_H_
