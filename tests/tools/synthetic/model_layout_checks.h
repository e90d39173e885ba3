#ifndef MNEME_TESTS_TOOLS_SYNTHETIC_MODEL_LAYOUT_CHECKS_H_
#define MNEME_TESTS_TOOLS_SYNTHETIC_MODEL_LAYOUT_CHECKS_H_

// Test helpers: what docs/MODEL_LAYOUT.md says a full-model checkpoint
// holds, written out from the document's tables independently of the
// synthetic maker, and a check of a checkpoint directory against it.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/dtype.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::synthetic::testing {

struct ExpectedTensor {
  checkpoint::DType dtype = checkpoint::DType::kU8;
  std::vector<int64_t> shape;
};

// Every tensor of a kFullModel checkpoint made with `o`, by name: the table
// of MODEL_LAYOUT.md (MXFP4 routed experts) plus the Engram tensors of
// ENGRAM.md, whose tables have engram_rows[i] rows (FP8 or NVFP4 as
// o.engram_format says).
std::map<std::string, ExpectedTensor> ExpectedModelTensors(
    const SyntheticCheckpointOptions& o,
    const std::vector<int64_t>& engram_rows);

// Checks (with gtest expectations) that directory `dir` is a kFullModel
// checkpoint of `o`: the index maps exactly ExpectedModelTensors() with
// their dtypes and shapes, every layer's non-Engram tensors share one shard
// of their own, embed / head / norm / hc_head share another, and the
// config's text_config has every MODEL_LAYOUT.md key with the value of `o`
// and the top-level quantization_config.
void ExpectFullModelCheckpoint(const std::string& dir,
                               const SyntheticCheckpointOptions& o);

}  // namespace mneme::synthetic::testing

#endif  // MNEME_TESTS_TOOLS_SYNTHETIC_MODEL_LAYOUT_CHECKS_H_
