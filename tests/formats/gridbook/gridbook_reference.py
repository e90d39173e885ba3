"""Numpy reference of the GridBook (PrismaQuant) codebook weight formats.

Test-only oracle for the C++ decoder.  Everything here is transcribed from the
public source of RobTand/gridbook 0.8.12 (commit 7edaabbf), cited as
``file:line`` below:

- ``docs/SPEC.md`` (normative): section 1 superblock layout, 1.1 LSB-first
  index stream, 1.2 FP4 scale codings v1 / v2, 1.3 FP8 per-channel scale,
  1.4 ``type_size`` table, 2 worked example, 3 decode recipe, 4.1 codebook
  digest.
- ``tests/cb_torch_reference.py``: the independent torch decoder; its
  ``reconstruct_cb_weight`` (:130-178) defines "decode-contract v1",
  ``W = bf16_RNE(f32(value) * f32(scale))``, which is what this module
  reproduces bit for bit.
- ``gridbook/codec.py``: the two-tier table and compose table (:30-37,
  :170-183), and ``nvfp4_act_quant_ref`` (:377-425), the CPU reference of the
  static NVFP4 activation contract ``e2m1_group16_ue4m3_static``.
- ``gridbook/cb_digest.py:29-46``: codebook SHA-256.
- ``gridbook/nvfp4_activation_contract.py:637-680``: ``target_values_sha256``.
- ``gridbook/runtime_contract.json:19-154``: packing keys and rung ladders.

Numbers are handled as numpy float32 where the source computes in float32
(IEEE round-to-nearest-even, no fused multiply-add), and float64 only where the
source does (the v2 compose table).  numpy only; no torch.

Run ``python3 gridbook_reference.py`` for the self-checks (exit 0 / 1).
"""

import hashlib
import re
import struct
import sys

import numpy as np

# --- format constants ------------------------------------------------------

SUPERBLOCK = 256            # SPEC.md:41-45; runtime_contract.json:21
VEC_DIM = 8                 # SPEC.md:18-20; runtime_contract.json:20
CODEWORDS_PER_SUPERBLOCK = SUPERBLOCK // VEC_DIM   # 32, runtime_contract.json:22
FP4_GROUP = 16              # SPEC.md:135-141; codec.py:22
V1_SCALE_BYTES = 16         # SPEC.md:135
V2_SCALE_BYTES = 9          # SPEC.md:144-147 (1 super byte + 8 nibble bytes)
TWO_TIER_SUPER_BIAS = 127   # SPEC.md:148-149; codec.py:35
E4M3_MAX = 448.0            # codec.py:25; cb_torch_reference.py:21
NVFP4_GRID_MAX = 6.0        # codec.py:24

# Default two-tier multiplier table "T4_2oct8m" (SPEC.md:172-174;
# codec.py:36-37).  An artifact may carry its own table in
# scheme.scale_coding.table (SPEC.md:436-437); gridbook falls back to this one
# when the table is absent (linear.py:219-230, moe.py:428-434).
T4_2OCT8M = (1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
             2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75)

# E2M1 magnitudes in code order (codec.py:28; cb_torch_reference.py:23).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Signed nibble code -> value, bit 3 = sign (codec.py:275-283, 420-423).
E2M1_VALUES = np.array(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES),
                       dtype=np.float32)

# Rung ladders of runtime_contract.json:59-154 (family, grid, mode, n_sub).
FAMILIES = {
    "NVFP4_CB_K": ("fp4", "product", 2, range(12, 25)),
    "NVFP4_CB_S": ("fp4", "signed", 1, range(12, 25)),
    "FP8_CB_K": ("fp8", "product", 4, range(28, 49)),
}

# SPEC.md:197-209 (section 1.4), normative: (grid, k) -> (v1, v2).  None =
# coding not defined for that grid.  type_size() must agree with every row.
TYPE_SIZE_TABLE = {
    ("fp4", 12): (64, 57), ("fp4", 13): (68, 61), ("fp4", 14): (72, 65),
    ("fp4", 16): (80, 73), ("fp4", 18): (88, 81), ("fp4", 20): (96, 89),
    ("fp4", 24): (112, 105),
    ("fp8", 36): (144, None), ("fp8", 40): (160, None),
    ("fp8", 44): (176, None), ("fp8", 48): (192, None),
}

# Scale codings this module names: "v1" (E4M3-direct, fp4), "v2" (two-tier,
# fp4 only), "none" (fp8: no plane).  SPEC.md:130-193; runtime_contract.json
# :35-57; linear.py:231-232 rejects two-tier on fp8.  In a scheme, v2 is a
# ``scale_coding`` object of kind "two_tier" (or the bare string), absent
# means v1 (SPEC.md:431-438, 520-523; linear.py:219-230).
SCALE_CODINGS = ("v1", "v2", "none")


# --- scheme arithmetic -----------------------------------------------------

def bit_split(k, n_sub):
    """Sub-index widths of a ``k``-bit product codeword, larger parts first.

    cb_torch_reference.py:26-30 (``_split_widths``): ``k // n + (i < k % n)``;
    SPEC.md:103-107; runtime_contract.json:25 ("ceil_first").  ``n_sub`` is
    1 (full / signed), 2 (fp4 product) or 4 (fp8 product).
    """
    k, n_sub = int(k), int(n_sub)
    if n_sub not in (1, 2, 4):
        raise ValueError(f"unsupported sub-codebook count: {n_sub}")
    base, extra = divmod(k, n_sub)
    return tuple(base + (1 if i < extra else 0) for i in range(n_sub))


def type_size(grid, k, scale_coding):
    """Bytes per 256-weight superblock: ``4k`` index bytes + the scale plane.

    SPEC.md:56-73 and 195-220: fp4 v1 ``4k+16``, fp4 v2 ``4k+9``, fp8 ``4k``
    (codec.py:40-41 covers v1/fp8; cb_torch_reference.py:194-196 v2).  Raises
    for a (grid, coding) pair the format does not define, and asserts the
    result against the SPEC section 1.4 table where that table has a row.
    """
    k = int(k)
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if grid == "fp4":
        if scale_coding == "v1":
            size = 4 * k + V1_SCALE_BYTES
        elif scale_coding == "v2":
            size = 4 * k + V2_SCALE_BYTES
        else:
            raise ValueError(f"fp4 scale coding must be v1 or v2, not "
                             f"{scale_coding!r}")
    elif grid == "fp8":
        if scale_coding not in ("none", "v1"):
            raise ValueError("two-tier scale coding is fp4-only "
                             "(linear.py:231-232)")
        size = 4 * k
    else:
        raise ValueError(f"unknown grid {grid!r}")
    row = TYPE_SIZE_TABLE.get((grid, k))
    if row is not None:
        expect = row[1] if scale_coding == "v2" else row[0]
        assert expect == size, (grid, k, scale_coding, size, expect)
    return size


def parse_format(name):
    """``NVFP4_CB_K16`` -> dict(grid, mode, k, n_sub).

    Name patterns and rung ladders: runtime_contract.json:59-154; SPEC.md
    :22-26.  Signed rungs are spelled ``NVFP4_CB_S{k}``.
    """
    m = re.fullmatch(r"(NVFP4_CB_K|NVFP4_CB_S|FP8_CB_K)(\d+)", name)
    if m is None:
        raise ValueError(f"not a GridBook codebook format: {name!r}")
    grid, mode, n_sub, rungs = FAMILIES[m.group(1)]
    k = int(m.group(2))
    if k not in rungs:
        raise ValueError(f"{name}: k={k} is not on the {m.group(1)} ladder")
    return {"grid": grid, "mode": mode, "k": k, "n_sub": n_sub}


def make_scheme(name, scale_coding, table=None):
    """The decode parameters of one format + scale coding.

    ``widths`` is ``bit_split(k, n_sub)`` for product mode and ``(k-8,)``
    (the magnitude-index width above the 8 sign bits) for signed mode.
    """
    s = parse_format(name)
    if s["grid"] == "fp8":
        if scale_coding not in ("none", "v1"):
            raise ValueError("fp8 has no scale plane")
        scale_coding = "none"
    if s["mode"] == "product":
        widths = bit_split(s["k"], s["n_sub"])
    elif s["mode"] == "signed":
        if s["k"] <= 8:
            raise ValueError("signed mode needs k > 8 (cb_gemv.cu:1154)")
        widths = (s["k"] - 8,)
    else:
        widths = (s["k"],)
    s.update(name=name, scale_coding=scale_coding, widths=widths,
             type_size=type_size(s["grid"], s["k"], scale_coding),
             table=(tuple(float(t) for t in (table or T4_2OCT8M))
                    if scale_coding == "v2" else None))
    return s


def table_shapes(scheme):
    """Sidecar table shapes (SPEC.md:306-311): product sub ``i`` is
    ``(2^b_i, 8/n_sub)``; signed / full is one ``(2^K, 8)`` table."""
    if scheme["mode"] == "product":
        return [(1 << w, VEC_DIM // scheme["n_sub"]) for w in scheme["widths"]]
    return [(1 << scheme["widths"][0], VEC_DIM)]


# --- scalar number formats -------------------------------------------------

def _e4m3_table():
    """float8_e4m3fn byte -> float32: bias 7, subnormals m*2^-9, 0x7F/0xFF
    NaN, no infinities."""
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 0xF and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = sign * m * 2.0 ** -9
        else:
            t[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t.astype(np.float32)


E4M3_TO_F32 = _e4m3_table()


def e4m3_decode(b):
    """uint8 array of E4M3 bytes -> float32 (``x.view(float8_e4m3fn).to(
    float32)``, codec.py:186-194)."""
    return E4M3_TO_F32[np.asarray(b, dtype=np.uint8)]


def e4m3_encode_rne(x):
    """float32 -> E4M3 bytes, round-to-nearest-even, as torch's
    ``.to(torch.float8_e4m3fn)`` does: subnormals kept, |x| >= 480 and NaN
    give 0x7F (non-saturating; callers clamp to 448 first, codec.py:394-395).
    """
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x).astype(np.float64)
    sign = np.signbit(x).astype(np.uint8) << 7
    out = np.zeros(x.shape, dtype=np.uint8)
    nan = ~(a < 480.0)                       # also NaN
    sub = a < 2.0 ** -6
    # Subnormal range: quantum 2^-9; m == 8 lands on the smallest normal,
    # whose byte 0x08 is the same integer.
    m_sub = np.rint(np.where(sub, a, 0.0) * 2.0 ** 9).astype(np.int64)
    safe = np.where(sub | nan, 1.0, a)
    e = np.floor(np.log2(safe)).astype(np.int64)
    q = np.rint(safe / np.exp2(e - 3)).astype(np.int64)   # 8..16, exact quotient
    e = np.where(q == 16, e + 1, e)
    q = np.where(q == 16, 8, q)
    normal = ((e + 7) << 3) | (q - 8)
    code = np.where(sub, m_sub, normal)
    code = np.where(nan | (code > 0x7E), 0x7F, code)
    out[...] = code.astype(np.uint8) | sign
    return out


def bf16_bits_rne(x):
    """float32 -> bfloat16 bits, round-to-nearest-even on the float32 bits.

    This is ``Tensor.to(torch.bfloat16)`` (c10 ``round_to_nearest_even``):
    ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16``; overflow carries into the
    exponent and gives +-inf; subnormals are rounded, not flushed.  NaN is
    returned as 0x7FC0 (the scalar c10 path; torch's AVX path gives 0xFFFF,
    so NaN bits are not a contract - compare NaN by class).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r).astype(np.uint16)


def same_bf16(a, b):
    """bf16 bit arrays equal, with any NaN matching any NaN."""
    a = np.asarray(a, dtype=np.uint16)
    b = np.asarray(b, dtype=np.uint16)
    na, nb = np.isnan(bf16_to_f32(a)), np.isnan(bf16_to_f32(b))
    return bool(np.array_equal(na, nb) and np.array_equal(a[~na], b[~nb]))


def bf16_to_f32(bits):
    """bfloat16 bits -> float32 (exact)."""
    b = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16
    return b.view(np.float32)


# --- index stream ----------------------------------------------------------

def pack_codewords(codes, k):
    """Inverse of :func:`extract_codewords` for one superblock's index stream:
    ``codes`` [..., 32] -> [..., 4k] bytes.  Codeword ``c`` occupies stream
    bits ``[c*k, c*k+k)`` LSB first, stream bit ``8b+j`` is bit ``j`` of byte
    ``b`` (SPEC.md:79-92).  Bit-by-bit, deliberately unlike the extractor."""
    codes = np.asarray(codes, dtype=np.uint64)
    lead = codes.shape[:-1]
    bits = np.zeros(lead + (32 * k,), dtype=np.uint8)
    for c in range(CODEWORDS_PER_SUPERBLOCK):
        for j in range(k):
            bits[..., c * k + j] = (codes[..., c] >> np.uint64(j)) & np.uint64(1)
    bits = bits.reshape(lead + (4 * k, 8))
    weights = (1 << np.arange(8)).astype(np.uint16)
    return (bits.astype(np.uint16) * weights).sum(axis=-1).astype(np.uint8)


def extract_codewords(qweight, k, ts):
    """The 32 ``k``-bit codewords of every superblock, LSB first.

    ``qweight`` uint8 [rows, n_sb*ts] -> uint64 [rows, n_sb, 32].  Same
    construction as cb_torch_reference.py:33-74: an 8-byte little-endian
    window anchored at byte ``(v*k)//8``, shifted by ``(v*k)%8`` and masked
    (k <= 57 fits).  Only the ``4k`` index bytes of each superblock are read;
    the window runs into zero padding, never into the scale plane.
    """
    qweight = np.asarray(qweight, dtype=np.uint8)
    rows, row_bytes = qweight.shape
    if row_bytes % ts:
        raise ValueError(f"row of {row_bytes} bytes is not whole superblocks "
                         f"of {ts}")
    if not 0 < k <= 57:
        raise ValueError("codewords of 1..57 bits only")
    n_sb = row_bytes // ts
    idx = qweight.reshape(rows, n_sb, ts)[:, :, :4 * k]
    pad = np.zeros((rows, n_sb, 8), dtype=np.uint8)
    padded = np.concatenate([idx, pad], axis=2).astype(np.uint64)
    v = np.arange(CODEWORDS_PER_SUPERBLOCK, dtype=np.int64)
    byte_base, shift = (v * k) // 8, (v * k) % 8
    window = np.zeros((rows, n_sb, CODEWORDS_PER_SUPERBLOCK), dtype=np.uint64)
    for b in range(8):
        window |= padded[:, :, byte_base + b] << np.uint64(8 * b)
    mask = np.uint64((1 << k) - 1)
    return (window >> shift.astype(np.uint64)) & mask


# --- codeword values -------------------------------------------------------

def tables_to_f32(tables):
    """Sidecar F16 tables -> float32, requiring them exact in bfloat16.

    gridbook decodes from a bf16 flat table (codec.py:146-159) and refuses a
    lossy cast (codec.py:77-103); grid-valued tables (E2M1 / E4M3) always pass.
    """
    out = []
    for t in tables:
        f = np.asarray(t, dtype=np.float16).astype(np.float32)
        if not np.array_equal(bf16_to_f32(bf16_bits_rne(f)), f,
                              equal_nan=False):
            raise ValueError("codebook table is not exact in bfloat16")
        out.append(f)
    return out


def decode_values(codes, tables, scheme):
    """Codewords [rows, n_sb, 32] -> unscaled values float32 [rows, n_sb*256].

    product (SPEC.md:103-118, cb_torch_reference.py:110-125): sub-index ``i``
    = ``(code >> off_i) & (2^b_i - 1)``, sub 0 in the low bits, ``off_i`` the
    sum of the earlier widths; the 8 coordinates are ``[sub0 | sub1 | ...]``,
    ``8/n_sub`` each.
    signed (SPEC.md:120-128, cb_torch_reference.py:102-109): low 8 bits are
    signs (bit ``j`` set => coordinate ``j`` negated, so a zero magnitude
    becomes -0.0), ``table[code >> 8]`` the 8 magnitudes.
    full (SPEC.md:97-101): ``table[code]``.
    """
    tabs = tables_to_f32(tables)
    rows, n_sb, _ = codes.shape
    if scheme["mode"] == "product":
        pieces, off = [], 0
        for w, tab in zip(scheme["widths"], tabs):
            if tab.shape != (1 << w, VEC_DIM // scheme["n_sub"]):
                raise ValueError(f"sub-table shape {tab.shape} for width {w}")
            idx = (codes >> np.uint64(off)) & np.uint64((1 << w) - 1)
            pieces.append(tab[idx.astype(np.int64)])
            off += w
        vals = np.concatenate(pieces, axis=-1)
    elif scheme["mode"] == "signed":
        (tab,) = tabs
        if tab.shape != (1 << (scheme["k"] - 8), VEC_DIM):
            raise ValueError(f"signed table shape {tab.shape}")
        mag = tab[(codes >> np.uint64(8)).astype(np.int64)]
        j = np.arange(VEC_DIM, dtype=np.uint64)
        neg = ((codes[..., None] >> j) & np.uint64(1)).astype(bool)
        vals = np.where(neg, -mag, mag)
    elif scheme["mode"] == "full":
        (tab,) = tabs
        vals = tab[codes.astype(np.int64)]
    else:
        raise ValueError(f"unknown mode {scheme['mode']!r}")
    return vals.reshape(rows, n_sb * SUPERBLOCK).astype(np.float32)


# --- scales ----------------------------------------------------------------

def compose_table(table=T4_2OCT8M):
    """Two-tier (E, c) -> scale: float32(float64(T[c]) * 2^(E-127)), (256, 16).

    codec.py:170-183 (``build_compose_table``) and cb_torch_reference.py
    :207-211.  For the default table every finite entry is exact in float32
    (subnormal at small E); products >= 2^128 (E == 255, and E == 254 with
    T[c] >= 2) overflow to +inf.  The fused CUDA lane's
    byte table (codec.py:345-350) clamps to [0, 448] and casts to E4M3
    instead, so it differs on pairs no conforming encoder emits.
    """
    t = np.asarray(table, dtype=np.float64)
    if t.shape != (16,):
        raise ValueError("the 4-bit two-tier table has 16 entries")
    exact = t[None, :] * np.exp2(np.arange(256, dtype=np.float64)[:, None]
                                 - TWO_TIER_SUPER_BIAS)
    with np.errstate(over="ignore"):
        return exact.astype(np.float32)


def compose_legality(table=T4_2OCT8M):
    """(256, 16) bool: the (E, c) pairs a conforming encoder may emit.

    cb_torch_reference.py:199-217: finite, in (0, 448], survives an E4M3 round
    trip bit for bit, and the float32 value equals the float64 product
    (SPEC.md:160-166).
    """
    t = np.asarray(table, dtype=np.float64)
    exact = t[None, :] * np.exp2(np.arange(256, dtype=np.float64)[:, None]
                                 - TWO_TIER_SUPER_BIAS)
    comp = compose_table(table)
    finite = np.isfinite(comp)
    inrange = finite & (comp > 0) & (comp <= E4M3_MAX)
    trip = e4m3_decode(e4m3_encode_rne(np.where(inrange, comp, 0)))
    return inrange & (trip == comp) & (comp.astype(np.float64) == exact)


def pack_v2_plane(super_e, sub_codes):
    """(E [...], c [..., 16]) -> 9-byte plane [..., 9]: byte E, then group
    ``g`` in byte ``g//2``, even ``g`` in the low nibble (SPEC.md:144-153)."""
    c = np.asarray(sub_codes, dtype=np.uint8)
    if np.any(c > 15):
        raise ValueError("sub codes are 4 bits")
    nib = c[..., 0::2] | (c[..., 1::2] << 4)
    return np.concatenate([np.asarray(super_e, dtype=np.uint8)[..., None], nib],
                          axis=-1)


def unpack_v2_plane(plane):
    """Inverse of :func:`pack_v2_plane` (cb_torch_reference.py:163-167)."""
    plane = np.asarray(plane, dtype=np.uint8)
    sub = plane[..., 1:9]
    codes = np.stack([sub & 0xF, sub >> 4], axis=-1)
    return plane[..., 0], codes.reshape(plane.shape[:-1] + (16,))


def decode_scales(qweight, scheme, weight_scale=None):
    """Per-weight float32 scale [rows, in].

    fp4 v1 (SPEC.md:135-142, codec.py:186-194, cb_torch_reference.py:171-175):
      16 E4M3 bytes after the ``4k`` index bytes; group ``g`` covers weights
      ``[16g, 16g+16)`` of the superblock.
    fp4 v2 (SPEC.md:144-170, cb_torch_reference.py:157-170):
      ``scale_g = compose[E, c_g]`` (see :func:`compose_table`).
    fp8 (SPEC.md:186-193, cb_torch_reference.py:150-154):
      ``weight_scale[row]``, float32.
    """
    qweight = np.asarray(qweight, dtype=np.uint8)
    rows, row_bytes = qweight.shape
    k, ts = scheme["k"], scheme["type_size"]
    n_sb = row_bytes // ts
    blocks = qweight.reshape(rows, n_sb, ts)
    if scheme["grid"] == "fp8":
        ws = np.asarray(weight_scale, dtype=np.float32).reshape(rows, 1)
        return np.broadcast_to(ws, (rows, n_sb * SUPERBLOCK))
    if scheme["scale_coding"] == "v1":
        group = e4m3_decode(blocks[:, :, 4 * k:4 * k + V1_SCALE_BYTES])
    elif scheme["scale_coding"] == "v2":
        e, c = unpack_v2_plane(blocks[:, :, 4 * k:4 * k + V2_SCALE_BYTES])
        comp = compose_table(scheme["table"] or T4_2OCT8M)
        group = comp[e.astype(np.int64)[..., None], c.astype(np.int64)]
    else:
        raise ValueError(f"unknown fp4 scale coding {scheme['scale_coding']!r}")
    return np.repeat(group.reshape(rows, n_sb * FP4_GROUP), FP4_GROUP, axis=1)


# --- the decode contract ---------------------------------------------------

def decode_weight_f32(qweight, tables, scheme, weight_scale=None):
    """``f32(value) * f32(scale)``, one float32 RNE multiply per weight."""
    codes = extract_codewords(qweight, scheme["k"], scheme["type_size"])
    values = decode_values(codes, tables, scheme)
    scales = decode_scales(qweight, scheme, weight_scale)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        return (values * scales).astype(np.float32)


def decode_weight_bf16(qweight, tables, scheme, weight_scale=None):
    """Decode-contract v1: ``W = bf16_RNE(f32(value) * f32(scale))`` as
    uint16 bits [rows, in].

    cb_torch_reference.py:146-154 and 177-178: the value is read from the
    bf16 table and widened to float32, multiplied once by the float32 scale
    (float32 rounding), then rounded once more to bf16 (``.to(bfloat16)``).
    The same per-weight rounding is the CUDA GEMV's default "decode contract
    v1" (cb_gemv.cu:300-310; contract v2 at cb_gemv.cu:219-228 instead hoists
    the scale out of the sum and never forms W).  For fp4 both roundings are
    exact (E2M1 x E4M3 has <= 6 significant bits); for fp8 the product of an
    E4M3 value and an arbitrary float32 scale is rounded twice.
    """
    return bf16_bits_rne(decode_weight_f32(qweight, tables, scheme,
                                           weight_scale))


def decode_row_recipe(qrow, tables, scheme, weight_scale_row=None):
    """One row, written as the SPEC.md:244-267 loop with Python ints, for
    cross-checking the vectorised path.  Returns bf16 bits (uint16 [in])."""
    k, ts = scheme["k"], scheme["type_size"]
    n_sb = len(qrow) // ts
    tabs = tables_to_f32(tables)
    comp = (compose_table(scheme["table"] or T4_2OCT8M)
            if scheme["scale_coding"] == "v2" else None)
    out = np.zeros(n_sb * SUPERBLOCK, dtype=np.float32)
    for s in range(n_sb):
        base = s * ts
        stream = int.from_bytes(bytes(qrow[base:base + 4 * k]), "little")
        for v in range(CODEWORDS_PER_SUPERBLOCK):
            code = (stream >> (v * k)) & ((1 << k) - 1)
            if scheme["mode"] == "product":
                cw, off = [], 0
                for w, tab in zip(scheme["widths"], tabs):
                    cw.extend(tab[(code >> off) & ((1 << w) - 1)])
                    off += w
            elif scheme["mode"] == "signed":
                mag = tabs[0][code >> 8]
                cw = [-mag[j] if (code >> j) & 1 else mag[j] for j in range(8)]
            else:
                cw = list(tabs[0][code])
            for j in range(VEC_DIM):
                g = (v * 8 + j) // FP4_GROUP
                if scheme["grid"] == "fp8":
                    sc = np.float32(weight_scale_row)
                elif scheme["scale_coding"] == "v1":
                    sc = E4M3_TO_F32[qrow[base + 4 * k + g]]
                else:
                    byte = qrow[base + 4 * k + 1 + g // 2]
                    sc = comp[qrow[base + 4 * k], (byte >> (4 * (g & 1))) & 0xF]
                with np.errstate(over="ignore", invalid="ignore"):
                    out[s * SUPERBLOCK + v * 8 + j] = np.float32(cw[j]) * sc
    return bf16_bits_rne(out)


# --- static NVFP4 W4A4 activation contract ---------------------------------

EXECUTION_CONTRACT = "e2m1_group16_ue4m3_static"  # nvfp4_activation_contract.py:36


def nvfp4_act_quant(x, global_scale):
    """``e2m1_group16_ue4m3_static`` exactly as codec.py:377-425
    (``nvfp4_act_quant_ref``) computes it on CPU, all in float32:

    1. ``xs = x * G`` (:392);
    2. per 16 consecutive values ``sf = e4m3_RNE(min(amax(|xs|) / 6, 448))``
       (:393-395), a true float32 division by 6;
    3. ``xg = clamp(xs / sf, -6, 6)`` with ``sf`` replaced by 1 where it is 0
       (:396-400);
    4. magnitude code = nearest E2M1 magnitude; on an exact tie the EVEN
       magnitude index wins (:402-417) - 0.25->0, 0.75->1.0, 1.25->1.0,
       1.75->2.0, 2.5->2.0, 3.5->4.0, 5->4.0;
    5. ``sf == 0`` => magnitude 0 for the whole group (:418-419);
    6. sign bit (bit 3) = signbit(xs), kept on zeros, including -0.0 inputs
       and underflowed groups (:420-423).

    Returns (codes uint8 [M, K] nibbles, sf uint8 [M, K/16] E4M3 bytes,
    recip float32 = 1/G rounded to float32 (:425)).

    Not reproduced: vLLM's ``scaled_fp4_quant`` and gridbook's own fused
    quantizer (cb_fused_fp4_gemm.cu:376-408) compute
    ``sf = G * (amax(x) * rcp.approx(6))`` and ``q = cvt.rn.e2m1(x *
    rcp.approx(sf * rcp.approx(G)))`` with approximate reciprocals, so their
    bytes can differ from this reference (codec.py:386-390; the gridbook tests
    only pin ties and underflow against them, test_nvfp4_act_quant_ref.py
    :1-9).  Even the torch reference is device-dependent: on CUDA, torch
    evaluates step 2 as ``amax * float32(1/6)`` (tensor / CPU scalar), which
    differs from the division for a few amax values just below an E4M3
    rounding midpoint, e.g. amax = 7.1249995 gives sf 1.125 here and 1.25
    there.  This module follows the CPU (division) semantics.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % FP4_GROUP:
        raise ValueError("x must be [M, K] with K a multiple of 16")
    g_scale = np.float32(np.asarray(global_scale, dtype=np.float32).reshape(-1)[0])
    m, k = x.shape
    with np.errstate(over="ignore", invalid="ignore"):
        xs = (x * g_scale).astype(np.float32)
        g = xs.reshape(m, k // FP4_GROUP, FP4_GROUP)
        amax = np.abs(g).max(axis=-1)
        sf_val = np.minimum(amax / np.float32(NVFP4_GRID_MAX),
                            np.float32(E4M3_MAX)).astype(np.float32)
        sf = e4m3_encode_rne(sf_val)
        sf_f = e4m3_decode(sf)
        nonzero = sf_f != 0
        safe = np.where(nonzero, sf_f, np.float32(1.0)).astype(np.float32)
        xg = np.clip(g / safe[..., None], np.float32(-NVFP4_GRID_MAX),
                     np.float32(NVFP4_GRID_MAX)).astype(np.float32)
    mag = np.asarray(E2M1_MAGNITUDES, dtype=np.float32)
    xmag = np.abs(xg)
    upper = np.minimum(np.searchsorted(mag, xmag, side="left"), 7)
    lower = np.maximum(upper - 1, 0)
    lower_dist = (xmag - mag[lower]).astype(np.float32)
    upper_dist = (mag[upper] - xmag).astype(np.float32)
    choose_upper = (upper_dist < lower_dist) | (
        (upper_dist == lower_dist) & ((upper & 1) == 0))
    mag_idx = np.where(choose_upper, upper, lower)
    mag_idx = np.where(nonzero[..., None], mag_idx, 0)
    sign = np.signbit(g).astype(np.uint8) << 3
    codes = (mag_idx.astype(np.uint8) | sign).reshape(m, k)
    recip = np.float32(np.float32(1.0) / g_scale)
    return codes, sf, recip


def nvfp4_act_dequant(codes, sf, recip):
    """Dequantized activation ``xq = (q * sf) * recip`` in float32.

    ``q * sf`` is exact (E2M1 x E4M3); ``recip`` is the float32 ``1/G`` that
    gridbook multiplies into the GEMM result per row (codec.py:425,
    nvfp4_activation_contract.py:770, linear.py:944-948), so the one rounding
    is that final multiply.  Signed zeros survive (-0 * sf * recip = -0).
    """
    codes = np.asarray(codes, dtype=np.uint8)
    m, k = codes.shape
    q = E2M1_VALUES[codes].reshape(m, k // FP4_GROUP, FP4_GROUP)
    s = e4m3_decode(sf)[..., None]
    return ((q * s).astype(np.float32) * np.float32(recip)).astype(
        np.float32).reshape(m, k)


def pack_e2m1_codes(codes):
    """Nibble codes [..., K] -> bytes [..., K/2], even element in the low
    nibble (codec.py:286-291)."""
    c = np.asarray(codes, dtype=np.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


# --- digests ---------------------------------------------------------------

def codebook_sha256(table):
    """SHA-256 of the table as contiguous little-endian float16, C order, no
    framing (cb_digest.py:29-46; SPEC.md:353-364)."""
    raw = np.ascontiguousarray(np.asarray(table, dtype=np.float32)
                               .astype("<f2")).tobytes()
    return hashlib.sha256(raw).hexdigest()


CONTRACT_SCHEMA = "prismaquant.nvfp4_w4a4_activation.v1"   # contract.py:22
SUPPORTED_POLICIES = (                                      # contract.py:48-57
    "legacy_6_over_calibration_amax.v1",
    "full_e4m3_range_448x6_over_calibration_amax.v1",
    "mse_grid_calibrated.v1",
)


def scale_f32(value, target=""):
    """One finite positive float32 (nvfp4_activation_contract.py:637-658)."""
    rounded = struct.unpack("<f", struct.pack("<f", float(value)))[0]
    if not np.isfinite(rounded) or rounded <= 0.0:
        raise ValueError(f"{target}.input_global_scale must be finite and > 0")
    return rounded


def target_values_sha256(scales, policy):
    """``execution_contracts.nvfp4_w4a4.target_values_sha256``
    (nvfp4_activation_contract.py:661-680): SHA-256 over ``<I``-length-prefixed
    UTF-8 of the v1 schema literal and the policy, then for each target name in
    sorted order its ``<I``-prefixed UTF-8 name and its ``<f`` value.  The v2
    record schema still frames with the v1 literal (:23-29)."""
    if policy not in SUPPORTED_POLICIES:
        raise ValueError(f"unsupported NVFP4 scale policy {policy!r}")
    d = hashlib.sha256()
    for field in (CONTRACT_SCHEMA, policy):
        enc = field.encode("utf-8")
        d.update(struct.pack("<I", len(enc)))
        d.update(enc)
    for target in sorted(scales):
        enc = str(target).encode("utf-8")
        d.update(struct.pack("<I", len(enc)))
        d.update(enc)
        d.update(struct.pack("<f", scale_f32(scales[target], str(target))))
    return d.hexdigest()


# --- self-checks -----------------------------------------------------------

# codec test vectors (tests/test_nvfp4_act_quant_ref.py:17-48).
MIDPOINT_ROW = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
                -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 6.0, 0.0]
MIDPOINT_CODES_RNE = [0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 7, 0]
UNDERFLOW_VALUES = [0.0, 2.0 ** -20, 0.001, 0.003, 0.005, 0.0058,
                    6.0 * 2.0 ** -10, 0.006, 0.008, -(2.0 ** -20), -0.001,
                    -0.003, -0.005, -0.0058, -(6.0 * 2.0 ** -10), -0.006]


def _check(cond, what, failures):
    if not cond:
        failures.append(what)


def check_worked_example(failures):
    """SPEC.md:224-240: NVFP4_CB_K12, widths (6, 6), (sub0, sub1) = (5, 3)
    <-> codeword 197; byte 1's low nibble finishes c0."""
    sch = make_scheme("NVFP4_CB_K12", "v1")
    _check(sch["widths"] == (6, 6) and sch["type_size"] == 64,
           "worked example: widths / type_size", failures)
    c0 = 5 | (3 << 6)
    _check(c0 == 197, "worked example: 5 | 3<<6 == 197", failures)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1 << 12, size=32, dtype=np.uint64)
    codes[0] = c0
    idx = pack_codewords(codes, 12)
    _check(idx[0] == (197 & 0xFF) and (idx[1] & 0xF) == (197 >> 8),
           "worked example: bytes 0/1", failures)
    _check(((int(idx[1]) >> 4) | (int(idx[2]) << 4)) == int(codes[1]),
           "worked example: c1 starts in byte 1's high nibble", failures)
    scales = np.full(16, 0x38, dtype=np.uint8)          # E4M3 1.0
    qw = np.concatenate([idx, scales])[None, :]
    _check(qw.shape == (1, 64), "worked example: cb_qweight (1, 64)", failures)
    got = int(extract_codewords(qw, 12, 64)[0, 0, 0])
    _check(got == 197 and (got & 63) == 5 and ((got >> 6) & 63) == 3,
           "worked example: extract 197 -> (5, 3)", failures)
    sub0 = np.asarray(E2M1_VALUES)[np.arange(256).reshape(64, 4) % 16]
    sub1 = np.asarray(E2M1_VALUES)[(np.arange(256).reshape(64, 4) * 3) % 16]
    w = bf16_to_f32(decode_weight_bf16(qw, [sub0, sub1], sch))
    _check(np.array_equal(w[0, :8], np.concatenate([sub0[5], sub1[3]])),
           "worked example: vector 0 = sub_cb0[5] | sub_cb1[3]", failures)


def check_type_sizes(failures):
    """SPEC.md:197-209 table, and the refusals."""
    for (grid, k), (v1, v2) in TYPE_SIZE_TABLE.items():
        if grid == "fp4":
            _check(type_size(grid, k, "v1") == v1 and
                   type_size(grid, k, "v2") == v2, f"type_size fp4 k{k}",
                   failures)
        else:
            _check(type_size(grid, k, "none") == v1, f"type_size fp8 k{k}",
                   failures)
    for bad in (("fp8", 36, "v2"), ("fp4", 16, "none"), ("fp6", 16, "v1")):
        try:
            type_size(*bad)
            failures.append(f"type_size accepted {bad}")
        except ValueError:
            pass
    for k in range(12, 25):
        _check(type_size("fp4", k, "v1") == 4 * k + 16 and
               type_size("fp4", k, "v2") == 4 * k + 9, f"fp4 formula k{k}",
               failures)
    for k in range(28, 49):
        _check(type_size("fp8", k, "none") == 4 * k, f"fp8 formula k{k}",
               failures)
    _check(bit_split(13, 2) == (7, 6) and bit_split(40, 4) == (10,) * 4 and
           bit_split(36, 4) == (9,) * 4 and bit_split(29, 4) == (8, 7, 7, 7)
           and bit_split(12, 2) == (6, 6), "bit_split examples", failures)
    for name in ("NVFP4_CB_K11", "NVFP4_CB_K25", "FP8_CB_K27", "FP8_CB_K49",
                 "NVFP4_CB_X12"):
        try:
            parse_format(name)
            failures.append(f"parse_format accepted {name}")
        except ValueError:
            pass


def check_index_round_trips(failures):
    """pack -> extract for every rung and the row recipe vs the vectorised
    decode for product / signed / fp8."""
    rng = np.random.default_rng(1)
    for k in list(range(12, 25)) + list(range(28, 49)):
        codes = rng.integers(0, 1 << k, size=(3, 2, 32), dtype=np.uint64)
        idx = pack_codewords(codes, k)
        ts = 4 * k + 5                       # arbitrary trailing plane bytes
        tail = rng.integers(0, 256, size=(3, 2, 5), dtype=np.uint8)
        qw = np.concatenate([idx, tail], axis=2).reshape(3, 2 * ts)
        _check(np.array_equal(extract_codewords(qw, k, ts), codes),
               f"codeword round trip k{k}", failures)
    cases = [("NVFP4_CB_K13", "v1"), ("NVFP4_CB_K16", "v2"),
             ("NVFP4_CB_S13", "v2"), ("NVFP4_CB_S12", "v1"),
             ("FP8_CB_K29", "none")]
    for name, coding in cases:
        sch = make_scheme(name, coding)
        if sch["grid"] == "fp4":
            pool = E2M1_VALUES if sch["mode"] == "product" else \
                E2M1_VALUES[:8]
        else:
            finite = np.array([b for b in range(256) if b & 0x7F != 0x7F])
            pool = E4M3_TO_F32[finite]
        tabs = [pool[rng.integers(0, len(pool), size=s)]
                for s in table_shapes(sch)]
        qw = rng.integers(0, 256, size=(2, 2 * sch["type_size"]),
                          dtype=np.uint8)
        ws = rng.uniform(0.01, 2.0, size=2).astype(np.float32)
        vec = decode_weight_bf16(qw, tabs, sch, ws)
        for r in range(2):
            ref = decode_row_recipe(qw[r], tabs, sch, ws[r])
            _check(same_bf16(vec[r], ref),
                   f"recipe vs vectorised {name}.{coding} row {r}", failures)
    # Signed sign bits: code with sign byte 0b10000001 over a zero magnitude.
    sch = make_scheme("NVFP4_CB_S12", "v1")
    tab = np.zeros((16, 8), dtype=np.float32)
    tab[1] = [0.5, 1, 1.5, 2, 3, 4, 6, 0]
    codes = np.zeros((1, 1, 32), dtype=np.uint64)
    codes[0, 0, 0] = (1 << 8) | 0b10000001
    vals = decode_values(codes, [tab], sch)
    _check(np.array_equal(vals[0, :8], [-0.5, 1, 1.5, 2, 3, 4, 6, -0.0]) and
           np.signbit(vals[0, 7]) and not np.signbit(vals[0, 8]),
           "signed sign bits", failures)


def check_numbers(failures):
    """E4M3 / bf16 conversions and the two-tier legality set."""
    finite = np.array([b for b in range(256) if b & 0x7F != 0x7F],
                      dtype=np.uint8)
    _check(np.array_equal(e4m3_encode_rne(E4M3_TO_F32[finite]), finite),
           "e4m3 byte round trip", failures)
    probes = np.array([1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 464.0,
                       450.0, 0.0, 1.0 + 2.0 ** -20, 2.0 ** -6 - 2.0 ** -12],
                      dtype=np.float32)
    want = [0x38, 0x3A, 0x00, 0x02, 0x7E, 0x7E, 0x00, 0x38, 0x08]
    _check(list(e4m3_encode_rne(probes)) == want, "e4m3 RNE probes", failures)
    b = bf16_bits_rne(np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -2.5,
                                3.4e38, 2.0 ** -130, np.inf], dtype=np.float32))
    _check(list(b) == [0x3F80, 0x3F82, 0xC020, 0x7F80, 0x0008, 0x7F80],
           "bf16 RNE probes", failures)
    legal = compose_legality()
    comp = compose_table()
    _check(int(legal.sum()) == 252, "252 legal two-tier pairs", failures)
    overflow = np.zeros((256, 16), dtype=bool)
    overflow[255] = True
    overflow[254, 8:] = True
    _check(np.array_equal(np.isinf(comp), overflow),
           "compose: only T[c] * 2^(E-127) >= 2^128 overflows", failures)
    es, cs = np.nonzero(legal)
    _check(es.min() == 117 and es.max() == 135, "legal E in [117, 135]",
           failures)
    _check(np.array_equal(e4m3_decode(e4m3_encode_rne(comp[legal])),
                          comp[legal]), "legal compose values are E4M3",
           failures)
    rng = np.random.default_rng(2)
    e = rng.integers(0, 256, size=(4, 3), dtype=np.uint8)
    c = rng.integers(0, 16, size=(4, 3, 16), dtype=np.uint8)
    e2, c2 = unpack_v2_plane(pack_v2_plane(e, c))
    _check(np.array_equal(e, e2) and np.array_equal(c, c2),
           "v2 plane round trip", failures)
    plane = pack_v2_plane(np.uint8(127), np.arange(16, dtype=np.uint8))
    _check(list(plane[1:]) == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE],
           "v2 even group in low nibble", failures)


def check_activation(failures):
    """tests/test_nvfp4_act_quant_ref.py:67-95 expectations."""
    codes, sf, recip = nvfp4_act_quant(np.array([MIDPOINT_ROW], np.float32),
                                       np.float32(1.0))
    _check(list(codes[0]) == MIDPOINT_CODES_RNE and list(sf[0]) == [0x38]
           and recip == 1.0, "activation midpoints", failures)
    row = np.concatenate([np.full(16, v, np.float32) for v in UNDERFLOW_VALUES])
    x = bf16_to_f32(bf16_bits_rne(row))[None, :]
    codes, sf, _ = nvfp4_act_quant(x, np.float32(1.0))
    under = [*range(7), *range(9, 15)]
    payload = codes[0].reshape(16, 16)
    _check(list(sf[0, under]) == [0] * 13 and list(sf[0, [7, 8, 15]]) ==
           [1, 1, 1] and not payload[:7].any() and
           set(payload[9:15].ravel().tolist()) == {8},
           "activation underflow boundary", failures)
    # Clamp: sf rounds down (1.06 -> 1.0), so 6.36 clamps to the top code.
    codes, sf, _ = nvfp4_act_quant(np.array([[6.36] + [0.0] * 15], np.float32),
                                   np.float32(1.0))
    _check(codes[0, 0] == 7 and sf[0, 0] == 0x38, "activation clamp",
           failures)
    # amax/6 is a true float32 division (CPU torch): 7.1249995 / 6 rounds
    # below the 1.1875 midpoint, so sf = 1.125 (0x39), not 1.25.
    _, sf, _ = nvfp4_act_quant(np.array([[7.1249995] + [0.0] * 15],
                                        np.float32), np.float32(1.0))
    _check(sf[0, 0] == 0x39, "activation amax/6 is a division", failures)
    deq = nvfp4_act_dequant(np.array([[7, 8, 15, 1] * 4], np.uint8),
                            np.array([[0x38]], np.uint8), np.float32(0.5))
    _check(list(deq[0, :4]) == [3.0, 0.0, -3.0, 0.25] and
           np.signbit(deq[0, 1]), "activation dequant", failures)


def check_digests(failures):
    t = np.array([[0.5, -1.0], [6.0, -0.0]], dtype=np.float32)
    raw = b"".join(struct.pack("<e", float(v)) for v in t.ravel())
    _check(codebook_sha256(t) == hashlib.sha256(raw).hexdigest(),
           "codebook digest bytes", failures)
    _check(codebook_sha256(np.zeros((0, 4))) == hashlib.sha256(b"").hexdigest(),
           "codebook digest empty", failures)
    d1 = target_values_sha256({"b": 2.0, "a": 1.5}, SUPPORTED_POLICIES[0])
    d2 = target_values_sha256({"a": 1.5, "b": 2.0}, SUPPORTED_POLICIES[0])
    manual = hashlib.sha256()
    for s in (CONTRACT_SCHEMA, SUPPORTED_POLICIES[0]):
        manual.update(struct.pack("<I", len(s)) + s.encode())
    for n, v in (("a", 1.5), ("b", 2.0)):
        manual.update(struct.pack("<I", 1) + n.encode() + struct.pack("<f", v))
    _check(d1 == d2 == manual.hexdigest(), "target digest framing", failures)


def self_test(verbose=True):
    """Run every check; return the list of failures (empty = pass)."""
    failures = []
    for check in (check_worked_example, check_type_sizes,
                  check_index_round_trips, check_numbers, check_activation,
                  check_digests):
        try:
            check(failures)
        except Exception as e:  # noqa: BLE001 - a crash is a failure too
            failures.append(f"{check.__name__} raised {e!r}")
    if verbose:
        for f in failures:
            print("FAIL:", f)
        print("gridbook_reference self-test:",
              "ok" if not failures else f"{len(failures)} failure(s)")
    return failures


if __name__ == "__main__":
    sys.exit(1 if self_test() else 0)
