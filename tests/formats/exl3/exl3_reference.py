"""Numpy reference for decoding exllamav3 EXL3 trellis weights (test-only).

Transcribed from turboderp-org/exllamav3 v1.4.1 (commit 4f8ad0121f48). Paths
below are relative to the repository root, with ``ext/`` standing for
``exllamav3/exllamav3_ext/``. The GPU kernels are the definition; every
function names the file:lines it follows.

Layout of one EXL3 linear with k = in_features, n = out_features:
- ``trellis`` I16 [k/16, n/16, 16*K]: one 16x16 tile of Ŵ per (tk, tn), K bits
  per weight, K = shape[-1] // 16 (exllamav3/modules/quant/exl3.py:66).
- ``suh`` F16 [k], ``svh`` F16 [n] (or legacy packed-sign ``su``/``sv`` I16).
- ``mcg`` / ``mul1`` scalar tensors whose presence selects the codebook.
- W (k, n), y = x @ W:  W = diag(su) · H · Ŵ · H · diag(sv), H block-diagonal
  with 128x128 Sylvester blocks / sqrt(128).

Everything here is exact: integer work wraps modulo 2^32 like the uint32 GPU
code, fp16 results are rounded once to nearest-even, and the dequantized W is
float64 (exllamav3 itself keeps W in fp16, so it differs from this by fp16
rounding of the Hadamard products).
"""

import numpy as np

CODEBOOKS = ("3inst", "mcg", "mul1")
# Kernel template index of each codebook: ext/quant/reconstruct.cu:89-91, 132-134.
CODEBOOK_INDEX = {"3inst": 0, "mcg": 1, "mul1": 2}

# ext/quant/codebook.cuh:61-62 (3INST), :69 (MCG), :78 (MUL1);
# the multipliers are also exllamav3/modules/quant/exl3_lib/quantize.py:18-19.
INST3_MUL = 89226354
INST3_ADD = 64248484
MCG_MULT = 0xCBAC1FED
MUL1_MULT = 0x83DCD12D
# lop3.b32 x, x, 0x8fff8fff, 0x3b603b60, 0x6a: with the PTX truth-table inputs
# a = 0xF0, b = 0xCC, c = 0xAA, (a & b) ^ c == 0x6A, so x = (x & MASK) ^ XOR.
# ext/quant/codebook.cuh:63, 72.
LOP3_MASK = 0x8FFF8FFF
LOP3_XOR = 0x3B603B60
# ext/quant/codebook.cuh:79-88.
MUL1_ACC = 0x6400          # fp16 bits of 1024.0
MUL1_K_INV_BITS = 0x1EEE   # fp16, ~1/147.7
MUL1_K_BIAS_BITS = 0xC931  # fp16, fp16((-1024 - 510) * k_inv) per the comment at :86

# exllamav3/modules/quant/exl3_lib/quantize.py:16 (RMS of the 3INST codebook).
CODEBOOK_SCALE = 1.24371088
HAD_DIM = 128  # quantize.py:15 (had_k, had_n)

_M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------
# fp16 helpers
# ---------------------------------------------------------------------------

def f16_bits_to_f64(bits):
    """fp16 bit patterns (any int array) -> float64 values."""
    return np.asarray(bits).astype(np.uint16).view(np.float16).astype(np.float64)


def f64_to_f16_bits(x):
    """float64 -> fp16 bits, one round-to-nearest-even straight from double.

    numpy converts float64 to float16 directly (no float32 step); this is
    asserted by self_check() with a value where double rounding would differ.
    """
    return np.asarray(x, dtype=np.float64).astype(np.float16).view(np.uint16)


# ---------------------------------------------------------------------------
# Codebooks: 16-bit state -> fp16 value
# ---------------------------------------------------------------------------

def codebook_value(cb, state):
    """fp16 bits (int) of one codebook entry; scalar transcription.

    ext/quant/codebook.cuh:56-90 (``decode_3inst<cb>``):
    - cb 0 "3inst" (:59-66): x = x*89226354 + 64248484 (uint32 wrap), lop3,
      then __hadd(low half, high half).
    - cb 1 "mcg" (:67-75): x = x*0xCBAC1FED, lop3, __hadd(low, high).
    - cb 2 "mul1" (:76-89): x = x*0x83DCD12D; sum = __dp4a(x, 0x01010101, 0x6400)
      (unsigned: byte sum + 0x6400); h = half bits (uint16) sum;
      __hfma(h, k_inv, k_bias).
    half2_uint32 (ext/util.cuh:74-81) puts bits 0..15 in the low half.
    __hadd is add.f16 and __hfma is fma.rn.f16 (cuda_fp16.hpp, CUDA 13.0:
    __hfma "rounding the result once in round-to-nearest-even mode"). The sum
    of two fp16 values and h*k_inv + k_bias are exact in float64, so rounding
    the float64 result once to fp16 reproduces both instructions.
    """
    x = int(state) & 0xFFFF
    if cb == "3inst":
        x = (x * INST3_MUL) & _M32
        x = (x + INST3_ADD) & _M32
    elif cb == "mcg":
        x = (x * MCG_MULT) & _M32
    elif cb == "mul1":
        x = (x * MUL1_MULT) & _M32
        s = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24) + MUL1_ACC
        h = float(f16_bits_to_f64(s & 0xFFFF))
        k_inv = float(f16_bits_to_f64(MUL1_K_INV_BITS))
        k_bias = float(f16_bits_to_f64(MUL1_K_BIAS_BITS))
        return int(f64_to_f16_bits(h * k_inv + k_bias))
    else:
        raise ValueError(f"unknown codebook {cb!r}")
    x = (x & LOP3_MASK) ^ LOP3_XOR
    lo = float(f16_bits_to_f64(x & 0xFFFF))
    hi = float(f16_bits_to_f64(x >> 16))
    return int(f64_to_f16_bits(lo + hi))


def lut(cb):
    """uint16[65536]: fp16 bits of codebook_value(cb, s) for every state s.

    Vectorised form of ext/quant/codebook.cuh:56-90 (see codebook_value).
    """
    x = np.arange(65536, dtype=np.uint32)
    if cb == "3inst":
        x = x * np.uint32(INST3_MUL) + np.uint32(INST3_ADD)
    elif cb == "mcg":
        x = x * np.uint32(MCG_MULT)
    elif cb == "mul1":
        x = x * np.uint32(MUL1_MULT)
        s = ((x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24)
             + np.uint32(MUL1_ACC))
        h = f16_bits_to_f64(s & 0xFFFF)
        return f64_to_f16_bits(h * f16_bits_to_f64(MUL1_K_INV_BITS)
                               + f16_bits_to_f64(MUL1_K_BIAS_BITS))
    else:
        raise ValueError(f"unknown codebook {cb!r}")
    x = (x & np.uint32(LOP3_MASK)) ^ np.uint32(LOP3_XOR)
    return f64_to_f16_bits(f16_bits_to_f64(x & 0xFFFF) + f16_bits_to_f64(x >> 16))


def mul1_cpu_value(state):
    """float32 value of the CPU MoE mul1 decode, exllamav3_ext/cpu/moe_mul1.cpp:174-179.

    (bytesum(state * 0x83DCD12D) - 510) * k_inv in float32. It is NOT the GPU
    definition (no fp16 rounding, k_bias not rounded); used only as a cross-check.
    """
    x = (np.asarray(state, dtype=np.uint32) & np.uint32(0xFFFF)) * np.uint32(MUL1_MULT)
    s = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24)
    k_inv = np.float32(f16_bits_to_f64(MUL1_K_INV_BITS))
    return (s.astype(np.float32) - np.float32(510.0)) * k_inv


def select_codebook(present):
    """Codebook of one EXL3 tensor from the names of the tensors stored for it.

    ``present``: tensor names ("<key>.mcg") or bare suffixes ("mcg").
    The value of the mcg/mul1 tensor is never read, only its presence
    (quantize.py:1414-1424; exl3.py:74-77). Priority follows the reconstruct
    kernels, ext/quant/reconstruct.cu:132-134 and :359-361
    (``if (mcg) cbi += 8; else if (mul1) cbi += 16``): mcg wins over mul1,
    neither gives 3inst.

    Note: exllamav3 is not consistent when both are present. exl3_gemm
    (ext/quant/exl3_gemm.cu:173, :493) refuses the pair with TORCH_CHECK,
    while exl3_gemv (exl3_gemv.cu:207-209) and quantize_tiles
    (quantize.cu:67-69) pick mul1; only reconstruct and decode_kernel
    (quantize.cu:107-112) pick mcg. exllamav3's quantizer never writes both.
    """
    names = {str(p).rsplit(".", 1)[-1] for p in present}
    if "mcg" in names:
        return "mcg"
    if "mul1" in names:
        return "mul1"
    return "3inst"


def is_exl3_storage(present):
    """True when the tensors form an EXL3 linear: trellis + (su|suh) + (sv|svh).

    exllamav3/modules/linear.py:383-387.
    """
    names = {str(p).rsplit(".", 1)[-1] for p in present}
    return "trellis" in names and bool(names & {"su", "suh"}) and bool(names & {"sv", "svh"})


def trellis_bits(trellis):
    """K (bits per weight) from the trellis shape: exl3.py:66 (shape[-1] // 16)."""
    K = int(np.shape(trellis)[-1]) // 16
    if not 1 <= K <= 8 or np.shape(trellis)[-1] != 16 * K:
        raise ValueError(f"bad trellis last dim {np.shape(trellis)[-1]}")
    return K


# ---------------------------------------------------------------------------
# Trellis tile bitstream -> 256 states
# ---------------------------------------------------------------------------

def _words32(tiles):
    """The uint32 words the kernels read: ``(const uint32_t*) trellis``.

    Little-endian: word i = int16[2i] | int16[2i+1] << 16 (the kernels cast the
    int16 tile pointer to uint32*, ext/quant/reconstruct.cu:32-35, 40).
    """
    p = np.ascontiguousarray(tiles).astype("<i2", copy=False).view("<u2").astype(np.uint32)
    return p[..., 0::2] | (p[..., 1::2] << np.uint32(16))


def unpack_states(tiles, K):
    """uint16 [..., 256] states of tiles int16 [..., 16*K] (the kernel reading).

    ext/quant/exl3_dq.cuh:15-31 (``dq``), for every t_offset in 0..255:
        b0 = t*K + K - 16 + 256*K; b1 = b0 + 16
        i0 = b0 / 32; i1 = (b1 - 1) / 32; s0 = (i1 + 1)*32 - b1
        a = ptr[i0 % (8K)]; b = ptr[i1 % (8K)]
        state = __funnelshift_r(b, a, s0) & 0xffff   ((a:b) >> s0, low 32 bits)
    s0 is always in 0..31, so the hardware's shift & 31 never matters. The bits
    are MSB-first inside each uint32, so a tile is a circular MSB-first
    bitstream whose 16-bit words 2i, 2i+1 are stored as int16[2i+1], int16[2i]
    (the pack kernel's SWAP16, ext/quant/pack.cu:56).
    """
    K = int(K)
    tiles = np.asarray(tiles)
    if tiles.shape[-1] != 16 * K:
        raise ValueError(f"tile has {tiles.shape[-1]} int16, expected {16 * K}")
    w = _words32(tiles).astype(np.uint64)
    nw = K * 256 // 32
    t = np.arange(256)
    b0 = t * K + K - 16 + 256 * K
    b1 = b0 + 16
    i0 = b0 // 32
    i1 = (b1 - 1) // 32
    s0 = ((i1 + 1) * 32 - b1).astype(np.uint64)
    a = w[..., i0 % nw]
    b = w[..., i1 % nw]
    merged = (a << np.uint64(32)) | b
    return ((merged >> s0) & np.uint64(0xFFFF)).astype(np.uint16)


def _funnelshift_r(lo, hi, shift):
    """__funnelshift_r(lo, hi, shift): ((hi:lo) >> (shift & 31)) low 32 bits."""
    return ((((hi & _M32) << 32) | (lo & _M32)) >> (shift & 31)) & _M32


def _fshift(b, a, shift):
    """ext/quant/exl3_dq.cuh:5-13: ((a:b) >> shift) low 32 bits, shift in 0..63."""
    return ((((a & _M32) << 32) | (b & _M32)) >> shift) & _M32


def _bfe16(src, pos):
    """BFE16_IMM (ext/ptx.cuh:315): bfe.u32 dst, src, pos, 16."""
    assert 0 <= pos <= 16
    return (src >> pos) & 0xFFFF


def unpack_states_unpack_kernel(tile, K):
    """States of one tile, per ``unpack_trellis_kernel`` (ext/quant/pack.cu:95-138).

    Independent second reading: thread t (0..127) extracts words 2t and 2t+1
    from one 32-bit window:
        b0 = t*2K + K - 16 + 256K; b1 = b0 + K; b2 = b1 + 16
        i0 = b0 / 32; i1 = (b2 - 1) / 32; s1 = (i1 + 1)*32 - b2
        w1 = __funnelshift_r(b, a, s1); w0 = w1 >> K; both & 0xffff
        ((uint32_t*) out)[t] = (w1 << 16) | w0   (out[2t] = w0, out[2t+1] = w1)
    """
    K = int(K)
    w = [int(v) for v in _words32(np.asarray(tile).reshape(16 * K))]
    nw = K * 256 // 32
    out = np.zeros(256, dtype=np.uint16)
    for t in range(128):
        b0 = t * 2 * K + K - 16 + 256 * K
        b1 = b0 + K
        b2 = b1 + 16
        i0 = b0 // 32
        i1 = (b2 - 1) // 32
        s1 = (i1 + 1) * 32 - b2
        a = w[i0 % nw]
        b = w[i1 % nw]
        w1 = _funnelshift_r(b, a, s1)
        w0 = (w1 >> K) & 0xFFFF
        w1 &= 0xFFFF
        out[2 * t] = w0
        out[2 * t + 1] = w1
    return out


def dq_dispatch_states(w, K, idx):
    """The 8 states at positions idx..idx+7 read by ``dq_dispatch<K>``.

    ext/quant/exl3_dq.cuh:254-293, the path used by reconstruct_kernel
    (reconstruct.cu:40) with idx = lane_id * 8. ``w``: list of the tile's
    uint32 words. Returns [w0..w7] (w0 = state at idx); dq_dispatch feeds
    these pairwise to decode_3inst_2, giving frag0 = (v0,v1),(v2,v3) and
    frag1 = (v4,v5),(v6,v7) with the first of each pair in the low half.
    """
    K = int(K)
    nw = K * 256 // 32

    def dq8(t_offset, align):               # exl3_dq.cuh:96-161
        b1 = (t_offset + 257) * K
        b0 = b1 - 16
        b2 = b1 + K * 7
        i0 = b0 // 32
        i2 = (b2 - 1) // 32
        s2 = (i2 + 1) * 32 - b2
        a = w[i0 % nw]
        b = w[i2 % nw]
        r = [0] * 8
        if align == 1:
            for m in range(8):
                r[7 - m] = _fshift(b, a, s2 + K * m)
        elif align == 2:
            for m in range(0, 8, 2):
                r[7 - m] = _fshift(b, a, s2 + K * m)
                r[6 - m] = r[7 - m] >> K
        elif align == 4:
            for m in range(0, 8, 4):
                r[7 - m] = _fshift(b, a, s2 + K * m)
                for q in range(1, 4):
                    r[7 - m - q] = r[8 - m - q] >> K
        elif align == 8:
            r[7] = _fshift(b, a, s2)
            for q in range(6, -1, -1):
                r[q] = r[q + 1] >> K
        return [v & 0xFFFF for v in r]

    def dq4(t_offset):                      # exl3_dq.cuh:52-72
        b0 = (t_offset + 257) * K - 16
        b1 = b0 + 3 * K
        b2 = b1 + 16
        i0 = b0 // 32
        i2 = (b2 - 1) // 32
        s2 = (i2 + 1) * 32 - b2
        a = w[i0 % nw]
        b = w[i2 % nw]
        w3 = _fshift(b, a, s2) & 0xFFFF
        w2 = _fshift(b, a, s2 + K) & 0xFFFF
        w1 = _fshift(b, a, s2 + K * 2) & 0xFFFF
        w0 = _fshift(b, a, s2 + K * 3) & 0xFFFF
        return [w0, w1, w2, w3]

    def dq2x2(t_offset):                    # exl3_dq.cuh:74-94
        r = []
        for i in range(2):
            b0 = (t_offset + 2 * i + 257) * K - 16
            b1 = b0 + 1 * K
            b2 = b1 + 16
            i0 = b0 // 32
            i2 = (b2 - 1) // 32
            s2 = (i2 + 1) * 32 - b2
            a = w[i0 % nw]
            b = w[i2 % nw]
            w1 = _fshift(b, a, s2) & 0xFFFF
            w0 = _fshift(b, a, s2 + K) & 0xFFFF
            r += [w0, w1]
        return r

    def aligned_4bits(t_offset):            # exl3_dq.cuh:163-184
        i1 = t_offset >> 3
        i0 = (i1 + 31) & 31
        a = w[i0]
        b = w[i1]
        s = _funnelshift_r(b, a, 20)        # FSHF_IMM(s, b, a, 20): shf.r.wrap
        return [_bfe16(s, 8), _bfe16(s, 4), s & 0xFFFF, _bfe16(b, 16),
                _bfe16(b, 12), _bfe16(b, 8), _bfe16(b, 4), b & 0xFFFF]

    def aligned_2bits(t_offset):            # exl3_dq.cuh:186-207
        i1 = t_offset >> 4
        i0 = (i1 + 15) & 15
        a = w[i0]
        b = w[i1]
        b = _fshift(b, a, ((~t_offset) & 8) << 1)
        return [_bfe16(b, 14), _bfe16(b, 12), _bfe16(b, 10), _bfe16(b, 8),
                _bfe16(b, 6), _bfe16(b, 4), _bfe16(b, 2), b & 0xFFFF]

    def aligned_1bit(t_offset):             # exl3_dq.cuh:209-230
        i1 = t_offset >> 5
        i0 = (i1 + 7) & 7
        a = w[i0]
        b = w[i1]
        b = _fshift(b, a, (~t_offset) & 24)
        return [_bfe16(b, 7), _bfe16(b, 6), _bfe16(b, 5), _bfe16(b, 4),
                _bfe16(b, 3), _bfe16(b, 2), _bfe16(b, 1), b & 0xFFFF]

    if K == 1:
        return aligned_1bit(idx)
    if K == 2:
        return aligned_2bits(idx)
    if K == 3:
        return dq8(idx, 4)
    if K == 4:
        return aligned_4bits(idx)
    if K in (5, 6, 8):
        return dq4(idx) + dq4(idx + 4)
    if K == 7:
        return dq2x2(idx) + dq2x2(idx + 4)
    raise ValueError(f"K={K}")


def symbols_from_tile(tile, K):
    """uint16[256] K-bit symbols of one tile: the inverse of pack_trellis_kernel.

    ext/quant/pack.cu:9-57: span t (0..15) packs symbols 16t..16t+15, MSB-first,
    into uint16 words s_packed[K*t .. K*t+K-1]; then each uint32 is SWAP16'd
    (util.cuh:72, __byte_perm(x, 0, 0x1032)) on store. So s_packed[2i] is
    stored at int16[2i+1] and s_packed[2i+1] at int16[2i].
    """
    K = int(K)
    g = [int(v) for v in np.asarray(tile).reshape(16 * K).astype("<i2").view("<u2")]
    s_packed = [0] * (16 * K)
    for i in range(8 * K):
        s_packed[2 * i] = g[2 * i + 1]
        s_packed[2 * i + 1] = g[2 * i]
    sym = np.zeros(256, dtype=np.uint16)
    mask = (1 << K) - 1
    for t in range(16):
        span = 0
        for j in range(K * t, K * t + K):
            span = (span << 16) | s_packed[j]
        for n in range(16):
            sym[16 * t + n] = (span >> (16 * K - (n + 1) * K)) & mask
    return sym


def states_from_symbols(sym, K):
    """Tail-biting trellis states: s_j = ((s_{j-1} << K) | sym_j) & 0xffff.

    The Viterbi encoder's state/edge relation, ext/quant/quantize_tiles_kernel.cuh
    :94-95 (predecessor edge = state >> K) and :277-283 (encoded =
    prev_edge << K | edge), run around the tile from roll 128 (:294-297), so
    the first state takes its high bits from the last symbols.
    """
    K = int(K)
    sym = [int(v) for v in sym]
    out = np.zeros(256, dtype=np.uint16)
    depth = (16 + K - 1) // K
    for j in range(256):
        s = 0
        for m in range(depth - 1, -1, -1):
            s = (s << K) | sym[(j - m) % 256]
        out[j] = s & 0xFFFF
    return out


def pack_trellis(states, K):
    """int16 [..., 16*K] from states uint16 [..., 256]; ext/quant/pack.cu:9-57.

    Only the low K bits of each state are kept (v &= (1 << K) - 1, :40).
    """
    K = int(K)
    states = np.asarray(states)
    lead = states.shape[:-1]
    flat = states.reshape(-1, 256)
    out = np.zeros((flat.shape[0], 16 * K), dtype=np.uint16)
    for ti in range(flat.shape[0]):
        s_unpacked = [int(v) for v in flat[ti]]
        s_packed = [0] * (16 * K)
        for t in range(16):                 # spans = 16, len = 16
            i = 16 * t
            j = K * t
            k = 32
            buf = 0
            for _ in range(16):
                v = s_unpacked[i] & ((1 << K) - 1)
                k -= K
                buf |= v << k
                if k <= 16:
                    s_packed[j] = (buf >> 16) & 0xFFFF
                    buf = (buf << 16) & _M32
                    k += 16
                    j += 1
                i += 1
        for t in range(8 * K):              # SWAP16 of each uint32
            out[ti, 2 * t] = s_packed[2 * t + 1]
            out[ti, 2 * t + 1] = s_packed[2 * t]
    return out.view(np.int16).reshape(lead + (16 * K,))


# ---------------------------------------------------------------------------
# Tile placement and Ŵ
# ---------------------------------------------------------------------------

def tensor_core_perm():
    """int64[256]: trellis position j holds tile element perm[j] = 16*row + col.

    exllamav3/modules/quant/exl3_lib/quantize.py:21-44 (identical table in
    exllamav3_ext/cpu/moe_mul1.cpp:96-111). The quantizer builds the encoded
    tile as tiles[:, perm] from a row-major 16x16 tile (quantize.py:571-585).
    """
    perm = [0] * 256
    for t in range(32):
        r0 = (t % 4) * 2
        r1 = r0 + 1
        r2 = r0 + 8
        r3 = r0 + 9
        c0 = t // 4
        c1 = c0 + 8
        perm[t * 8 + 0] = r0 * 16 + c0
        perm[t * 8 + 1] = r1 * 16 + c0
        perm[t * 8 + 2] = r2 * 16 + c0
        perm[t * 8 + 3] = r3 * 16 + c0
        perm[t * 8 + 4] = r0 * 16 + c1
        perm[t * 8 + 5] = r1 * 16 + c1
        perm[t * 8 + 6] = r2 * 16 + c1
        perm[t * 8 + 7] = r3 * 16 + c1
    return np.array(perm, dtype=np.int64)


TC_PERM = tensor_core_perm()


def decode_what(trellis, cb):
    """uint16 [k, n]: fp16 bits of Ŵ (row = input feature), from trellis
    int16 [k/16, n/16, 16*K].

    Ŵ[16*tk + perm[j] // 16, 16*tn + perm[j] % 16] = CB(state_j of tile (tk, tn)).
    Tile (tk, tn) is trellis[tk, tn] (reconstruct.cu:26-33) and Ŵ is stored
    row-major with k rows (reconstruct.cu:78-83, 111).
    """
    trellis = np.asarray(trellis)
    K = trellis_bits(trellis)
    tk, tn = trellis.shape[:2]
    vals = lut(cb)[unpack_states(trellis, K)]           # [tk, tn, 256], position order
    tiles = np.empty_like(vals)
    tiles[..., TC_PERM] = vals                          # row-major 16x16 order
    return tiles.reshape(tk, tn, 16, 16).transpose(0, 2, 1, 3).reshape(tk * 16, tn * 16)


def reconstruct_kernel_block(tiles8, K, cb):
    """uint16 [16, 128]: one reconstruct_kernel block (ext/quant/reconstruct.cu:11-84).

    tiles8: int16 [8, 16*K], the 8 consecutive tiles trellis[tk, 8*nb : 8*nb+8].
    Lane-by-lane transcription (warp = tile, lane l decodes positions 8l..8l+7
    with dq_dispatch, then the __shfl_down_sync(4) shuffle into tile[16][8][8]
    half2). Used only to check decode_what's placement.
    """
    table = lut(cb)
    tile = np.zeros((16, 8, 16), dtype=np.uint16)      # [row][warp][half column]
    for warp in range(8):
        w = [int(v) for v in _words32(np.asarray(tiles8[warp]))]
        f = [[int(table[s]) for s in dq_dispatch_states(w, K, lane * 8)] for lane in range(32)]
        for lane in range(32):
            if lane & 4:
                continue
            own, nb = f[lane], f[lane + 4]             # n_i = lane+4's frag
            m = [(own[i], nb[i]) for i in range(8)]    # m0..m7 (lo, hi)
            r0 = (lane % 4) * 2
            r1, r2, r3 = r0 + 1, r0 + 8, r0 + 9
            c0 = lane // 8
            c1 = c0 + 4
            for (r, c), mm in zip([(r0, c0), (r1, c0), (r2, c0), (r3, c0),
                                   (r0, c1), (r1, c1), (r2, c1), (r3, c1)], m):
                tile[r, warp, 2 * c] = mm[0]
                tile[r, warp, 2 * c + 1] = mm[1]
    return tile.reshape(16, 128)


# ---------------------------------------------------------------------------
# Hadamard, signs, full dequantization
# ---------------------------------------------------------------------------

def hadamard(n=HAD_DIM):
    """float64 [n, n]: Sylvester Hadamard / sqrt(n), natural order.

    exllamav3/util/hadamard.py:107-121 (get_hadamard: recurse n/2 down to the
    1x1 "+" of hadamard_data/hadamard_1.txt), :34-42 (sylvester: [[h, h], [h, -h]]),
    :133-137 and quantize.py:344 (scale 1/sqrt(n)). Symmetric and orthonormal.
    Only powers of two are supported here (EXL3 uses 128).
    """
    if n < 1 or n & (n - 1):
        raise ValueError("power of two only")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def unpack_signs(packed):
    """float64 ±1 [16 * len]: bit i of uint16 word j -> element 16j + i, set => -1.

    exllamav3/modules/quant/exl3.py:142-158 (unpack_bf). Inverse of
    pack_signs_kernel (ext/quant/pack.cu:176-201).
    """
    bits = np.asarray(packed).astype("<i2").view("<u2").astype(np.int64).reshape(-1)
    expanded = (bits[:, None] >> np.arange(16)) & 1
    return 1.0 - 2.0 * expanded.reshape(-1).astype(np.float64)


def pack_signs(values):
    """int16 [len/16] from fp16 values; ext/quant/pack.cu:176-201.

    For each group of 16: out = 0; for i: out >>= 1; out |= bits(v_i) & 0x8000.
    """
    bits = np.asarray(values, dtype=np.float16).view(np.uint16).reshape(-1, 16)
    out = np.zeros(bits.shape[0], dtype=np.uint16)
    for j in range(bits.shape[0]):
        o = 0
        for i in range(16):
            o >>= 1
            o |= int(bits[j, i]) & 0x8000
        out[j] = o
    return out.view(np.int16)


def _had_l(x):
    """preapply_had_l (quantize.py:340-347): H @ x per block of 128 rows."""
    k, n = x.shape
    return np.einsum("ij,bjn->bin", hadamard(HAD_DIM), x.reshape(k // HAD_DIM, HAD_DIM, n)).reshape(k, n)


def _had_r(x):
    """preapply_had_r (quantize.py:350-357) / had_r_128: x @ H per 128 columns."""
    k, n = x.shape
    return (x.reshape(k, n // HAD_DIM, HAD_DIM) @ hadamard(HAD_DIM)).reshape(k, n)


def dequantize(trellis, suh, svh, cb):
    """float64 W [k, n] (y = x @ W) = diag(su) · H · Ŵ · H · diag(sv).

    exllamav3/modules/quant/exl3.py:227-237 (get_weight_tensor):
    w = reconstruct(Ŵ); w = had_l(w); w *= suh[:, None]; w = had_r(w);
    w *= svh[None, :]. Also reconstruct.cu:147-154. suh/svh are fp16 values
    (np.float16) or ±1 from unpack_signs.
    """
    what = f16_bits_to_f64(decode_what(trellis, cb))
    su = np.asarray(suh).astype(np.float64).reshape(-1)
    sv = np.asarray(svh).astype(np.float64).reshape(-1)
    k, n = what.shape
    if su.shape != (k,) or sv.shape != (n,) or k % HAD_DIM or n % HAD_DIM:
        raise ValueError(f"shape mismatch: Ŵ {what.shape}, su {su.shape}, sv {sv.shape}")
    w = _had_l(what) * su[:, None]
    return _had_r(w) * sv[None, :]


def forward_kernel_route(x, trellis, suh, svh, cb):
    """float64 y = x @ W computed the way the kernels order it.

    exl3.py:186-214 and libtorch/linear.cpp:34-45: xh = had_r_128(x * suh),
    y' = xh @ Ŵ, y = had_r_128(y') * svh (hadamard.cu:83-107: x.view(-1,128) @ H).
    """
    what = f16_bits_to_f64(decode_what(trellis, cb))
    su = np.asarray(suh).astype(np.float64)
    sv = np.asarray(svh).astype(np.float64)
    xh = _had_r(np.asarray(x, dtype=np.float64) * su[None, :])
    return _had_r(xh @ what) * sv[None, :]


# ---------------------------------------------------------------------------
# Self-check
# ---------------------------------------------------------------------------

def self_check(seed=0, verbose=False):
    """Assert invariants derived from the exllamav3 source; returns a dict of stats."""
    rng = np.random.default_rng(seed)
    stats = {}

    # numpy rounds float64 -> float16 once (a float32 step would give 0x3C00).
    x = 1.0 + 2.0 ** -11 + 2.0 ** -40
    assert int(f64_to_f16_bits(x)) == 0x3C01, "float64 -> float16 is not single-rounded"
    assert int(np.float32(x).astype(np.float16).view(np.uint16)) == 0x3C00

    luts = {cb: lut(cb) for cb in CODEBOOKS}
    for cb in CODEBOOKS:
        table = luts[cb]
        # Scalar transcription agrees with the vectorised table (every state).
        for s in range(65536):
            assert codebook_value(cb, s) == int(table[s]), (cb, s)
        v = f16_bits_to_f64(table)
        assert np.all(np.isfinite(v)), cb
        # No subnormal results, so fp16 flush-to-zero modes cannot matter.
        assert np.all((v == 0) | (np.abs(v) >= 2.0 ** -14)), cb
        stats[f"rms.{cb}"] = float(np.sqrt(np.mean(v * v)))
        stats[f"distinct.{cb}"] = int(np.unique(table).size)

    # quantize.py:16 hard-codes the RMS of the 3INST codebook.
    assert abs(stats["rms.3inst"] - CODEBOOK_SCALE) < 1e-6, stats["rms.3inst"]

    # 3inst/mcg: after the lop3 each fp16 half has exponent field 0b011xx,
    # i.e. magnitude in [0.125, 2): no zero, subnormal, inf or nan halves.
    xs = np.arange(65536, dtype=np.uint32)
    for cb, xx in (("3inst", xs * np.uint32(INST3_MUL) + np.uint32(INST3_ADD)),
                   ("mcg", xs * np.uint32(MCG_MULT))):
        xx = (xx & np.uint32(LOP3_MASK)) ^ np.uint32(LOP3_XOR)
        for half in (xx & 0xFFFF, xx >> 16):
            mag = np.abs(f16_bits_to_f64(half))
            assert mag.min() >= 0.125 and mag.max() < 2.0, cb

    # mul1: byte sums 0..1020 -> h = 1024 + s exactly; k_bias is the fp16 of
    # (-1024 - 510) * k_inv (codebook.cuh:86); the GPU value stays close to the
    # CPU float formula of moe_mul1.cpp:174-179.
    k_inv = float(f16_bits_to_f64(MUL1_K_INV_BITS))
    assert int(f64_to_f16_bits(-1534.0 * k_inv)) == MUL1_K_BIAS_BITS
    cpu = mul1_cpu_value(np.arange(65536)).astype(np.float64)
    gpu = f16_bits_to_f64(luts["mul1"])
    stats["mul1.max_abs_gpu_minus_cpu"] = float(np.max(np.abs(gpu - cpu)))
    assert stats["mul1.max_abs_gpu_minus_cpu"] < 4e-3
    sums = np.round(cpu / np.float32(k_inv)).astype(np.int64) + 510
    assert sums.min() >= 0 and sums.max() <= 1020

    # Tile permutation: a permutation; equal to the placement the
    # reconstruct kernel's lane shuffle produces (checked on tiles below).
    assert np.array_equal(np.sort(TC_PERM), np.arange(256))

    # Four readings of the bitstream agree, and pack(unpack(t)) == t, for
    # random tiles plus all-zero / all-one / single-bit tiles.
    for K in range(1, 9):
        special = [np.zeros(16 * K, np.int16), np.full(16 * K, -1, np.int16)]
        for bit in (0, 15, 16, 31, 16 * 16 * K - 1):
            t = np.zeros(16 * K, np.uint16)
            t[bit // 16] = 1 << (bit % 16)
            special.append(t.view(np.int16))
        tiles = [*special, *rng.integers(0, 65536, (12, 16 * K), dtype=np.uint16).view(np.int16)]
        for tile in tiles:
            s_dq = unpack_states(tile, K)
            s_unpack = unpack_states_unpack_kernel(tile, K)
            w = [int(v) for v in _words32(tile)]
            s_disp = np.array([s for lane in range(32) for s in dq_dispatch_states(w, K, lane * 8)],
                              dtype=np.uint16)
            s_sym = states_from_symbols(symbols_from_tile(tile, K), K)
            assert np.array_equal(s_dq, s_unpack), ("unpack_trellis_kernel", K)
            assert np.array_equal(s_dq, s_disp), ("dq_dispatch", K)
            assert np.array_equal(s_dq, s_sym), ("symbols + recurrence", K)
            assert np.array_equal(pack_trellis(s_dq, K), tile), ("pack round trip", K)
        # States of a vector of tiles == per-tile states.
        many = rng.integers(0, 65536, (2, 3, 16 * K), dtype=np.uint16).view(np.int16)
        st = unpack_states(many, K)
        assert all(np.array_equal(st[i, j], unpack_states(many[i, j], K))
                   for i in range(2) for j in range(3))

    # Ŵ placement == lane-by-lane transcription of reconstruct_kernel.
    for K in range(1, 9):
        for cb in CODEBOOKS:
            tr = rng.integers(0, 65536, (2, 8, 16 * K), dtype=np.uint16).view(np.int16)
            what = decode_what(tr, cb)
            for tk in range(2):
                assert np.array_equal(what[16 * tk:16 * tk + 16], reconstruct_kernel_block(tr[tk], K, cb)), \
                    ("reconstruct_kernel", K, cb)

    # Hadamard: natural order H[i, j] = (-1)^popcount(i & j), symmetric, orthonormal.
    h = hadamard(128)
    ii, jj = np.meshgrid(np.arange(128), np.arange(128), indexing="ij")
    pc = np.vectorize(lambda v: bin(int(v)).count("1"))(ii & jj)
    assert np.array_equal(h * np.sqrt(128), np.where(pc % 2, -1.0, 1.0))
    assert np.array_equal(h, h.T)
    assert np.allclose(h @ h, np.eye(128), atol=1e-14)

    # Legacy signs: pack_signs(unpack_signs(p)) == p.
    p = rng.integers(0, 65536, 24, dtype=np.uint16).view(np.int16)
    u = unpack_signs(p)
    assert np.array_equal(pack_signs(u.astype(np.float16)), p)
    assert np.all(np.abs(u) == 1.0) and u.size == 24 * 16
    assert unpack_signs(np.array([1], np.int16))[0] == -1.0
    assert unpack_signs(np.array([-32768], np.int16))[15] == -1.0

    # Dense W and the kernel route give the same y.
    for cb in CODEBOOKS:
        K = 3
        tr = rng.integers(0, 65536, (16, 8, 16 * K), dtype=np.uint16).view(np.int16)
        suh = (rng.choice([-1.0, 1.0], 256) * rng.uniform(0.5, 2, 256) * 0.01).astype(np.float16)
        svh = (rng.choice([-1.0, 1.0], 128) * rng.uniform(0.5, 2, 128) * 0.01).astype(np.float16)
        xin = rng.standard_normal((3, 256))
        y1 = xin @ dequantize(tr, suh, svh, cb)
        y2 = forward_kernel_route(xin, tr, suh, svh, cb)
        assert np.allclose(y1, y2, rtol=1e-12, atol=1e-15), cb

    # Codebook selection.
    assert select_codebook(["w.trellis", "w.suh", "w.svh"]) == "3inst"
    assert select_codebook(["w.trellis", "w.mul1"]) == "mul1"
    assert select_codebook(["w.trellis", "w.mcg"]) == "mcg"
    assert select_codebook(["mcg", "mul1"]) == "mcg"
    assert is_exl3_storage(["a.trellis", "a.su", "a.svh"])
    assert not is_exl3_storage(["a.trellis", "a.suh"])

    if verbose:
        for key, val in stats.items():
            print(f"{key}: {val}")
    return stats


if __name__ == "__main__":
    self_check(verbose=True)
    print("exl3_reference self-check OK")
