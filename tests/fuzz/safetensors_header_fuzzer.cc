// libFuzzer target for the safetensors header parser.
//
// Each input is parsed twice: as a whole file (8-byte length, header, data),
// and - so that mutations of the JSON are not all lost to a stale length -
// its bytes after the first 8 as a bare JSON header followed by a data
// region of kVirtualDataBytes. Either way the parser must not crash, must
// reject with DataLoss only, and whatever it accepts must satisfy the
// invariants the readers rely on (checked below; a violation aborts).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"
#include "checkpoint/safetensors_header.h"

namespace {

using ::mneme::checkpoint::DTypeSize;
using ::mneme::checkpoint::SafetensorsHeader;
using ::mneme::checkpoint::TensorInfo;

constexpr char kFileName[] = "fuzz-input.safetensors";
constexpr uint64_t kVirtualDataBytes = 4096;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

void CheckResult(const absl::StatusOr<SafetensorsHeader>& result) {
  if (!result.ok()) {
    if (result.status().code() != absl::StatusCode::kDataLoss) {
      Fail("rejection is not DataLoss");
    }
    if (result.status().message().find(kFileName) == absl::string_view::npos) {
      Fail("message does not name the file");
    }
    return;
  }
  const SafetensorsHeader& header = *result;
  if (header.data_offset != 8 + header.header_length) Fail("data_offset");
  if (header.data_offset > header.file_size) Fail("data region");
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (previous != nullptr && !(previous->name < t.name)) {
      Fail("tensors not sorted by unique name");
    }
    previous = &t;
    if (t.name == "__metadata__") Fail("__metadata__ parsed as a tensor");
    if (t.offset < header.data_offset) Fail("tensor before data region");
    if (t.byte_length > header.file_size - t.offset) Fail("tensor past end");
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) Fail("negative dimension");
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
        Fail("accepted shape overflows");
      }
    }
    if (bytes != t.byte_length) Fail("byte length != shape x dtype size");
    if (header.Find(t.name) != &t) Fail("Find() disagrees");
  }
  for (const TensorInfo& a : header.tensors) {
    for (const TensorInfo& b : header.tensors) {
      if (&a == &b || a.byte_length == 0 || b.byte_length == 0) continue;
      if (a.offset < b.offset + b.byte_length &&
          b.offset < a.offset + a.byte_length) {
        Fail("overlapping tensors accepted");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  CheckResult(mneme::checkpoint::ParseSafetensorsBuffer(input, kFileName));
  const absl::string_view json = input.substr(size < 8 ? size : 8);
  CheckResult(mneme::checkpoint::ParseSafetensorsHeaderJson(
      json, 8 + json.size() + kVirtualDataBytes, kFileName));
  return 0;
}
