#ifndef MNEME_TESTS_TOOLS_QUANT_CHECKPOINT_TEST_UTIL_H_
#define MNEME_TESTS_TOOLS_QUANT_CHECKPOINT_TEST_UTIL_H_

// Test helpers for the checkpoint conversion tools: small synthetic sources
// and ways to damage them.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors_writer.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::quant::testing {

// A synthetic checkpoint under a fresh temp directory: small tables
// (engram_vocab_size 100, a few thousand rows each), correlated wkv, two
// threads, then `customize` applied to the options. Returns its directory.
std::string MakeSource(
    const std::string& name,
    const std::function<void(synthetic::SyntheticCheckpointOptions&)>&
        customize = nullptr);

// Every file under `dir` (recursively) by relative path -> contents.
std::map<std::string, std::string> ReadTree(const std::string& dir);

std::string ReadFile(const std::string& path);

// Rewrites the safetensors file `path` in place: `edit` may change, add or
// drop declarations and their bytes (keyed by tensor name).
struct ShardContents {
  std::vector<checkpoint::TensorDecl> decls;
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::map<std::string, std::string> metadata;
};
void RewriteShard(const std::string& path,
                  const std::function<void(ShardContents&)>& edit);

// The shard file (relative name) that holds `tensor` per the index of `dir`.
std::string ShardOf(const std::string& dir, const std::string& tensor);

// Drops `tensor` from the index of `dir` (the shard keeps its bytes).
void RemoveFromIndex(const std::string& dir, const std::string& tensor);

// Overwrites byte `offset` of tensor `tensor` of checkpoint `dir`.
void PatchTensorByte(const std::string& dir, const std::string& tensor,
                     uint64_t offset, uint8_t value);

// The bytes of tensor `tensor` of checkpoint `dir`.
std::vector<uint8_t> TensorBytes(const std::string& dir,
                                 const std::string& tensor);

// H_c = W_c^T W_c of every hash column of layer `layer`'s wkv, computed
// plainly from the tensor bytes (e4m3 x 2^(e - 127), 32 x 32 blocks).
std::vector<std::vector<double>> NaiveWkvHessians(const std::string& dir,
                                                  int layer);

}  // namespace mneme::quant::testing

#endif  // MNEME_TESTS_TOOLS_QUANT_CHECKPOINT_TEST_UTIL_H_
