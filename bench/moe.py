#!/usr/bin/env python3
"""Two experts larger than RAM: Wan 2.2 A14B's high-noise and low-noise transformers from files.

Issue 28, item 4 ("only the active expert holds retained memory; the switch is planned"), at
full size: two checkpoints of the Wan 2.1 14B layout (Wan 2.2 A14B's experts each have it; 28.6
GB bf16 each, 57 GB together) written to this machine's disk by `ddo synth --values normal`
(seeds 1 and 2), and one pipeline of both, staged by ddo.enable_pipeline_offload under a host
limit (16 GiB by default) on an emulated card (8 GiB): the high-noise expert runs its steps, the
pipeline's step callback switches at the boundary (stager.prepare: the other expert's retained
store released, this one's read and its first units loading), then the low-noise expert runs
its steps. The models are bench/cards.py's stand-ins of the layout (every tensor a parameter of
the same name and shape, every 2-D weight a real matmul over the tokens), built on the meta
device and associated with the files (from_pretrained_with_dynamic_offload), so the bytes and
units are the real experts'.

Per expert: each step against max(its resident step, bytes copied to the device / the bus,
bytes read from the file / the disk's O_DIRECT rate), all measured in this run; the file
bytes per step; the retained bytes of both experts after every step (the inactive one must
hold none); the switch's time; bit-identity of each expert's output to its resident run. For
the whole staged process: peak RSS (VmHWM) and, where a cgroup v2 child can be made, its
memory.peak under memory.max = the limit. The page cache is dropped before the staged run
where the machine allows.

  H200:  PYTHONPATH=python DDO_LIBRARY=<build>/libddo.so python3 bench/moe.py --ddo <build>/ddo \\
             --out $OUT/moe.json                       (needs 57 GB free under --dir)
  Smoke: python3 bench/moe.py --tiny --out /tmp/moe.json   (cpu device, 6 blocks, widths / 6)
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cards  # noqa: E402  (the layout stand-in and its input)
import lowram  # noqa: E402  (cgroups, the page cache, the launcher that reports peak RSS)
import torch_flux as tf  # noqa: E402  (the bus, the bytes a session moved)

GIB = 1 << 30
LAYOUT = "wan2.1-t2v-14b"
EXPERTS = ("transformer", "transformer_2")  # Wan 2.2's names: high-noise, then low-noise


def log(msg):
    print(f"[moe {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def expert_path(args, name):
    return os.path.join(args.dir, f"{'tiny-' if args.tiny else ''}{name}.safetensors")


def layout_file(args):
    """The layout synth writes from: the real one, or --tiny's cut of it (a file in --dir)."""
    if not args.tiny:
        return os.path.join(tf.repo_root(), "data", "layouts", f"{LAYOUT}.json")
    path = os.path.join(args.dir, "tiny-layout.json")
    with open(path, "w") as f:
        json.dump({"tensors": layout_tensors(args)}, f)
    return path


def layout_tensors(args):
    """The layout's tensors; --tiny: 6 blocks, every width over 64 divided by 6 (130 MB an
    expert: about two 64 MiB segments of a retained store, so a tiny expert is retained in
    part and reads the rest from its file every step, as the full-size ones do)."""
    return cards.load_layout(LAYOUT, args.tiny, div=6)


def model_bytes(tensors):
    n = 0
    for t in tensors:
        k = 2  # BF16: every tensor of the layout
        for d in t["shape"]:
            k *= d
        n += k
    return n


def direct_read_gbps(path, nbytes):
    """The file's O_DIRECT read rate (GB/s) over its first nbytes, in 64 MiB reads."""
    import mmap
    piece = 64 << 20
    buf = mmap.mmap(-1, piece)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        t0, done = time.perf_counter(), 0
        while done < nbytes:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            done += n
        return done / (time.perf_counter() - t0) / 1e9
    finally:
        os.close(fd)
        buf.close()


def child_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def common_args(args):
    out = ["--dir", args.dir, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--tokens", str(args.tokens), "--limit-gib", str(args.limit_gib),
           "--card-gib", str(args.card_gib)]
    return out + (["--tiny"] if args.tiny else [])


def main(argv=None):
    args = parse_args(argv)
    if args.role:
        return {"resident": resident_role, "staged": staged_role}[args.role](args)
    t_start = time.time()
    os.makedirs(args.dir, exist_ok=True)
    tensors = layout_tensors(args)
    size = model_bytes(tensors)
    res = {"schema": "ddo.bench.moe", "tiny": args.tiny, "layout": LAYOUT, "experts": EXPERTS,
           "expert_bytes": size, "limit_bytes": int(args.limit_gib * GIB),
           "card_gib": args.card_gib, "argv": sys.argv[1:] if argv is None else argv}
    paths = {n: expert_path(args, n) for n in EXPERTS}
    need = sum(size for p in paths.values() if not os.path.exists(p))
    free = shutil.disk_usage(args.dir).free
    res["disk"] = {"free_bytes": free, "need_bytes": need}
    if need > free:
        res["error"] = (f"the two experts need {need / 1e9:.1f} GB more under {args.dir}, "
                        f"{free / 1e9:.1f} GB free")
        return finish(args, res, t_start)
    lay = layout_file(args)
    for seed, (name, path) in enumerate(paths.items(), 1):
        if not os.path.exists(path):
            t0 = time.time()
            subprocess.run([args.ddo, "synth", "--layout", lay, "--out", path, "--values",
                            "normal", "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
            res.setdefault("synth_s", {})[name] = time.time() - t0
    res["page_cache_before_disk"] = lowram.drop_caches()
    # The bound's disk rate: the whole of an expert's file (the steps read from all of it).
    # The first 2 GiB alone, just written, read faster on the H100 machine of 2026-12-06
    # (2.10 GB/s): kept as disk_head_gbps, with the ratio against it (ratio_head).
    res["disk_head_gbps"] = direct_read_gbps(paths[EXPERTS[0]], min(size, 2 * GIB))
    res["disk_gbps"] = direct_read_gbps(paths[EXPERTS[1]], size)
    cuda = not args.tiny and torch_cuda()
    if cuda:
        res["bus"] = tf.measure_bus(2.0)
    res["resident"] = {}
    for name in EXPERTS:  # each expert whole on the device: its step and its output
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--role", "resident",
                              "--expert", name] + common_args(args), env=child_env(),
                             capture_output=True, text=True)
        if out.returncode != 0:
            res["error"] = f"resident {name}: {out.stdout[-1500:]}{out.stderr[-1500:]}"
            return finish(args, res, t_start)
        res["resident"][name] = json.loads(out.stdout.strip().splitlines()[-1])
    res["page_cache_before_staged"] = lowram.drop_caches()
    cg, cg_note = (None, "none asked")
    if not args.no_cgroup and not args.tiny:
        cg, cg_note = lowram.make_cgroup(f"ddo-moe-{os.getpid()}", int(args.limit_gib * GIB))
    res["cgroup"] = cg_note
    staged_json = os.path.join(args.dir, "staged.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "staged", "--result",
           staged_json] + common_args(args)
    out = subprocess.run([sys.executable, "-S", "-E", "-c", lowram.LAUNCH, cg or "-"] + cmd,
                         env=child_env(), capture_output=True, text=True)
    res["cgroup_peak_bytes"] = lowram.cgroup_peak(cg) if cg else None
    peaks = [int(ln.split()[1]) for ln in out.stdout.splitlines()
             if ln.startswith("lowram-peak-rss-kib ")]
    res["staged_peak_rss_bytes"] = peaks[-1] * 1024 if peaks else None
    if out.returncode != 0 or not os.path.exists(staged_json):
        res["error"] = f"staged (rc {out.returncode}): {out.stdout[-1500:]}{out.stderr[-2500:]}"
        return finish(args, res, t_start)
    with open(staged_json) as f:
        res["staged"] = json.load(f)
    summarize(res, args)
    return finish(args, res, t_start)


def summarize(res, args):
    """Per expert: the median step against its bound; the RSS and cgroup peaks against the
    limit; the inactive expert's retained bytes; bit-identity."""
    bus = res["bus"]["bus_gbps"] * 1e9 if "bus" in res else None
    disk = res["disk_gbps"] * 1e9
    st = res["staged"]
    for name in EXPERTS:
        e = st["experts"][name]
        steps = [s for s in st["steps"] if s["active"] == name and s["timed"]]
        step = statistics.median(s["step_s"] for s in steps)
        copied = statistics.median(s["copied_bytes"] for s in steps)
        read = statistics.median(s["file_bytes"] for s in steps)
        floor = max(res["resident"][name]["step_s"], copied / bus if bus else 0.0)
        bound = max(floor, read / disk)
        head = max(floor, read / (res.get("disk_head_gbps", res["disk_gbps"]) * 1e9))
        e.update(step_s=step, copied_bytes_per_step=copied, file_bytes_per_step=read,
                 bound_s=bound, ratio=step / bound, ratio_head=step / head,
                 bit_identical=e["bits"]["identical"],
                 inactive_held_bytes=max(s["held"][o] for s in steps for o in EXPERTS
                                         if o != name))
    limit = res["limit_bytes"] = st.get("limit_bytes", res["limit_bytes"])
    res["within_limit_rss"] = res["staged_peak_rss_bytes"] is not None and \
        res["staged_peak_rss_bytes"] <= limit
    res["within_limit_cgroup"] = None if res["cgroup_peak_bytes"] is None else \
        res["cgroup_peak_bytes"] <= limit
    res["target_ratio"] = 1.1


def finish(args, res, t_start):
    res["wall_s"] = time.time() - t_start
    text = json.dumps(res, indent=1, default=str)
    with open(os.path.join(args.out, "moe.json") if os.path.isdir(args.out) else args.out,
              "w") as f:
        f.write(text)
    brief = {k: v for k, v in res.items() if not isinstance(v, (dict, list))}
    for name, e in res.get("staged", {}).get("experts", {}).items():
        brief[name] = {k: e.get(k) for k in ("step_s", "bound_s", "ratio", "bit_identical",
                                             "inactive_held_bytes", "switch_s")}
    log(json.dumps(brief, default=str))
    return 0 if "error" not in res else 1


def torch_cuda():
    import torch
    return torch.cuda.is_available()


def make_input(args, tensors, device):
    import torch
    g = torch.Generator().manual_seed(20261205)
    return torch.randn(args.tokens, cards.hidden_dim(tensors), generator=g).to(
        torch.bfloat16).to(device)


def loader(tensors):
    import torch
    return lambda path, **_: cards.build_model(tensors, "meta", torch.bfloat16)


def ref_path(args, name):
    """Where the resident run of expert name leaves its output (torch.save, as torch_flux)."""
    return os.path.join(args.dir, f"{'tiny-' if args.tiny else ''}{name}-ref.pt")


def resident_role(args):
    """One expert whole on the device (read from its file into host memory, then moved): its
    median step, and its output saved for the staged run's comparison."""
    import torch
    import ddo
    tensors = layout_tensors(args)
    path = expert_path(args, args.expert)
    device = "cuda" if not args.tiny and torch.cuda.is_available() else "cpu"
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=loader(tensors))
    module = ddo.loading.materialize(res.module, path).to(device)
    x = make_input(args, tensors, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step, out = cards.run_steps(module, x, args, sync)
    torch.save(out.detach().to("cpu"), ref_path(args, args.expert))
    print(json.dumps({"step_s": step, "device": device}))
    return 0


def staged_role(args):
    """Both experts from their files, staged under the host limit: the high-noise expert's
    steps, the switch at the boundary (stager.prepare), the low-noise expert's steps."""
    import types
    import torch
    import ddo
    tensors = layout_tensors(args)
    cuda = not args.tiny and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    mods = {n: ddo.from_pretrained_with_dynamic_offload(expert_path(args, n),
                                                        model_loader=loader(tensors)).module
            for n in EXPERTS}
    pipe = types.SimpleNamespace(components=dict(mods))
    if cuda:  # the host limit, 2 GiB of it the process's own (as bench/lowram.py)
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(args.card_gib * GIB / total)
        limit = int(args.limit_gib * GIB)
        opts = dict(device_memory_limit_gb=args.card_gib, system_ram_headroom_gb=2.0)
    else:  # --tiny: this process as it is now, two staging windows and 96 MiB (room for one
        # expert's 64 MiB segment of retained store, not for two)
        headroom = tf.read_status_kib("VmRSS") * 1024 + (128 << 20)
        limit = headroom + (64 << 20) + (96 << 20)
        opts = dict(execution_device="cpu", device_budget_gb=0.05,
                    vmm_staging_buffer_gb=0.0625, system_ram_headroom_gb=headroom / GIB)
    t0 = time.perf_counter()
    res = ddo.enable_pipeline_offload(pipe, environ={}, available_system_ram_gb=limit / GIB,
                                      **opts)
    out = {"enable_s": time.perf_counter() - t0, "steps": [], "experts": {},
           "limit_bytes": limit}
    st = res.stager
    x = make_input(args, tensors, device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def held(n):
        return res[n].metrics_snapshot().get("retained_bytes") or 0

    def moved(n):
        copied, _ = tf.ddo_bytes(res[n])
        return copied or 0, res[n].metrics_snapshot().get("bytes_staged_from_file") or 0

    try:
        for k, name in enumerate(EXPERTS):
            e = out["experts"][name] = {}
            if k > 0:  # the pipeline's step callback at the boundary
                sync()
                t0 = time.perf_counter()
                st.prepare(name)
                e["switch_s"] = time.perf_counter() - t0
                e["held_after_switch"] = {n: held(n) for n in EXPERTS}
            last = None
            for i in range(args.warmup + args.steps):
                c0, f0 = moved(name)
                sync()
                t0 = time.perf_counter()
                with torch.no_grad():
                    last = mods[name](x)
                sync()
                dt = time.perf_counter() - t0
                c1, f1 = moved(name)
                out["steps"].append({"active": name, "timed": i >= args.warmup, "step_s": dt,
                                     "copied_bytes": c1 - c0, "file_bytes": f1 - f0,
                                     "held": {n: held(n) for n in EXPERTS}})
            e["bits"] = tf.same_bits(torch.load(ref_path(args, name)), last.detach().to("cpu"))
            e["plan_retained_bytes"] = sum(u["bytes"] for u in res[name].plan["units"]
                                           if u["retained"] and not u["resident"])
        out["events"] = [list(ev) for ev in st.events]
        out["peak_rss_bytes"] = tf.read_status_kib("VmHWM") * 1024
    finally:
        ddo.close_pipeline_offload(pipe)
    with open(args.result, "w") as f:
        json.dump(out, f)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddo", default=os.path.join(HERE, "..", "build", "ddo"))
    p.add_argument("--dir", default="/tmp/ddo-moe", help="where the two experts are written")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="JSON file or folder")
    p.add_argument("--tiny", action="store_true", help="the cpu device, 6 blocks, widths / 6")
    p.add_argument("--limit-gib", type=float, default=16.0, help="the host limit")
    p.add_argument("--card-gib", type=float, default=8.0, help="the emulated card")
    p.add_argument("--steps", type=int, default=2, help="timed steps per expert")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per expert")
    p.add_argument("--tokens", type=int, default=None, help="rows of the input (4680; --tiny 64)")
    p.add_argument("--no-cgroup", action="store_true", help="no cgroup for the staged run")
    p.add_argument("--role", choices=("resident", "staged"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--expert", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tokens is None:
        args.tokens = 64 if args.tiny else 4680
    return args


if __name__ == "__main__":
    sys.exit(main())
