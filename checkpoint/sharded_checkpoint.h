#ifndef MNEME_CHECKPOINT_SHARDED_CHECKPOINT_H_
#define MNEME_CHECKPOINT_SHARDED_CHECKPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/tensor_source.h"

namespace mneme::checkpoint {

struct ShardedCheckpointOptions {
  // Options for every shard. Default: see SafetensorsReaderOptions.
  SafetensorsReaderOptions reader;
};

// Where a tensor of a checkpoint lives. Both pointers are owned by the
// ShardedCheckpoint and live as long as it does.
struct TensorLocation {
  const SafetensorsReader* shard = nullptr;
  const TensorInfo* info = nullptr;
};

// The safetensors files of a Hugging Face checkpoint directory: either
// model.safetensors.index.json and the shards it names, or a single
// model.safetensors (the index wins if both exist).
//
// Shards are opened eagerly at Create(): each is one open descriptor and its
// parsed header (a few hundred KB at most), and opening them all up front
// means every index reference is validated before anything is served. Only
// tensors named in the index's weight_map are visible; tensors a shard holds
// beyond those are ignored, as Hugging Face loaders do.
//
// A TensorSource over the visible tensors (see tensor_source.h); its
// NotFound messages name the checkpoint directory, its other errors the
// shard file.
//
// Thread-safe: immutable after Create().
class ShardedCheckpoint final : public TensorSource {
 public:
  // Opens the checkpoint in directory `dir`. NotFound if `dir` holds neither
  // file; DataLoss for a corrupt index or shard, a shard the index names that
  // does not exist (naming index, shard and a tensor), or a tensor the index
  // lists that its shard lacks (naming index, shard and tensor).
  static absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> Create(
      const std::string& dir, const ShardedCheckpointOptions& options = {});

  ShardedCheckpoint(const ShardedCheckpoint&) = delete;
  ShardedCheckpoint& operator=(const ShardedCheckpoint&) = delete;

  const std::string& dir() const { return dir_; }
  // The parsed index; nullopt for a single-file checkpoint.
  const std::optional<CheckpointIndex>& index() const { return index_; }
  // The open shards, sorted by file name.
  const std::vector<std::unique_ptr<SafetensorsReader>>& shards() const {
    return shards_;
  }
  // Every visible tensor by name.
  const std::map<std::string, TensorLocation, std::less<>>& tensors() const {
    return tensors_;
  }

  // The tensor called `name`; nullptr if absent.
  const TensorLocation* FindOrNull(absl::string_view name) const;
  // The tensor called `name`; NotFound (naming the checkpoint directory and
  // the tensor) if absent.
  absl::StatusOr<TensorLocation> Find(absl::string_view name) const;

  // TensorSource.
  std::vector<std::string> TensorNames() const override;
  absl::StatusOr<TensorSpec> GetTensorSpec(
      absl::string_view name) const override;
  absl::StatusOr<std::vector<uint8_t>> ReadTensorBytes(
      absl::string_view name) const override;
  absl::Status ReadTensorByteRange(absl::string_view name, uint64_t offset,
                                   absl::Span<uint8_t> out) const override;

 private:
  explicit ShardedCheckpoint(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;
  std::optional<CheckpointIndex> index_;
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::map<std::string, TensorLocation, std::less<>> tensors_;
};

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_SHARDED_CHECKPOINT_H_
