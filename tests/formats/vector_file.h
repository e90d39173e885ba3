#ifndef MNEME_TESTS_FORMATS_VECTOR_FILE_H_
#define MNEME_TESTS_FORMATS_VECTOR_FILE_H_

// Test vectors written by the formats' Python references (a safetensors file
// generated at test time): typed reads of whole tensors, and the path the
// wrapper script passes in MNEME_VECTORS.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors_reader.h"
#include "gtest/gtest.h"

namespace mneme::testing {

class VectorFile {
 public:
  // Opens $MNEME_VECTORS; fails the test when it is unset or unreadable.
  static std::unique_ptr<VectorFile> OpenFromEnvironment() {
    const char* path = std::getenv("MNEME_VECTORS");
    if (path == nullptr) {
      ADD_FAILURE() << "MNEME_VECTORS is not set (run through the sh_test)";
      return nullptr;
    }
    auto reader = checkpoint::SafetensorsReader::Create(path);
    if (!reader.ok()) {
      ADD_FAILURE() << reader.status();
      return nullptr;
    }
    return std::unique_ptr<VectorFile>(new VectorFile(*std::move(reader)));
  }

  bool Has(const std::string& name) const {
    return reader_->FindOrNull(name) != nullptr;
  }

  std::vector<int64_t> Shape(const std::string& name) const {
    const auto* info = reader_->FindOrNull(name);
    return info == nullptr ? std::vector<int64_t>{} : info->shape;
  }

  const std::map<std::string, std::string>& metadata() const {
    return reader_->metadata();
  }

  // The tensor's bytes reinterpreted as T (sizes must agree).
  template <typename T>
  std::vector<T> Read(const std::string& name) const {
    auto bytes = reader_->ReadTensor(name);
    if (!bytes.ok()) {
      ADD_FAILURE() << name << ": " << bytes.status();
      return {};
    }
    EXPECT_EQ(bytes->size() % sizeof(T), 0u) << name;
    std::vector<T> values(bytes->size() / sizeof(T));
    std::memcpy(values.data(), bytes->data(), values.size() * sizeof(T));
    return values;
  }

 private:
  explicit VectorFile(std::unique_ptr<checkpoint::SafetensorsReader> reader)
      : reader_(std::move(reader)) {}

  std::unique_ptr<checkpoint::SafetensorsReader> reader_;
};

}  // namespace mneme::testing

#endif  // MNEME_TESTS_FORMATS_VECTOR_FILE_H_
