#include "text/pretokenizer.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "text/byte_level.h"
#include "text/tokenizer_json.h"
#include "text/unicode_regex.h"

namespace mneme::text {
namespace {

// The GPT-2 split that ByteLevel applies when use_regex is set.
constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

enum class Behavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

struct Segment {
  ByteRange range;
  bool is_match = false;
};

// Hugging Face's SplitDelimiterBehavior applied to a segmentation of the text
// into matches and non-matches: the ranges to keep, in order.
std::vector<ByteRange> ApplyBehavior(const std::vector<Segment>& segments,
                                     Behavior behavior) {
  std::vector<ByteRange> out;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Segment& s : segments) out.push_back(s.range);
      break;
    case Behavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) out.push_back(s.range);
      }
      break;
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.range.end;
        } else {
          out.push_back(s.range);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.range.end;
        } else {
          out.push_back(s.range);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->range.begin;
        } else {
          out.push_back(it->range);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

std::vector<ByteRange> FindLiteral(absl::string_view text,
                                   absl::string_view literal) {
  std::vector<ByteRange> matches;
  if (literal.empty()) return matches;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(literal, pos);
    if (hit == absl::string_view::npos) break;
    matches.push_back({hit, hit + literal.size()});
    pos = hit + literal.size();
  }
  return matches;
}

std::string SpellBytes(absl::string_view bytes) {
  std::u32string chars;
  chars.reserve(bytes.size());
  for (unsigned char b : bytes) {
    chars.push_back(text::ByteLevelCharOfByte(b));
  }
  return text::EncodeUtf8(chars);
}

}  // namespace

struct PreTokenizer::Step {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  // kSplit: the regex, or the literal when `regex` is null; kByteLevel with
  // use_regex: the GPT-2 regex.
  std::unique_ptr<UnicodeRegex> regex;
  std::string literal;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;

  // The segmentation of `text` into matches and the text between them, as
  // Hugging Face's Pattern::find_matches (with invert applied).
  // `matcher` is a matcher of `regex` (null when there is none).
  absl::StatusOr<std::vector<Segment>> Segments(
      absl::string_view text, UnicodeRegex::Matcher* matcher) const {
    std::vector<ByteRange> matches;
    if (matcher != nullptr) {
      if (absl::Status status = matcher->FindAll(text, &matches);
          !status.ok()) {
        return status;
      }
    } else {
      matches = FindLiteral(text, literal);
    }
    std::vector<Segment> segments;
    if (text.empty()) {
      segments.push_back({{0, 0}, false});
    } else {
      size_t previous = 0;
      for (const ByteRange& m : matches) {
        if (previous != m.begin) {
          segments.push_back({{previous, m.begin}, false});
        }
        segments.push_back({m, true});
        previous = m.end;
      }
      if (previous != text.size()) {
        segments.push_back({{previous, text.size()}, false});
      }
    }
    if (invert) {
      for (Segment& s : segments) s.is_match = !s.is_match;
    }
    return segments;
  }

  absl::Status Apply(const std::string& piece, UnicodeRegex::Matcher* matcher,
                     std::vector<std::string>* out) const {
    if (kind == Kind::kByteLevel) {
      const std::string text = add_prefix_space && piece[0] != ' '
                                   ? absl::StrCat(" ", piece)
                                   : piece;
      if (regex == nullptr) {
        if (!text.empty()) out->push_back(SpellBytes(text));
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(std::vector<Segment> segments, Segments(text, matcher));
      for (const Segment& s : segments) {
        if (s.range.end > s.range.begin) {
          out->push_back(SpellBytes(absl::string_view(text).substr(
              s.range.begin, s.range.end - s.range.begin)));
        }
      }
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<Segment> segments, Segments(piece, matcher));
    for (const ByteRange& r : ApplyBehavior(segments, behavior)) {
      if (r.end > r.begin)
        out->push_back(piece.substr(r.begin, r.end - r.begin));
    }
    return absl::OkStatus();
  }
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(
    const nlohmann::json& spec) {
  auto pre_tokenizer = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  if (spec.is_null()) return pre_tokenizer;
  RETURN_IF_ERROR(pre_tokenizer->AddSteps(spec, /*depth=*/0));
  return pre_tokenizer;
}

absl::Status PreTokenizer::AddSteps(const nlohmann::json& spec, int depth) {
  ASSIGN_OR_RETURN(std::string type, TypeOf(spec, "pre_tokenizer"));
  ASSIGN_OR_RETURN(
      bool sequence,
      ExpandSequence(spec, type, "pretokenizers", "pre_tokenizer", depth,
                     [this](const nlohmann::json& member, int member_depth) {
                       return AddSteps(member, member_depth);
                     }));
  if (sequence) return absl::OkStatus();
  Step step;
  if (type == "Split") {
    ASSIGN_OR_RETURN(Pattern pattern, PatternOf(spec, "pre_tokenizer Split"));
    if (pattern.is_regex) {
      absl::StatusOr<std::unique_ptr<UnicodeRegex>> regex =
          UnicodeRegex::Create(pattern.text);
      if (!regex.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pre_tokenizer Split: ", regex.status().message()));
      }
      step.regex = *std::move(regex);
    } else {
      step.literal = pattern.text;
    }
    ASSIGN_OR_RETURN(std::string behavior,
                     StringField(spec, "behavior", "pre_tokenizer Split"));
    if (behavior == "Removed") {
      step.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = Behavior::kContiguous;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "pre_tokenizer Split: unknown behavior \"", behavior, "\""));
    }
    ASSIGN_OR_RETURN(bool invert,
                     BoolField(spec, "invert", false, "pre_tokenizer Split"));
    step.invert = invert;
  } else if (type == "ByteLevel") {
    step.kind = Step::Kind::kByteLevel;
    ASSIGN_OR_RETURN(
        step.add_prefix_space,
        BoolField(spec, "add_prefix_space", true, "pre_tokenizer ByteLevel"));
    ASSIGN_OR_RETURN(
        const bool use_regex,
        BoolField(spec, "use_regex", true, "pre_tokenizer ByteLevel"));
    if (use_regex) {
      ASSIGN_OR_RETURN(std::unique_ptr<UnicodeRegex> regex,
                       UnicodeRegex::Create(kGpt2Pattern));
      step.regex = std::move(regex);
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported pre_tokenizer type \"", type,
                     "\" (supported: Split, ByteLevel, Sequence)"));
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status PreTokenizer::PreTokenize(absl::string_view text,
                                       std::vector<std::string>* pieces) const {
  if (text.empty()) return absl::OkStatus();
  std::vector<std::string> current;
  current.emplace_back(text);
  std::vector<std::string> next;
  for (const Step& step : steps_) {
    next.clear();
    std::optional<UnicodeRegex::Matcher> matcher;
    if (step.regex != nullptr) matcher.emplace(*step.regex);
    for (const std::string& piece : current) {
      if (absl::Status status = step.Apply(
              piece, matcher.has_value() ? &*matcher : nullptr, &next);
          !status.ok()) {
        return status;
      }
    }
    current.swap(next);
  }
  for (std::string& piece : current) pieces->push_back(std::move(piece));
  return absl::OkStatus();
}

}  // namespace mneme::text
