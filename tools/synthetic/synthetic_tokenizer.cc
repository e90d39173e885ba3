#include "tools/synthetic/synthetic_tokenizer.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "text/byte_level.h"

namespace mneme::synthetic {
namespace {

// Words (UTF-8, a leading ' ' is part of the token as in byte-level BPE).
// Each becomes a token, together with every prefix (its merge chain), so
// multi-byte characters also appear split across tokens.
constexpr const char* kWords[] = {
    // Frequent English words, for realistic token streams.
    " the",
    " of",
    " and",
    " a",
    " to",
    " in",
    " is",
    " that",
    " for",
    " it",
    " with",
    " as",
    " was",
    " on",
    " be",
    " by",
    " this",
    " are",
    " from",
    " at",
    " or",
    " an",
    " which",
    " not",
    " have",
    " memory",
    " model",
    " token",
    " tokens",
    " table",
    " row",
    " rows",
    " layer",
    " serve",
    " cluster",
    " disk",
    " cache",
    " hash",
    " expert",
    " experts",
    " attention",
    "The",
    "In",
    "It",
    "This",
    ".",
    ",",
    ":",
    ";",
    "!",
    "?",
    "'s",
    " (",
    ")",
    // Case and spacing variants that normalise together.
    "Hello",
    "hello",
    "HELLO",
    " Hello",
    " hello",
    " HELLO",
    "hello ",
    // Accents (dropped after NFD).
    "café",
    "cafe",
    "Café",
    " café",
    "naïve",
    "naive",
    "résumé",
    "resume",
    "Ångström",
    "angstrom",
    "São",
    "Zürich",
    "zurich",
    // Compatibility forms (NFKC): full-width, ligatures, superscripts.
    "ＡＢＣ",
    "abc",
    "ＡＢ",
    "１２３",
    "ﬁ",
    "fi",
    "ﬂow",
    "flow",
    "x²",
    "x2",
    "№",
    "™",
    // Whitespace-only tokens.
    " ",
    "  ",
    "    ",
    "\n",
    "\n\n",
    "\t",
    " \t",
    "\r\n",
    " \n",
    // Case mapping beyond ASCII.
    "ΣΟΦΟΣ",
    "σοφος",
    "Straße",
    "STRASSE",
    "İstanbul",
    "istanbul",
    // CJK, emoji and other multi-byte text.
    "中文",
    "中",
    "文",
    "日本語",
    "こんにちは",
    "한국어",
    "🙂",
    "👍🏽",
    "émoji",
    // Code.
    "def",
    " return",
    "():",
    " {",
    "}",
    "    return",
    "==",
    "->",
    "#include",
    " std",
    "::",
    "0x",
    "123",
    "2026",
    "1.5",
};

std::string Spell(const std::string& bytes) {
  std::u32string chars;
  for (unsigned char b : bytes) chars.push_back(text::ByteLevelCharOfByte(b));
  return text::EncodeUtf8(chars);
}

struct Vocabulary {
  std::vector<std::pair<std::string, int64_t>> added;  // content, id
  std::map<std::string, int64_t> vocab;                // byte-level spelling
  std::vector<std::string> merges;
  int64_t next_id = 0;

  int64_t Add(const std::string& token) {
    auto [it, inserted] = vocab.emplace(token, next_id);
    if (inserted) ++next_id;
    return it->second;
  }
};

Vocabulary BuildVocabulary() {
  Vocabulary v;
  const std::pair<const char*, int64_t> specials[] = {
      {"<｜begin▁of▁sentence｜>", kBosTokenId},
      {"<｜end▁of▁sentence｜>", kEosTokenId},
      {"<｜▁pad▁｜>", kPadTokenId},
  };
  for (const auto& [content, id] : specials) {
    v.added.emplace_back(content, id);
    v.Add(content);
  }
  for (int b = 0; b < 256; ++b)
    v.Add(Spell(std::string(1, static_cast<char>(b))));
  for (const char* word : kWords) {
    const std::string bytes = word;
    std::string prefix = bytes.substr(0, 1);
    for (size_t i = 1; i < bytes.size(); ++i) {
      const std::string next = bytes.substr(i, 1);
      const std::string merged = prefix + next;
      if (v.vocab.count(Spell(merged)) == 0) {
        v.merges.push_back(Spell(prefix) + " " + Spell(next));
        v.Add(Spell(merged));
      }
      prefix = merged;
    }
  }
  return v;
}

}  // namespace

std::string SyntheticTokenizerJson() {
  const Vocabulary v = BuildVocabulary();
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const auto& [content, id] : v.added) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  std::vector<std::pair<int64_t, std::string>> by_id;
  for (const auto& [token, id] : v.vocab) by_id.emplace_back(id, token);
  std::sort(by_id.begin(), by_id.end());
  for (const auto& [id, token] : by_id) vocab[token] = id;

  nlohmann::ordered_json split_regex = {
      {"type", "Split"},
      {"pattern",
       {{"Regex",
         "[\\r\\n]|\\s?[A-Za-z\\p{L}\\p{M}]+|\\s?\\p{N}{1,3}|"
         "\\s?[^\\s\\p{L}\\p{M}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
      {"behavior", "Isolated"},
      {"invert", false}};
  nlohmann::ordered_json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {split_regex,
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
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
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", v.merges}}},
  };
  return tokenizer.dump(1) + "\n";
}

int64_t SyntheticVocabSize() { return BuildVocabulary().next_id; }

}  // namespace mneme::synthetic
