#!/usr/bin/python3
"""Independent safetensors reader/writer used to cross-check the C++ code.

Written from the format's specification (8-byte little-endian header length,
JSON header, data region), not from the C++ implementation.

  safetensors_interop.py write PATH
      Writes a file the way the reference serializer lays it out: tensors
      sorted by dtype size (largest first) then name, contiguous, header
      padded with spaces to a multiple of 8, "__metadata__" first.
  safetensors_interop.py check PATH SEED
      Validates PATH by the reference implementation's strict rules (header
      starts with '{', tensors contiguous from offset 0 to the end of the
      file) and checks that the i-th tensor in data order holds
      pattern_bytes(n, SEED + i) (the C++ test helper's generator). Prints
      one line per tensor and exits non-zero on any mismatch.
"""

import json
import struct
import sys

import numpy as np

SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1,
         "U8": 1, "I8": 1, "I32": 4, "I64": 8, "I16": 2}
MASK = (1 << 64) - 1


def pattern_bytes(n, seed):
    state = (0x9E3779B97F4A7C15 ^ seed) & MASK
    out = bytearray(n)
    for i in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK
        out[i] = state >> 56
    return bytes(out)


def write(path):
    tensors = {
        "f32": ("F32", [2, 3],
                np.array([[1.5, -2.0, 0.0], [3.25, 1e-3, -7.0]],
                         dtype="<f4").tobytes()),
        "i64": ("I64", [3], np.array([-3, 0, 1 << 40], dtype="<i8").tobytes()),
        "i32": ("I32", [2], np.array([-1, 65536], dtype="<i4").tobytes()),
        "bf16": ("BF16", [4], np.array([0x3F80, 0xC000, 0, 0x7F80],
                                       dtype="<u2").tobytes()),
        "f16": ("F16", [1], np.array([1.0], dtype="<f2").tobytes()),
        "e4m3": ("F8_E4M3", [2, 2], bytes([0x38, 0xB8, 0x7E, 0x00])),
        "e8m0": ("F8_E8M0", [3], bytes([127, 128, 255])),
        "u8": ("U8", [5], bytes([0, 1, 2, 254, 255])),
        "i8": ("I8", [2], np.array([-128, 127], dtype="i1").tobytes()),
        "empty": ("F32", [0, 3], b""),
    }
    order = sorted(tensors, key=lambda n: (-SIZES[tensors[n][0]], n))
    header = {"__metadata__": {"format": "pt"}}
    data = b""
    for name in order:
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def check(path, seed):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    text = blob[8:8 + n]
    assert n % 8 == 0, "header length %d not a multiple of 8" % n
    assert text.startswith(b"{"), "header does not start with '{'"
    assert text.rstrip(b" ").endswith(b"}"), "header padding is not spaces"
    header = json.loads(text)
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    expected_begin = 0
    for i, (name, info) in enumerate(entries):
        begin, end = info["data_offsets"]
        assert begin == expected_begin, "%s: gap or overlap at %d" % (
            name, begin)
        count = 1
        for d in info["shape"]:
            count *= d
        assert end - begin == count * SIZES[info["dtype"]], name
        want = pattern_bytes(end - begin, seed + i)
        assert data[begin:end] == want, "%s: bytes differ" % name
        print(name, info["dtype"], info["shape"], begin, end)
        expected_begin = end
    assert expected_begin == len(data), "data region has trailing bytes"
    print("OK")


def main():
    if sys.argv[1] == "write":
        write(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("unknown mode " + sys.argv[1])


if __name__ == "__main__":
    main()
