// Synthetic checkpoints of the released layouts: the tensor set of each arch
// against a table written here from ../shared/docs/MODEL_V4.md §2,
// MODEL_V41.md §1.2-1.7 and the V4-Flash-0731 headers (not from the
// writer), configs, values, full-shape sparse files, and option errors.
#include "tools/synthetic/release_checkpoint.h"

#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::synthetic {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<int64_t>;

struct Want {
  std::string dtype;
  Shape shape;
  bool operator==(const Want& o) const {
    return dtype == o.dtype && shape == o.shape;
  }
};
using Table = std::map<std::string, Want>;

std::string Show(const Want& w) {
  return absl::StrCat(w.dtype, " [", absl::StrJoin(w.shape, ","), "]");
}

// --- The independent table ---

// The dimensions the docs give (MODEL_V4.md §1 "V4-Flash" / "tiny" columns,
// MODEL_V41.md §1.1, the 0731 config.json, /the agreed tiny specs).
struct Doc {
  bool v41 = false;
  bool dspark = false;  // 0731 or V4.1
  int64_t V = 0, d = 0, nh = 0, D = 0, q_lora = 0, R = 0, G = 0, n_I = 0;
  int64_t d_I = 0, E = 0, I = 0, layers = 0;
  int64_t block = 0;
  std::vector<int> m = {};  // compress ratio per main layer
  int hash = 0;
  int stages = 1;
  int64_t dspark_E = 0, r = 0;
  int targets = 3;
  std::set<int> kv_src = {};
  std::set<int> idx_src = {};
  std::vector<int> engram = {};
  std::vector<int64_t> engram_rows = {};
  // Vision tower: layers, width, MLP width (patch 14, downsample 3).
  int vision_layers = 0;
  int64_t vd = 0, vi = 0;
};

Doc TinyV4(int64_t vocab) {
  Doc c{.V = vocab,
        .d = 256,
        .nh = 8,
        .D = 128,
        .q_lora = 128,
        .R = 128,
        .G = 4,
        .n_I = 8,
        .d_I = 128,
        .E = 16,
        .I = 128,
        .layers = 5,
        .block = 128};
  c.m = {0, 0, 4, 128, 4};
  c.hash = 3;
  return c;
}
Doc Tiny0731(int64_t vocab) {
  Doc c = TinyV4(vocab);
  c.dspark = true;
  c.stages = 3;
  c.dspark_E = 16;
  c.r = 32;
  return c;
}
Doc FullV4() {
  Doc c{.V = 129280,
        .d = 4096,
        .nh = 64,
        .D = 512,
        .q_lora = 1024,
        .R = 1024,
        .G = 8,
        .n_I = 64,
        .d_I = 128,
        .E = 256,
        .I = 2048,
        .layers = 43,
        .block = 128};
  c.m = {0, 0};
  for (int i = 2; i < 43; ++i) c.m.push_back(i % 2 == 0 ? 4 : 128);
  c.hash = 3;
  return c;
}
Doc Full0731() {
  Doc c = FullV4();
  c.E = 160;
  c.dspark = true;
  c.stages = 3;
  c.dspark_E = 160;
  c.r = 256;
  return c;
}
Doc TinyV41(int64_t vocab, std::vector<int64_t> engram_rows) {
  Doc c{.V = vocab,
        .d = 256,
        .nh = 8,
        .D = 128,
        .q_lora = 128,
        .R = 64,
        .G = 4,
        .n_I = 4,
        .d_I = 128,
        .E = 16,
        .I = 128,
        .layers = 9,
        .block = 32};
  c.v41 = c.dspark = true;
  c.m = {0, 0, 2, 2, 2, 2, 1, 1, 1};
  c.stages = 3;
  c.dspark_E = 8;
  c.r = 32;
  c.kv_src = {2, 4, 6};
  c.idx_src = {2, 4, 6, 8};
  c.engram = {1, 3};
  c.engram_rows = std::move(engram_rows);
  c.vision_layers = 2, c.vd = 64, c.vi = 128;
  return c;
}
Doc FullV41() {
  Doc c{.V = 129280,
        .d = 5120,
        .nh = 64,
        .D = 512,
        .q_lora = 1280,
        .R = 1024,
        .G = 8,
        .n_I = 32,
        .d_I = 128,
        .E = 384,
        .I = 2304,
        .layers = 40,
        .block = 32};
  c.v41 = c.dspark = true;
  c.m = {0, 0};
  for (int i = 0; i < 18; ++i) c.m.push_back(2);
  for (int i = 0; i < 20; ++i) c.m.push_back(1);
  c.stages = 3;
  c.dspark_E = 128;
  c.r = 256;
  c.kv_src = {2, 8, 14, 20};
  c.idx_src = {2, 8, 14, 20, 24, 28, 32, 36};
  c.engram = {1, 14};
  c.engram_rows = {384006168, 384016682};
  c.vision_layers = 32, c.vd = 1024, c.vi = 2816;
  return c;
}

int64_t Up(int64_t x, int64_t b) { return (x + b - 1) / b; }

class TableBuilder {
 public:
  explicit TableBuilder(const Doc& c) : c_(c) {}

  Table Build() {
    t_["embed.weight"] = {"BF16", {c_.V, c_.d}};
    t_["head.weight"] = {"BF16", {c_.V, c_.d}};
    t_["norm.weight"] = {"BF16", {c_.d}};
    if (c_.v41) {
      for (const char* n : {"image_start", "image_end", "image_newline"}) {
        t_[n] = {"BF16", {c_.d}};
      }
      // ViT + aligner, all BF16 (vision.py of the release).
      t_["vision.patch_embed.proj.weight"] = {"BF16", {c_.vd, 588}};
      t_["vision.patch_embed.proj.bias"] = {"BF16", {c_.vd}};
      for (int b = 0; b < c_.vision_layers; ++b) {
        const std::string p = absl::StrCat("vision.blocks.", b, ".");
        t_[p + "norm1.weight"] = {"BF16", {c_.vd}};
        t_[p + "norm2.weight"] = {"BF16", {c_.vd}};
        t_[p + "attn.wqkv.weight"] = {"BF16", {3 * c_.vd, c_.vd}};
        t_[p + "attn.wqkv.bias"] = {"BF16", {3 * c_.vd}};
        t_[p + "attn.wo.weight"] = {"BF16", {c_.vd, c_.vd}};
        t_[p + "attn.wo.bias"] = {"BF16", {c_.vd}};
        t_[p + "mlp.w1.weight"] = {"BF16", {2 * c_.vi, c_.vd}};
        t_[p + "mlp.w2.weight"] = {"BF16", {c_.vd, c_.vi}};
      }
      t_["vision.norm.weight"] = {"BF16", {c_.vd}};
      t_["aligner.w1.weight"] = {"BF16", {c_.d, 9 * c_.vd}};
      t_["aligner.w1.bias"] = {"BF16", {c_.d}};
      t_["aligner.w2.weight"] = {"BF16", {c_.d, c_.d}};
      t_["aligner.w2.bias"] = {"BF16", {c_.d}};
    } else {
      HcHead("");
    }
    for (int i = 0; i < c_.layers; ++i) {
      Layer(absl::StrCat("layers.", i, "."), i, c_.m[i], c_.E, true);
    }
    for (int s = 0; s < c_.stages; ++s) {
      const std::string p = absl::StrCat("mtp.", s, ".");
      Layer(p, -1, 0, c_.dspark ? c_.dspark_E : c_.E, false);
      if (!c_.dspark) {
        Fp8(p + "e_proj", c_.d, c_.d);
        Fp8(p + "h_proj", c_.d, c_.d);
        for (const char* n : {"enorm", "hnorm", "norm"}) {
          t_[p + n + ".weight"] = {"BF16", {c_.d}};
        }
        HcHead(p);
        continue;
      }
      if (s == 0) {
        Fp8(p + "main_proj", c_.d, c_.targets * c_.d);
        t_[p + "main_norm.weight"] = {"BF16", {c_.d}};
      }
      if (s == 2) {
        t_[p + "norm.weight"] = {"BF16", {c_.d}};
        const std::string w1 = c_.v41 ? "embed" : "markov_w1";
        const std::string w2 = c_.v41 ? "head" : "markov_w2";
        t_[absl::StrCat(p, "markov_head.", w1, ".weight")] = {"BF16",
                                                              {c_.V, c_.r}};
        t_[absl::StrCat(p, "markov_head.", w2, ".weight")] = {"BF16",
                                                              {c_.V, c_.r}};
        t_[p + "confidence_head.proj.weight"] = {"BF16", {1, c_.d + c_.r}};
        if (!c_.v41) HcHead(p);
      }
    }
    for (size_t i = 0; i < c_.engram.size(); ++i) {
      const std::string p = absl::StrCat("layers.", c_.engram[i], ".engram.");
      t_[p + "embed.weight"] = {"F8_E4M3", {c_.engram_rows[i], 256}};
      t_[p + "embed.scale"] = {"F8_E8M0", {c_.engram_rows[i], 8}};
      t_[p + "wkv.weight"] = {"F8_E4M3", {5 * c_.d, int64_t{24} * 256}};
      t_[p + "wkv.scale"] = {"F8_E8M0", {5 * c_.d / 32, 24 * 256 / 32}};
      t_[p + "q_weight"] = {"BF16", {4, c_.d}};
      t_[p + "k_weight"] = {"BF16", {4, c_.d}};
    }
    return t_;
  }

 private:
  void Fp8(const std::string& p, int64_t out, int64_t in) {
    t_[p + ".weight"] = {"F8_E4M3", {out, in}};
    t_[p + ".scale"] = {"F8_E8M0", {Up(out, c_.block), Up(in, c_.block)}};
  }
  void Fp4(const std::string& p, int64_t out, int64_t in) {
    t_[p + ".weight"] = {"I8", {out, in / 2}};
    t_[p + ".scale"] = {"F8_E8M0", {out, in / 32}};
  }
  void HcHead(const std::string& p) {
    t_[p + "hc_head_fn"] = {"F32", {4, 4 * c_.d}};
    t_[p + "hc_head_base"] = {"F32", {4}};
    t_[p + "hc_head_scale"] = {"F32", {1}};
  }
  // layer < 0: an MTP / DSpark stage.
  void Layer(const std::string& p, int layer, int m, int64_t experts,
             bool main) {
    const int64_t d = c_.d;
    for (const char* n : {"attn_norm", "ffn_norm"}) {
      t_[p + n + ".weight"] = {"BF16", {d}};
    }
    for (const char* n : {"hc_attn", "hc_ffn"}) {
      t_[p + n + "_fn"] = {"F32", {24, 4 * d}};
      t_[p + n + "_base"] = {"F32", {24}};
      t_[p + n + "_scale"] = {"F32", {3}};
    }
    const std::string a = p + "attn.";
    t_[a + "attn_sink"] = {"F32", {c_.nh}};
    Fp8(a + "wq_a", c_.q_lora, d);
    t_[a + "q_norm.weight"] = {"BF16", {c_.q_lora}};
    Fp8(a + "wq_b", c_.nh * c_.D, c_.q_lora);
    Fp8(a + "wkv", c_.D, d);
    t_[a + "kv_norm.weight"] = {"BF16", {c_.D}};
    Fp8(a + "wo_a", c_.G * c_.R, c_.nh * c_.D / c_.G);
    Fp8(a + "wo_b", d, c_.G * c_.R);
    if (c_.v41 && main) {
      if (c_.kv_src.count(layer)) {
        t_[a + "compressor.wkv.weight"] = {"BF16", {c_.D, d}};
        if (m == 2) t_[a + "compressor.wgate.weight"] = {"BF16", {c_.D, d}};
        t_[a + "compressor.norm.weight"] = {"BF16", {c_.D}};
      }
      if (c_.idx_src.count(layer)) {
        Fp8(a + "indexer.wq_b", c_.n_I * c_.d_I, c_.q_lora);
        t_[a + "indexer.weights_proj.weight"] = {"BF16", {c_.n_I, d}};
        if (c_.kv_src.count(layer)) {
          t_[a + "indexer.wk.weight"] = {"BF16", {c_.d_I, c_.D}};
          t_[a + "indexer.k_norm.weight"] = {"BF16", {c_.d_I}};
        }
      }
    } else if (!c_.v41 && m > 0) {
      const int64_t cc = m == 4 ? 2 : 1;
      t_[a + "compressor.ape"] = {"F32", {m, cc * c_.D}};
      t_[a + "compressor.wkv.weight"] = {"BF16", {cc * c_.D, d}};
      t_[a + "compressor.wgate.weight"] = {"BF16", {cc * c_.D, d}};
      t_[a + "compressor.norm.weight"] = {"BF16", {c_.D}};
      if (m == 4) {
        Fp8(a + "indexer.wq_b", c_.n_I * c_.d_I, c_.q_lora);
        t_[a + "indexer.weights_proj.weight"] = {"BF16", {c_.n_I, d}};
        t_[a + "indexer.compressor.ape"] = {"F32", {4, 2 * c_.d_I}};
        t_[a + "indexer.compressor.wkv.weight"] = {"BF16", {2 * c_.d_I, d}};
        t_[a + "indexer.compressor.wgate.weight"] = {"BF16", {2 * c_.d_I, d}};
        t_[a + "indexer.compressor.norm.weight"] = {"BF16", {c_.d_I}};
      }
    }
    const std::string f = p + "ffn.";
    t_[f + "gate.weight"] = {"BF16", {experts, d}};
    if (main && layer < c_.hash) {
      t_[f + "gate.tid2eid"] = {"I64", {c_.V, 6}};
    } else {
      t_[f + "gate.bias"] = {"F32", {experts}};
      if (c_.v41) t_[f + "gate.bias_vl"] = {"F32", {experts}};
    }
    for (int64_t e = 0; e < experts; ++e) {
      const std::string x = absl::StrCat(f, "experts.", e, ".");
      Fp4(x + "w1", c_.I, d);
      Fp4(x + "w2", d, c_.I);
      Fp4(x + "w3", c_.I, d);
    }
    Fp8(f + "shared_experts.w1", c_.I, d);
    Fp8(f + "shared_experts.w2", d, c_.I);
    Fp8(f + "shared_experts.w3", c_.I, d);
  }

  const Doc& c_;
  Table t_;
};

// --- Reading what was written ---

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadAll(path));
}

struct Shard {
  nlohmann::json header;
  uint64_t data_start = 0;
};

Shard ReadHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string json(n, '\0');
  in.read(json.data(), static_cast<std::streamsize>(n));
  return {nlohmann::json::parse(json), 8 + n};
}

struct Written {
  Table table;
  std::map<std::string, std::string> shard_of;
  uint64_t data_bytes = 0;
  uint64_t allocated = 0;  // st_blocks * 512 over the shards
  int shards = 0;
};

// Reads every shard's header; checks the offsets tile the data region and
// the file size; the index maps exactly the headers' tensors.
Written ReadCheckpoint(const std::string& dir) {
  Written w;
  const nlohmann::json index = ReadJson(dir + "/model.safetensors.index.json");
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) {
    files.insert(file.get<std::string>());
  }
  for (const std::string& file : files) {
    const std::string path = absl::StrCat(dir, "/", file);
    const Shard shard = ReadHeader(path);
    ++w.shards;
    uint64_t end = 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& [name, v] : shard.header.items()) {
      if (name == "__metadata__") continue;
      EXPECT_EQ(w.table.count(name), 0u) << name << " in two shards";
      w.table[name] = {v["dtype"], v["shape"].get<Shape>()};
      w.shard_of[name] = file;
      EXPECT_EQ(index["weight_map"].value(name, ""), file) << name;
      ranges.emplace_back(v["data_offsets"][0], v["data_offsets"][1]);
    }
    std::sort(ranges.begin(), ranges.end());
    for (const auto& [a, b] : ranges) {
      EXPECT_EQ(a, end) << file;
      end = b;
    }
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), shard.data_start + end)
        << file;
    w.allocated += static_cast<uint64_t>(st.st_blocks) * 512;
    w.data_bytes += end;
  }
  EXPECT_EQ(index["weight_map"].size(), w.table.size());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), w.data_bytes);
  return w;
}

uint64_t ElementSize(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16") return 2;
  if (dtype == "I64") return 8;
  return 1;
}

void ExpectTable(const Written& got, const Table& want) {
  for (const auto& [name, w] : want) {
    auto it = got.table.find(name);
    if (it == got.table.end()) {
      ADD_FAILURE() << "missing " << name << " " << Show(w);
      continue;
    }
    EXPECT_EQ(it->second, w)
        << name << ": got " << Show(it->second) << ", want " << Show(w);
  }
  for (const auto& [name, w] : got.table) {
    EXPECT_TRUE(want.count(name)) << "unexpected " << name << " " << Show(w);
  }
  uint64_t bytes = 0;
  for (const auto& [name, w] : want) {
    uint64_t n = ElementSize(w.dtype);
    for (int64_t d : w.shape) n *= static_cast<uint64_t>(d);
    bytes += n;
  }
  EXPECT_EQ(got.data_bytes, bytes);
}

// The raw bytes of tensor `name` of a checkpoint.
std::string TensorBytes(const std::string& dir, const std::string& file,
                        const std::string& name) {
  const Shard shard = ReadHeader(dir + "/" + file);
  const auto& v = shard.header.at(name);
  const uint64_t a = v["data_offsets"][0];
  const uint64_t b = v["data_offsets"][1];
  return ReadAll(dir + "/" + file).substr(shard.data_start + a, b - a);
}

std::string Make(const std::string& name, ReleaseArch arch, bool full,
                 uint64_t seed = 0) {
  std::string dir = mneme::testing::MakeTempDir(name) + "/ckpt";
  const absl::Status status = MakeReleaseCheckpoint({.out_dir = dir,
                                                     .arch = arch,
                                                     .seed = seed,
                                                     .full_shapes = full,
                                                     .engram_vocab_size = 100,
                                                     .threads = 2});
  EXPECT_TRUE(status.ok()) << status;
  return dir;
}

std::vector<int64_t> EngramRows(const nlohmann::json& text_config) {
  return text_config["engram_num_embeddings"].get<std::vector<int64_t>>();
}

// The 82 key patterns of the released V4-Flash model.safetensors.index.json
// (layer, expert and w1..w3 numbers replaced by 0), as MODEL_V4.md [HD]
// cites them.
std::set<std::string> V4FlashKeyPatterns() {
  std::set<std::string> p = {"embed.weight",  "hc_head_base", "hc_head_fn",
                             "hc_head_scale", "head.weight",  "norm.weight"};
  const char* block[] = {"attn.attn_sink",
                         "attn.kv_norm.weight",
                         "attn.q_norm.weight",
                         "attn.wkv.scale",
                         "attn.wkv.weight",
                         "attn.wo_a.scale",
                         "attn.wo_a.weight",
                         "attn.wo_b.scale",
                         "attn.wo_b.weight",
                         "attn.wq_a.scale",
                         "attn.wq_a.weight",
                         "attn.wq_b.scale",
                         "attn.wq_b.weight",
                         "attn_norm.weight",
                         "ffn.experts.0.w0.scale",
                         "ffn.experts.0.w0.weight",
                         "ffn.gate.bias",
                         "ffn.gate.weight",
                         "ffn.shared_experts.w0.scale",
                         "ffn.shared_experts.w0.weight",
                         "ffn_norm.weight",
                         "hc_attn_base",
                         "hc_attn_fn",
                         "hc_attn_scale",
                         "hc_ffn_base",
                         "hc_ffn_fn",
                         "hc_ffn_scale"};
  for (const char* b : block) {
    p.insert(absl::StrCat("layers.0.", b));
    p.insert(absl::StrCat("mtp.0.", b));
  }
  for (const char* b :
       {"attn.compressor.ape", "attn.compressor.norm.weight",
        "attn.compressor.wgate.weight", "attn.compressor.wkv.weight",
        "attn.indexer.compressor.ape", "attn.indexer.compressor.norm.weight",
        "attn.indexer.compressor.wgate.weight",
        "attn.indexer.compressor.wkv.weight",
        "attn.indexer.weights_proj.weight", "attn.indexer.wq_b.scale",
        "attn.indexer.wq_b.weight", "ffn.gate.tid2eid"}) {
    p.insert(absl::StrCat("layers.0.", b));
  }
  for (const char* b :
       {"e_proj.scale", "e_proj.weight", "enorm.weight", "h_proj.scale",
        "h_proj.weight", "hc_head_base", "hc_head_fn", "hc_head_scale",
        "hnorm.weight", "norm.weight"}) {
    p.insert(absl::StrCat("mtp.0.", b));
  }
  return p;
}

std::set<std::string> KeyPatterns(const Written& got) {
  std::set<std::string> out;
  for (const auto& [name, w] : got.table) {
    std::string p;
    for (size_t i = 0; i < name.size(); ++i) {
      // A number that is a whole dotted component, or follows "w" (w1..w3);
      // "tid2eid" stays as it is.
      if (std::isdigit(static_cast<unsigned char>(name[i])) && i > 0 &&
          (name[i - 1] == '.' || name[i - 1] == 'w')) {
        p += '0';
        while (i + 1 < name.size() &&
               std::isdigit(static_cast<unsigned char>(name[i + 1]))) {
          ++i;
        }
      } else {
        p += name[i];
      }
    }
    out.insert(p);
  }
  return out;
}

// --- Tiny models ---

TEST(ReleaseCheckpointTest, TinyV4FlashHasEveryReleasedTensor) {
  const std::string dir = Make("v4", ReleaseArch::kV4Flash, false);
  const Written got = ReadCheckpoint(dir);
  const Table want = TableBuilder(TinyV4(SyntheticVocabSize())).Build();
  EXPECT_EQ(want.size(), 792u);  // MODEL_V4.md §2: 792 tensors
  ExpectTable(got, want);
  const std::set<std::string> patterns = V4FlashKeyPatterns();
  EXPECT_EQ(patterns.size(), 82u);
  EXPECT_EQ(KeyPatterns(got), patterns);
  const nlohmann::json c = ReadJson(dir + "/config.json");
  EXPECT_EQ(c["model_type"], "deepseek_v4");
  EXPECT_EQ(c["architectures"][0], "DeepseekV4ForCausalLM");
  EXPECT_EQ(c["vocab_size"], SyntheticVocabSize());
  EXPECT_EQ(c["hidden_size"], 256);
  EXPECT_EQ(c["num_hidden_layers"], 5);
  EXPECT_EQ(c["compress_ratios"], (std::vector<int>{0, 0, 4, 128, 4, 0}));
  EXPECT_EQ(c["num_hash_layers"], 3);
  EXPECT_EQ(c["num_nextn_predict_layers"], 1);
  EXPECT_EQ(c["index_topk"], 16);
  EXPECT_EQ(c["o_lora_rank"], 128);
  EXPECT_EQ(c["scoring_func"], "sqrtsoftplus");
  EXPECT_EQ(c["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(c["quantization_config"]["weight_block_size"],
            (std::vector<int>{128, 128}));
  EXPECT_EQ(c["expert_dtype"], "fp4");
  EXPECT_FALSE(c.contains("text_config"));
  // An m = 4 indexer sees 300 / 4 = 75 entries at 300 tokens: it drops some.
  EXPECT_LT(c["index_topk"].get<int>(), 300 / 4);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;
  }
}

TEST(ReleaseCheckpointTest, TinyV4FlashValuesAreHealthy) {
  const std::string dir = Make("v4vals", ReleaseArch::kV4Flash, false, 5);
  const Written got = ReadCheckpoint(dir);
  // tid2eid: 6 distinct experts in [0, 16) per row.
  const std::string name = "layers.1.ffn.gate.tid2eid";
  const std::string t = TensorBytes(dir, got.shard_of.at(name), name);
  ASSERT_EQ(t.size(), static_cast<size_t>(SyntheticVocabSize()) * 6 * 8);
  std::set<int64_t> seen;
  for (int64_t row = 0; row < SyntheticVocabSize(); ++row) {
    std::set<int64_t> ids;
    for (int j = 0; j < 6; ++j) {
      int64_t id = 0;
      std::memcpy(&id, t.data() + (row * 6 + j) * 8, 8);
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 16);
      ids.insert(id);
      seen.insert(id);
    }
    EXPECT_EQ(ids.size(), 6u) << "row " << row;
  }
  EXPECT_EQ(seen.size(), 16u);
  // FP8 block scales: one per 128 x 128 block, near 2^-13 for N(0, 1/256)
  // weights (amax ~ 0.2 -> 0.2 / 448 ~ 2^-11).
  const std::string s =
      TensorBytes(dir, got.shard_of.at("layers.0.attn.wq_a.scale"),
                  "layers.0.attn.wq_a.scale");
  ASSERT_EQ(s.size(), 2u);
  for (char c : s) {
    EXPECT_GE(static_cast<uint8_t>(c), 127 - 14);
    EXPECT_LE(static_cast<uint8_t>(c), 127 - 8);
  }
  // Experts e = 3 (mod 8) have larger w1 scales than their neighbours.
  auto mean_exponent = [&](const std::string& n) {
    const std::string b = TensorBytes(dir, got.shard_of.at(n), n);
    double sum = 0;
    for (char c : b) sum += static_cast<uint8_t>(c);
    return sum / b.size();
  };
  EXPECT_NEAR(mean_exponent("layers.3.ffn.experts.3.w1.scale") -
                  mean_exponent("layers.3.ffn.experts.2.w1.scale"),
              2.0, 0.3);
  // Deterministic per seed; another seed differs.
  const std::string again = Make("v4again", ReleaseArch::kV4Flash, false, 5);
  const std::string other = Make("v4other", ReleaseArch::kV4Flash, false, 6);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename();
    if (f == "config.json") continue;
    EXPECT_EQ(ReadAll(absl::StrCat(dir, "/", f)),
              ReadAll(absl::StrCat(again, "/", f)))
        << f;
    if (f.rfind("model-", 0) == 0) {
      EXPECT_NE(ReadAll(absl::StrCat(dir, "/", f)),
                ReadAll(absl::StrCat(other, "/", f)))
          << f;
    }
  }
}

TEST(ReleaseCheckpointTest, TinyV41FlashHasEveryReleasedTensor) {
  const std::string dir = Make("v41", ReleaseArch::kV41Flash, false, 3);
  const Written got = ReadCheckpoint(dir);
  const nlohmann::json c = ReadJson(dir + "/config.json");
  const nlohmann::json& t = c["text_config"];
  const Table want =
      TableBuilder(TinyV41(SyntheticVocabSize(), EngramRows(t))).Build();
  ExpectTable(got, want);
  EXPECT_EQ(c["model_type"], "deepseek_v41");
  EXPECT_EQ(c["architectures"][0], "DeepseekV41ForCausalLM");
  EXPECT_EQ(c["quantization_config"]["weight_block_size"],
            (std::vector<int>{32, 32}));
  EXPECT_EQ(c["quantization_config"]["expert_dtype"], "fp4");
  EXPECT_EQ(t["compress_ratios"],
            (std::vector<int>{0, 0, 2, 2, 2, 2, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(t["kv_source_layer_ids"], (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(t["index_source_layer_ids"], (std::vector<int>{2, 4, 6, 8}));
  EXPECT_EQ(t["candidate_source_layer_id"], 6);
  EXPECT_EQ(t["rms_norm_eps"], 1e-20);
  EXPECT_EQ(t["num_nextn_predict_layers"], 3);
  EXPECT_EQ(t["dspark_target_layer_ids"], (std::vector<int>{6, 7, 8}));
  EXPECT_EQ(t["dspark_n_routed_experts"], 8);
  EXPECT_EQ(t["engram_layer_ids"], (std::vector<int>{1, 3}));
  EXPECT_EQ(t["vocab_size"], SyntheticVocabSize());
  EXPECT_LT(t["dspark_noise_token_id"].get<int64_t>(), SyntheticVocabSize());
  // Ratio-2 sources see 150 entries at 300 tokens, index_topk 16 drops most;
  // level 1 keeps (8 - 1) x 4 + 1 >= 16 candidates.
  EXPECT_LT(t["index_topk"].get<int>(), 300 / 2);
  EXPECT_GE((t["candidate_topk_blocks"].get<int>() - 1) *
                    t["candidate_block_size"].get<int>() +
                1,
            t["index_topk"].get<int>());

  // The Engram tensors are byte for byte those of the existing maker.
  SyntheticCheckpointOptions o;
  o.out_dir = mneme::testing::MakeTempDir("v41engram") + "/ckpt";
  o.seed = 3;
  o.engram_vocab_size = 100;
  o.hidden_size = 256;
  o.num_hidden_layers = 9;
  o.engram_layer_ids = {1, 3};
  o.threads = 2;
  ASSERT_TRUE(MakeSyntheticCheckpoint(o).ok());
  const nlohmann::json old_index =
      ReadJson(o.out_dir + "/model.safetensors.index.json");
  EXPECT_EQ(ReadJson(o.out_dir +
                     "/config.json")["text_config"]["engram_num_embeddings"],
            t["engram_num_embeddings"]);
  for (const auto& [name, file] : old_index["weight_map"].items()) {
    EXPECT_EQ(TensorBytes(dir, got.shard_of.at(name), name),
              TensorBytes(o.out_dir, file.get<std::string>(), name))
        << name;
  }
}

TEST(ReleaseCheckpointTest, TinyV4Flash0731HasDsparkStages) {
  const std::string dir = Make("0731", ReleaseArch::kV4Flash0731, false);
  const Written got = ReadCheckpoint(dir);
  ExpectTable(got, TableBuilder(Tiny0731(SyntheticVocabSize())).Build());
  const nlohmann::json c = ReadJson(dir + "/config.json");
  EXPECT_EQ(c["model_type"], "deepseek_v4");
  EXPECT_EQ(c["compress_ratios"], (std::vector<int>{0, 0, 4, 128, 4, 0, 0, 0}));
  EXPECT_EQ(c["dspark_target_layer_ids"], (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(c["dspark_markov_rank"], 32);
  EXPECT_EQ(c["dspark_block_size"], 5);
}

// --- Full shapes ---

void ExpectSparse(const Written& got) {
  // Headers only: a few MB at most are allocated for tens or hundreds of GB.
  EXPECT_LT(got.allocated, uint64_t{64} << 20);
  EXPECT_GT(got.data_bytes, uint64_t{100} << 30);
}

TEST(ReleaseCheckpointTest, FullShapesV4Flash) {
  const std::string dir = Make("fullv4", ReleaseArch::kV4Flash, true);
  const Written got = ReadCheckpoint(dir);
  ExpectTable(got, TableBuilder(FullV4()).Build());
  ExpectSparse(got);
  EXPECT_EQ(KeyPatterns(got), V4FlashKeyPatterns());
  const nlohmann::json c = ReadJson(dir + "/config.json");
  EXPECT_EQ(c["vocab_size"], 129280);
  EXPECT_EQ(c["n_routed_experts"], 256);
  EXPECT_EQ(c["compress_ratios"].size(), 44u);
  EXPECT_EQ(got.table.at("layers.0.ffn.gate.tid2eid"),
            (Want{"I64", {129280, 6}}));
  EXPECT_EQ(got.table.at("mtp.0.e_proj.weight"),
            (Want{"F8_E4M3", {4096, 4096}}));
}

TEST(ReleaseCheckpointTest, FullShapes0731MatchesTheReleasedHeaders) {
  const std::string dir = Make("full0731", ReleaseArch::kV4Flash0731, true);
  const Written got = ReadCheckpoint(dir);
  ExpectTable(got, TableBuilder(Full0731()).Build());
  ExpectSparse(got);
  // The released 0731 checkpoint: 45,821 tensors, 107,803,320,952 bytes.
  EXPECT_EQ(got.table.size(), 45821u);
  EXPECT_EQ(got.data_bytes, 107803320952u);
  // A few entries copied from the released headers.
  EXPECT_EQ(got.table.at("mtp.0.main_proj.scale"), (Want{"F8_E8M0", {32, 96}}));
  EXPECT_EQ(got.table.at("mtp.2.confidence_head.proj.weight"),
            (Want{"BF16", {1, 4352}}));
  EXPECT_EQ(got.table.at("layers.3.attn.compressor.ape"),
            (Want{"F32", {128, 512}}));
  const nlohmann::json c = ReadJson(dir + "/config.json");
  EXPECT_EQ(c["n_routed_experts"], 160);
  EXPECT_EQ(c["compress_ratios"].size(), 46u);
  EXPECT_EQ(c["dspark_target_layer_ids"], (std::vector<int>{40, 41, 42}));
  EXPECT_EQ(c["dspark_noise_token_id"], 128799);
}

TEST(ReleaseCheckpointTest, FullShapesV41Flash) {
  const std::string dir = Make("fullv41", ReleaseArch::kV41Flash, true);
  const Written got = ReadCheckpoint(dir);
  ExpectTable(got, TableBuilder(FullV41()).Build());
  ExpectSparse(got);
  const nlohmann::json t = ReadJson(dir + "/config.json")["text_config"];
  EXPECT_EQ(t["engram_num_embeddings"],
            (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(t["engram_compressed_vocab_size"], 99092);
  EXPECT_EQ(t["compress_ratios"].size(), 43u);
  EXPECT_EQ(t["n_routed_experts"], 384);
  EXPECT_EQ(got.table.at("layers.14.engram.embed.weight"),
            (Want{"F8_E4M3", {384016682, 256}}));
  EXPECT_EQ(got.table.at("layers.2.attn.indexer.wq_b.weight"),
            (Want{"F8_E4M3", {4096, 1280}}));
  // MODEL_V41.md §1.7: the release has 96,085 tensors.
  EXPECT_EQ(got.table.size(), 96085u);
  EXPECT_EQ(got.table.at("aligner.w1.weight"), (Want{"BF16", {5120, 9216}}));
  EXPECT_EQ(got.table.at("vision.blocks.31.mlp.w1.weight"),
            (Want{"BF16", {5632, 1024}}));
  EXPECT_LE(got.shards, 64);
}

// --- Errors ---

TEST(ReleaseCheckpointTest, BadOptionsAreClearErrors) {
  EXPECT_EQ(ParseReleaseArch("v5").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ParseReleaseArch("v5").status().message().find("v4.1-flash"),
            std::string::npos);
  for (ReleaseArch a : {ReleaseArch::kV4Flash, ReleaseArch::kV41Flash,
                        ReleaseArch::kV4Flash0731}) {
    EXPECT_EQ(*ParseReleaseArch(ReleaseArchName(a)), a);
  }
  EXPECT_EQ(MakeReleaseCheckpoint({}).code(),
            absl::StatusCode::kInvalidArgument);
  const std::string dir = mneme::testing::MakeTempDir("bad");
  EXPECT_EQ(
      MakeReleaseCheckpoint({.out_dir = dir + "/x", .engram_vocab_size = 5})
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MakeReleaseCheckpoint({.out_dir = dir + "/x", .threads = -1}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeReleaseCheckpoint(
                {.out_dir = dir + "/x", .arch = static_cast<ReleaseArch>(7)})
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::ofstream(dir + "/file") << "x";
  EXPECT_EQ(MakeReleaseCheckpoint({.out_dir = dir}).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mneme::synthetic
