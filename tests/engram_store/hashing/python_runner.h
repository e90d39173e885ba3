#ifndef MNEME_TESTS_ENGRAM_STORE_HASHING_PYTHON_RUNNER_H_
#define MNEME_TESTS_ENGRAM_STORE_HASHING_PYTHON_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mneme::engram::testing {

// Path of a data dependency of the running test, given relative to the
// workspace root (e.g. "tests/engram_store/hashing/numpy_vectors.py").
std::string RunfilePath(absl::string_view workspace_relative);

// A fresh path under $TEST_TMPDIR.
std::string TempPath(absl::string_view name);

// Runs `/usr/bin/python3 script args...` and waits for it. Internal with the
// exit status if it fails (its stderr goes to the test log).
absl::Status RunPython(const std::string& script,
                       const std::vector<std::string>& args);

// Reads a whole file.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Writes a whole file.
absl::Status WriteFile(const std::string& path, absl::string_view contents);

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_HASHING_PYTHON_RUNNER_H_
