#ifndef MNEME_TESTS_TESTING_COMMAND_H_
#define MNEME_TESTS_TESTING_COMMAND_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace mneme::testing {

// What a finished command left behind.
struct CommandResult {
  // Exit code, 128 + signal if killed, -1 if it could not run or finish.
  int code = -1;
  std::string out;
  std::string err;
};

// Runs `argv` (argv[0] a path) to completion. A command that cannot start
// or does not finish within `timeout` fails the current test (and is
// killed) and gives code -1.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         absl::Duration timeout = absl::Seconds(120));

// Runs the `mneme` CLI (//tools:mneme, a data dependency of the test) with
// `args`.
CommandResult RunMneme(const std::vector<std::string>& args,
                       absl::Duration timeout = absl::Seconds(120));

// The tiny model (`mneme make-checkpoint --model --seed 21`) in
// $TEST_TMPDIR/tiny, made on the first call of the test process.
const std::string& TinyModelCheckpoint();
// The tiny model whose DSpark drafter agrees well with it (`--aligned-draft
// --seed 21`) in $TEST_TMPDIR/tiny-aligned, made on the first call.
const std::string& TinyAlignedCheckpoint();
// The tiny V4-Flash-0731 model (V4 with DSpark stages; `--arch
// v4-flash-0731 --seed 21`) in $TEST_TMPDIR/tiny-0731, made on the first
// call.
const std::string& Tiny0731Checkpoint();

// The non-empty lines of `text`.
std::vector<std::string> NonEmptyLines(const std::string& text);

}  // namespace mneme::testing

#endif  // MNEME_TESTS_TESTING_COMMAND_H_
