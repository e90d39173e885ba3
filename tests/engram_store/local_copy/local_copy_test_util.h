#ifndef MNEME_TESTS_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_TEST_UTIL_H_
#define MNEME_TESTS_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engram_store/engram_checkpoint.h"
#include "engram_store/hashing/column_split.h"
#include "engram_store/local_copy/local_copy_manifest.h"
#include "formats/row_format.h"

namespace mneme::engram::testing {

// A small synthetic checkpoint (tools/synthetic, engram_vocab_size 300:
// ~7,200 rows per table, layers 1 and 3) of `format`, written once per test
// process under $TEST_TMPDIR and shared; tests must not modify it.
const std::string& SharedCheckpointDir(formats::RowFormat format);

// A fresh synthetic checkpoint of `format` (for tests that change it).
std::string MakeCheckpoint(formats::RowFormat format, uint64_t seed = 3);

// Opens `dir`; fails the test (and returns nullptr) if it cannot.
std::unique_ptr<EngramCheckpoint> OpenCheckpoint(const std::string& dir);

// The rows of Engram layer `layer_index` that `rank` serves, computed
// straight from the rank's columns and the layer's primes/offsets (not from
// the coalesced ranges the local copy code uses): one flag per table row.
std::vector<bool> ServedRows(const EngramCheckpoint& checkpoint,
                             size_t layer_index, int tp_size, int rank,
                             ColumnSplit split);

// A LocalCopyTarget of one rank.
LocalCopyTarget OneRank(int tp_size, int rank, ColumnSplit split);

// The whole contents of a file ("" if it cannot be read).
std::string ReadFileOrEmpty(const std::string& path);

// Flips the bits of byte `offset` of `path`.
void FlipByte(const std::string& path, uint64_t offset);

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_LOCAL_COPY_LOCAL_COPY_TEST_UTIL_H_
