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
  dest     alloc       torch's device allocation (cudaMalloc), as the bus figure
           vmm         one physical handle (cuMemCreate) mapped into a reserved range
                       (cuMemMap), as a slot of ddo's vmm routes is (--no-vmm skips it)
  load     idle        nothing else on the device
           matmul      bf16 matrix products queued on another stream, running throughout
           stream      a bandwidth-bound elementwise kernel on another stream, throughout

Each rate is the median of --repeats timed copies (CUDA events on the copy stream), in GB/s.

  python3 bench/copy_rate_probe.py [--total-gib 2] [--piece-mib 18] [--json out.json]

Exits 77 without a CUDA device (nothing to measure).
"""

import argparse
import ctypes
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


class _VmmRange:
    """n bytes of device memory mapped through the driver's VMM calls: one handle (cuMemCreate)
    mapped read/write into a reserved range; a torch tensor views it through
    __cuda_array_interface__. close() unmaps and releases it."""

    class _Loc(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class _Prop(ctypes.Structure):
        pass

    class _Access(ctypes.Structure):
        pass

    _Prop._fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                      ("location", _Loc), ("win32HandleMetaData", ctypes.c_void_p),
                      ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                      ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
    _Access._fields_ = [("location", _Loc), ("flags", ctypes.c_int)]

    def __init__(self, n, device_index):
        cu = ctypes.CDLL("libcuda.so.1")
        self.cu = cu
        prop = self._Prop(type=1, location=self._Loc(type=1, id=device_index))  # pinned, device
        gran = ctypes.c_size_t(0)
        self._check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0),
                    "cuMemGetAllocationGranularity")
        self.size = (n + gran.value - 1) // gran.value * gran.value
        self.handle = ctypes.c_ulonglong(0)
        self.ptr = ctypes.c_ulonglong(0)
        self._check(cu.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(self.size),
                                   ctypes.byref(prop), ctypes.c_ulonglong(0)), "cuMemCreate")
        self._check(cu.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(self.size),
                                           ctypes.c_size_t(0), ctypes.c_ulonglong(0),
                                           ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        self._check(cu.cuMemMap(self.ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                self.handle, ctypes.c_ulonglong(0)), "cuMemMap")
        acc = self._Access(location=self._Loc(type=1, id=device_index), flags=3)  # read/write
        self._check(cu.cuMemSetAccess(self.ptr, ctypes.c_size_t(self.size), ctypes.byref(acc),
                                      ctypes.c_size_t(1)), "cuMemSetAccess")
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1",
                                         "data": (self.ptr.value, False), "strides": None,
                                         "version": 2}

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUresult {rc}")

    def close(self):
        self.cu.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
        self.cu.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
        self.cu.cuMemRelease(self.handle)


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
    ap.add_argument("--no-vmm", action="store_true",
                    help="skip the VMM-mapped destination (only torch's allocation)")
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
    dests = {"alloc": torch.empty(n, dtype=torch.uint8, device=dev)}
    vmm, vmm_error = None, None
    if not args.no_vmm:
        try:
            vmm = _VmmRange(n, dev.index or 0)
            dests["vmm"] = torch.as_tensor(vmm, device=dev)
        except (OSError, RuntimeError, TypeError, AttributeError) as e:
            vmm_error = f"{type(e).__name__}: {e}"  # the alloc rows still run
    copy_stream, load_stream = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
    rates = {}
    for dname, dst in dests.items():
        for load in ("idle", "matmul", "stream"):
            for name, src in sources.items():
                for shape, p in (("whole", n), ("pieces", piece)):
                    timed_copy(torch, dst, src, p, copy_stream)  # warm-up
                    xs = []
                    for _ in range(args.repeats):
                        load_kernels(torch, dev, load, load_stream, 0.15)
                        xs.append(timed_copy(torch, dst, src, p, copy_stream))
                        load_stream.synchronize()
                    key = f"{name}/{shape}/{load}"
                    rates[key if dname == "alloc" else f"{key}/vmm"] = statistics.median(xs)
    for u in undo:
        u()
    dests.clear()
    torch.cuda.synchronize()
    if vmm is not None:
        vmm.close()
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "bytes": n, "piece_bytes": piece, "repeats": args.repeats,
           "anon_huge_kib_before_after_huge": [huge0, huge1], "rates_gbps": rates,
           "vmm_error": vmm_error}
    base = rates["pinned/whole/idle"]
    res["over_pinned_whole_idle"] = {k: v / base for k, v in rates.items()}
    report(res, args.json)
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
