#include "tests/tools/quant/checkpoint_test_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/checkpoint_index.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/sharded_checkpoint.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace mneme::quant::testing {

namespace fs = std::filesystem;

std::string MakeSource(
    const std::string& name,
    const std::function<void(synthetic::SyntheticCheckpointOptions&)>&
        customize) {
  synthetic::SyntheticCheckpointOptions options;
  options.out_dir = mneme::testing::MakeTempDir(name) + "/source";
  options.engram_vocab_size = 100;
  options.wkv_kind = synthetic::WkvKind::kCorrelated;
  options.threads = 2;
  if (customize) customize(options);
  const absl::Status status = synthetic::MakeSyntheticCheckpoint(options);
  EXPECT_TRUE(status.ok()) << status;
  return options.out_dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::map<std::string, std::string> ReadTree(const std::string& dir) {
  std::map<std::string, std::string> tree;
  for (const fs::directory_entry& entry :
       fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    tree[fs::relative(entry.path(), dir).string()] =
        ReadFile(entry.path().string());
  }
  return tree;
}

void RewriteShard(const std::string& path,
                  const std::function<void(ShardContents&)>& edit) {
  ShardContents contents;
  {
    auto reader = checkpoint::SafetensorsReader::Create(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<const checkpoint::TensorInfo*> infos;
    for (const checkpoint::TensorInfo& info : (*reader)->tensors()) {
      infos.push_back(&info);
    }
    std::sort(infos.begin(), infos.end(),
              [](auto* a, auto* b) { return a->offset < b->offset; });
    for (const checkpoint::TensorInfo* info : infos) {
      contents.decls.push_back({info->name, info->dtype, info->shape});
      auto bytes = (*reader)->ReadTensor(info->name);
      ASSERT_TRUE(bytes.ok());
      contents.bytes[info->name] = *std::move(bytes);
    }
    contents.metadata = (*reader)->metadata();
  }
  edit(contents);
  fs::remove(path);
  auto writer = checkpoint::SafetensorsWriter::Create(
      path, contents.decls, {.metadata = contents.metadata});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const checkpoint::TensorDecl& d : contents.decls) {
    ASSERT_TRUE((*writer)->Append(d.name, contents.bytes[d.name]).ok())
        << d.name;
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

std::string ShardOf(const std::string& dir, const std::string& tensor) {
  auto index =
      checkpoint::ReadCheckpointIndex(dir + "/model.safetensors.index.json");
  EXPECT_TRUE(index.ok());
  return index.ok() ? index->weight_map.at(tensor) : "";
}

void RemoveFromIndex(const std::string& dir, const std::string& tensor) {
  const std::string path = dir + "/model.safetensors.index.json";
  auto index = checkpoint::ReadCheckpointIndex(path);
  ASSERT_TRUE(index.ok());
  ASSERT_EQ(index->weight_map.erase(tensor), 1u) << tensor;
  ASSERT_TRUE(checkpoint::WriteCheckpointIndex(path, *index).ok());
}

void PatchTensorByte(const std::string& dir, const std::string& tensor,
                     uint64_t offset, uint8_t value) {
  auto checkpoint = checkpoint::ShardedCheckpoint::Create(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const checkpoint::TensorLocation* t = (*checkpoint)->FindOrNull(tensor);
  ASSERT_NE(t, nullptr) << tensor;
  const int fd = ::open(t->shard->path().c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &value, 1, t->info->offset + offset), 1);
  ::close(fd);
}

std::vector<uint8_t> TensorBytes(const std::string& dir,
                                 const std::string& tensor) {
  auto checkpoint = checkpoint::ShardedCheckpoint::Create(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  if (!checkpoint.ok()) return {};
  const checkpoint::TensorLocation* t = (*checkpoint)->FindOrNull(tensor);
  EXPECT_NE(t, nullptr) << tensor;
  if (t == nullptr) return {};
  auto bytes = t->shard->ReadTensor(tensor);
  EXPECT_TRUE(bytes.ok());
  return bytes.ok() ? *bytes : std::vector<uint8_t>();
}

std::vector<std::vector<double>> NaiveWkvHessians(const std::string& dir,
                                                  int layer) {
  const std::string prefix = "layers." + std::to_string(layer) + ".engram.wkv.";
  const std::vector<uint8_t> codes = TensorBytes(dir, prefix + "weight");
  const std::vector<uint8_t> scales = TensorBytes(dir, prefix + "scale");
  const int64_t in = int64_t{24} * 256;
  const int64_t out = static_cast<int64_t>(codes.size()) / in;
  std::vector<std::vector<double>> h(
      24, std::vector<double>(size_t{256} * 256, 0.0));
  std::vector<double> row(in);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t c = 0; c < in; ++c) {
      row[c] = static_cast<double>(formats::E4m3ToFloat(codes[o * in + c])) *
               formats::Ue8m0ToFloat(scales[(o / 32) * (in / 32) + c / 32]);
    }
    for (int col = 0; col < 24; ++col) {
      const double* w = row.data() + int64_t{col} * 256;
      for (int i = 0; i < 256; ++i) {
        for (int j = i; j < 256; ++j) h[col][i * 256 + j] += w[i] * w[j];
      }
    }
  }
  for (std::vector<double>& m : h) {
    for (int i = 0; i < 256; ++i) {
      for (int j = 0; j < i; ++j) m[i * 256 + j] = m[j * 256 + i];
    }
  }
  return h;
}

}  // namespace mneme::quant::testing
