#!/usr/bin/env python3
"""Writes the seed corpora of the tokenizer.json, config.json, chat template,
local copy and OpenAI request body fuzz targets (tests/fuzz/corpus/<target>/). Seeds named
deep_* nest past the depth limits (docs/RELIABILITY.md); before those limits
existed several of them overflowed the stack. The local copy seeds start from
corpus/local_copy/valid_manifest.json, a manifest ManifestToJson wrote for
the test checkpoint (kept as is). Run from the repository root:

  python3 tests/fuzz/make_fuzz_corpora.py
"""
import json
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
DEEP = 100000  # Far past any limit; each such seed is ~200 KB.


def write(target, name, text):
    directory = os.path.join(ROOT, target)
    os.makedirs(directory, exist_ok=True)
    data = text.encode("utf-8") if isinstance(text, str) else text
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def arrays(depth, closed=True):
    return "[" * depth + ("]" * depth if closed else "")


def objects(depth):
    return '{"a":' * depth + "1" + "}" * depth


# ---------------------------------------------------------------- tokenizer
def tokenizer(**fields):
    base = {
        "version": "1.0",
        "added_tokens": [
            {"id": 0, "content": "<s>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3},
                  "merges": ["a b"]},
    }
    base.update(fields)
    return json.dumps(base, ensure_ascii=False)


def nested_sequences(component, list_key, levels):
    for _ in range(levels):
        component = {"type": "Sequence", list_key: [component]}
    return component


T = "tokenizer_json"
write(T, "valid_minimal.json", tokenizer())
write(T, "valid_components.json", tokenizer(
    normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Lowercase"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Strip", "strip_left": True, "strip_right": False}]},
    pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False,
         "use_regex": False}]},
    post_processor={"type": "Sequence", "processors": [
        {"type": "ByteLevel"},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "special_tokens": {"<s>": {"id": "<s>", "ids": [0],
                                    "tokens": ["<s>"]}}}]},
    decoder={"type": "Sequence", "decoders": [{"type": "ByteLevel"}]}))
write(T, "valid_nested_sequences.json", tokenizer(
    normalizer=nested_sequences({"type": "Lowercase"}, "normalizers", 8)))
write(T, "bad_no_model.json", '{"normalizer": null}')
write(T, "bad_vocab_id.json", tokenizer(
    model={"type": "BPE", "vocab": {"a": [1, {"x": "y" * 300}]},
           "merges": []}))
write(T, "bad_truncated.json", tokenizer()[:200])
WITHOUT_NORMALIZER = json.loads(tokenizer())
del WITHOUT_NORMALIZER["normalizer"]
write(T, "deep_normalizer_arrays.json", '{"normalizer": ' + arrays(DEEP) +
      ", " + json.dumps(WITHOUT_NORMALIZER)[1:])
write(T, "deep_added_token.json",
      '{"added_tokens": [{"content": ' + arrays(DEEP) + '}], "model": {}}')
write(T, "deep_unclosed.json", arrays(DEEP, closed=False))
write(T, "deep_sequences_in_limit.json", tokenizer(
    normalizer=nested_sequences({"type": "NFC"}, "normalizers", 60)))
write(T, "deep_sequences_past_limit.json", tokenizer(
    pre_tokenizer=nested_sequences({"type": "ByteLevel"}, "pretokenizers",
                                   200)))

# ------------------------------------------------------------------ config
C = "config_json"
V4 = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 61,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32},
    "engram_layer_ids": [1, 15], "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                            "weight_block_size": [128, 128]},
}
write(C, "valid_v4.json", json.dumps(V4, indent=2))
write(C, "valid_text_config.json", json.dumps(
    {"model_type": "deepseek_v41", "text_config": V4}))
write(C, "bad_duplicate.json", '{"vocab_size": 1, "vocab_size": 2}')
write(C, "bad_not_object.json", "[1, 2, 3]")
write(C, "bad_truncated.json", json.dumps(V4)[:100])
write(C, "bad_nul.json", b'{"vocab_size": 1}\x00{"x": 2}')
write(C, "deep_rope_scaling.json",
      '{"vocab_size": 8, "rope_scaling": ' + arrays(DEEP) + "}")
write(C, "deep_objects.json", objects(DEEP))
write(C, "deep_text_config.json",
      '{"text_config": {"num_hidden_layers": 2, "x": ' + arrays(DEEP) + "}}")

# ----------------------------------------------------------- chat template
H = "chat_template"
DSML = "\uff5cDSML\uff5c"
SCHEMA = json.dumps({"name": "get_weather", "description": "Weather",
                     "parameters": {"type": "object", "properties": {
                         "city": {"type": "string"},
                         "days": {"type": "integer"}},
                         "required": ["city"]}})
write(H, "valid_chat.txt", "t\nsYou are helpful.\nuHello\naHi!\nrgreeting\n"
      "uWhat is 2+2?\n")
write(H, "valid_tools.txt", "\n".join([
    "tk", "f" + SCHEMA, "uWeather in Paris?",
    'a', 'rlooking it up', 'cget_weather {"city": "Paris", "days": 2}',
    "tSunny", "icall_3", "uThanks", ""]))
write(H, "valid_v41_response_format.txt", "\n".join([
    "1", 'j{"type": "json_schema", "json_schema": {"name": "x", '
    '"schema": {"type": "object"}}}', "dBe brief.", "uHi", "lremember", ""]))
write(H, "valid_dsml_output.txt", "".join([
    "treasoning</think>answer\n\n<", DSML, "tool_calls>\n<", DSML,
    'invoke name="f">\n<', DSML, 'parameter name="n" string="false">3</',
    DSML, "parameter>\n<", DSML, 'parameter name="o" string="false">',
    '{"k": [1, 2]}</', DSML, "parameter>\n</", DSML, "invoke>\n</", DSML,
    "tool_calls>"]))
write(H, "valid_dsml_v41_output.txt", "".join([
    "x<", DSML, " calls>\n<", DSML, ' invoke name="f">\n<', DSML,
    ' parameter name="s" string="true">text</', DSML, " parameter>\n</",
    DSML, " invoke>\n</", DSML, " calls>"]))
write(H, "bad_tool_schema.txt", "\nf{not json\nuHi\n")
write(H, "deep_tool_schema.txt", "\nf" + arrays(DEEP) + "\nuHi\n")
write(H, "deep_arguments.txt", "\nuHi\na\ncf " + objects(DEEP) + "\n")
write(H, "deep_response_format.txt", "\nj" + arrays(DEEP, False) + "\nuHi\n")
write(H, "deep_dsml_parameter.txt", "".join([
    "\n\n<", DSML, "tool_calls>\n<", DSML, 'invoke name="f">\n<', DSML,
    'parameter name="o" string="false">', arrays(DEEP), "</", DSML,
    "parameter>\n</", DSML, "invoke>\n</", DSML, "tool_calls>"]))

# -------------------------------------------------------------- local copy
L = "local_copy"
MAGIC = "mneme-localize-journal 1 "
with open(os.path.join(ROOT, L, "valid_manifest.json")) as f:
    manifest = json.load(f)
compact = json.dumps(manifest, separators=(",", ":"))
write(L, "valid_journal.txt", MAGIC + compact + "\n"
      "range 1 0 4 0 01234567\nrange 1 4 4 64 89abcdef\nrange 3 0 1\n")
write(L, "bad_manifest_kind.json", json.dumps(dict(manifest, kind="other")))
write(L, "bad_manifest_fields.json", json.dumps(
    dict(manifest, layers=[{"layer": "x"}])))
write(L, "bad_journal_torn.txt", MAGIC + compact[:len(compact) // 2])
write(L, "deep_manifest.json", '{"kind": ' + arrays(DEEP) + "}")
write(L, "deep_manifest_unclosed.json", objects(DEEP)[:-DEEP])
write(L, "deep_journal.txt", MAGIC + '{"layers": ' + arrays(DEEP) + "}\n"
      "range 1 0 4 0 01234567\n")

# ---------------------------------------------------------- OpenAI request
O = "openai_request"
MODEL = "deepseek-v4"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}


def body(**fields):
    return json.dumps(dict({"model": MODEL}, **fields), ensure_ascii=False)


write(O, "valid_completion.json", body(
    prompt="Once upon a time", max_tokens=32, temperature=0.7, top_p=0.9,
    top_k=40, min_p=0.05, seed=7, n=2, stop=["\n\n", "The end"],
    stop_token_ids=[1], ignore_eos=False, user="u1"))
write(O, "valid_completion_logprobs_echo.json", body(
    prompt=["Hello", [0, 300, 301], "world"], max_tokens=0, echo=True,
    logprobs=3, prompt_logprobs=2))
write(O, "valid_chat_tools.json", body(
    messages=[
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "reasoning_content": "I should look it up.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather",
             "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."},
                                     {"type": "text", "text": "Tomorrow?"}]}],
    tools=[WEATHER], tool_choice="auto", reasoning_effort="high",
    max_completion_tokens=64))
write(O, "valid_chat_named_tool.json", body(
    messages=[{"role": "developer", "content": "Call tools."},
              {"role": "user", "content": "Weather in Rome?"}],
    tools=[WEATHER, {"type": "function", "function": {"name": "noop"}}],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    chat_template_kwargs={"thinking": True}))
write(O, "valid_chat_stream_logprobs.json", body(
    messages=[{"role": "user", "content": "Count to three."},
              {"role": "latest_reminder", "content": "Be brief."}],
    stream=True, stream_options={"include_usage": True}, logprobs=True,
    top_logprobs=5, prompt_logprobs=1, max_tokens=16, stop="four",
    tool_choice="none", chat_template_kwargs={"enable_thinking": False}))
write(O, "bad_fields.json", body(
    prompt="x", messages=[{"role": "robot"}], n=0, logprobs="yes",
    stop=[1], tools=[{"type": "function", "function": {"name": ""}}],
    tool_choice="required", reasoning_effort=[1]))
write(O, "bad_tool_choice.json", body(
    messages=[{"role": "user", "content": "hi"}], tools=[WEATHER, WEATHER],
    tool_choice={"type": "function", "function": {"name": "missing"}}))
write(O, "bad_truncated.json", body(
    messages=[{"role": "user", "content": "hi"}], tools=[WEATHER])[:120])
write(O, "deep_tool_parameters.json", body(
    messages=[{"role": "user", "content": "hi"}],
    tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "x": 0}}}])
    .replace('"x": 0', '"x": ' + arrays(DEEP)))
write(O, "deep_tool_call_arguments.json", body(
    messages=[{"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {
                   "name": "f", "arguments": "[" * DEEP}}]},
              {"role": "user", "content": "hi"}]))
write(O, "deep_prompt.json", '{"model": "' + MODEL + '", "prompt": ' +
      arrays(DEEP) + ', "stop": ' + arrays(1000) + "}")
write(O, "deep_messages.json", '{"model": "' + MODEL + '", "messages": ' +
      arrays(DEEP) + ', "tool_choice": ' + objects(1000) +
      ', "chat_template_kwargs": ' + objects(1000) + "}")
