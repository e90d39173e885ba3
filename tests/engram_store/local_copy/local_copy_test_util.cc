#include "tests/engram_store/local_copy/local_copy_test_util.h"

#include <fstream>
#include <map>
#include <sstream>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram::testing {

std::string MakeCheckpoint(formats::RowFormat format, uint64_t seed) {
  synthetic::SyntheticCheckpointOptions options;
  options.out_dir = ::mneme::testing::MakeTempDir("ckpt") + "/checkpoint";
  options.engram_format = format;
  options.engram_vocab_size = 300;
  options.seed = seed;
  options.threads = 2;
  const absl::Status status = synthetic::MakeSyntheticCheckpoint(options);
  EXPECT_TRUE(status.ok()) << status;
  return options.out_dir;
}

const std::string& SharedCheckpointDir(formats::RowFormat format) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* dirs = new std::map<formats::RowFormat, std::string>();
  absl::MutexLock lock(&mu);
  auto it = dirs->find(format);
  if (it == dirs->end()) {
    it = dirs->emplace(format, MakeCheckpoint(format)).first;
  }
  return it->second;
}

std::unique_ptr<EngramCheckpoint> OpenCheckpoint(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> c =
      EngramCheckpoint::Open(dir);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::vector<bool> ServedRows(const EngramCheckpoint& checkpoint,
                             size_t layer_index, int tp_size, int rank,
                             ColumnSplit split) {
  const HashLayout& layout = checkpoint.hasher().layout();
  const LayerHashLayout& layer = layout.layers()[layer_index];
  std::vector<bool> served(static_cast<size_t>(layer.num_rows), false);
  for (int c = 0; c < layout.num_columns(); ++c) {
    const bool mine = split == ColumnSplit::kStrided
                          ? c % tp_size == rank
                          : c / (layout.num_columns() / tp_size) == rank;
    if (!mine) continue;
    for (int64_t r = layer.offsets[c]; r < layer.offsets[c] + layer.primes[c];
         ++r) {
      served[static_cast<size_t>(r)] = true;
    }
  }
  return served;
}

LocalCopyTarget OneRank(int tp_size, int rank, ColumnSplit split) {
  return LocalCopyTarget{.tp_size = tp_size, .ranks = {rank}, .split = split};
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  ASSERT_TRUE(f.good()) << path << " offset " << offset;
  c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  ASSERT_TRUE(f.good());
}

}  // namespace mneme::engram::testing
