#!/usr/bin/python3
"""Regenerates the seed corpus of the safetensors header fuzzer.

  /usr/bin/python3 tests/fuzz/make_safetensors_header_corpus.py \
      tests/fuzz/corpus/safetensors_header

Files named valid_* must parse; files named bad_* must be rejected with
DataLoss (safetensors_header_corpus_test checks both).
"""

import json
import os
import struct
import sys


def header_bytes(header, pad=True):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return text


def file_bytes(header_text, data=b"", length=None):
    if length is None:
        length = len(header_text)
    return struct.pack("<Q", length) + header_text + data


def layout(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, nbytes) laid out contiguously."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    return header, bytes(offset)


def main(out_dir):
    seeds = {}
    seeds["valid_empty"] = file_bytes(header_bytes({}))
    header, data = layout(
        [("layers.1.engram.embed.weight", "F8_E4M3", [4, 256], 1024),
         ("layers.1.engram.embed.scale", "F8_E8M0", [4, 8], 32)],
        metadata={"format": "pt"})
    seeds["valid_fp8_table"] = file_bytes(header_bytes(header), data)
    header, data = layout(
        [("layers.14.engram.embed.weight", "U8", [3, 128], 384),
         ("layers.14.engram.embed.scale", "F8_E4M3", [3, 16], 48),
         ("layers.14.engram.q_weight", "BF16", [4, 2], 16)])
    seeds["valid_nvfp4_table"] = file_bytes(header_bytes(header), data)
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1,
             "U8": 1, "I8": 1, "I32": 4, "I64": 8}
    header, data = layout([("t." + d, d, [2, 3], 6 * s)
                           for d, s in sizes.items()])
    seeds["valid_all_dtypes"] = file_bytes(header_bytes(header), data)
    header = {
        "scalar": {"dtype": "F32", "shape": [], "data_offsets": [4, 8]},
        "empty": {"dtype": "I64", "shape": [0, 5], "data_offsets": [8, 8]},
        "gap": {"dtype": "U8", "shape": [3], "data_offsets": [16, 19]},
    }
    seeds["valid_gaps_scalar_empty"] = file_bytes(header_bytes(header),
                                                  bytes(24))
    seeds["valid_unpadded"] = file_bytes(
        header_bytes({"x": {"dtype": "I32", "shape": [1],
                            "data_offsets": [0, 4]}}, pad=False), bytes(4))

    seeds["bad_short"] = b"\x02\x00\x00\x00\x00"
    seeds["bad_length_past_end"] = file_bytes(b"{}", length=4096)
    seeds["bad_length_absurd"] = file_bytes(b"{}", length=(1 << 64) - 1)
    seeds["bad_json"] = file_bytes(b'{"w":{"dtype":"U8",')
    seeds["bad_not_object"] = file_bytes(b"[1,2,3] ")
    seeds["bad_nul"] = file_bytes(b"{}\x00{\"a\":1}")
    seeds["bad_dtype"] = file_bytes(header_bytes(
        {"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}),
        bytes(8))
    seeds["bad_negative_shape"] = file_bytes(header_bytes(
        {"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}))
    seeds["bad_shape_overflow"] = file_bytes(header_bytes(
        {"w": {"dtype": "I64", "shape": [4294967296, 4294967296],
               "data_offsets": [0, 0]}}))
    seeds["bad_begin_after_end"] = file_bytes(header_bytes(
        {"w": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}}),
        bytes(2))
    seeds["bad_offsets_past_end"] = file_bytes(header_bytes(
        {"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}),
        bytes(4))
    seeds["bad_length_mismatch"] = file_bytes(header_bytes(
        {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}),
        bytes(8))
    seeds["bad_overlap"] = file_bytes(header_bytes(
        {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
         "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}),
        bytes(12))
    seeds["bad_duplicate"] = file_bytes(
        b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2))
    seeds["bad_metadata"] = file_bytes(header_bytes(
        {"__metadata__": {"format": 1}}))
    seeds["bad_types"] = file_bytes(header_bytes(
        {"w": {"dtype": 3, "shape": "x", "data_offsets": {}}}))

    os.makedirs(out_dir, exist_ok=True)
    for name, blob in sorted(seeds.items()):
        with open(os.path.join(out_dir, name + ".safetensors"), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main(sys.argv[1])
