#include "checkpoint/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mneme::checkpoint {
namespace {

using nlohmann::json;

constexpr absl::string_view kMetadataKey = "__metadata__";
// Names longer than this are shortened in messages.
constexpr size_t kMaxQuotedNameBytes = 200;

absl::Status FileError(absl::string_view file_name, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("safetensors file '", file_name, "': ", what));
}

absl::Status TensorError(absl::string_view file_name, absl::string_view tensor,
                         absl::string_view what) {
  return absl::DataLossError(absl::StrCat("safetensors file '", file_name,
                                          "', tensor ", QuoteTensorName(tensor),
                                          ": ", what));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<TensorInfo> ParseTensorEntry(const std::string& name,
                                            const json& entry,
                                            uint64_t data_offset,
                                            uint64_t data_size,
                                            absl::string_view file_name) {
  if (!entry.is_object()) {
    return TensorError(file_name, name, "entry is not a JSON object");
  }
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) {
    return TensorError(file_name, name, "missing \"dtype\"");
  }
  if (!dtype_it->is_string()) {
    return TensorError(file_name, name, "\"dtype\" is not a string");
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = ParseDTypeName(dtype_name);
  if (!dtype) {
    return TensorError(
        file_name, name,
        absl::StrCat(
            "unsupported dtype \"",
            absl::CHexEscape(dtype_name.substr(0, kMaxQuotedNameBytes)), "\""));
  }
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) {
    return TensorError(file_name, name, "missing \"shape\"");
  }
  if (!shape_it->is_array()) {
    return TensorError(file_name, name, "\"shape\" is not an array");
  }
  uint64_t elements = 1;
  bool overflow = false;
  for (const json& dim : *shape_it) {
    std::optional<uint64_t> d = JsonToUint64(dim);
    if (!d || *d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return TensorError(file_name, name,
                         absl::StrCat("dimension ", info.shape.size(),
                                      " of \"shape\" is not an integer in "
                                      "[0, 2^63): ",
                                      JsonSnippet(dim, 64)));
    }
    info.shape.push_back(static_cast<int64_t>(*d));
    if (__builtin_mul_overflow(elements, *d, &elements)) overflow = true;
  }
  uint64_t expected_bytes = 0;
  if (overflow ||
      elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(elements, DTypeSize(info.dtype),
                             &expected_bytes)) {
    // A product of zero is fine even if partial products overflowed, but a
    // zero-sized tensor with such dimensions is not worth supporting.
    return TensorError(
        file_name, name,
        absl::StrCat("shape ", ShapeString(info.shape), " overflows 64 bits"));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) {
    return TensorError(file_name, name, "missing \"data_offsets\"");
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return TensorError(file_name, name,
                       "\"data_offsets\" is not an array of two integers");
  }
  std::optional<uint64_t> begin = JsonToUint64((*offsets_it)[0]);
  std::optional<uint64_t> end = JsonToUint64((*offsets_it)[1]);
  if (!begin || !end) {
    return TensorError(
        file_name, name,
        "\"data_offsets\" holds something other than non-negative integers");
  }
  if (*begin > *end) {
    return TensorError(
        file_name, name,
        absl::StrCat("data_offsets begin ", *begin, " is after end ", *end));
  }
  if (*end > data_size) {
    return TensorError(file_name, name,
                       absl::StrCat("data_offsets [", *begin, ", ", *end,
                                    ") run past the end of the data region (",
                                    data_size, " bytes)"));
  }
  if (*end - *begin != expected_bytes) {
    return TensorError(
        file_name, name,
        absl::StrCat("data_offsets [", *begin, ", ", *end, ") hold ",
                     *end - *begin, " bytes but shape ",
                     ShapeString(info.shape), " of ", dtype_name, " needs ",
                     expected_bytes));
  }
  info.offset = data_offset + *begin;
  info.byte_length = expected_bytes;
  return info;
}

}  // namespace

int64_t TensorInfo::NumElements() const {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  return elements;
}

const TensorInfo* SafetensorsHeader::Find(absl::string_view name) const {
  auto it = std::lower_bound(
      tensors.begin(), tensors.end(), name,
      [](const TensorInfo& t, absl::string_view n) { return t.name < n; });
  if (it == tensors.end() || it->name != name) return nullptr;
  return &*it;
}

std::vector<const TensorInfo*> SafetensorsHeader::TensorsInFileOrder() const {
  std::vector<const TensorInfo*> ordered;
  ordered.reserve(tensors.size());
  for (const TensorInfo& t : tensors) ordered.push_back(&t);
  std::sort(ordered.begin(), ordered.end(),
            [](const TensorInfo* a, const TensorInfo* b) {
              return a->offset != b->offset ? a->offset < b->offset
                                            : a->name < b->name;
            });
  return ordered;
}

std::string QuoteTensorName(absl::string_view name) {
  if (name.size() > kMaxQuotedNameBytes) {
    return absl::StrCat("'",
                        absl::CHexEscape(name.substr(0, kMaxQuotedNameBytes)),
                        "...' (", name.size(), " bytes)");
  }
  return absl::StrCat("'", absl::CHexEscape(name), "'");
}

absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(
    absl::string_view prefix, uint64_t file_size, absl::string_view file_name,
    const SafetensorsParseOptions& options) {
  if (file_size < kSafetensorsLengthBytes ||
      prefix.size() < kSafetensorsLengthBytes) {
    return FileError(file_name,
                     absl::StrCat("file is ", file_size,
                                  " bytes, too short for the 8-byte header "
                                  "length"));
  }
  uint64_t length = 0;
  for (size_t i = 0; i < kSafetensorsLengthBytes; ++i) {
    length |= uint64_t{static_cast<uint8_t>(prefix[i])} << (8 * i);
  }
  if (length > options.max_header_bytes) {
    return FileError(
        file_name,
        absl::StrCat("header length ", length, " exceeds the limit of ",
                     options.max_header_bytes, " bytes"));
  }
  if (length > file_size - kSafetensorsLengthBytes) {
    return FileError(file_name, absl::StrCat("header length ", length,
                                             " runs past the end of the file (",
                                             file_size, " bytes)"));
  }
  return length;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeaderJson(
    absl::string_view header_json, uint64_t file_size,
    absl::string_view file_name) {
  SafetensorsHeader header;
  header.header_length = header_json.size();
  header.data_offset = kSafetensorsLengthBytes + header.header_length;
  header.file_size = file_size;
  if (header.data_offset > file_size) {
    return FileError(
        file_name,
        absl::StrCat("header length ", header.header_length,
                     " runs past the end of the file (", file_size, " bytes)"));
  }
  const uint64_t data_size = file_size - header.data_offset;

  ParsedJson parsed = ParseJson(header_json);
  if (parsed.too_deep) {
    return FileError(file_name,
                     absl::StrCat("header nests arrays / objects deeper than "
                                  "the limit of ",
                                  kMaxJsonDepth));
  }
  if (!parsed.valid()) {
    return FileError(file_name, "header is not valid JSON");
  }
  const json& root = parsed.value;
  if (!root.is_object()) {
    return FileError(file_name, "header is not a JSON object");
  }
  if (parsed.duplicate_key) {
    return FileError(file_name,
                     absl::StrCat("header repeats the key ",
                                  QuoteTensorName(*parsed.duplicate_key)));
  }

  header.tensors.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (key == kMetadataKey) {
      if (!it.value().is_object()) {
        return FileError(file_name, "\"__metadata__\" is not a JSON object");
      }
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return FileError(file_name, absl::StrCat("\"__metadata__\" entry ",
                                                   QuoteTensorName(m.key()),
                                                   " is not a string"));
        }
        header.metadata.emplace(m.key(),
                                m.value().get_ref<const std::string&>());
      }
      continue;
    }
    ASSIGN_OR_RETURN(TensorInfo info,
                     ParseTensorEntry(key, it.value(), header.data_offset,
                                      data_size, file_name));
    header.tensors.push_back(std::move(info));
  }
  // nlohmann objects iterate in key order, so tensors are sorted by name.

  // Overlaps: sort the non-empty tensors by start; each must start at or
  // after the furthest end seen so far.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(header.tensors.size());
  for (const TensorInfo& t : header.tensors) {
    if (t.byte_length > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) {
              return a->offset != b->offset ? a->offset < b->offset
                                            : a->name < b->name;
            });
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (furthest != nullptr &&
        t->offset < furthest->offset + furthest->byte_length) {
      return TensorError(
          file_name, t->name,
          absl::StrCat(
              "bytes [", t->offset - header.data_offset, ", ",
              t->offset - header.data_offset + t->byte_length,
              ") overlap tensor ", QuoteTensorName(furthest->name), " at [",
              furthest->offset - header.data_offset, ", ",
              furthest->offset - header.data_offset + furthest->byte_length,
              ")"));
    }
    if (furthest == nullptr ||
        t->offset + t->byte_length > furthest->offset + furthest->byte_length) {
      furthest = t;
    }
  }
  return header;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsBuffer(
    absl::string_view file_bytes, absl::string_view file_name,
    const SafetensorsParseOptions& options) {
  ASSIGN_OR_RETURN(uint64_t length,
                   ParseSafetensorsHeaderLength(file_bytes, file_bytes.size(),
                                                file_name, options));
  return ParseSafetensorsHeaderJson(
      file_bytes.substr(kSafetensorsLengthBytes, static_cast<size_t>(length)),
      file_bytes.size(), file_name);
}

}  // namespace mneme::checkpoint
