#!/usr/bin/env python3
"""copy_queue_probe.py - does a small synchronous host->device copy wait behind ddo's uploads?

Issue 27's GGUF Q4_K step on the H200 was 0.1 s longer under ddo than resident while its kernels
took the same time (docs/benchmarks.md); on an H100 the same bench added 12 ms. Diffusers' native
Q4_K dequantization builds a small tensor on the host and copies it to the device for every
layer (`torch.tensor(..., device=...)`, 494 a step for Flux): a pageable copy that the host waits
for. If the driver queues it on the copy engine that ddo's unit uploads (pinned copies on a
non-blocking stream, ~100 MB a unit) are using, each such copy can wait for the upload in flight,
and a host-bound step pays every wait. This probe measures that on the machine it runs on:

  alone     the latency of torch.tensor(<64 floats>, device="cuda") with nothing else running;
  beside    the same while a stream keeps uploading --chunk-mib pieces from pinned host memory
            (as ddo's copy stream does), the median and the 90th percentile;
  upload    the uploads' rate during the probe (GB/s).

  python3 bench/copy_queue_probe.py [--samples 400] [--chunk-mib 64] [--json out.json]

Exits 77 without a CUDA device (nothing to measure).
"""

import argparse
import json
import statistics
import sys
import threading
import time


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cuda_torch(name):
    """torch, or None (said on stderr) without a CUDA device: the probes then exit 77."""
    import torch
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device: nothing to measure", file=sys.stderr)
        return None
    return torch


def report(res, path):
    """The probe's result on stdout, and in path (JSON) when given."""
    print(json.dumps(res, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def small_copies(torch, dev, n):
    """n latencies (seconds) of a small pageable host->device copy the host waits for."""
    vals = [float(i) for i in range(64)]
    out = []
    for _ in range(n):
        t = time.perf_counter()
        torch.tensor(vals, device=dev)
        out.append(time.perf_counter() - t)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--chunk-mib", type=int, default=64)
    ap.add_argument("--total-gib", type=float, default=2.0, help="pinned source, cycled")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch = cuda_torch("copy_queue_probe")
    if torch is None:
        return 77
    dev = torch.device("cuda:0")
    torch.cuda.init()
    small_copies(torch, dev, 20)  # warm-up
    alone = small_copies(torch, dev, args.samples)

    chunk = args.chunk_mib << 20
    n_chunks = max(1, int(args.total_gib * (1 << 30)) // chunk)
    src = torch.empty(n_chunks * chunk, dtype=torch.uint8).pin_memory()
    dst = torch.empty(chunk, dtype=torch.uint8, device=dev)
    stream = torch.cuda.Stream(device=dev)
    stop = threading.Event()
    moved = [0]

    def upload():
        k = 0
        with torch.cuda.stream(stream):
            while not stop.is_set():
                for _ in range(4):  # a unit's worth queued at once, as the session issues it
                    dst.copy_(src[(k % n_chunks) * chunk:(k % n_chunks + 1) * chunk],
                              non_blocking=True)
                    k += 1
                stream.synchronize()
                moved[0] += 4 * chunk

    th = threading.Thread(target=upload, daemon=True)
    t0 = time.perf_counter()
    th.start()
    time.sleep(0.05)
    beside = small_copies(torch, dev, args.samples)
    stop.set()
    th.join()
    wall = time.perf_counter() - t0
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "chunk_bytes": chunk, "samples": args.samples,
           "alone_median_s": statistics.median(alone), "alone_p90_s": percentile(alone, 0.9),
           "beside_median_s": statistics.median(beside), "beside_p90_s": percentile(beside, 0.9),
           "upload_gbps": moved[0] / wall / 1e9}
    res["beside_over_alone"] = res["beside_median_s"] / res["alone_median_s"]
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
