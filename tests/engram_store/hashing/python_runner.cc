#include "tests/engram_store/hashing/python_runner.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace mneme::engram::testing {
namespace {

std::string Env(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

std::string ShellQuote(absl::string_view arg) {
  return absl::StrCat("'", absl::StrReplaceAll(arg, {{"'", "'\\''"}}), "'");
}

}  // namespace

std::string RunfilePath(absl::string_view workspace_relative) {
  return absl::StrCat(Env("TEST_SRCDIR", "."), "/",
                      Env("TEST_WORKSPACE", "mneme"), "/", workspace_relative);
}

std::string TempPath(absl::string_view name) {
  return absl::StrCat(Env("TEST_TMPDIR", "/tmp"), "/", name);
}

absl::Status RunPython(const std::string& script,
                       const std::vector<std::string>& args) {
  std::string command = absl::StrCat("/usr/bin/python3 ", ShellQuote(script));
  for (const std::string& arg : args) {
    absl::StrAppend(&command, " ", ShellQuote(arg));
  }
  const int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("`", command, "` failed with status ", status));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::Status WriteFile(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace mneme::engram::testing
