#!/usr/bin/env python3
"""copy_rate_probe.py - what makes ddo's uploads slower during a step than the bus alone?

The copy-bound cards of issue 26 (docs/benchmarks.md) run their uploads at 50.4-52.0 GB/s during
a step, against 54.2-54.8 GB/s for one 2 GiB copy alone (`torch_flux.measure_bus`), and that is
the gap to the bound. Three things differ between the two: the source memory (the bus figure
copies from torch's pinned allocation; the binding registers the module's own tensors in place
with cuMemHostRegister), the copies' size (a unit is about 20 tensors, one copy each), and the
kernels running beside the copies. This probe measures each alone, on the machine it runs on:

  sources  pinned      torch's pinned allocator (cudaHostAlloc), as the bus figure
           registered  a plain host tensor registered in place (as ddo registers a module)
           huge        anonymous memory advised MADV_HUGEPAGE, touched, then registered
  shapes   whole       one copy of --total-gib
           pieces      the same bytes in --piece-mib copies queued back to back
  load     idle        nothing else on the device
           matmul      bf16 matrix products queued on another stream, running throughout
           stream      a bandwidth-bound elementwise kernel on another stream, throughout

Each rate is the median of --repeats timed copies (CUDA events on the copy stream), in GB/s.

  python3 bench/copy_rate_probe.py [--total-gib 2] [--piece-mib 18] [--json out.json]

Exits 77 without a CUDA device (nothing to measure).
"""

import argparse
import mmap
import statistics
import sys

from copy_queue_probe import cuda_torch, report  # (bench/ is this script's folder)

GIB = 1 << 30


def register(torch, t):
    """cudaHostRegister (portable) of a host tensor in place; returns its unregister call."""
    rt = torch.cuda.cudart()
    ptr = t.data_ptr()
    err = rt.cudaHostRegister(ptr, t.numel() * t.element_size(), 1)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    return lambda: rt.cudaHostUnregister(ptr)


def huge_tensor(torch, n):
    """n bytes of anonymous memory advised MADV_HUGEPAGE before the first touch, as a tensor."""
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(m, dtype=torch.uint8)
    t.fill_(1)
    return t, m


def anon_huge_kib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def load_kernels(torch, dev, kind, stream, seconds):
    """Queues about `seconds` of `kind` work on `stream` (calibrated once per kind)."""
    if kind == "idle":
        return
    cache = load_kernels.__dict__.setdefault("cache", {})
    if kind not in cache:
        if kind == "matmul":
            a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
            fn = (lambda a=a: torch.mm(a, a))
        else:
            a = torch.ones(GIB // 4, device=dev, dtype=torch.float32)
            fn = (lambda a=a: a.mul_(1.0))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(stream)
            for _ in range(10):
                fn()
            e1.record(stream)
        e1.synchronize()
        per = e0.elapsed_time(e1) / 1e3 / 10
        cache[kind] = (fn, per)
    fn, per = cache[kind]
    with torch.cuda.stream(stream):
        for _ in range(max(1, int(seconds / per))):
            fn()


def timed_copy(torch, dst, src, piece, copy_stream):
    n = src.numel()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(copy_stream):
        e0.record(copy_stream)
        if piece >= n:
            dst.copy_(src, non_blocking=True)
        else:
            for o in range(0, n, piece):
                dst[o:o + piece].copy_(src[o:o + piece], non_blocking=True)
        e1.record(copy_stream)
    e1.synchronize()
    return n / (e0.elapsed_time(e1) / 1e3) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-gib", type=float, default=2.0)
    ap.add_argument("--piece-mib", type=float, default=18.0,
                    help="the pieces' size (Flux's 3072x3072 bf16 projection is 18 MiB)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch = cuda_torch("copy_rate_probe")
    if torch is None:
        return 77
    dev = torch.device("cuda:0")
    n = int(args.total_gib * GIB) // 4096 * 4096
    piece = max(4096, int(args.piece_mib * (1 << 20)) // 4096 * 4096)
    huge0 = anon_huge_kib()
    sources = {"pinned": torch.empty(n, dtype=torch.uint8).pin_memory()}
    plain = torch.empty(n, dtype=torch.uint8)
    plain.fill_(1)
    undo = [register(torch, plain)]
    sources["registered"] = plain
    huge, keep = huge_tensor(torch, n)
    huge1 = anon_huge_kib()
    undo.append(register(torch, huge))
    sources["huge"] = huge
    dst = torch.empty(n, dtype=torch.uint8, device=dev)
    copy_stream, load_stream = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
    rates = {}
    for load in ("idle", "matmul", "stream"):
        for name, src in sources.items():
            for shape, p in (("whole", n), ("pieces", piece)):
                timed_copy(torch, dst, src, p, copy_stream)  # warm-up
                xs = []
                for _ in range(args.repeats):
                    load_kernels(torch, dev, load, load_stream, 0.15)
                    xs.append(timed_copy(torch, dst, src, p, copy_stream))
                    load_stream.synchronize()
                rates[f"{name}/{shape}/{load}"] = statistics.median(xs)
    for u in undo:
        u()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "bytes": n, "piece_bytes": piece, "repeats": args.repeats,
           "anon_huge_kib_before_after_huge": [huge0, huge1], "rates_gbps": rates}
    base = rates["pinned/whole/idle"]
    res["over_pinned_whole_idle"] = {k: v / base for k, v in rates.items()}
    report(res, args.json)
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
