#ifndef MNEME_TESTS_FUZZ_FUZZ_CORPUS_H_
#define MNEME_TESTS_FUZZ_FUZZ_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

// The fuzz entry point a corpus test links in.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace mneme::fuzz {

// `relative` (a directory of the workspace, e.g.
// "tests/fuzz/corpus/tokenizer_json") under the test's runfiles root.
std::string CorpusDir(const std::string& relative);
// The file names in `dir` (not . and ..); empty if it cannot be read.
std::vector<std::string> ListCorpus(const std::string& dir);
// The bytes of `path`.
std::string ReadCorpusFile(const std::string& path);
// LLVMFuzzerTestOneInput over `input`.
int RunFuzzInput(const std::string& input);

}  // namespace mneme::fuzz

#endif  // MNEME_TESTS_FUZZ_FUZZ_CORPUS_H_
