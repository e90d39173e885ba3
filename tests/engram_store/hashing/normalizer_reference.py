"""Reference for the compressed tokenizer's text normalization, written from
the Hugging Face normalizer sequence the model's compressed tokenizer uses:
NFKC, NFD, StripAccents (drops General_Category M*), Lowercase (per char, no
context), [ \\t\\r\\n]+ -> ' ', '^ $' -> U+E000, Strip (Rust's
char::is_whitespace), U+E000 -> ' '.

Usage: normalizer_reference.py IN.json OUT.json
IN.json is a list of strings; OUT.json the normalized strings, or null for
an input holding a code point this Python's Unicode database does not assign
(its normalization may differ between Unicode versions).
"""

import json
import re
import sys
import unicodedata

# Unicode White_Space, which Rust's char::is_whitespace tests.
WHITE_SPACE = set(
    [chr(c) for c in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680,
                      0x2028, 0x2029, 0x202F, 0x205F, 0x3000)] +
    [chr(c) for c in range(0x2000, 0x200B)])
SENTINEL = "\ue000"


def normalize(text):
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))
    s = "".join(c.lower() for c in s)
    s = re.sub(r"[ \t\r\n]+", " ", s)
    if s == " ":
        s = SENTINEL
    begin, end = 0, len(s)
    while begin < end and s[begin] in WHITE_SPACE:
        begin += 1
    while end > begin and s[end - 1] in WHITE_SPACE:
        end -= 1
    return s[begin:end].replace(SENTINEL, " ")


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        texts = json.load(f)
    out = []
    for text in texts:
        if any(unicodedata.category(c) == "Cn" for c in text):
            out.append(None)
        else:
            out.append(normalize(text))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True)


if __name__ == "__main__":
    main()
