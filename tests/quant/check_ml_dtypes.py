#!/usr/bin/env python3
"""Checks reshard's FP8 quantizer bit for bit against numpy + ml_dtypes.

usage: check_ml_dtypes.py QUANT_TOOL [--exhaustive] [--seed=N]

For every FP8 format (e4m3, e5m2), scheme (128x128 blocks, MX [1, 32], per channel, per tensor)
and source dtype (bf16, fp16, fp32), random tiles of odd shapes (partial blocks) are quantized by
QUANT_TOOL (tests/quant/quant_tool.cc, which runs QuantizeTile) and by the reference below,
written from the formulas of docs/quantization.md with numpy and ml_dtypes only:

    amax  = largest |x| over the block's finite elements (0 when none)
    fp32: scale = float32(amax) / float32(max), 1 when not > 0; q = clip(x / scale, -max, max)
    MX:   e = floor(log2(amax)) - emax (np.frexp), clamped to [-127, 127], 0 when amax == 0;
          byte e + 127; q = clip(x * float32(2^-e), -max, max)
    then q.astype(ml_dtypes.float8_e4m3fn / float8_e5m2).

Blocks are all zero, all NaN, all Inf, source-dtype subnormals only, values over the dtype's whole
range, or ordinary values with zeros of both signs, subnormals, NaN of both signs (with payloads),
+-Inf and isolated huge values sprinkled in. Each case also runs once with the tile stored
column-major, so the quantizer reads it with strides. Then EncodeFp8 alone (no scale) on every bf16
and fp16 pattern and a million random fp32 patterns; --exhaustive adds all 2^32 fp32 patterns
(several minutes).

Exit status: 0 all equal, 1 a mismatch (the first is printed: case, index, input, expected, got)
or a tool failure, 77 numpy or ml_dtypes cannot be imported (run scripts/python-env.sh), unless
RESHARD_REQUIRE_PYTHON_DEPS=1, which turns that into a failure.
"""

import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77


def import_deps():
    try:
        import ml_dtypes  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        message = (f"check_ml_dtypes: cannot import numpy and ml_dtypes with {sys.executable} "
                   f"({e}); run scripts/python-env.sh and configure with "
                   f"-DRESHARD_PYTHON=<repo>/.venv/bin/python3")
        if os.environ.get("RESHARD_REQUIRE_PYTHON_DEPS") == "1":
            print(message + " (RESHARD_REQUIRE_PYTHON_DEPS=1, so this fails)", file=sys.stderr)
            sys.exit(1)
        print(message + "; skipping", file=sys.stderr)
        sys.exit(SKIP)


import_deps()
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

FORMATS = {
    # name: (code, ml_dtypes type, max, emax)
    "e4m3": (0, ml_dtypes.float8_e4m3fn, np.float32(448.0), 8),
    "e5m2": (1, ml_dtypes.float8_e5m2, np.float32(57344.0), 15),
}
# name: (code, bytes, numpy type of the values, unsigned type of the bits, exponent bits,
#        mantissa bits)
DTYPES = {
    "bf16": (0, 2, ml_dtypes.bfloat16, np.uint16, 8, 7),
    "fp16": (1, 2, np.float16, np.uint16, 5, 10),
    "fp32": (2, 4, np.float32, np.uint32, 8, 23),
}
ARITH_FP32, ARITH_MX, ARITH_ENCODE = 0, 1, 2


class Mismatch(Exception):
    pass


# ----- quant_tool -----

def run_tool(tool, workdir, fmt, arith, dtype, bits, block, column_major=False):
    """Quantizes `bits` (the source elements' bit patterns, shaped as the tile) with quant_tool;
    returns (fp8 bytes shaped as the tile, scale bytes)."""
    shape = bits.shape
    header = b"RSQ1" + bytes([FORMATS[fmt][0], arith, DTYPES[dtype][0], int(column_major),
                              len(shape), 0, 0, 0])
    header += struct.pack(f"<{len(shape)}q", *shape) + struct.pack(f"<{len(shape)}q", *block)
    data = bits.astype(bits.dtype.newbyteorder("<")).tobytes(order="F" if column_major else "C")
    inp = os.path.join(workdir, "in.bin")
    out = os.path.join(workdir, "out.bin")
    with open(inp, "wb") as f:
        f.write(header + data)
    r = subprocess.run([tool, inp, out], capture_output=True, text=True)
    if r.returncode != 0:
        raise Mismatch(f"quant_tool exited with {r.returncode}: {r.stderr.strip()}")
    with open(out, "rb") as f:
        result = np.frombuffer(f.read(), dtype=np.uint8)
    n = int(np.prod(shape))
    return result[:n].reshape(shape), result[n:]


# ----- The reference -----

def to_float32(dtype, bits):
    return bits.view(DTYPES[dtype][2]).astype(np.float32)


def encode(fmt, x32):
    _, fp8, mx, _ = FORMATS[fmt]
    return np.clip(x32, -mx, mx).astype(fp8).view(np.uint8)


def block_slices(shape, block):
    """Every block as (row-major block index, tuple of slices)."""
    counts = [-(-n // b) for n, b in zip(shape, block)]
    for index in np.ndindex(*counts):
        yield index, tuple(slice(i * b, min((i + 1) * b, n))
                           for i, b, n in zip(index, block, shape))


def reference(fmt, arith, dtype, bits, block):
    """Returns (fp8 bytes, scale bytes) from the formulas, block by block."""
    _, _, fp8_max, emax = FORMATS[fmt]
    x = to_float32(dtype, bits)
    q = np.zeros(x.shape, np.uint8)
    scales = []
    for _, where in block_slices(x.shape, block):
        xb = x[where]
        finite = xb[np.isfinite(xb)]
        amax = np.float32(np.nanmax(np.abs(finite))) if finite.size else np.float32(0)
        if arith == ARITH_FP32:
            scale = np.float32(amax / fp8_max)
            if not scale > 0:
                scale = np.float32(1)
            scales.append(np.array([scale], np.float32).view(np.uint8))
            q[where] = encode(fmt, (xb / scale).astype(np.float32))
        else:
            if amax == 0:
                e = 0
            else:
                _, exponent = np.frexp(amax)  # amax = m * 2^exponent, m in [0.5, 1)
                e = min(max(int(exponent) - 1 - emax, -127), 127)
            scales.append(np.array([e + 127], np.uint8))
            multiplier = np.float32(2.0 ** -e)  # exact: 2^-127 is an fp32 subnormal
            q[where] = encode(fmt, (xb * multiplier).astype(np.float32))
    return q, (np.concatenate(scales) if scales else np.zeros(0, np.uint8))


# ----- Data -----

KINDS = ["ordinary", "zero", "nan", "inf", "subnormal", "wide", "one_huge"]


def special_bits(dtype):
    """Bit patterns of the dtype: +-0, +-Inf, NaNs of both signs with payloads."""
    _, _, _, utype, ebits, mbits = DTYPES[dtype]
    width = 1 + ebits + mbits
    sign = 1 << (width - 1)
    inf = ((1 << ebits) - 1) << mbits
    quiet = 1 << (mbits - 1)
    nans = [inf | quiet, inf | 1, inf | quiet | 1, inf | ((1 << mbits) - 1)]
    return (np.array([0, sign], utype), np.array([inf, sign | inf], utype),
            np.array(nans + [sign | n for n in nans], utype))


def random_bits(rng, dtype, kind, n, scale_exponent):
    """n source bit patterns of one block kind."""
    _, _, vtype, utype, ebits, mbits = DTYPES[dtype]
    width = 1 + ebits + mbits
    sign = (rng.integers(0, 2, n).astype(np.uint64) << (width - 1)).astype(utype)
    zeros, infs, nans = special_bits(dtype)
    bias = (1 << (ebits - 1)) - 1
    if kind == "zero":
        return rng.choice(zeros, n)
    if kind == "nan":
        return rng.choice(nans, n)
    if kind == "inf":
        return rng.choice(infs, n)
    if kind == "subnormal":
        return sign | rng.integers(1, 1 << mbits, n).astype(utype)
    if kind == "wide":
        # Any finite pattern: exponents over the whole range, subnormals included.
        exponent = rng.integers(0, (1 << ebits) - 1, n).astype(np.uint64)
        mantissa = rng.integers(0, 1 << mbits, n).astype(np.uint64)
        return sign | ((exponent << mbits) | mantissa).astype(utype)
    # Ordinary values around 2^scale_exponent, then specials sprinkled in.
    x = rng.standard_normal(n) * 2.0 ** scale_exponent
    bits = x.astype(vtype).view(utype).copy()
    if kind == "one_huge":
        bits[rng.integers(0, n)] = np.array([float(np.finfo(vtype).max) * 0.7], vtype).view(utype)[0]
        return bits
    pick = rng.random(n)
    for lo, hi, pool in [(0.00, 0.02, zeros), (0.02, 0.03, nans), (0.03, 0.04, infs)]:
        where = (pick >= lo) & (pick < hi)
        bits[where] = rng.choice(pool, int(where.sum()))
    where = (pick >= 0.04) & (pick < 0.05)  # source-dtype subnormals
    bits[where] = sign[where] | rng.integers(1, 1 << mbits, int(where.sum())).astype(utype)
    where = (pick >= 0.05) & (pick < 0.06)  # isolated huge values, far above the others
    huge = 2.0 ** min(scale_exponent + 40, bias) * (1 + rng.random(int(where.sum())))
    bits[where] = huge.astype(vtype).view(utype) | sign[where]
    return bits


def random_tile(rng, dtype, shape, block, kinds):
    """A tile whose every block is of a kind drawn from `kinds`."""
    _, _, _, utype, ebits, _ = DTYPES[dtype]
    bias = (1 << (ebits - 1)) - 1
    bits = np.zeros(shape, utype)
    for _, where in block_slices(shape, block):
        n = int(np.prod([s.stop - s.start for s in where]))
        # Block magnitudes over most of the dtype's range (fp16's is small).
        scale_exponent = int(rng.integers(-(bias * 3) // 4, (bias * 3) // 4))
        kind = kinds[int(rng.integers(0, len(kinds)))]
        bits[where] = random_bits(rng, dtype, kind, n, scale_exponent).reshape(
            [s.stop - s.start for s in where])
    return bits


# The schemes: (name, arith, [(shape, block), ...]). Shapes are odd so that blocks are partial.
SCHEMES = [
    ("block128", ARITH_FP32, [((147, 261), (128, 128)), ((5, 300), (128, 128)),
                              ((130, 7), (128, 128))]),
    ("mx32", ARITH_MX, [((37, 181), (1, 32)), ((3, 31), (1, 32)), ((1, 1000), (1, 32))]),
    ("channel", ARITH_FP32, [((53, 97), (1, 97)), ((200, 11), (1, 11))]),
    ("tensor", ARITH_FP32, [((41, 67), (41, 67)), ((3, 17, 29), (3, 17, 29)), ((7, 5), (7, 5))]),
]


def describe_index(shape, flat):
    return str(tuple(int(i) for i in np.unravel_index(flat, shape))) if shape else "()"


def compare(case, dtype, bits, got, want, got_scales, want_scales, block, arith):
    if got_scales.size != want_scales.size:
        raise Mismatch(f"{case}: {got_scales.size} scale bytes, expected {want_scales.size}")
    x = to_float32(dtype, bits)
    if arith != ARITH_ENCODE and not np.array_equal(got_scales, want_scales):
        per = 1 if arith == ARITH_MX else 4
        b = int(np.nonzero(got_scales != want_scales)[0][0]) // per
        got_b = got_scales[b * per:(b + 1) * per]
        want_b = want_scales[b * per:(b + 1) * per]
        blocks = list(block_slices(bits.shape, block))
        index, where = blocks[b]
        xb = x[where]
        finite = xb[np.isfinite(xb)]
        amax = np.abs(finite).max() if finite.size else 0.0
        raise Mismatch(f"{case}: scale of block {index} (amax {amax!r}): expected bytes "
                       f"{want_b.tobytes().hex()}, got {got_b.tobytes().hex()}")
    if not np.array_equal(got, want):
        flat = int(np.nonzero(got.reshape(-1) != want.reshape(-1))[0][0])
        raw = int(bits.reshape(-1)[flat])
        raise Mismatch(f"{case}: element {describe_index(bits.shape, flat)}: input "
                       f"0x{raw:0{bits.itemsize * 2}x} ({x.reshape(-1)[flat]!r}), expected "
                       f"0x{int(want.reshape(-1)[flat]):02x}, got 0x{int(got.reshape(-1)[flat]):02x}")


def count_coverage(seen, fmt, arith, dtype, bits, want, want_scales):
    """What the inputs held, to show that the cases reach the edges they are meant to."""
    x = to_float32(dtype, bits)
    tiny = np.finfo(DTYPES[dtype][2]).smallest_normal
    seen["NaN"] += int(np.isnan(x).sum())
    seen["Inf"] += int(np.isinf(x).sum())
    seen["subnormal"] += int(((x != 0) & (np.abs(x) < tiny)).sum())
    seen["zero"] += int((x == 0).sum())
    max_code = 0x7E if fmt == "e4m3" else 0x7B
    # Encoded as +-max: the block amax of fp32 schemes, and every value that saturates (Inf too).
    seen["at +-max"] += int((((want & 0x7F) == max_code) & ~np.isnan(x)).sum())
    if arith == ARITH_MX:
        seen["neutral scales"] += int((want_scales == 127).sum())
    else:
        seen["neutral scales"] += int((want_scales.view(np.float32) == 1).sum())


def check_schemes(tool, workdir, rng):
    total_elements = total_scales = cases = 0
    for fmt in FORMATS:
        for scheme, arith, shapes in SCHEMES:
            for dtype in DTYPES:
                elements = scales = 0
                seen = dict.fromkeys(["NaN", "Inf", "subnormal", "zero", "at +-max",
                                      "neutral scales"], 0)
                for shape, block in shapes:
                    # Blocks of mixed kinds, then (tensor scheme: one block) one tile per kind.
                    tiles = [random_tile(rng, dtype, shape, block, KINDS)]
                    tiles += [random_tile(rng, dtype, shape, block, [k]) for k in KINDS]
                    for bits in tiles:
                        want, want_scales = reference(fmt, arith, dtype, bits, block)
                        for column_major in (False, True):
                            case = (f"{fmt} {scheme} {dtype} shape {shape} block {block}"
                                    f"{' column-major' if column_major else ''}")
                            got, got_scales = run_tool(tool, workdir, fmt, arith, dtype, bits,
                                                       block, column_major)
                            compare(case, dtype, bits, got, want, got_scales, want_scales, block,
                                    arith)
                            elements += bits.size
                            scales += want_scales.size // (1 if arith == ARITH_MX else 4)
                            count_coverage(seen, fmt, arith, dtype, bits, want, want_scales)
                print(f"{fmt} {scheme:8} {dtype}: {elements} elements, {scales} scales equal ("
                      + ", ".join(f"{v} {k}" for k, v in seen.items()) + ")")
                total_elements += elements
                total_scales += scales
                cases += 1
    return cases, total_elements, total_scales


def check_encode(tool, workdir, rng, exhaustive):
    """EncodeFp8 alone: every bf16 and fp16 pattern, random fp32 patterns, or all of them."""
    count = 0
    for fmt in FORMATS:
        runs = [("bf16", np.arange(1 << 16, dtype=np.uint16)),
                ("fp16", np.arange(1 << 16, dtype=np.uint16)),
                ("fp32", rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32))]
        for dtype, bits in runs:
            got, _ = run_tool(tool, workdir, fmt, ARITH_ENCODE, dtype, bits, (1,))
            compare(f"{fmt} encode {dtype}", dtype, bits, got, encode(fmt, to_float32(dtype, bits)),
                    np.zeros(0, np.uint8), np.zeros(0, np.uint8), (1,), ARITH_ENCODE)
            count += bits.size
        print(f"{fmt} encode: every bf16 and fp16 pattern, 2^20 random fp32 patterns equal")
        if exhaustive:
            chunk = 1 << 24
            for start in range(0, 1 << 32, chunk):
                bits = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32)
                got, _ = run_tool(tool, workdir, fmt, ARITH_ENCODE, "fp32", bits, (1,))
                compare(f"{fmt} encode fp32 exhaustive", "fp32", bits, got,
                        encode(fmt, bits.view(np.float32)), np.zeros(0, np.uint8),
                        np.zeros(0, np.uint8), (1,), ARITH_ENCODE)
                count += bits.size
            print(f"{fmt} encode: all 2^32 fp32 patterns equal")
    return count


def main(argv):
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        print("check_ml_dtypes: expects the path of quant_tool (see --help).", file=sys.stderr)
        return 2
    seed = 13
    for a in argv[1:]:
        if a.startswith("--seed="):
            seed = int(a.split("=", 1)[1])
    tool = args[0]
    rng = np.random.default_rng(seed)
    with np.errstate(all="ignore"), tempfile.TemporaryDirectory(prefix="quant_ml_dtypes.") as d:
        try:
            cases, elements, scales = check_schemes(tool, d, rng)
            encoded = check_encode(tool, d, rng, "--exhaustive" in argv)
        except Mismatch as e:
            print(f"check_ml_dtypes: MISMATCH: {e}", file=sys.stderr)
            return 1
    print(f"check_ml_dtypes: {cases} cases, {elements} elements and {scales} scales, then "
          f"{encoded} single encodes, all bit for bit equal to ml_dtypes {ml_dtypes.__version__} "
          f"(numpy {np.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
