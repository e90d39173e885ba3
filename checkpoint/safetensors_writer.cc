#include "checkpoint/safetensors_writer.h"

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace mneme::checkpoint {
namespace {

absl::Status DeclError(absl::string_view path, absl::string_view tensor,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors writer for '", path, "', tensor ",
                   QuoteTensorName(tensor), ": ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorDecl> tensors,
    const SafetensorsWriterOptions& options) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!options.metadata.empty()) {
    nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
    for (const auto& [key, value] : options.metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors writer for '", path, "': metadata entry ",
                         QuoteTensorName(key), " is not valid UTF-8"));
      }
      metadata[key] = value;
    }
    header["__metadata__"] = std::move(metadata);
  }

  std::vector<TensorInfo> layout;
  layout.reserve(tensors.size());
  std::map<std::string, size_t, std::less<>> index_by_name;
  uint64_t data_bytes = 0;
  for (TensorDecl& decl : tensors) {
    if (decl.name.empty()) return DeclError(path, decl.name, "empty name");
    if (decl.name == "__metadata__") {
      return DeclError(path, decl.name, "reserved name");
    }
    if (!IsValidUtf8(decl.name)) {
      return DeclError(path, decl.name, "name is not valid UTF-8");
    }
    if (!index_by_name.emplace(decl.name, layout.size()).second) {
      return DeclError(path, decl.name, "declared twice");
    }
    uint64_t bytes = DTypeSize(decl.dtype);
    for (int64_t d : decl.shape) {
      if (d < 0) return DeclError(path, decl.name, "negative dimension");
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        return DeclError(path, decl.name, "size overflows 64 bits");
      }
    }
    uint64_t end;
    if (__builtin_add_overflow(data_bytes, bytes, &end)) {
      return DeclError(path, decl.name, "file size overflows 64 bits");
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
    layout.push_back(std::move(info));
    data_bytes = end;
  }

  std::string header_json = header.dump();
  header_json.append((8 - header_json.size() % 8) % 8, ' ');
  const uint64_t data_offset = kSafetensorsLengthBytes + header_json.size();
  if (data_bytes >
      static_cast<uint64_t>(std::numeric_limits<off_t>::max()) - data_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors writer for '", path, "': ", data_bytes,
                     " bytes of tensors exceed the largest file size"));
  }
  for (TensorInfo& info : layout) info.offset += data_offset;

  std::string temp_path;
  ASSIGN_OR_RETURN(ScopedFd fd, CreateTempFileNextTo(path, &temp_path));
  std::string prefix(kSafetensorsLengthBytes, '\0');
  for (size_t i = 0; i < kSafetensorsLengthBytes; ++i) {
    prefix[i] = static_cast<char>((header_json.size() >> (8 * i)) & 0xFF);
  }
  prefix += header_json;
  absl::Status status;
  if (::ftruncate(fd.get(), static_cast<off_t>(data_offset + data_bytes)) !=
      0) {
    status = absl::ErrnoToStatus(errno,
                                 absl::StrCat("cannot size '", temp_path, "'"));
  }
  if (status.ok()) {
    status = PwriteFully(
        fd.get(), 0,
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(prefix.data()),
                            prefix.size()),
        temp_path);
  }
  if (!status.ok()) {
    ::unlink(temp_path.c_str());
    return status;
  }
  auto writer = std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter(
      path, std::move(temp_path), std::move(fd), std::move(layout), data_bytes,
      options.buffer_bytes));
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
