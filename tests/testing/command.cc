#include "tests/testing/command.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace mneme::testing {

CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout) {
  auto child = Subprocess::Start(argv);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return {};
  absl::StatusOr<int> code = (*child)->Wait(timeout);
  EXPECT_TRUE(code.ok()) << code.status();
  return {code.ok() ? *code : -1, (*child)->Stdout(), (*child)->Stderr()};
}

CommandResult RunMneme(const std::vector<std::string>& args,
                       absl::Duration timeout) {
  std::vector<std::string> argv = {RunfilePath("mneme/tools/mneme")};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, timeout);
}

std::vector<std::string> NonEmptyLines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

namespace {

// `mneme make-checkpoint --model --seed 21 EXTRA` into $TEST_TMPDIR/NAME.
std::string* MakeTinyModel(const std::string& name,
                           const std::vector<std::string>& extra) {
  const char* tmp = getenv("TEST_TMPDIR");
  auto* d =
      new std::string(absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name));
  std::vector<std::string> args = {"make-checkpoint", "--model", "--out", *d,
                                   "--seed",          "21"};
  args.insert(args.end(), extra.begin(), extra.end());
  const CommandResult r = RunMneme(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return d;
}

}  // namespace

const std::string& TinyModelCheckpoint() {
  static const std::string* dir = MakeTinyModel("tiny", {});
  return *dir;
}

const std::string& Tiny0731Checkpoint() {
  static const std::string* dir =
      MakeTinyModel("tiny-0731", {"--arch", "v4-flash-0731"});
  return *dir;
}

const std::string& TinyAlignedCheckpoint() {
  static const std::string* dir =
      MakeTinyModel("tiny-aligned", {"--aligned-draft"});
  return *dir;
}

}  // namespace mneme::testing
