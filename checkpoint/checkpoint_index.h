#ifndef MNEME_CHECKPOINT_CHECKPOINT_INDEX_H_
#define MNEME_CHECKPOINT_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::checkpoint {

// File names of the Hugging Face checkpoint layout.
inline constexpr absl::string_view kIndexFileName =
    "model.safetensors.index.json";
inline constexpr absl::string_view kSingleShardFileName = "model.safetensors";
inline constexpr absl::string_view kConfigFileName = "config.json";

// Largest index file accepted, bytes. Default for ReadCheckpointIndex.
inline constexpr uint64_t kMaxIndexFileBytes = uint64_t{256} << 20;

// The contents of model.safetensors.index.json:
//   {"metadata": {"total_size": 123}, "weight_map": {"tensor": "shard"}}
struct CheckpointIndex {
  // metadata.total_size: bytes of all tensors, as the writer computed it.
  // Informational (writers disagree on what it counts); nullopt if absent.
  std::optional<uint64_t> total_size;
  // Tensor name -> shard file name, relative to the checkpoint directory.
  std::map<std::string, std::string> weight_map;
};

// Parses the text of an index file; `file_name` is used in messages.
// DataLoss (naming the file, and the tensor where there is one) for invalid
// JSON, a repeated key, a missing or non-object "weight_map", a shard name
// that is not a string, is empty, absolute or contains a ".." component, or
// a "metadata.total_size" that is not a non-negative integer. Other keys
// (and other metadata entries) are ignored.
absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(
    absl::string_view json_text, absl::string_view file_name);

// Reads and parses the index file at `path`. NotFound if it does not exist.
absl::StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& path);

// The index as JSON text (2-space indented, keys sorted, trailing newline).
// InvalidArgument if a name is not valid UTF-8.
absl::StatusOr<std::string> SerializeCheckpointIndex(
    const CheckpointIndex& index);

// Writes the index to `path` atomically (temporary file + rename).
absl::Status WriteCheckpointIndex(const std::string& path,
                                  const CheckpointIndex& index);

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_CHECKPOINT_INDEX_H_
