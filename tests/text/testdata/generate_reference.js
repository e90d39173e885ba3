// Writes the reference test data of //tests/text:tokenizer_reference_test
// with the Hugging Face `tokenizers` library (its Node binding from the npm
// registry): the crafted tokenizer.json files, and for every tokenizer the
// ids, decodes and lookups the reference gives on a varied corpus.
//
//   node generate_reference.js TESTDATA_DIR
//
// TESTDATA_DIR must already hold synthetic_tokenizer.json (written by
// //tests/text:write_synthetic_tokenizer). See README.md beside this file.
// Deterministic: the same inputs give byte-identical outputs.
'use strict';

const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

const REFERENCE = 'tokenizers ' + require('tokenizers/package.json').version + ' (npm)';

// ---------------------------------------------------------------------------
// Byte-level alphabet (GPT-2 bytes_to_unicode).
function byteLevelAlphabet() {
  const chars = [];
  let next = 0x100;
  for (let b = 0; b < 256; ++b) {
    const self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    chars.push(String.fromCodePoint(self ? b : next++));
  }
  return chars;
}
const BYTE_CHARS = byteLevelAlphabet();

// ---------------------------------------------------------------------------
// Training text for the crafted vocabularies: prose, code, CJK, whitespace.
const TRAINING_TEXT = [
  'The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away.',
  'In the beginning the model reads the tokens of the prompt, then it writes new tokens one at a time.',
  'Memory tables hold rows of numbers; each row is selected by hashing the last few tokens.',
  "It's a serving system: it's fast, it's careful, and it doesn't lose requests. We're done; they've left.",
  'Hello world! Hello again, world. Hello, hello, HELLO.',
  'int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) {\n    printf("%s\\n", argv[i]);\n  }\n  return 0;\n}\n',
  'def tokenize(text):\n    """Split text into tokens."""\n    return [t for t in text.split() if t]\n\n\nclass Model:\n    def __init__(self):\n        self.layers = []\n',
  'const x = await fetch(url); if (x.ok) { return x.json(); } else { throw new Error("failed"); }',
  '    \n        \n\t\t\n\n\n   x   y   z\r\n\r\n',
  '中文分词是自然语言处理的基础。我们在这里测试中文文本的编码和解码。人工智能模型需要大量的数据。',
  '日本語のテキストもここにあります。ひらがなとカタカナと漢字を混ぜて書きます。トークナイザーのテストです。',
  '한국어 텍스트도 여기에 있습니다. 토크나이저를 시험합니다.',
  'Ελληνικά κείμενα και русский текст для проверки. Déjà vu, café, naïve, résumé, Zürich, São Paulo.',
  'Numbers: 0 1 2 3 12 123 1234 12345 3.14159 2026-01-15 1,000,000 $42.50 100%',
  'Emoji: 🙂 👍🏽 🚀 ❤️ 👨‍👩‍👧 🇫🇷 — and some symbols: ± × ÷ ≤ ≥ ≠ → ← ∞ © ® ™ …',
  'https://example.com/path?query=value&other=1 user@example.org #hashtag @mention',
  'Streaming text out of a server means decoding tokens one at a time and never splitting a character.',
];

// ---------------------------------------------------------------------------
// A deterministic BPE trainer over the pieces the reference pre-tokenizer
// makes of the training text. `initial(piece)` spells a piece as symbols;
// `join(a, b)` names the merge result.
function trainBpe(pieces, numMerges, initial, join) {
  const counts = new Map();
  for (const p of pieces) counts.set(p, (counts.get(p) || 0) + 1);
  const words = [...counts.entries()].sort().map(([p, n]) => ({ symbols: initial(p), count: n }));
  const merges = [];
  for (let m = 0; m < numMerges; ++m) {
    const pairCounts = new Map();
    for (const w of words) {
      for (let i = 0; i + 1 < w.symbols.length; ++i) {
        const key = w.symbols[i] + '\u0000' + w.symbols[i + 1];
        pairCounts.set(key, (pairCounts.get(key) || 0) + w.count);
      }
    }
    let best = null;
    let bestCount = 0;
    for (const [key, n] of pairCounts) {
      if (n > bestCount || (n === bestCount && key < best)) {
        best = key;
        bestCount = n;
      }
    }
    if (best === null) break;
    const [a, b] = best.split('\u0000');
    merges.push([a, b]);
    const merged = join(a, b);
    for (const w of words) {
      const out = [];
      for (let i = 0; i < w.symbols.length; ++i) {
        if (i + 1 < w.symbols.length && w.symbols[i] === a && w.symbols[i + 1] === b) {
          out.push(merged);
          ++i;
        } else {
          out.push(w.symbols[i]);
        }
      }
      w.symbols = out;
    }
  }
  return merges;
}

function addedToken(id, content, flags) {
  return Object.assign(
    { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
    flags || {},
  );
}

function emptyModel() {
  return {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false,
    vocab: {}, merges: [],
  };
}

// The pieces the reference makes of the training text with `skeleton`'s
// normalizer and pre-tokenizer.
function trainingPieces(skeleton) {
  const tok = Tokenizer.fromString(JSON.stringify(skeleton));
  const normalizer = tok.getNormalizer();
  const pre = tok.getPreTokenizer();
  const pieces = [];
  for (const text of TRAINING_TEXT) {
    const normalized = normalizer ? normalizer.normalizeString(text) : text;
    for (const [piece] of pre.preTokenizeString(normalized)) pieces.push(piece);
  }
  return pieces;
}

// ---------------------------------------------------------------------------
// deepseek_style: DeepSeek-V3/V4's tokenizer.json layout (normalizer, the
// three Split regexes and ByteLevel, TemplateProcessing with BOS, ByteLevel
// decoder, "a b" merges) with the chat special tokens, over a small trained
// vocabulary.
const DEEPSEEK_SPLITS = [
  '\\p{N}{1,3}',
  '[一-龥぀-ゟ゠-ヿ]+',
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];

function deepseekStyle() {
  const BOS = '<｜begin▁of▁sentence｜>';
  const EOS = '<｜end▁of▁sentence｜>';
  const PAD = '<｜▁pad▁｜>';
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [],
    normalizer: { type: 'Sequence', normalizers: [] },
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: DEEPSEEK_SPLITS.map((r) => ({ type: 'Split', pattern: { Regex: r }, behavior: 'Isolated', invert: false }))
        .concat([{ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }]),
    },
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: BOS, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
      pair: [
        { SpecialToken: { id: BOS, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: BOS, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } },
      ],
      special_tokens: { [BOS]: { id: BOS, ids: [0], tokens: [BOS] } },
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: emptyModel(),
  };
  const vocab = {};
  let next = 0;
  for (const s of [BOS, EOS, PAD]) vocab[s] = next++;
  for (const c of BYTE_CHARS) vocab[c] = next++;
  tokenizer.model.vocab = Object.assign({}, vocab);
  const merges = trainBpe(trainingPieces(tokenizer), 1500, (p) => [...p], (a, b) => a + b);
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = next++;
  tokenizer.model.vocab = vocab;
  tokenizer.model.merges = merges.map(([a, b]) => a + ' ' + b);
  // Special tokens in the vocabulary (0..2), then the chat tokens after it,
  // some special and some not, as DeepSeek's file has them.
  const added = [addedToken(0, BOS), addedToken(1, EOS), addedToken(2, PAD)];
  const extra = [
    ['<｜User｜>', false], ['<｜Assistant｜>', false], ['<think>', false], ['</think>', false],
    ['<｜fim▁hole｜>', true], ['<｜fim▁begin｜>', true], ['<｜fim▁end｜>', true],
    ['<｜tool▁calls▁begin｜>', false], ['<｜tool▁calls▁end｜>', false],
    ['<｜place▁holder▁no▁0｜>', true], ['<｜place▁holder▁no▁1｜>', true], ['<｜place▁holder▁no▁10｜>', true],
    ['<|EOT|>', true],
  ];
  for (const [content, special] of extra) added.push(addedToken(next++, content, { special }));
  tokenizer.added_tokens = added;
  const config = {
    add_bos_token: true,
    add_eos_token: false,
    bos_token: { __type: 'AddedToken', content: BOS, lstrip: false, normalized: true, rstrip: false, single_word: false },
    eos_token: { __type: 'AddedToken', content: EOS, lstrip: false, normalized: true, rstrip: false, single_word: false },
    pad_token: { __type: 'AddedToken', content: EOS, lstrip: false, normalized: true, rstrip: false, single_word: false },
    clean_up_tokenization_spaces: false,
    model_max_length: 131072,
    tokenizer_class: 'LlamaTokenizerFast',
  };
  return { tokenizer, config };
}

// ---------------------------------------------------------------------------
// gpt2_style: ByteLevel pre-tokenizer with the GPT-2 regex and a prefix
// space, an NFC + Replace normalizer, added tokens with lstrip / rstrip /
// single_word / normalized, [a, b] merges with ignore_merges, whole-word
// tokens without merges, and an EOS-appending template.
function gpt2Style() {
  const EOT = '<|endoftext|>';
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [],
    normalizer: {
      type: 'Sequence',
      normalizers: [
        { type: 'NFC' },
        { type: 'Replace', pattern: { String: '\r\n' }, content: '\n' },
        { type: 'Replace', pattern: { Regex: '[‘’]' }, content: "'" },
      ],
    },
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    post_processor: {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: 'TemplateProcessing',
          single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: EOT, type_id: 0 } }],
          pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }, { SpecialToken: { id: EOT, type_id: 0 } }],
          special_tokens: { [EOT]: { id: EOT, ids: [0], tokens: [EOT] } },
        },
      ],
    },
    decoder: { type: 'Sequence', decoders: [{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }] },
    model: emptyModel(),
  };
  tokenizer.model.ignore_merges = true;
  const vocab = {};
  let next = 0;
  vocab[EOT] = next++;
  for (const c of BYTE_CHARS) vocab[c] = next++;
  tokenizer.model.vocab = Object.assign({}, vocab);
  const merges = trainBpe(trainingPieces(tokenizer), 1200, (p) => [...p], (a, b) => a + b);
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = next++;
  // Whole words without merge chains: reachable only through ignore_merges.
  for (const w of ['Ġsupercalifragilistic', 'Ġtokenization', 'ĠÐ¿ÑĢÐ¸Ð²ÐµÑĤ', 'ĠĠĠĠĠĠĠĠ']) {
    if (!(w in vocab)) vocab[w] = next++;
  }
  tokenizer.model.vocab = vocab;
  tokenizer.model.merges = merges;
  const added = [
    addedToken(0, EOT),
    addedToken(next++, '[MASK]', { lstrip: true, rstrip: true }),
    addedToken(next++, '<sep>', { rstrip: true, special: false }),
    addedToken(next++, '<cls>', { lstrip: true }),
    addedToken(next++, 'cat', { single_word: true, special: false }),
    // Decomposed é: matched in the NFC-normalized text as "étude".
    addedToken(next++, 'e\u0301tude', { normalized: true, special: false }),
    addedToken(next++, '<|im_start|>', {}),
    addedToken(next++, '<|im_end|>', {}),
    addedToken(next++, '<|im', { special: false }),
  ];
  tokenizer.added_tokens = added;
  return { tokenizer, config: null };
}

// ---------------------------------------------------------------------------
// llama3_style: one Split with a case-insensitive group and ByteLevel without
// its own regex, [a, b] merges with ignore_merges, a BOS template and many
// reserved special tokens.
function llama3Style() {
  const BOT = '<|begin_of_text|>';
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [],
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        {
          type: 'Split',
          pattern: {
            Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
          },
          behavior: 'Isolated',
          invert: false,
        },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: BOT, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [{ SpecialToken: { id: BOT, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: BOT, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
          special_tokens: { [BOT]: { id: BOT, ids: [0], tokens: [BOT] } },
        },
      ],
    },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: emptyModel(),
  };
  tokenizer.model.ignore_merges = true;
  const vocab = {};
  let next = 0;
  vocab[BOT] = next++;
  for (const c of BYTE_CHARS) vocab[c] = next++;
  tokenizer.model.vocab = Object.assign({}, vocab);
  const merges = trainBpe(trainingPieces(tokenizer), 1500, (p) => [...p], (a, b) => a + b);
  for (const [a, b] of merges) if (!(a + b in vocab)) vocab[a + b] = next++;
  tokenizer.model.vocab = vocab;
  tokenizer.model.merges = merges;
  const added = [addedToken(0, BOT)];
  for (const content of ['<|end_of_text|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>',
    '<|reserved_special_token_0|>', '<|reserved_special_token_1|>', '<|reserved_special_token_10|>']) {
    added.push(addedToken(next++, content));
  }
  tokenizer.added_tokens = added;
  return { tokenizer, config: null };
}

// ---------------------------------------------------------------------------
// wordpiece_style: a non-byte-level BPE with an unknown token (fused), a
// continuing-subword prefix, the other Split behaviors and normalizers, and
// no decoder (tokens joined by spaces).
function wordpieceStyle() {
  const UNK = '[UNK]';
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [],
    normalizer: {
      type: 'Sequence',
      normalizers: [{ type: 'NFKC' }, { type: 'Lowercase' }, { type: 'Strip', strip_left: true, strip_right: true }, { type: 'Prepend', prepend: '^' }],
    },
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: '\\s+' }, behavior: 'Removed', invert: false },
        { type: 'Split', pattern: { String: '-' }, behavior: 'MergedWithPrevious', invert: false },
        { type: 'Split', pattern: { Regex: '[$#@]' }, behavior: 'MergedWithNext', invert: false },
        { type: 'Split', pattern: { Regex: '\\p{N}' }, behavior: 'Contiguous', invert: false },
        { type: 'Split', pattern: { Regex: '[\\p{L}\\p{M}\\p{N}^#-]+' }, behavior: 'Isolated', invert: true },
      ],
    },
    post_processor: null,
    decoder: null,
    model: emptyModel(),
  };
  tokenizer.model.unk_token = UNK;
  tokenizer.model.fuse_unk = true;
  tokenizer.model.continuing_subword_prefix = '##';
  const vocab = {};
  let next = 0;
  vocab[UNK] = next++;
  // Characters of the training text (lowercased by the normalizer) only: the
  // rest of the world is unknown.
  tokenizer.model.vocab = Object.assign({ a: 1 }, vocab);
  const pieces = trainingPieces(tokenizer);
  const chars = new Set();
  for (const p of pieces) {
    const cs = [...p];
    cs.forEach((c, i) => chars.add(i === 0 ? c : '##' + c));
  }
  for (const c of [...chars].sort()) vocab[c] = next++;
  const merges = trainBpe(pieces, 600, (p) => [...p].map((c, i) => (i === 0 ? c : '##' + c)),
    (a, b) => a + b.slice(2));
  for (const [a, b] of merges) if (!(a + b.slice(2) in vocab)) vocab[a + b.slice(2)] = next++;
  tokenizer.model.vocab = vocab;
  tokenizer.model.merges = merges.map(([a, b]) => a + ' ' + b);
  tokenizer.added_tokens = [
    addedToken(0, UNK),
    addedToken(next++, '[CLS]', {}),
    addedToken(next++, 'New York', { normalized: true, special: false }),
  ];
  return { tokenizer, config: null };
}

// ---------------------------------------------------------------------------
// The corpus.
function corpus(specialTokens) {
  const texts = [
    '',
    ' ',
    '\n',
    'Hello world',
    'Hello, world! How are you today?',
    ' leading space and trailing space ',
    "It's what they've said: we're sure you'll see I'd've done it.",
    'The quick brown fox jumps over the lazy dog.',
    // Whitespace runs.
    'a  b   c    d     e',
    'tabs\tand\t\ttabs\t\t\tend',
    'lines\nand\n\nblank\n\n\nlines\n',
    'windows\r\nline\r\n\r\nendings\r\n',
    '   \n   \n\t \n',
    ' '.repeat(1000),
    'x' + ' '.repeat(300) + 'y',
    '\n'.repeat(64),
    ' \u00a0\u2003\u3000 mixed\u00a0spaces\u2009here \u200b zero\u200bwidth',
    'trailing spaces    ',
    // Code.
    'int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) {\n    std::cout << argv[i] << "\\n";\n  }\n  return 0;\n}\n',
    'def f(x):\n    if x > 0:\n        return x ** 2\n    return -x  # negative\n',
    '#include <vector>\nstd::vector<int64_t> ids = {1, 2, 3};\n',
    'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;',
    '{"key": "value", "list": [1, 2.5, -3e10, null, true], "nested": {"a": {}}}',
    '<div class="x">&nbsp;&lt;tag&gt;</div>',
    'if(a&&b||!c){x+=1;}else{y-=2;}',
    '$ ls -la /usr/local/bin | grep -v "^d" > out.txt 2>&1',
    // CJK.
    '中文分词是自然语言处理的基础。',
    '我爱北京天安门，天安门上太阳升。',
    '日本語のテキスト：ひらがな、カタカナ、漢字。',
    'トークナイザーのテストです',
    '한국어 텍스트입니다. 안녕하세요!',
    '中文English混合text文本123数字',
    '𠀀𠀁 rare CJK extension B 𪚥',
    // Emoji.
    '🙂',
    'I ❤️ emoji 🚀🚀🚀 and 👍🏽 thumbs',
    'Family: 👨‍👩‍👧‍👦, flags: 🇫🇷🇯🇵🇺🇸, keycap: 1️⃣',
    '🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂',
    // Accents and other scripts.
    'café naïve résumé Zürich São Ångström',
    'cafe\u0301 decomposed e\u0301 and precomposed é',
    'Ελληνικά: Σίσυφος ΣΟΦΟΣ',
    'Русский текст: привет, мир!',
    'עברית ועוד العربية والمزيد',
    'हिन्दी और ไทย ภาษา',
    'ﬁnancial ﬂow ＡＢＣ１２３ x² ½ № ™',
    'İstanbul Straße ǅemal',
    // Numbers.
    '0 1 12 123 1234 12345 123456 1234567',
    '3.14159265358979323846 and 2.71828',
    '1,000,000 and 1.000.000 and 1 000 000',
    'Year 2026, pi≈3.14, 100% of $42.50, 7/8, -15°C',
    '١٢٣ ٤٥٦ Arabic-Indic digits and Ⅻ roman',
    // Long words.
    'pneumonoultramicroscopicsilicovolcanoconiosis',
    'Supercalifragilisticexpialidocious antidisestablishmentarianism',
    'a'.repeat(2000),
    'ab'.repeat(700),
    'https://example.com/a/very/long/path/with-many-segments_and_underscores?x=1&y=2#frag',
    // Punctuation and symbols.
    '!!! ??? ... --- *** ### @@@ $$$',
    '«quotes» „more“ ‘single’ “double” — dash – en…',
    '\u0000null\u0001control\u007fdel',
    'tokenization supercalifragilistic привет',
    'concatenate the cat; cat, cats and a cat.',
    'New York and new york and NEW   YORK',
    'e\u0301tude and étude and Étude',
  ];
  // The tokenizer's own added tokens, alone, adjacent, repeated, and with
  // spaces around them (lstrip / rstrip).
  for (const s of specialTokens) {
    texts.push(s);
    texts.push('before' + s + 'after');
    texts.push('before ' + s + ' after');
    texts.push('  ' + s + '   ' + s + s + '\n');
  }
  if (specialTokens.length >= 2) {
    texts.push(specialTokens.join(''));
    texts.push(specialTokens.join(' text '));
  }
  texts.push(...randomTexts(specialTokens));
  return texts;
}

// Deterministic random strings over a pool of every kind of character the
// pre-tokenizer regexes tell apart, with the tokenizer's added tokens mixed
// in.
function randomTexts(specialTokens) {
  let state = 0x9e3779b9;
  const random = () => {
    // mulberry32
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const pool = [...'abcXYZéüßΣσπжЖ中文字ひらカナ한글ℕℝ0123456789٣' + "'\".,;:!?-_()[]{}<>/@#$%^&*+=~`|" +
    '     \t\n\r\u00a0\u3000\u2028\u0301\u0308\u200d'].concat(['🙂', '👍🏽', '🇫🇷', '\r\n', "'s", "'LL", 'the', 'The', ' the']);
  const texts = [];
  for (let i = 0; i < 80; ++i) {
    const length = 1 + Math.floor(random() * 60);
    let text = '';
    for (let j = 0; j < length; ++j) {
      if (specialTokens.length > 0 && random() < 0.03) {
        text += specialTokens[Math.floor(random() * specialTokens.length)];
      } else {
        text += pool[Math.floor(random() * pool.length)];
      }
    }
    texts.push(text);
  }
  return texts;
}

// Id sequences to decode: runs of one token (partial characters), special
// tokens, unknown ids, everything reversed.
function decodeCases(vocabSize, encodings, specialIds) {
  const cases = [];
  const all = [];
  for (const e of encodings) all.push(...e);
  for (let i = 0; i + 7 <= all.length && cases.length < 40; i += 13) {
    cases.push(all.slice(i, i + 7));
  }
  cases.push(all.slice(0, 200).reverse());
  cases.push(specialIds.concat([vocabSize + 5, 1 << 30]).concat(specialIds));
  for (let id = 0; id < Math.min(vocabSize, 600); id += 37) cases.push([id, id + 1, id + 2]);
  return cases;
}

async function reference(name, tokenizerFile, configFile, dir) {
  const json = fs.readFileSync(path.join(dir, tokenizerFile), 'utf8');
  const tok = Tokenizer.fromString(json);
  const spec = JSON.parse(json);
  const added = spec.added_tokens.map((t) => t.content);
  const texts = corpus(added);
  const cases = [];
  const encodings = [];
  for (const text of texts) {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const withSpecial = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = plain.getIds();
    encodings.push(ids);
    cases.push({
      text,
      ids,
      ids_with_special: withSpecial.getIds(),
      decoded: await tok.decode(ids, false),
      decoded_skip_special: await tok.decode(withSpecial.getIds(), true),
    });
  }
  const vocabSize = tok.getVocabSize(true);
  const specialIds = spec.added_tokens.map((t) => tok.tokenToId(t.content));
  const decodes = [];
  for (const ids of decodeCases(vocabSize, encodings, specialIds)) {
    decodes.push({ ids, text: await tok.decode(ids, false), text_skip_special: await tok.decode(ids, true) });
  }
  // token -> id, and that id back to its token string (for a normalized
  // added token, its normalized content).
  const lookup = (token) => {
    const id = tok.tokenToId(token);
    return { token, id, id_to_token: id === null ? null : tok.idToToken(id) };
  };
  const lookups = spec.added_tokens.map((t) => lookup(t.content));
  for (const probe of ['Ġthe', 'the', 'Ġ', 'a', '##e', 'not-a-token-at-all']) lookups.push(lookup(probe));
  return {
    name,
    reference: REFERENCE,
    tokenizer: tokenizerFile,
    tokenizer_config: configFile,
    vocab_size: vocabSize,
    lookups,
    cases,
    decodes,
  };
}

// Pretty JSON with arrays of numbers (ids) and of strings (merges) kept on
// one line each.
function pretty(value, indent) {
  const pad = ' '.repeat(indent);
  if (Array.isArray(value)) {
    if (value.every((v) => typeof v !== 'object' || v === null || (Array.isArray(v) && v.every((w) => typeof w === 'string')))) {
      if (value.every((v) => typeof v === 'number' || v === null)) return JSON.stringify(value);
      if (value.length === 0) return '[]';
      return '[\n' + value.map((v) => pad + ' ' + JSON.stringify(v)).join(',\n') + '\n' + pad + ']';
    }
    return '[\n' + value.map((v) => pad + ' ' + pretty(v, indent + 1)).join(',\n') + '\n' + pad + ']';
  }
  if (value !== null && typeof value === 'object') {
    const keys = Object.keys(value);
    if (keys.length === 0) return '{}';
    return '{\n' + keys.map((k) => pad + ' ' + JSON.stringify(k) + ': ' + pretty(value[k], indent + 1)).join(',\n') + '\n' + pad + '}';
  }
  return JSON.stringify(value);
}

function writeJson(file, value) {
  fs.writeFileSync(file, pretty(value, 0) + '\n');
}

async function main() {
  const dir = process.argv[2];
  if (!dir) {
    console.error('usage: node generate_reference.js TESTDATA_DIR');
    process.exit(2);
  }
  const crafted = {
    deepseek_style: deepseekStyle(),
    gpt2_style: gpt2Style(),
    llama3_style: llama3Style(),
    wordpiece_style: wordpieceStyle(),
  };
  for (const [name, { tokenizer, config }] of Object.entries(crafted)) {
    writeJson(path.join(dir, name + '.json'), tokenizer);
    if (config) writeJson(path.join(dir, name + '_config.json'), config);
  }
  const all = [
    ['synthetic', 'synthetic_tokenizer.json', null],
    ['deepseek_style', 'deepseek_style.json', 'deepseek_style_config.json'],
    ['gpt2_style', 'gpt2_style.json', null],
    ['llama3_style', 'llama3_style.json', null],
    ['wordpiece_style', 'wordpiece_style.json', null],
  ];
  for (const [name, file, config] of all) {
    const expected = await reference(name, file, config, dir);
    writeJson(path.join(dir, name + '.expected.json'), expected);
    console.log(name + ': ' + expected.cases.length + ' texts, ' + expected.decodes.length + ' decodes, vocab ' + expected.vocab_size);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
