#ifndef MNEME_CHECKPOINT_SAFETENSORS_HEADER_H_
#define MNEME_CHECKPOINT_SAFETENSORS_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"

namespace mneme::checkpoint {

// Parsing and validation of the header of a safetensors file, kept free of
// I/O so that it can run over a memory buffer (tests, the fuzz target) as
// well as over what SafetensorsReader preads.
//
// File layout: an 8-byte little-endian length N, N bytes of JSON, then the
// data region. The JSON object maps each tensor name to
//   {"dtype": "F8_E4M3", "shape": [rows, 256], "data_offsets": [begin, end]}
// (offsets relative to the start of the data region, end exclusive) and may
// hold "__metadata__", an object of string values. Unknown fields inside a
// tensor entry are ignored, as the reference implementation does.
//
// Validation (every failure is DataLoss and names the file, and the tensor
// where there is one): file shorter than 8 bytes; N past the end of the file
// or above the cap; JSON that does not parse or is not an object; a duplicate
// key; wrong field types; an unsupported dtype; a negative, non-integer or
// overflowing dimension; begin > end; end past the end of the file;
// end - begin != elements x dtype size; two tensors whose bytes overlap.
// Gaps between tensors and bytes after the last tensor are allowed;
// zero-length tensors may sit anywhere inside the data region.

// Bytes of the little-endian header length that starts every file.
inline constexpr size_t kSafetensorsLengthBytes = 8;
// Default cap on the JSON header (the reference implementation's limit).
inline constexpr uint64_t kDefaultMaxHeaderBytes = uint64_t{100} << 20;

// One tensor of a safetensors file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  // Dimensions, outermost first; empty for a scalar. Each is >= 0.
  std::vector<int64_t> shape;
  // Absolute offset in the file of the tensor's first byte (8 + N + begin).
  uint64_t offset = 0;
  // Bytes of the tensor: NumElements() x DTypeSize(dtype).
  uint64_t byte_length = 0;

  // Product of the dimensions (1 for a scalar).
  int64_t NumElements() const;
};

// The parsed header of one safetensors file.
struct SafetensorsHeader {
  // N: bytes of the JSON header (including any padding).
  uint64_t header_length = 0;
  // Absolute offset of the data region: 8 + N.
  uint64_t data_offset = 0;
  // Size of the whole file, bytes.
  uint64_t file_size = 0;
  // The "__metadata__" map (empty if absent).
  std::map<std::string, std::string> metadata;
  // Every tensor, sorted by name.
  std::vector<TensorInfo> tensors;

  // The tensor called `name`, or nullptr.
  const TensorInfo* Find(absl::string_view name) const;

  // Every tensor in the order its bytes appear in the file (by offset, then
  // by name for empty tensors that share one): the order a rewrite of the
  // file keeps. Pointers into `tensors`.
  std::vector<const TensorInfo*> TensorsInFileOrder() const;
};

struct SafetensorsParseOptions {
  // Largest accepted JSON header, bytes. Default: kDefaultMaxHeaderBytes
  // (100 MiB).
  uint64_t max_header_bytes = kDefaultMaxHeaderBytes;
};

// Decodes the header length N from the first bytes of a file of `file_size`
// bytes (`prefix` holds at least the first 8 bytes, or all of a shorter file).
// DataLoss if the file is shorter than 8 bytes, N exceeds
// options.max_header_bytes, or 8 + N exceeds file_size. `file_name` is used
// in messages only.
absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(
    absl::string_view prefix, uint64_t file_size, absl::string_view file_name,
    const SafetensorsParseOptions& options = {});

// Parses and validates the JSON header (exactly the N bytes after the length)
// of a file of `file_size` bytes. DataLoss as listed above.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeaderJson(
    absl::string_view header_json, uint64_t file_size,
    absl::string_view file_name);

// Both steps over a whole file held in memory.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsBuffer(
    absl::string_view file_bytes, absl::string_view file_name,
    const SafetensorsParseOptions& options = {});

// "'name'" with non-printable bytes escaped and very long names shortened:
// how tensor names appear in the messages of this package.
std::string QuoteTensorName(absl::string_view name);

}  // namespace mneme::checkpoint

#endif  // MNEME_CHECKPOINT_SAFETENSORS_HEADER_H_
