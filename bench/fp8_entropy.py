#!/usr/bin/env python3
"""fp8_entropy.py - what ddo's lossless weight codec (DDOC) saves on FP8 E4M3 weights, against
the entropy bounds an FP8 coder could reach (docs/formats.md, "FP8 and the weight codec";
docs/codec.md, "FP8").

Weights: normal(0, 0.02) matrices of Flux.1-dev's block shapes (dim 3072: four 3072 x 3072
attention projections, a 12288 x 3072 MLP up and a 3072 x 12288 MLP down per block), each
scaled per tensor into E4M3's range (max |w| -> 448) and rounded to the nearest E4M3 value, as
ComfyUI's scaled-FP8 checkpoints are made; written as a ComfyUI-layout safetensors file
(F8_E4M3 weights, F32 weight_scale). Then:
  ddoc      `ddo inspect --codec --json FILE`: DDOC's coded / raw bytes of the F8_E4M3 tensors
            (each element's whole byte Huffman-coded, docs/codec.md)
  huffman   the whole-byte Huffman code of the same counts without DDOC's layout (no lane
            table, padding or headers): DDOC's cost over it is its layout
  H(byte)   the order-0 entropy of the FP8 bytes: no coder of single bytes does better
  sign-free the sign raw, the other 7 bits entropy-coded: 1 + H(byte & 0x7F) bits
  exp-split sign and mantissa bits raw, the exponent bits entropy-coded (DFloat11's split,
            which DDOC applies to BF16): 1 + mantissa bits + H(exponent) bits

    DDO_BIN=build/ddo python3 bench/fp8_entropy.py [--blocks 2] [--format e4m3|e5m2]
        [--out FILE.json]
--format e5m2: the same weights scaled to E5M2's range (max |w| -> 57344) as F8_E5M2.
(torch only; torch 1.13 works: the bytes are made through a table of the 256 E4M3 values.)
"""

import argparse
import ctypes
import heapq
import json
import os
import struct
import subprocess
import tempfile

import torch


# (mantissa bits, bias, largest finite value, safetensors dtype) per format
FORMATS = {"e4m3": (3, 7, 448.0, "F8_E4M3"), "e5m2": (2, 15, 57344.0, "F8_E5M2")}


def fp8_values(fmt):
    """The value of each byte of fmt (NaN for NaN and infinity codes)."""
    mb, bias, _, _ = FORMATS[fmt]
    vals = []
    for b in range(256):
        s, e, m = b >> 7, (b & 0x7F) >> mb, b & ((1 << mb) - 1)
        scale = float(1 << mb)
        v = m / scale * 2.0 ** (1 - bias) if e == 0 else (1 + m / scale) * 2.0 ** (e - bias)
        if (fmt == "e4m3" and e == 15 and m == 7) or (fmt == "e5m2" and e == 31):
            v = float("nan")
        vals.append(-v if s else v)
    return torch.tensor(vals, dtype=torch.float64)


E4M3 = fp8_values("e4m3")
_TABLES = {}


def tables(fmt):
    if fmt not in _TABLES:
        v = fp8_values(fmt)
        finite = torch.arange(256)[~torch.isnan(v)]
        vals, order = v[finite].sort()
        _TABLES[fmt] = vals, finite[order].to(torch.uint8)
    return _TABLES[fmt]


def encode(w, fmt="e4m3"):
    """float -> nearest FP8 byte (ties to the even code, as a float8 cast rounds)."""
    _VALS, _CODES = tables(fmt)
    top = FORMATS[fmt][2]
    w = w.double().clamp(-top, top)
    i = torch.searchsorted(_VALS, w).clamp(1, len(_VALS) - 1)
    lo, hi = _VALS[i - 1], _VALS[i]
    dlo, dhi = (w - lo).abs(), (hi - w).abs()
    even_hi = (_CODES[i] & 1) == 0
    pick = torch.where((dlo < dhi) | ((dlo == dhi) & ~even_hi), i - 1, i)
    return _CODES[pick]


def entropy(counts):
    n = counts.sum().item()
    p = counts[counts > 0].double() / n
    return float(-(p * p.log2()).sum())


def huffman_bits(counts):
    """Mean code length (bits per symbol) of a Huffman code of counts (no length limit)."""
    heap = [(int(c), i, [i]) for i, c in enumerate(counts.tolist()) if c > 0]
    depth = [0] * len(counts)
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        for s in a[2] + b[2]:
            depth[s] += 1
        heapq.heappush(heap, (a[0] + b[0], min(a[1], b[1]), a[2] + b[2]))
    n = int(counts.sum())
    return sum(depth[i] * int(c) for i, c in enumerate(counts.tolist())) / n


def write_comfy(path, tensors, f8="F8_E4M3"):
    header, off = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        dt = f8 if t.dtype == torch.uint8 else "F32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors.values():
            f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--dim", type=int, default=3072)
    ap.add_argument("--format", choices=sorted(FORMATS), default="e4m3")
    ap.add_argument("--out")
    a = ap.parse_args()
    mb, _, top, f8_name = FORMATS[a.format]
    d, g = a.dim, torch.Generator().manual_seed(0)
    shapes = {"to_q": (d, d), "to_k": (d, d), "to_v": (d, d), "to_out": (d, d),
              "ff_up": (4 * d, d), "ff_down": (d, 4 * d)}
    tensors, counts = {}, torch.zeros(256, dtype=torch.int64)
    for b in range(a.blocks):
        for n, shape in shapes.items():
            w = torch.randn(shape, generator=g) * 0.02
            scale = w.abs().max() / top
            code = torch.cat([encode(row, a.format) for row in (w / scale).split(512)])
            counts += torch.bincount(code.flatten().long(), minlength=256)
            tensors[f"blocks.{b}.{n}.weight"] = code.contiguous()
            tensors[f"blocks.{b}.{n}.weight_scale"] = scale.reshape(1).float()
    exp = torch.zeros(128 >> mb, dtype=torch.int64)
    for byte in range(256):
        exp[(byte & 0x7F) >> mb] += counts[byte]
    h_byte, h_exp = entropy(counts), entropy(exp)
    mag = counts[:128] + counts[128:]
    h_mag, huff = entropy(mag), huffman_bits(counts)
    ddo = os.environ.get("DDO_BIN", "build/ddo")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fp8.safetensors")
        write_comfy(path, tensors, f8_name)
        out = subprocess.run([ddo, "inspect", "--codec", "--json", path], check=True,
                             capture_output=True, text=True).stdout
    f8 = next(x for x in json.loads(out)["dtypes"] if x["dtype"] == f8_name)
    res = {"elements": int(counts.sum()), "ddoc_ratio": f8["ratio"],
           "ddoc_saved": 1 - f8["ratio"], "h_byte_bits": h_byte,
           "byte_bound_saved": 1 - h_byte / 8, "huffman_bits": huff,
           "huffman_saved": 1 - huff / 8, "sign_free_saved": 1 - (1 + h_mag) / 8,
           "format": f8_name, "h_exponent_bits": h_exp,
           "exp_split_saved": 1 - (1 + mb + h_exp) / 8}
    print(f"{res['elements']:,} {f8_name} weights ({a.blocks} blocks of dim {d}, max |w| -> "
          f"{top:g})")
    print(f"  DDOC (ddo inspect --codec): coded/raw {f8['ratio']:.4f}, saves "
          f"{100 * res['ddoc_saved']:.2f} %")
    print(f"  whole-byte Huffman, no layout: {huff:.3f} bits/byte, saves "
          f"{100 * res['huffman_saved']:.2f} %")
    print(f"  order-0 byte entropy      : {h_byte:.3f} bits/byte, bound saves "
          f"{100 * res['byte_bound_saved']:.2f} %")
    print(f"  sign raw + H(7 bits)      : {1 + h_mag:.3f} bits/byte, saves "
          f"{100 * res['sign_free_saved']:.2f} %")
    print(f"  exponent split ({1 + mb} raw + H): H(exp) {h_exp:.3f} bits, saves "
          f"{100 * res['exp_split_saved']:.2f} %")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
