"""Safetensors reading and writing with numpy, and the exact decoding of the
checkpoint number formats to float64 (test-only reference code).

Formats (../shared/docs/MODEL_V4.md section 3, ENGRAM.md "Decoding"):
- F8_E4M3 (e4m3fn): no infinities, 0x7F/0xFF are NaN, max 448.
- F8_E8M0 (ue8m0): 2^(b-127), 0xFF is NaN.
- BF16: the upper 16 bits of a float32.
- FP8 weight: e4m3(w[i, j]) * e8m0(scale[i // B0, j // B1]), B the
  quantization_config.weight_block_size.
- MXFP4 weight: I8/U8 [out, in/2], element 2c in the LOW nibble of byte c,
  2c+1 in the HIGH nibble; E8M0 scale [out, in/32].
- NVFP4 rows: e2m1 nibbles (low = even) times an E4M3 scale per 16 times an
  F32 global scale.
"""

import json
import os
import struct

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _e4m3_table():
    t = np.zeros(256)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * 2.0 ** -6 * m / 8.0
        else:
            t[b] = s * 2.0 ** (e - 7) * (1.0 + m / 8.0)
    return t


E4M3 = _e4m3_table()
E8M0 = np.array([np.nan if b == 255 else 2.0 ** (b - 127)
                 for b in range(256)])

# safetensors dtype name -> (numpy storage dtype, bytes per element)
STORAGE = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "F8_E4M3": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"), "I8": np.dtype("i1"), "U8": np.dtype("u1"),
    "I16": np.dtype("<i2"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8"),
    "U16": np.dtype("<u2"), "U32": np.dtype("<u4"), "U64": np.dtype("<u8"),
    "BOOL": np.dtype("u1"),
}

MAX_HEADER = 100 << 20


class SafetensorsFile:
    """One .safetensors file, memory-mapped; tensors are read lazily."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError(f"{path}: shorter than 8 bytes")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or 8 + n > size:
                raise ValueError(f"{path}: bad header size {n}")
            header = json.loads(f.read(n))
        self.data_start = 8 + n
        self.header = {k: v for k, v in header.items() if k != "__metadata__"}
        for name, info in self.header.items():
            if info["dtype"] not in STORAGE:
                raise ValueError(f"{path}: {name}: dtype {info['dtype']}")
            a, b = info["data_offsets"]
            count = int(np.prod(info["shape"], dtype=np.int64))
            if b - a != count * STORAGE[info["dtype"]].itemsize or \
                    self.data_start + b > size or a > b:
                raise ValueError(f"{path}: {name}: bad data_offsets")
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def dtype(self, name):
        return self.header[name]["dtype"]

    def shape(self, name):
        return tuple(self.header[name]["shape"])

    def raw(self, name):
        """The stored array (storage dtype, memory-mapped)."""
        info = self.header[name]
        a, b = info["data_offsets"]
        buf = self._map[self.data_start + a:self.data_start + b]
        return buf.view(STORAGE[info["dtype"]]).reshape(info["shape"])


def decode(dtype, raw):
    """Stored values -> float64 (element-wise formats only)."""
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(
            np.float64)
    if dtype == "F8_E4M3":
        return E4M3[raw]
    if dtype == "F8_E8M0":
        return E8M0[raw]
    return np.asarray(raw).astype(np.float64)


def dequant_fp8(w, s, block):
    """e4m3 [out, in] with an e8m0 scale [ceil(out/b0), ceil(in/b1)]."""
    out, inp = w.shape
    b0, b1 = block
    if s.shape != ((out + b0 - 1) // b0, (inp + b1 - 1) // b1):
        raise ValueError(f"fp8 scale shape {s.shape} for {w.shape} / {block}")
    scale = E8M0[s]
    scale = np.repeat(np.repeat(scale, b0, axis=0)[:out], b1, axis=1)[:, :inp]
    return E4M3[w] * scale


def unpack_fp4(packed):
    """[.., n/2] bytes -> [.., n] e2m1 values, low nibble first."""
    b = np.asarray(packed).view(np.uint8)
    out = np.empty(b.shape[:-1] + (b.shape[-1] * 2,))
    out[..., 0::2] = E2M1[b & 0x0F]
    out[..., 1::2] = E2M1[b >> 4]
    return out


def dequant_mxfp4(w, s):
    """I8/U8 [out, in/2] with an e8m0 scale [out, in/32]."""
    v = unpack_fp4(w)
    if s.shape[0] != v.shape[0] or v.shape[1] % s.shape[1]:
        raise ValueError(f"fp4 scale shape {s.shape} for {v.shape}")
    return v * np.repeat(E8M0[s], v.shape[1] // s.shape[1], axis=1)


class Checkpoint:
    """A checkpoint directory: config.json, model.safetensors.index.json (or
    one model.safetensors) and the shards."""

    def __init__(self, directory):
        self.dir = directory
        with open(os.path.join(directory, "config.json")) as f:
            self.config = json.load(f)
        index = os.path.join(directory, "model.safetensors.index.json")
        self.files = {}
        self.where = {}
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            for name, shard in weight_map.items():
                if "/" in shard or shard.startswith("."):
                    raise ValueError(f"bad shard name {shard}")
                if shard not in self.files:
                    self.files[shard] = SafetensorsFile(
                        os.path.join(directory, shard))
                if name not in self.files[shard].header:
                    raise ValueError(f"{name} not in {shard}")
                self.where[name] = self.files[shard]
        else:
            f = SafetensorsFile(os.path.join(directory, "model.safetensors"))
            self.files["model.safetensors"] = f
            for name in f.header:
                self.where[name] = f

    def has(self, name):
        return name in self.where

    def dtype(self, name):
        return self.where[name].dtype(name)

    def shape(self, name):
        return self.where[name].shape(name)

    def raw(self, name):
        if name not in self.where:
            raise KeyError(f"tensor {name} not in the checkpoint")
        return self.where[name].raw(name)

    def tensor(self, name):
        """An element-wise tensor (BF16, F32, I64, ...) as float64 / int."""
        dt = self.dtype(name)
        r = self.raw(name)
        if dt.startswith("I") or dt.startswith("U"):
            return np.asarray(r).astype(np.int64)
        return decode(dt, np.asarray(r))

    def linear(self, prefix, block):
        """The dequantized float64 [out, in] matrix of `prefix`.weight (with
        `prefix`.scale when the weight is FP8 or packed FP4)."""
        wname = prefix + ".weight"
        dt = self.dtype(wname)
        if dt == "F8_E4M3":
            return dequant_fp8(np.asarray(self.raw(wname)),
                               np.asarray(self.raw(prefix + ".scale")), block)
        if dt in ("I8", "U8"):
            return dequant_mxfp4(np.asarray(self.raw(wname)),
                                 np.asarray(self.raw(prefix + ".scale")))
        return self.tensor(wname)


# ---------------------------------------------------------------------------
# Writing (for the tests' own tiny checkpoints).


def bf16_bits(x):
    """float -> bf16 bits, round to nearest even."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


_E4M3_POS = E4M3[:127]  # bytes 0..126: the finite non-negative values
_E4M3_MID = (_E4M3_POS[1:] + _E4M3_POS[:-1]) / 2


def e4m3_bits(x):
    """float -> nearest e4m3 byte (values clipped to +-448)."""
    x = np.clip(np.asarray(x, dtype=np.float64), -448, 448)
    idx = np.searchsorted(_E4M3_MID, np.abs(x))
    return (idx | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def e2m1_nibbles(x):
    mags = E2M1[:8]
    idx = np.abs(np.abs(x)[..., None] - mags).argmin(-1)
    return (idx | np.where(x < 0, 8, 0)).astype(np.uint8)


def quant_fp8(w, block):
    """float [out, in] (dims multiples of the block) -> (e4m3 bytes, e8m0
    scale bytes)."""
    out, inp = w.shape
    b0, b1 = block
    if out % b0 or inp % b1:
        raise ValueError("quant_fp8 needs whole blocks")
    blk = w.reshape(out // b0, b0, inp // b1, b1)
    amax = np.maximum(np.abs(blk).max(axis=(1, 3)), 1e-30)
    e = np.clip(np.ceil(np.log2(amax / 448.0)), -127, 127)
    q = e4m3_bits(blk / (2.0 ** e)[:, None, :, None]).reshape(out, inp)
    return q, (e + 127).astype(np.uint8)


def quant_mxfp4(w):
    """float [out, in] -> (I8 [out, in/2], e8m0 [out, in/32])."""
    out, inp = w.shape
    blocks = w.reshape(out, inp // 32, 32)
    amax = np.maximum(np.abs(blocks).max(-1), 1e-30)
    e = np.clip(np.ceil(np.log2(amax / 6.0)), -127, 127).astype(np.int64)
    nib = e2m1_nibbles(blocks / (2.0 ** e)[..., None]).reshape(out, inp)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (e + 127).astype(np.uint8)


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype name, numpy array already in storage
    form)."""
    header = {}
    offset = 0
    blobs = []
    for name, dt, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=STORAGE[dt])
        data = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for data in blobs:
            f.write(data)
    return offset
