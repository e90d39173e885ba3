#include "checkpoint/safetensors_writer.h"

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mneme::checkpoint {
namespace {

absl::Status DeclError(absl::string_view context, absl::string_view tensor,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(context, ", tensor ", QuoteTensorName(tensor), ": ", what));
}

}  // namespace

absl::StatusOr<EncodedSafetensorsHeader> EncodeSafetensorsHeader(
    std::vector<TensorDecl> tensors,
    const std::map<std::string, std::string>& metadata,
    absl::string_view context) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json entries = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(context, ": metadata entry ", QuoteTensorName(key),
                         " is not valid UTF-8"));
      }
      entries[key] = value;
    }
    header["__metadata__"] = std::move(entries);
  }

  EncodedSafetensorsHeader encoded;
  encoded.layout.reserve(tensors.size());
  absl::flat_hash_set<std::string> names;
  uint64_t data_bytes = 0;
  for (TensorDecl& decl : tensors) {
    if (decl.name.empty()) return DeclError(context, decl.name, "empty name");
    if (decl.name == "__metadata__") {
      return DeclError(context, decl.name, "reserved name");
    }
    if (!IsValidUtf8(decl.name)) {
      return DeclError(context, decl.name, "name is not valid UTF-8");
    }
    if (!names.insert(decl.name).second) {
      return DeclError(context, decl.name, "declared twice");
    }
    uint64_t bytes = DTypeSize(decl.dtype);
    for (int64_t d : decl.shape) {
      if (d < 0) return DeclError(context, decl.name, "negative dimension");
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return DeclError(context, decl.name, "size overflows 64 bits");
      }
    }
    uint64_t end;
    if (__builtin_add_overflow(data_bytes, bytes, &end)) {
      return DeclError(context, decl.name, "file size overflows 64 bits");
    }
    header[decl.name] = {
        {"dtype", std::string(DTypeName(decl.dtype))},
        {"shape", decl.shape},
        {"data_offsets", {data_bytes, end}},
    };
    TensorInfo info;
    info.name = std::move(decl.name);
    info.dtype = decl.dtype;
    info.shape = std::move(decl.shape);
    info.offset = data_bytes;  // Made absolute below.
    info.byte_length = bytes;
    encoded.layout.push_back(std::move(info));
    data_bytes = end;
  }

  // Every string was checked to be valid UTF-8 above, so dump() cannot
  // throw.
  std::string header_json = header.dump();
  header_json.append((8 - header_json.size() % 8) % 8, ' ');
  const uint64_t data_offset = kSafetensorsLengthBytes + header_json.size();
  if (data_bytes >
      static_cast<uint64_t>(std::numeric_limits<off_t>::max()) - data_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": ", data_bytes,
                     " bytes of tensors exceed the largest file size"));
  }
  for (TensorInfo& info : encoded.layout) info.offset += data_offset;
  encoded.prefix.assign(kSafetensorsLengthBytes, '\0');
  for (size_t i = 0; i < kSafetensorsLengthBytes; ++i) {
    encoded.prefix[i] =
        static_cast<char>((header_json.size() >> (8 * i)) & 0xFF);
  }
  encoded.prefix += header_json;
  encoded.data_bytes = data_bytes;
  return encoded;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorDecl> tensors,
    const SafetensorsWriterOptions& options) {
  ASSIGN_OR_RETURN(EncodedSafetensorsHeader encoded,
                   EncodeSafetensorsHeader(
                       std::move(tensors), options.metadata,
                       absl::StrCat("safetensors writer for '", path, "'")));
  std::map<std::string, size_t, std::less<>> index_by_name;
  for (size_t i = 0; i < encoded.layout.size(); ++i) {
    index_by_name.emplace(encoded.layout[i].name, i);
  }
  const uint64_t file_size = encoded.prefix.size() + encoded.data_bytes;

  std::string temp_path;
  ASSIGN_OR_RETURN(ScopedFd fd, CreateTempFileNextTo(path, &temp_path));
  absl::Status status;
  if (::ftruncate(fd.get(), static_cast<off_t>(file_size)) != 0) {
    status = absl::ErrnoToStatus(errno,
                                 absl::StrCat("cannot size '", temp_path, "'"));
  }
  if (status.ok()) {
    status =
        PwriteFully(fd.get(), 0,
                    absl::MakeConstSpan(
                        reinterpret_cast<const uint8_t*>(encoded.prefix.data()),
                        encoded.prefix.size()),
                    temp_path);
  }
  if (!status.ok()) {
    ::unlink(temp_path.c_str());
    return status;
  }
  auto writer = std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter(
      path, std::move(temp_path), std::move(fd), std::move(encoded.layout),
      encoded.data_bytes, options.buffer_bytes));
  writer->index_by_name_ = std::move(index_by_name);
  return writer;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::string temp_path,
                                     ScopedFd fd,
                                     std::vector<TensorInfo> layout,
                                     uint64_t data_bytes, size_t buffer_bytes)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      fd_(std::move(fd)),
      layout_(std::move(layout)),
      data_bytes_(data_bytes),
      buffer_bytes_(buffer_bytes),
      states_(layout_.size()) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (!finished_) {
    fd_.reset();
    ::unlink(temp_path_.c_str());
  }
}

absl::Status SafetensorsWriter::Fail(absl::Status status) {
  error_ = status;
  return status;
}

absl::Status SafetensorsWriter::Flush(size_t index) {
  TensorState& state = states_[index];
  if (state.buffer.empty()) return absl::OkStatus();
  absl::Status status =
      PwriteFully(fd_.get(), layout_[index].offset + state.flushed,
                  absl::MakeConstSpan(state.buffer), temp_path_);
  if (!status.ok()) return Fail(status);
  state.flushed += state.buffer.size();
  state.buffer.clear();
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Append(absl::string_view name,
                                       absl::Span<const uint8_t> bytes) {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors writer for '", path_, "' already finished"));
  }
  if (!error_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors writer for '", path_,
                     "' failed earlier: ", error_.message()));
  }
  auto it = index_by_name_.find(name);
  if (it == index_by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("safetensors writer for '", path_,
                                            "': undeclared tensor ",
                                            QuoteTensorName(name)));
  }
  const size_t index = it->second;
  TensorState& state = states_[index];
  const uint64_t length = layout_[index].byte_length;
  if (bytes.size() > length - state.written) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors writer for '", path_, "', tensor ", QuoteTensorName(name),
        ": appending ", bytes.size(), " bytes after ", state.written,
        " exceeds its ", length, " bytes"));
  }
  state.written += bytes.size();
  if (state.buffer.size() + bytes.size() <= buffer_bytes_) {
    if (state.buffer.capacity() == 0) {
      state.buffer.reserve(
          static_cast<size_t>(std::min<uint64_t>(buffer_bytes_, length)));
    }
    state.buffer.insert(state.buffer.end(), bytes.begin(), bytes.end());
    if (state.written == length || state.buffer.size() == buffer_bytes_) {
      RETURN_IF_ERROR(Flush(index));
    }
    if (state.written == length) std::vector<uint8_t>().swap(state.buffer);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Flush(index));
  absl::Status status = PwriteFully(
      fd_.get(), layout_[index].offset + state.flushed, bytes, temp_path_);
  if (!status.ok()) return Fail(status);
  state.flushed += bytes.size();
  if (state.written == length) std::vector<uint8_t>().swap(state.buffer);
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors writer for '", path_, "' already finished"));
  }
  if (!error_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("safetensors writer for '", path_,
                     "' failed earlier: ", error_.message()));
  }
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (states_[i].written != layout_[i].byte_length) {
      return absl::FailedPreconditionError(absl::StrCat(
          "safetensors writer for '", path_, "', tensor ",
          QuoteTensorName(layout_[i].name), ": only ", states_[i].written,
          " of ", layout_[i].byte_length, " bytes were appended"));
    }
  }
  absl::Status status = CommitTempFile(std::move(fd_), temp_path_, path_);
  if (!status.ok()) return Fail(status);
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace mneme::checkpoint
