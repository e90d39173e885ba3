#include "checkpoint/checkpoint_index.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/safetensors_header.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mneme::checkpoint {
namespace {

using nlohmann::json;

absl::Status IndexError(absl::string_view file_name, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("checkpoint index '", file_name, "': ", what));
}

bool IsSafeRelativePath(absl::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(
    absl::string_view json_text, absl::string_view file_name) {
  ParsedJson parsed = ParseJson(json_text);
  if (parsed.too_deep) {
    return IndexError(
        file_name, absl::StrCat("nests arrays / objects deeper than the limit "
                                "of ",
                                kMaxJsonDepth));
  }
  if (!parsed.valid()) return IndexError(file_name, "not valid JSON");
  const json& root = parsed.value;
  if (!root.is_object()) return IndexError(file_name, "not a JSON object");
  if (parsed.duplicate_key) {
    return IndexError(file_name,
                      absl::StrCat("repeats the key ",
                                   QuoteTensorName(*parsed.duplicate_key)));
  }
  CheckpointIndex index;
  if (auto metadata = root.find("metadata"); metadata != root.end()) {
    if (!metadata->is_object() && !metadata->is_null()) {
      return IndexError(file_name, "\"metadata\" is not an object");
    }
    if (metadata->is_object()) {
      if (auto total = metadata->find("total_size"); total != metadata->end()) {
        std::optional<uint64_t> value = JsonToUint64(*total);
        if (!value) {
          return IndexError(file_name,
                            "\"metadata.total_size\" is not a non-negative "
                            "integer");
        }
        index.total_size = *value;
      }
    }
  }
  auto weight_map = root.find("weight_map");
  if (weight_map == root.end()) {
    return IndexError(file_name, "missing \"weight_map\"");
  }
  if (!weight_map->is_object()) {
    return IndexError(file_name, "\"weight_map\" is not an object");
  }
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    if (!it.value().is_string()) {
      return IndexError(file_name,
                        absl::StrCat("tensor ", QuoteTensorName(it.key()),
                                     ": shard is not a string"));
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!IsSafeRelativePath(shard)) {
      return IndexError(
          file_name,
          absl::StrCat("tensor ", QuoteTensorName(it.key()), ": shard ",
                       QuoteTensorName(shard),
                       " is not a relative path inside the checkpoint"));
    }
    index.weight_map.emplace(it.key(), shard);
  }
  return index;
}

absl::StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxIndexFileBytes));
  return ParseCheckpointIndex(text, path);
}

absl::StatusOr<std::string> SerializeCheckpointIndex(
    const CheckpointIndex& index) {
  json root = json::object();
  json metadata = json::object();
  if (index.total_size) metadata["total_size"] = *index.total_size;
  root["metadata"] = std::move(metadata);
  json weight_map = json::object();
  for (const auto& [tensor, shard] : index.weight_map) {
    if (!IsValidUtf8(tensor) || !IsValidUtf8(shard)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint index: tensor ", QuoteTensorName(tensor),
          " or its shard ", QuoteTensorName(shard), " is not valid UTF-8"));
    }
    weight_map[tensor] = shard;
  }
  root["weight_map"] = std::move(weight_map);
  return root.dump(2) + "\n";
}

absl::Status WriteCheckpointIndex(const std::string& path,
                                  const CheckpointIndex& index) {
  ASSIGN_OR_RETURN(std::string text, SerializeCheckpointIndex(index));
  return WriteFileAtomically(path, text);
}

}  // namespace mneme::checkpoint
