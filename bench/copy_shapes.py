#!/usr/bin/env python3
"""copy_shapes.py - host->device copy rate by the shape of the host memory and of the copies.

What limits a streamed step at about 52.5 GB/s against the 55 GB/s of one large pinned copy?
This measures, on one GPU with torch's CUDA copies (no ddo), the same 4 GiB moved as:
  pinned-1      one copy from cudaHostAlloc'ed memory (the bus figure of every bench)
  pinned-64M    64 MiB copies from that memory (ddo's copy piece)
  pinned-tensor copies of the sizes of Flux.1-dev's tensors (from a layout file), 256-B gaps
  reg-1         one copy from pageable memory registered in one cudaHostRegister call
  reg-tensor    the tensor-sized copies from that one registration
  reg-each      one allocation and one registration per tensor (a module's tensors in place)
  reg-each-frag reg-each plus two sub-page copies per tensor from a pinned arena (in place,
                as ddo registers a module's tensors today)
Each case: 1 warm-up pass, then the median of 5 passes, GB/s over the bytes moved.

    python3 bench/copy_shapes.py [--layout data/layouts/flux1-dev.json] [--out FILE.json]
"""

import argparse
import json
import statistics
import time

import torch

GiB = 1 << 30


def tensor_sizes(layout, total):
    """Byte sizes of the layout's tensors, cycled until total bytes."""
    with open(layout) as f:
        d = json.load(f)
    sizes = []
    for t in d["tensors"] if isinstance(d, dict) and "tensors" in d else d:
        n = 2
        for s in t["shape"]:
            n *= s
        if n > 0:
            sizes.append(n)
    out, acc, i = [], 0, 0
    while acc < total:
        n = min(sizes[i % len(sizes)], total - acc)
        out.append(n)
        acc += n
        i += 1
    return out


def timed(passes, stream, fn):
    times = []
    for k in range(passes + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            fn()
        stream.synchronize()
        if k > 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pack_costs(res, each, sizes, total, cr):
    """Host-side costs of packing a module's tensors into one buffer: allocation with first
    touch, the copy into memory already touched, registration, and pinned allocation."""
    page = 4096

    def clock(fn):
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    def pack(dst):
        o = 0
        for t, n in zip(each, sizes):
            dst[o:o + n].copy_(t[64:64 + n])
            o += n
    s_alloc, buf = clock(lambda: torch.empty(total + page, dtype=torch.uint8))
    s_first, _ = clock(lambda: pack(buf))
    s_again, _ = clock(lambda: pack(buf))
    base = (-buf.data_ptr()) % page
    s_reg, _ = clock(lambda: cr.cudaHostRegister(buf.data_ptr() + base, total - page, 0))
    s_unreg, _ = clock(lambda: cr.cudaHostUnregister(buf.data_ptr() + base))
    buf = None  # (released; not `del`, which pyflakes reads as undefined in the lambdas)
    s_palloc, pb = clock(lambda: torch.empty(total, dtype=torch.uint8, pin_memory=True))
    s_pfirst, _ = clock(lambda: pack(pb))
    pb = None
    out = {"alloc_s": s_alloc, "pack_first_touch_s": s_first, "pack_touched_s": s_again,
           "register_s": s_reg, "unregister_s": s_unreg, "pinned_alloc_s": s_palloc,
           "pack_into_pinned_s": s_pfirst, "threads": torch.get_num_threads()}
    for k, v in out.items():
        if k.endswith("_s"):
            print(f"{k:20s} {v:8.3f} s  {total / v / 1e9:7.2f} GB/s", flush=True)
    res["pack"] = out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="data/layouts/flux1-dev.json")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    total = int(a.gib * GiB)
    sizes = tensor_sizes(a.layout, total)
    cr = torch.cuda.cudart()
    dev = torch.empty(total + 256 * len(sizes), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "bytes": total,
           "copies_tensor": len(sizes), "cases": {}}

    def rate(name, fn, nbytes=total, copies=None):
        s = timed(a.passes, stream, fn)
        res["cases"][name] = {"s": s, "gbps": nbytes / s / 1e9, "copies": copies}
        print(f"{name:14s} {nbytes / s / 1e9:7.2f} GB/s  ({copies} copies)", flush=True)

    def runs(src_at, pieces):
        def go():
            for d_off, s, n in pieces:
                dev[d_off:d_off + n].copy_(src_at(s, n), non_blocking=True)
        return go

    # the pieces: (device offset, host offset, bytes)
    def layout_pieces(chunks, gap):
        out, d, h = [], 0, 0
        for n in chunks:
            out.append((d, h, n))
            d += (n + gap + 255) // 256 * 256 if gap else n
            h += n
        return out

    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(1)

    def at(buf):
        return lambda s, n: buf[s:s + n]
    rate("pinned-1", runs(at(pinned), [(0, 0, total)]), copies=1)
    p64 = [(o, o, min(64 << 20, total - o)) for o in range(0, total, 64 << 20)]
    rate("pinned-64M", runs(at(pinned), p64), copies=len(p64))
    pt = layout_pieces(sizes, 256)
    rate("pinned-tensor", runs(at(pinned), pt), copies=len(pt))
    del pinned

    page = 4096
    raw = torch.empty(total + page, dtype=torch.uint8)
    base = (-raw.data_ptr()) % page
    reg = raw[base:base + total]
    reg.fill_(1)
    rc = cr.cudaHostRegister(reg.data_ptr(), total, 0)
    res["register_rc"] = int(rc) if not isinstance(rc, tuple) else int(rc[0])
    rate("reg-1", runs(at(reg), [(0, 0, total)]), copies=1)
    rate("reg-tensor", runs(at(reg), pt), copies=len(pt))
    cr.cudaHostUnregister(reg.data_ptr())
    del reg, raw

    each = []
    for n in sizes:
        t = torch.empty(n + 2 * page, dtype=torch.uint8)
        t.fill_(1)
        each.append(t)
    pieces = []  # (device offset, tensor, start, bytes) inner pages only
    frags = []
    d = 0
    for t, n in zip(each, sizes):
        p = t.data_ptr() + 64  # a torch allocation's start is not page aligned
        ia = (p + page - 1) // page * page
        ib = (p + n) // page * page
        if ib > ia:
            cr.cudaHostRegister(ia, ib - ia, 0)
            pieces.append((d + ia - p, t, ia - t.data_ptr(), ib - ia))
            frags.append((d, ia - p))
            frags.append((d + ib - p, p + n - ib))
        d += (n + 255) // 256 * 256
    moved = sum(x[3] for x in pieces)

    def go_each():
        for d_off, t, s, n in pieces:
            dev[d_off:d_off + n].copy_(t[s:s + n], non_blocking=True)
    rate("reg-each", go_each, nbytes=moved, copies=len(pieces))
    arena = torch.empty(max(1, sum(n for _d, n in frags)), dtype=torch.uint8, pin_memory=True)
    fr = []
    o = 0
    for d_off, n in frags:
        if n > 0:
            fr.append((d_off, o, n))
            o += n

    def go_frag():
        k = 0
        for d_off, t, s, n in pieces:
            for j in (0, 1):
                if k + j < len(fr):
                    fd, fo, fn = fr[k + j]
                    dev[fd:fd + fn].copy_(arena[fo:fo + fn], non_blocking=True)
            k += 2
            dev[d_off:d_off + n].copy_(t[s:s + n], non_blocking=True)
    rate("reg-each-frag", go_frag, nbytes=moved + o, copies=len(pieces) + len(fr))
    for d_off, t, s, n in pieces:
        cr.cudaHostUnregister(t.data_ptr() + s)
    pack_costs(res, each, sizes, total, cr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
