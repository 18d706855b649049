#!/usr/bin/env python3
"""Device sets (docs/multi-gpu.md): donor mode and split mode's intake, for ONE multi-GPU call.

Issue 30, "On a multi-GPU kind": the Flux.1-dev transformer (Diffusers' FluxTransformer2DModel,
random bf16 weights, 22.17 GiB; bench/torch_flux.py builds it) on two or more GPUs:

  donor  zero resident on cuda:0, every streamed unit stored on cuda:1: the median step against
         max(resident step on cuda:0, streamed bytes per step / measured cuda:1 -> cuda:0 rate)
         (target <= 1.05), outputs bit-identical to the resident model, cuda:0's device weights
         within the 4 GiB budget and cuda:1 holding the planned store
  split  each GPU's weight intake when it copies 1/N of the model's bytes from pinned host
         memory and NCCL's all-gather completes them (ddo_device_measure_split; read back and
         compared on every GPU), against one link's measured rate (target >= 1.6 x on x2,
         >= 3 x on x4). The intake without a session.
  share  the split as the binding runs it: one process per GPU (torch.distributed over NCCL;
         gloo with --cpu), each running enable_offload(model, device_mode="split") zero
         resident on its own GPU: each uploads its share of every streamed unit over its own
         link and the group's all-gather completes the unit. Per rank: the median step against
         max(resident step, host bytes per step / its link's measured rate), the weight intake
         (streamed bytes per step / step) against that link, bit-identity to its resident run.

  GPU:   PYTHONPATH=.devbench/src:python DDO_LIBRARY=<build>/libddo.so \\
         python3 bench/multi_gpu.py --out $OUT/multi_gpu.json    (--cases donor,split,share)
  Smoke: python3 bench/multi_gpu.py --toy --cpu      (cpu:0/cpu:1 emulate the set; no Diffusers)

Donor and split run in this one process; share starts one process per GPU (this script with
--share-rank) and collects their results.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import statistics
import sys
import time

GIB = 1 << 30
# Donor: zero resident (docs/benchmarks.md), the 4 GiB device budget of the torch_flux cases;
# host memory is not pinned (the store device is the source, the host copy is read once).
DONOR_OPTIONS = {
    "always_resident_modules_pattern": "^$",
    "small_tensor_threshold_bytes": 0,
    "resident_module_budget_gb": 0,
    "vmm_resident_weight_budget_gb": 4,
    "pin_cpu_memory": False,
}
TARGET_DONOR_RATIO = 1.05
TARGET_SPLIT = {2: 1.6, 4: 3.0}


def log(msg):
    print(f"[multi_gpu {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def torch_flux():
    """bench/torch_flux.py as a module: the model, inputs and forward it benchmarks."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_flux.py")
    spec = importlib.util.spec_from_file_location("torch_flux", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed_steps(tf, module, inputs, args, cuda):
    import torch
    times, out = [], None
    with torch.no_grad():
        for i in range(args.warmup + args.steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = tf.forward(module, inputs, args.toy)
            if cuda:
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
    return out, times


def ddo_devices(specs):
    """ddo devices opened by spec (closed by the caller with close_devices)."""
    from ddo import _native
    L = _native.lib()
    devs = []
    for s in specs:
        h = ctypes.c_void_p()
        _native.check(L.ddo_device_create(s.encode(), None, ctypes.byref(h)))
        devs.append(h)
    return devs


def close_devices(devs):
    from ddo import _native
    for h in devs:
        _native.lib().ddo_device_destroy(h)


class DeviceBandwidth(ctypes.Structure):  # ddo_device_bandwidth (include/ddo.h)
    _fields_ = [("pinned_bytes_per_s", ctypes.c_double),
                ("pinned_2mib_bytes_per_s", ctypes.c_double),
                ("pageable_bytes_per_s", ctypes.c_double),
                ("register_s_per_gib", ctypes.c_double),
                ("pinned_alloc_s_per_gib", ctypes.c_double), ("bytes", ctypes.c_uint64)]


def one_link(spec, nbytes):
    """The pinned host->device rate of one device (ddo_device_measure), bytes/s."""
    from ddo import _native
    (h,) = ddo_devices([spec])
    try:
        fn = _native.lib().ddo_device_measure
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(DeviceBandwidth)]
        bw = DeviceBandwidth()
        _native.check(fn(h, nbytes, ctypes.byref(bw)))
        return bw.pinned_bytes_per_s
    finally:
        close_devices([h])


def peer_rate(to_spec, from_spec, nbytes):
    from ddo import _native
    to, frm = ddo_devices([to_spec, from_spec])
    try:
        rate = ctypes.c_double(0)
        _native.check(_native.lib().ddo_device_measure_peer(to, frm, nbytes, ctypes.byref(rate)))
        return rate.value
    finally:
        close_devices([to, frm])


def donor_case(tf, args, devs):
    """Resident on devs[0], then donor mode over devs[0:2]; the ratio to the bound."""
    import torch
    import ddo
    cuda = devs[0].startswith("cuda")
    model, info = tf.build_model(args)
    inputs = tf.make_inputs(args, devs[0] if cuda else "cpu")
    res = {"case": "donor", "devices": devs[:2], "model": info}
    resident = model.to(devs[0]) if cuda else model
    ref, times = timed_steps(tf, resident, inputs, args, cuda)
    res["resident_median_step_s"] = statistics.median(times)
    ref = ref.detach().to("cpu")
    model = resident.to("cpu")
    if cuda:
        torch.cuda.empty_cache()
    res["peer_bytes_per_s"] = peer_rate(devs[0], devs[1], int(args.link_gib * GIB))
    r = ddo.enable_offload(model, backend="vmm", devices=devs[:2], **DONOR_OPTIONS)
    try:
        snap0 = r.metrics_snapshot(collect_completed=True).as_dict()
        out, times = timed_steps(tf, r.module, inputs, args, cuda)
        snap1 = r.metrics_snapshot(collect_completed=True).as_dict()
        res["plan_device_set"] = r.plan.get("device_set")
        res["median_step_s"] = statistics.median(times)
        res["step_times_s"] = times
        copied = snap1["devices"]["bytes_from_store"] - snap0["devices"]["bytes_from_store"]
        res["streamed_bytes_per_step"] = copied / max(1, args.warmup + args.steps)
        res["bound_s"] = max(res["resident_median_step_s"],
                             res["streamed_bytes_per_step"] / res["peer_bytes_per_s"])
        res["ratio"] = res["median_step_s"] / res["bound_s"]
        res["target_ratio"] = TARGET_DONOR_RATIO
        res["bit_identical"] = bool(torch.equal(out.detach().to("cpu"), ref))
        res["device_weights_peak_bytes"] = snap1["capacities"]["device_weights_peak_bytes"]
        res["within_budget"] = res["device_weights_peak_bytes"] <= 4 * GIB
        res["store_device_peak_bytes"] = snap1["devices"]["store_device_peak_bytes"]
        res["planned_store_bytes"] = snap1["devices"]["planned_store_bytes"]
        res["store_fill_s"] = snap1["devices"]["store_fill_ns"] / 1e9
    finally:
        r.close()
    return res


def split_case(tf, args, devs):
    """Each device's intake under the split upload of the model's bytes, against one link."""
    from ddo import _native
    nbytes = int(args.split_gib * GIB)
    res = {"case": "split", "devices": devs, "bytes": nbytes}
    res["one_link_bytes_per_s"] = one_link(devs[0], nbytes)
    handles = ddo_devices(devs)
    try:
        arr = (ctypes.c_void_p * len(handles))(*[h.value for h in handles])
        rate = ctypes.c_double(0)
        rc = _native.lib().ddo_device_measure_split(arr, len(handles), nbytes, None,
                                                    ctypes.byref(rate))
        if rc != 0:
            res["error"] = _native.lib().ddo_last_error().decode()
            return res
        res["intake_bytes_per_s"] = rate.value  # read back and compared on every device
        res["intake_ratio"] = rate.value / res["one_link_bytes_per_s"]
        res["target_ratio"] = TARGET_SPLIT.get(len(devs))
        res["nccl_nvls_enable"] = os.environ.get("NCCL_NVLS_ENABLE")
    finally:
        close_devices(handles)
    return res


def share_case(tf, args, devs):
    """Share mode: this script once per device (--share-rank), their results collected."""
    import subprocess
    import tempfile
    n = len(devs)
    res = {"case": "share", "devices": devs, "ranks": []}
    passed = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--link-gib={args.link_gib}",
              f"--image-tokens={args.image_tokens}", f"--text-tokens={args.text_tokens}",
              f"--toy-dim={args.toy_dim}"]
    passed += [f for f, on in (("--tiny", args.tiny), ("--toy", args.toy), ("--cpu", args.cpu))
               if on]
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # ddo as imported here
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--share-rank",
                                   str(r), "--share-world", str(n), "--share-dir", tmp] + passed,
                                  env=env) for r in range(n)]
        rcs = [p.wait() for p in procs]
        for r in range(n):
            path = os.path.join(tmp, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    res["ranks"].append(json.load(f))
    if any(rcs) or len(res["ranks"]) < n:
        res["error"] = f"rank exit codes {rcs}; {len(res['ranks'])} of {n} results"
        return res
    ranks = res["ranks"]
    res["bit_identical"] = all(r["bit_identical"] for r in ranks)
    res["ratio_max"] = max(r["ratio"] for r in ranks)
    res["intake_ratio_min"] = min(r["intake_ratio"] for r in ranks)
    res["same_gathers"] = len({r["gathers"] for r in ranks}) == 1
    res["target_intake_ratio"] = TARGET_SPLIT.get(n)
    return res


def share_rank(args):
    """One rank of the share case (a process of its own): resident step, then share mode."""
    import torch
    import torch.distributed as dist
    import ddo
    r, n, cuda = args.share_rank, args.share_world, not args.cpu
    dev = f"cuda:{r}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(r)
    dist.init_process_group("nccl" if cuda else "gloo", rank=r, world_size=n,
                            init_method="file://" + os.path.join(args.share_dir, "store"))
    res = {"rank": r, "device": dev}
    res["one_link_bytes_per_s"] = one_link(dev, int(args.link_gib * GIB))
    tf = torch_flux()
    model, _info = tf.build_model(args)
    inputs = tf.make_inputs(args, dev)
    resident = model.to(dev) if cuda else model
    ref, times = timed_steps(tf, resident, inputs, args, cuda)
    res["resident_median_step_s"] = statistics.median(times)
    ref = ref.detach().to("cpu")
    model = resident.to("cpu")
    del resident
    if cuda:
        torch.cuda.empty_cache()
    opts = dict(DONOR_OPTIONS, pin_cpu_memory=True)
    res["options"] = opts
    off = ddo.enable_offload(model, backend="vmm", device_mode="split", execution_device=dev,
                             **opts)
    try:
        snap0 = off.metrics_snapshot(collect_completed=True).as_dict()["devices"]
        out, times = timed_steps(tf, off.module, inputs, args, cuda)
        snap1 = off.metrics_snapshot(collect_completed=True).as_dict()["devices"]
        steps = args.warmup + args.steps  # snap0 is taken before the warm-up
        host = snap1["bytes_share_uploaded"] - snap0["bytes_share_uploaded"]
        left = snap1["bytes_share_left"] - snap0["bytes_share_left"]
        res["route"] = off.plan["route"]
        res["median_step_s"] = statistics.median(times)
        res["step_times_s"] = times
        res["host_bytes_per_step"] = host / steps
        res["streamed_bytes_per_step"] = (host + left) / steps
        res["bound_s"] = max(res["resident_median_step_s"],
                             res["host_bytes_per_step"] / res["one_link_bytes_per_s"])
        res["ratio"] = res["median_step_s"] / res["bound_s"]
        res["intake_bytes_per_s"] = res["streamed_bytes_per_step"] / res["median_step_s"]
        res["intake_ratio"] = res["intake_bytes_per_s"] / res["one_link_bytes_per_s"]
        res["gathers"] = off._share.gathers if off._share is not None else 0
        res["plan_replaced"] = off._share.plan_replaced if off._share is not None else None
        res["bit_identical"] = bool(torch.equal(out.detach().to("cpu"), ref))
    finally:
        off.close()
        dist.destroy_process_group()
    with open(os.path.join(args.share_dir, f"rank{r}.json"), "w") as f:
        json.dump(res, f, default=str)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Donor and split device sets (issue 30)")
    p.add_argument("--cases", default="donor,split,share")
    p.add_argument("--out", default=None, help="JSON results file")
    p.add_argument("--gpus", type=int, default=0, help="GPUs of the split case (0: all)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--link-gib", type=float, default=1.0, help="bytes of the peer measurement")
    p.add_argument("--split-gib", type=float, default=4.0, help="bytes of the split measurement")
    p.add_argument("--image-tokens", type=int, default=4096)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--tiny", action="store_true", help="tiny Flux configuration")
    p.add_argument("--toy", action="store_true", help="built-in Flux-like module, no Diffusers")
    p.add_argument("--cpu", action="store_true", help="cpu:0, cpu:1 emulate the set (smoke)")
    p.add_argument("--toy-dim", type=int, default=64, help="the toy module's width")
    p.add_argument("--share-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--share-world", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--share-dir", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.share_rank is not None:
        return share_rank(args)
    tf = torch_flux()
    if args.cpu:
        n = max(2, args.gpus)
        devs = [f"cpu:{i}" for i in range(n)]
        args.link_gib = min(args.link_gib, 0.0625)
        args.split_gib = min(args.split_gib, 0.0625)
    else:
        import torch
        n = args.gpus or torch.cuda.device_count()
        if n < 2:
            log(f"{n} GPU(s): a device set needs two or more")
            return 2
        devs = [f"cuda:{i}" for i in range(n)]
    results = {"meta": {"devices": devs, "argv": sys.argv[1:],
                        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}}
    for case in args.cases.split(","):
        log(f"case {case} on {devs}")
        try:
            case_fn = {"donor": donor_case, "split": split_case, "share": share_case}[case]
            results[case] = case_fn(tf, args, devs)
        except Exception as e:  # the other case still runs; the error is recorded
            results[case] = {"case": case, "error": f"{type(e).__name__}: {e}"}
        log(json.dumps({k: v for k, v in results[case].items()
                        if not isinstance(v, (dict, list))}, default=str))
    text = json.dumps(results, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0 if all("error" not in results[c] for c in args.cases.split(",")) else 1


if __name__ == "__main__":
    sys.exit(main())
