#include "services/coordinator/openai_choice.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mneme::coordinator {
namespace {

using nlohmann::json;

// OpenAI's JSON has no -inf: vLLM writes -9999.0.
double Finite(float logprob) {
  return std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0;
}

int64_t CodePoints(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

json Bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace

ChoiceOutput::ChoiceOutput(const OpenAiRequest& request, int index,
                           const text::Tokenizer& tokenizer, uint64_t id_seed)
    : request_(request),
      index_(index),
      tokenizer_(tokenizer),
      text_(tokenizer, request.stops) {
  if (request.chat) {
    parser_ = std::make_unique<text::ChatOutputParser>(
        ChatParserOptions(request.chat_request, id_seed));
  }
}

void ChoiceOutput::SetPrompt(absl::Span<const int64_t> ids,
                             const std::optional<std::string>& text) {
  prompt_ids_.assign(ids.begin(), ids.end());
  prompt_text_ = text.has_value()
                     ? *text
                     : tokenizer_.Decode(ids, text::SkipSpecialTokens::kNo);
}

void ChoiceOutput::AddPromptPositions(
    absl::Span<const TokenLogprobs> positions) {
  prompt_positions_.insert(prompt_positions_.end(), positions.begin(),
                           positions.end());
}

std::string ChoiceOutput::TokenString(int64_t id) const {
  const int64_t one[] = {id};
  return tokenizer_.Decode(one, text::SkipSpecialTokens::kNo);
}

void ChoiceOutput::Route(const std::string& text, json& delta) {
  if (text.empty()) return;
  text_all_ += text;
  if (parser_ == nullptr) {
    delta["text"] = delta.value("text", std::string()) + text;
    return;
  }
  Apply(parser_->Feed(text), delta);
}

void ChoiceOutput::Apply(const std::vector<text::ChatOutputDelta>& deltas,
                         json& delta) {
  for (const text::ChatOutputDelta& d : deltas) {
    switch (d.kind) {
      case text::ChatOutputDelta::Kind::kReasoning: {
        saw_reasoning_ = true;
        reasoning_all_ += d.text;
        const std::string r =
            delta.value("reasoning_content", std::string()) + d.text;
        delta["reasoning_content"] = r;
        delta["reasoning"] = r;
        break;
      }
      case text::ChatOutputDelta::Kind::kContent:
        content_all_ += d.text;
        delta["content"] = delta.value("content", std::string()) + d.text;
        break;
      case text::ChatOutputDelta::Kind::kToolCallBegin:
        tool_calls_.push_back(
            {{"id", d.id},
             {"type", "function"},
             {"function", {{"name", d.name}, {"arguments", ""}}}});
        delta["tool_calls"].push_back(
            {{"index", d.index},
             {"id", d.id},
             {"type", "function"},
             {"function", {{"name", d.name}, {"arguments", ""}}}});
        break;
      case text::ChatOutputDelta::Kind::kToolCallArguments: {
        if (d.index < 0 || static_cast<size_t>(d.index) >= tool_calls_.size()) {
          break;  // The parser begins every call it continues.
        }
        tool_calls_[static_cast<size_t>(d.index)]["function"]["arguments"]
            .get_ref<std::string&>() += d.text;
        json& calls = delta["tool_calls"];
        if (!calls.empty() && calls.back()["index"] == d.index) {
          calls.back()["function"]["arguments"].get_ref<std::string&>() +=
              d.text;
        } else {
          calls.push_back(
              {{"index", d.index}, {"function", {{"arguments", d.text}}}});
        }
        break;
      }
    }
  }
}

json ChoiceOutput::LogprobsJson(absl::Span<const int64_t> tokens,
                                absl::Span<const float> logprobs,
                                absl::Span<const TopLogprobs> top,
                                bool with_prompt, int64_t& offset) const {
  if (request_.logprobs < 0) return nullptr;
  if (request_.chat) {
    json content = json::array();
    for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
      const std::string s = TokenString(tokens[i]);
      json alternatives = json::array();
      if (i < top.size()) {
        for (size_t k = 0; k < top[i].token_ids.size() &&
                           static_cast<int>(k) < request_.logprobs;
             ++k) {
          const std::string a = TokenString(top[i].token_ids[k]);
          alternatives.push_back({{"token", a},
                                  {"logprob", Finite(top[i].logprobs[k])},
                                  {"bytes", Bytes(a)}});
        }
      }
      content.push_back({{"token", s},
                         {"logprob", Finite(logprobs[i])},
                         {"bytes", Bytes(s)},
                         {"top_logprobs", std::move(alternatives)}});
    }
    return json{{"content", std::move(content)}};
  }
  json toks = json::array();
  json lps = json::array();
  json tops = json::array();
  json offsets = json::array();
  auto top_dict = [&](int64_t chosen, float chosen_lp, const TopLogprobs& t) {
    // The chosen token and the N most likely, keyed by their text (equal
    // texts collapse, as in vLLM).
    json d = json::object();
    for (size_t k = 0;
         k < t.token_ids.size() && static_cast<int>(k) < request_.logprobs;
         ++k) {
      d[TokenString(t.token_ids[k])] = Finite(t.logprobs[k]);
    }
    d[TokenString(chosen)] = Finite(chosen_lp);
    return d;
  };
  if (with_prompt) {
    for (size_t i = 0; i < prompt_ids_.size(); ++i) {
      const std::string s = TokenString(prompt_ids_[i]);
      toks.push_back(s);
      offsets.push_back(offset);
      offset += CodePoints(s);
      const TokenLogprobs* p =
          i < prompt_positions_.size() ? &prompt_positions_[i] : nullptr;
      if (p == nullptr || !p->logprob.has_value()) {
        lps.push_back(nullptr);
        tops.push_back(nullptr);
      } else {
        lps.push_back(Finite(*p->logprob));
        tops.push_back(top_dict(prompt_ids_[i], *p->logprob, p->top));
      }
    }
  }
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    const std::string s = TokenString(tokens[i]);
    toks.push_back(s);
    offsets.push_back(offset);
    offset += CodePoints(s);
    lps.push_back(Finite(logprobs[i]));
    tops.push_back(top_dict(tokens[i], logprobs[i],
                            i < top.size() ? top[i] : TopLogprobs{}));
  }
  return json{{"tokens", std::move(toks)},
              {"token_logprobs", std::move(lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

bool ChoiceOutput::TakePrompt(json& delta) {
  if (!request_.echo || prompt_sent_) return false;
  prompt_sent_ = true;
  delta["text"] = prompt_text_;
  text_all_ += prompt_text_;
  return true;
}

std::optional<json> ChoiceOutput::Add(absl::Span<const int64_t> tokens,
                                      absl::Span<const float> logprobs,
                                      absl::Span<const TopLogprobs> top) {
  if (request_.prompt_only) {
    tokens = {};
    logprobs = {};
    top = {};
  }
  json delta = json::object();
  const bool with_prompt = TakePrompt(delta);
  if (first_ && parser_ != nullptr &&
      !request_.chat_request.forced_prefix.empty()) {
    // The forced call's opening is in the prompt: the parser reads it first.
    const std::string prefix = request_.chat_request.forced_prefix;
    Route(prefix, delta);
    text_all_.resize(text_all_.size() - prefix.size());
  }
  if (!tokens.empty()) {
    tokens_all_.insert(tokens_all_.end(), tokens.begin(), tokens.end());
    logprobs_all_.insert(logprobs_all_.end(), logprobs.begin(), logprobs.end());
    for (size_t i = 0; i < tokens.size(); ++i) {
      top_all_.push_back(i < top.size() ? top[i] : TopLogprobs{});
    }
  }
  Route(text_.Add(tokens), delta);
  const bool has_logprobs = request_.logprobs >= 0 && !tokens.empty();
  if (delta.empty() && !has_logprobs && !first_ && !with_prompt) {
    return std::nullopt;
  }
  json choice = {{"index", index_}};
  if (request_.chat) {
    if (first_) delta["role"] = "assistant";
    if (first_ && !delta.contains("content") &&
        !delta.contains("reasoning_content") && !delta.contains("tool_calls")) {
      delta["content"] = "";
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = delta.value("text", std::string());
    if (with_prompt) choice["prompt_logprobs"] = PromptLogprobsJson();
  }
  choice["logprobs"] =
      LogprobsJson(tokens, logprobs, top, with_prompt, offset_);
  choice["finish_reason"] = nullptr;
  first_ = false;
  return choice;
}

std::vector<json> ChoiceOutput::Finish(GenerateEnd end) {
  std::vector<json> out;
  json delta = json::object();
  (void)TakePrompt(delta);
  Route(text_.Finish(), delta);
  // Whatever the parser held back (a partial tag that never completed).
  if (parser_ != nullptr) Apply(parser_->Finish(), delta);
  if (!delta.empty()) {
    json choice = {{"index", index_}};
    if (request_.chat) {
      if (first_) delta["role"] = "assistant";
      choice["delta"] = std::move(delta);
    } else {
      choice["text"] = delta.value("text", std::string());
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    first_ = false;
    out.push_back(std::move(choice));
  }
  if (text_.stopped()) {
    finish_reason_ = "stop";
  } else if (request_.prompt_only) {
    finish_reason_ = "length";
  } else {
    switch (end) {
      case GenerateEnd::kStop:
        finish_reason_ = "stop";
        break;
      case GenerateEnd::kLength:
        finish_reason_ = "length";
        break;
      case GenerateEnd::kAbort:
        finish_reason_ = "abort";
        break;
    }
  }
  // As vLLM reports it: a response that called tools ends with tool_calls.
  if (parser_ != nullptr && !tool_calls_.empty() && finish_reason_ != "abort") {
    finish_reason_ = "tool_calls";
  }
  json last = {{"index", index_}};
  if (request_.chat) {
    last["delta"] = json::object();
    if (first_) last["delta"]["role"] = "assistant";
  } else {
    last["text"] = "";
  }
  last["logprobs"] = nullptr;
  last["finish_reason"] = finish_reason_;
  first_ = false;
  out.push_back(std::move(last));
  return out;
}

json ChoiceOutput::Whole() const {
  json choice = {{"index", index_}};
  if (request_.chat) {
    json message = {{"role", "assistant"}};
    if (parser_ == nullptr) {
      message["content"] = text_all_;
    } else {
      // Empty content is null (vLLM); so is reasoning that never came.
      message["content"] =
          content_all_.empty() ? json(nullptr) : json(content_all_);
      if (saw_reasoning_ || request_.chat_request.thinking) {
        const json r = saw_reasoning_ ? json(reasoning_all_) : json(nullptr);
        message["reasoning_content"] = r;
        message["reasoning"] = r;
      }
      if (!tool_calls_.empty()) message["tool_calls"] = tool_calls_;
    }
    choice["message"] = std::move(message);
  } else {
    choice["text"] = text_all_;
    if (request_.prompt_logprobs >= 0) {
      choice["prompt_logprobs"] = PromptLogprobsJson();
    }
  }
  int64_t offset = 0;
  choice["logprobs"] =
      LogprobsJson(tokens_all_, logprobs_all_, top_all_, request_.echo, offset);
  choice["finish_reason"] =
      finish_reason_.empty() ? json(nullptr) : json(finish_reason_);
  return choice;
}

json ChoiceOutput::PromptLogprobsJson() const {
  if (request_.prompt_logprobs < 0) return nullptr;
  json out = json::array();
  for (size_t i = 0; i < prompt_ids_.size(); ++i) {
    const TokenLogprobs* p =
        i < prompt_positions_.size() ? &prompt_positions_[i] : nullptr;
    if (p == nullptr || !p->logprob.has_value()) {
      out.push_back(nullptr);
      continue;
    }
    json entry = json::object();
    for (size_t k = 0; k < p->top.token_ids.size() &&
                       static_cast<int>(k) < request_.prompt_logprobs;
         ++k) {
      entry[std::to_string(p->top.token_ids[k])] = {
          {"logprob", Finite(p->top.logprobs[k])},
          {"rank", static_cast<int64_t>(k) + 1},
          {"decoded_token", TokenString(p->top.token_ids[k])}};
    }
    json actual = {{"logprob", Finite(*p->logprob)},
                   {"decoded_token", TokenString(prompt_ids_[i])}};
    // Its rank when it is among the alternatives; null otherwise.
    actual["rank"] = nullptr;
    for (size_t k = 0; k < p->top.token_ids.size(); ++k) {
      if (p->top.token_ids[k] == prompt_ids_[i]) {
        actual["rank"] = static_cast<int64_t>(k) + 1;
        break;
      }
    }
    entry[std::to_string(prompt_ids_[i])] = std::move(actual);
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace mneme::coordinator
