#include "checkpoint/sharded_checkpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace mneme::checkpoint {
namespace {

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::Create(
    const std::string& dir, const ShardedCheckpointOptions& options) {
  auto checkpoint =
      std::unique_ptr<ShardedCheckpoint>(new ShardedCheckpoint(dir));
  const std::string index_path = JoinPath(dir, kIndexFileName);
  ASSIGN_OR_RETURN(const bool has_index, PathExists(index_path));

  if (!has_index) {
    const std::string single_path = JoinPath(dir, kSingleShardFileName);
    ASSIGN_OR_RETURN(const bool has_single, PathExists(single_path));
    if (!has_single) {
      return absl::NotFoundError(absl::StrCat("checkpoint directory '", dir,
                                              "' has neither ", kIndexFileName,
                                              " nor ", kSingleShardFileName));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                     SafetensorsReader::Create(single_path, options.reader));
    for (const TensorInfo& info : reader->tensors()) {
      checkpoint->tensors_.emplace(info.name,
                                   TensorLocation{reader.get(), &info});
    }
    checkpoint->shards_.push_back(std::move(reader));
    return checkpoint;
  }

  ASSIGN_OR_RETURN(CheckpointIndex index, ReadCheckpointIndex(index_path));

  // Shard file -> one tensor that names it (for messages).
  std::map<std::string, std::string> shard_files;
  for (const auto& [tensor, shard] : index.weight_map) {
    shard_files.emplace(shard, tensor);
  }
  std::map<std::string, const SafetensorsReader*> readers;
  for (const auto& [shard, some_tensor] : shard_files) {
    const std::string shard_path = JoinPath(dir, shard);
    ASSIGN_OR_RETURN(const bool exists, PathExists(shard_path));
    if (!exists) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint index '", index_path, "' names shard '", shard,
          "' (e.g. for tensor ", QuoteTensorName(some_tensor), ") but '",
          shard_path, "' does not exist"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                     SafetensorsReader::Create(shard_path, options.reader));
    readers.emplace(shard, reader.get());
    checkpoint->shards_.push_back(std::move(reader));
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    const SafetensorsReader* reader = readers.at(shard);
    const TensorInfo* info = reader->FindOrNull(tensor);
    if (info == nullptr) {
      return absl::DataLossError(
          absl::StrCat("checkpoint index '", index_path, "' places tensor ",
                       QuoteTensorName(tensor), " in shard '", reader->path(),
                       "', which has no such tensor"));
    }
    checkpoint->tensors_.emplace(tensor, TensorLocation{reader, info});
  }
  checkpoint->index_ = std::move(index);
  return checkpoint;
}

const TensorLocation* ShardedCheckpoint::FindOrNull(
    absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<TensorLocation> ShardedCheckpoint::Find(
    absl::string_view name) const {
  const TensorLocation* location = FindOrNull(name);
  if (location == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint '", dir_, "' has no tensor ", QuoteTensorName(name)));
  }
  return *location;
}

std::vector<std::string> ShardedCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, location] : tensors_) names.push_back(name);
  return names;
}

absl::StatusOr<TensorSpec> ShardedCheckpoint::GetTensorSpec(
    absl::string_view name) const {
  ASSIGN_OR_RETURN(const TensorLocation location, Find(name));
  return ToTensorSpec(*location.info);
}

absl::StatusOr<std::vector<uint8_t>> ShardedCheckpoint::ReadTensorBytes(
    absl::string_view name) const {
  ASSIGN_OR_RETURN(const TensorLocation location, Find(name));
  return location.shard->ReadTensorBytes(name);
}

absl::Status ShardedCheckpoint::ReadTensorByteRange(
    absl::string_view name, uint64_t offset, absl::Span<uint8_t> out) const {
  ASSIGN_OR_RETURN(const TensorLocation location, Find(name));
  return location.shard->ReadTensorByteRange(name, offset, out);
}

}  // namespace mneme::checkpoint
