#include "tests/engram_store/hashing/test_tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mneme::engram::testing {
namespace {

std::string Utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else {  // The byte-level alphabet stays below U+0800.
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return out;
}

}  // namespace

std::string ByteLevelSpelling(absl::string_view bytes) {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<char32_t> table(256, 0);
  for (int b : bs) table[b] = static_cast<char32_t>(b);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    if (table[b] == 0) table[b] = next++;
  }
  std::string out;
  for (char c : bytes) out += Utf8(table[static_cast<uint8_t>(c)]);
  return out;
}

std::string MakeTokenizerJson(const std::vector<std::string>& vocab,
                              const std::vector<AddedToken>& added,
                              const std::vector<int64_t>& vocab_ids) {
  nlohmann::json vocab_json = nlohmann::json::object();
  for (size_t i = 0; i < vocab.size(); ++i) {
    vocab_json[vocab[i]] =
        vocab_ids.empty() ? static_cast<int64_t>(i) : vocab_ids[i];
  }
  nlohmann::json added_json = nlohmann::json::array();
  for (const AddedToken& token : added) {
    added_json.push_back({{"id", token.id},
                          {"content", token.content},
                          {"single_word", false},
                          {"lstrip", false},
                          {"rstrip", false},
                          {"normalized", !token.special},
                          {"special", token.special}});
  }
  nlohmann::json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added_json},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"vocab", vocab_json},
        {"merges", nlohmann::json::array()}}},
  };
  return root.dump();
}

}  // namespace mneme::engram::testing
