#include "tools/cli/tensor_command.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/gridbook_artifact.h"
#include "checkpoint/model_config.h"
#include "checkpoint/sharded_checkpoint.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "gpu/cpu/cpu_backend.h"
#include "gpu/host_weight.h"
#include "model/model_config.h"
#include "model/weight_loader.h"
#include "nlohmann/json.hpp"
#include "tools/cli/args.h"

namespace mneme::cli {
namespace {

// The module a tensor name belongs to (its format suffix dropped).
std::string ModuleName(std::string name) {
  for (const char* suffix : {".weight", ".trellis", ".cb_qweight", ".scale",
                             ".weight_scale", ".suh", ".svh", ".su", ".sv"}) {
    if (absl::EndsWith(name, suffix)) {
      name.resize(name.size() - std::strlen(suffix));
      break;
    }
  }
  return name;
}

// NumPy's .npy version 1.0: magic, version, a little-endian header length,
// the header dict padded with spaces to a 64-byte boundary (ending in a
// newline), then the little-endian float32 data in C order.
std::string NpyBytes(const std::vector<float>& values, int64_t rows,
                     int64_t cols) {
  std::string header = absl::StrFormat(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows,
      cols);
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xFF));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(values.data()),
             values.size() * sizeof(float));
  return out;
}

}  // namespace

absl::Status RunTensor(const std::vector<std::string>& argv,
                       std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv, {"checkpoint", "name", "npy", "threads"}, {"json"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError("tensor takes no positional arguments");
  }
  ASSIGN_OR_RETURN(const std::string dir, args.Required("checkpoint"));
  ASSIGN_OR_RETURN(const std::string name, args.Required("name"));
  ASSIGN_OR_RETURN(const std::string npy, args.Required("npy"));
  ASSIGN_OR_RETURN(const int64_t threads, args.GetInt("threads", 0, 0, 1024));
  // The FP8 block shape from the config (the architecture's otherwise).
  int block_rows = 128;
  int block_cols = 128;
  if (absl::StatusOr<std::unique_ptr<checkpoint::ModelConfig>> config =
          checkpoint::ModelConfig::Create(dir + "/config.json");
      config.ok()) {
    if (absl::StatusOr<model::ModelDims> dims = model::LoadModelDims(**config);
        dims.ok()) {
      block_rows = dims->fp8_block_rows;
      block_cols = dims->fp8_block_cols;
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::ShardedCheckpoint> ckpt,
                   checkpoint::ShardedCheckpoint::Create(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::GridbookArtifact> gridbook,
                   checkpoint::GridbookArtifact::Open(dir));
  ASSIGN_OR_RETURN(
      std::unique_ptr<gpu::CpuBackend> backend,
      gpu::CpuBackend::Create({.threads = static_cast<int>(threads)}));
  model::WeightLoader load(*ckpt, *backend, block_rows, block_cols,
                           ckpt->dir());
  load.set_gridbook(gridbook.get());
  const std::string module = ModuleName(name);
  absl::StatusOr<std::pair<int64_t, int64_t>> shape = load.LinearShape(module);
  if (!shape.ok()) {
    return absl::NotFoundError(absl::StrCat("no linear weight \"", module,
                                            "\" in ", dir, " (",
                                            shape.status().message(), ")"));
  }
  const auto [rows, cols] = *shape;
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::Weight> weight,
                   load.Linear(module, rows, cols));
  std::vector<float> values(static_cast<size_t>(rows * cols));
  backend->DequantizeWeight(*weight, absl::MakeSpan(values));
  RETURN_IF_ERROR(WriteFileAtomically(npy, NpyBytes(values, rows, cols)));
  const char* format = gpu::WeightFormatName(weight->format());
  if (args.Has("json")) {
    out << nlohmann::json{{"name", module},
                          {"format", format},
                          {"shape", {rows, cols}},
                          {"stored_bytes", weight->bytes()},
                          {"npy", npy}}
               .dump()
        << "\n";
  } else {
    out << absl::StrFormat("%s: %s [%d, %d], %d bytes stored -> %s\n", module,
                           format, rows, cols, weight->bytes(), npy);
  }
  return absl::OkStatus();
}

}  // namespace mneme::cli
