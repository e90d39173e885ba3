#ifndef MNEME_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define MNEME_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "checkpoint/safetensors_writer.h"

namespace mneme::checkpoint::testing {

// A fresh, empty directory under $TEST_TMPDIR.
std::string MakeTempDir();

// Writes `contents` to `path` (replacing it); fails the test on error.
void WriteFileOrFail(const std::string& path, absl::string_view contents);

// Whether `path` exists.
bool FileExists(const std::string& path);

// The bytes of a safetensors file: 8-byte little-endian length of
// `header_json`, the header, then `data`.
std::string SafetensorsBytes(absl::string_view header_json,
                             absl::string_view data);

// `n` deterministic pseudo-random bytes that depend on `seed`.
std::vector<uint8_t> PatternBytes(size_t n, uint32_t seed);

// Writes a safetensors file holding `tensors`; tensor i is filled with
// PatternBytes(bytes, seed + i). Fails the test on error.
void WritePatternFile(const std::string& path,
                      const std::vector<TensorDecl>& tensors, uint32_t seed,
                      const SafetensorsWriterOptions& options = {});

}  // namespace mneme::checkpoint::testing

#endif  // MNEME_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
