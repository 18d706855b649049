#!/usr/bin/env python3
"""Larger than RAM, measured: a transformer layout written to this machine's disk (`ddo synth`)
under a host limit below its size on an emulated 8 GiB card. --model picks it:

  wan   (default) the Wan 2.1 14B transformer (data/layouts/wan2.1-t2v-14b.json, 28.6 GB bf16)
        under a host limit of 12 GiB;
  qwen  the Qwen-Image 20B transformer (data/layouts/qwen-image.json, 40.9 GB bf16) under
        16 GiB.

One process per case (`ddo bench`, its own peak RSS from wait4 in a small launcher), the page
cache dropped before each case where the machine allows (echo 3 > /proc/sys/vm/drop_caches;
whether it did is recorded), the disk's O_DIRECT read rate and the bus measured in the same run
(Wan: about 6 minutes on the H200 machine by estimate, 28.6 GB written once, then about 20 GB
read from the disk per streamed step; Qwen-Image about 1.4 times that):

  reference      the whole model resident (the card unlimited): the resident step, the bus,
                 the O_DIRECT rate and the checksum every case must match;
  raw            host limit (available_system_ram_gb) and the 8 GiB card: what is not retained
                 streams from the checkpoint every step;
  sidecar-build  the same with weight_codec=ddoc1 and a cache directory: setup codes the
                 file-streamed tensors into their sidecar;
  sidecar        the same again: the sidecar exists and is read (coded bytes from the disk);
  auto           weight_codec=auto with the cache directory, the plan given the reference's
                 O_DIRECT rate (ddo bench --file-read-gbps): disk-bound, auto reads the
                 sidecar; what it chose is recorded.

Targets per case: step <= 1.1 x max(resident step, bus-fed bytes / bus, file-read bytes /
O_DIRECT rate) (ddo bench's bound); peak RSS <= the host limit; the sidecar's file bytes per
step <= 0.7 x raw's; bit-identical to the reference. JSON to OUT/lowram.json.

The sidecar check: what the sidecar case reads from the disk per step (from the checkpoint plus
from the sidecar) over what raw reads from the checkpoint, <= 0.7; and every case that codes
with a cache directory (sidecar-build, sidecar, auto when it chose ddoc1) must read its
file-streamed tensors from the sidecar: at most 5 % of its disk bytes raw from the checkpoint
(sidecar_read_ok; a case that fails it fails the run).

The limited cases skip ddo bench's page-cache read of the whole checkpoint
(--no-page-cache-read): it fills the page cache, which the case's cgroup counts, so its
memory.peak would read the limit whatever ddo does. --cases picks the cases after the
reference (always run: the rates and the checksum); --previous takes the cases not run from an
earlier lowram.json (raw's file bytes for the sidecar check).

  H200:  python3 bench/lowram.py --ddo build/ddo --dir /tmp/lowram --out $OUT [--model qwen]
         [--cases sidecar-build,sidecar,auto --previous OLD/lowram.json]
  tiny:  python3 bench/lowram.py --tiny --ddo build/ddo --out /tmp/x [--model qwen]   (the cpu
         device, 0.1 GiB of the layout, the same scaled limits for both models;
         tests/python/test_bench_lowram.py runs it)

The checkpoint stays in --dir for the next run of the same model; before writing one, the other
model's checkpoints this bench wrote there are removed when the disk lacks the room for the
checkpoint and its sidecar (the H200 machine's 64 GiB disk does not hold both models).
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
# --model: the layout, the default host limit (GiB) and the --tiny scale (both tiny checkpoints
# are about 0.1 GiB, so that one set of tiny limits serves both).
MODELS = {"wan": ("wan2.1-t2v-14b", 12.0, 0.06), "qwen": ("qwen-image", 16.0, 0.05)}


def layout_path(model):
    return os.path.join(HERE, "..", "data", "layouts", MODELS[model][0] + ".json")


def make_room(args, path, need):
    """Before the checkpoint at path is written: where the disk under --dir has less than need
    bytes free, the other models' checkpoints this bench wrote there are removed. What it saw and
    did, for the JSON."""
    free = shutil.disk_usage(args.dir).free
    disk = {"free_bytes": free, "need_bytes": need, "removed": []}
    if free >= need:
        return disk
    for name in sorted(os.listdir(args.dir)):
        other = os.path.join(args.dir, name)
        if other != path and name.endswith((".safetensors", ".safetensors.part")) and \
                name.split("-")[0] in MODELS:
            os.remove(other)
            disk["removed"].append(name)
    disk["free_bytes_after"] = shutil.disk_usage(args.dir).free
    return disk


def drop_caches():
    """Drops the page cache (needs root and a writable /proc/sys); returns what happened."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "dropped"
    except OSError as e:
        return f"not dropped: {e.strerror}"


# Starts the tool from a small interpreter and reports its peak RSS: a process forked from this
# one (torch, pytest) would count this process's pages in its own peak (ru_maxrss keeps the
# forked image's high-water mark across exec). With a cgroup directory as its first argument
# ("-": none) the child joins that cgroup before it execs.
LAUNCH = ("import os, sys\ncg = sys.argv.pop(1)\npid = os.fork()\nif pid == 0:\n"
          "    if cg != '-':\n"
          "        open(os.path.join(cg, 'cgroup.procs'), 'w').write(str(os.getpid()))\n"
          "    os.execv(sys.argv[1], sys.argv[1:])\n"
          "_p, st, ru = os.wait4(pid, 0)\nsys.stdout.write('\\nlowram-peak-rss-kib %d\\n' % "
          "ru.ru_maxrss)\nsys.exit(os.waitstatus_to_exitcode(st))\n")
CGROUP_ROOT = "/sys/fs/cgroup"


def make_cgroup(name, limit_bytes):
    """A cgroup v2 child with memory.max = limit_bytes, where the machine lets this process make
    one (root, a writable cgroup2 hierarchy with the memory controller); its path, or None and
    why not."""
    path = os.path.join(CGROUP_ROOT, name)
    try:
        with open(os.path.join(CGROUP_ROOT, "cgroup.controllers")) as f:
            if "memory" not in f.read().split():
                return None, "no memory controller in " + CGROUP_ROOT
        if os.path.isdir(path):
            os.rmdir(path)
        os.mkdir(path)
    except OSError as e:
        return None, f"not set: {e.strerror} ({e.filename})"
    try:
        if not os.path.exists(os.path.join(path, "memory.max")):
            with open(os.path.join(CGROUP_ROOT, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        with open(os.path.join(path, "memory.max"), "w") as f:
            f.write(str(int(limit_bytes)))
        return path, "memory.max %d" % int(limit_bytes)
    except OSError as e:
        try:
            os.rmdir(path)
        except OSError:
            pass
        return None, f"not set: {e.strerror} ({e.filename})"


def cgroup_peak(path):
    """memory.peak of the case's cgroup (bytes; None where the kernel has no memory.peak), then
    the cgroup removed."""
    peak = None
    try:
        with open(os.path.join(path, "memory.peak")) as f:
            peak = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        os.rmdir(path)
    except OSError:
        pass
    return peak


def run_case(args, path, name, flags, extra, log, cgroup_limit=0):
    """One `ddo bench` process with one case; its JSON, peak RSS (bytes) and wall time. With a
    cgroup_limit (bytes) the case runs in a cgroup of that memory.max where one can be made;
    its memory.peak goes into the case's log entry."""
    js = os.path.join(args.work, f"{name}.json")
    cmd = [args.ddo, "bench", path, "--steps", str(args.steps), "--tokens", str(args.tokens),
           "--case", " ".join([name] + flags), "--json", js] + extra + args.common
    cache = "kept (--keep-cache)" if args.keep_cache else drop_caches()
    cg, cg_note = (None, "none asked")
    if cgroup_limit > 0 and not args.no_cgroup:
        cg, cg_note = make_cgroup(f"ddo-lowram-{os.getpid()}-{name}", cgroup_limit)
    left = args.deadline - time.time() - 10
    t0 = time.time()
    with open(os.path.join(args.work, f"{name}.log"), "w") as out:
        try:
            rc = subprocess.run([sys.executable, "-S", "-E", "-c", LAUNCH, cg or "-"] + cmd,
                                stdout=out, stderr=subprocess.STDOUT,
                                timeout=max(left, 1)).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.time() - t0
    cg_peak = cgroup_peak(cg) if cg else None
    text = open(os.path.join(args.work, f"{name}.log")).read()
    peaks = [int(ln.split()[1]) for ln in text.splitlines()
             if ln.startswith("lowram-peak-rss-kib ")]
    maxrss_kib = peaks[-1] if peaks else 1 << 40  # unknown: never "within the limit"
    log.append({"case": name, "cmd": " ".join(shlex.quote(c) for c in cmd), "rc": rc,
                "wall_s": wall, "page_cache": cache, "cgroup": cg_note,
                "cgroup_peak_bytes": cg_peak, "tail": text[-1500:]})
    print(f"{name}: rc {rc}, {wall:.1f} s, peak RSS {maxrss_kib / 1048576:.2f} GiB, "
          f"cache {cache}", flush=True)
    res = json.load(open(js)) if rc == 0 and os.path.exists(js) else None
    return res, maxrss_kib * 1024, wall


CASES = ("raw", "sidecar-build", "sidecar", "auto")
# A case that codes with a cache directory reads at most this share of its disk bytes raw.
SIDE_FILE_SHARE = 0.05


def sidecar_check(out):
    """The sidecar's disk bytes against raw's (sidecar_over_raw_file_bytes: checkpoint plus
    sidecar bytes of the sidecar case over raw's checkpoint bytes) and, per coding case, whether
    its file-streamed tensors came from the sidecar (sidecar_read_ok). False when any fails."""
    cases = out["cases"]
    ok = True
    for name in ("sidecar-build", "sidecar", "auto"):
        c = cases.get(name, {})
        if c.get("file_fed_bytes_per_step") is None or c.get("from_previous") or \
                (name == "auto" and c.get("weight_codec") != "ddoc1"):
            continue
        disk = c["file_fed_bytes_per_step"] + (c.get("sidecar_fed_bytes_per_step") or 0.0)
        share = c["file_fed_bytes_per_step"] / disk if disk > 0 else 1.0
        c["raw_share_of_disk_bytes"] = share
        c["sidecar_read_ok"] = (c.get("sidecar_fed_bytes_per_step") or 0) > 0 and \
            share <= SIDE_FILE_SHARE
        ok = ok and c["sidecar_read_ok"]
    raw = cases.get("raw", {}).get("file_fed_bytes_per_step")
    side = cases.get("sidecar", {})
    ratio = None
    if raw and side.get("file_fed_bytes_per_step") is not None:
        ratio = (side["file_fed_bytes_per_step"] +
                 (side.get("sidecar_fed_bytes_per_step") or 0.0)) / raw
    out["sidecar_over_raw_file_bytes"] = ratio
    out["sidecar_ok"] = ratio is not None and 0 < ratio <= 0.7 and \
        side.get("sidecar_read_ok") is True
    return ok


def case_of(res, name):
    for c in (res or {}).get("cases", []):
        if c["name"] == name:
            return c
    return None


def native_tool(path):
    """The ddo binary itself: a console script (a wheel's `ddo`) is a Python process whose
    own peak RSS (the interpreter's) would be measured instead; its package's bin/ddo is used."""
    with open(path, "rb") as f:
        if f.read(4) == b"\x7fELF":
            return path
    try:
        import ddo as pkg
        cand = os.path.join(os.path.dirname(pkg.__file__), "bin", "ddo")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    except ImportError:
        pass
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddo", default=os.path.join(HERE, "..", "build", "ddo"))
    ap.add_argument("--dir", default="/tmp/ddo-lowram", help="where the checkpoint is written")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tiny", action="store_true", help="the cpu device, 0.1 GiB of the layout")
    ap.add_argument("--model", choices=sorted(MODELS), default="wan",
                    help="wan: Wan 2.1 14B (12 GiB); qwen: Qwen-Image 20B (16 GiB)")
    ap.add_argument("--limit-gib", type=float, default=None,
                    help="the host limit (default: the model's, above)")
    ap.add_argument("--card-gib", type=float, default=8.0)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--keep-cache", action="store_true", help="never drop the page cache")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--deadline-s", type=float, default=540.0,
                    help="cases not started by then are skipped (a running one is stopped)")
    ap.add_argument("--no-cgroup", action="store_true",
                    help="never put a case into a cgroup of the host limit")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated cases to run after the reference (default: all)")
    ap.add_argument("--previous", default=None,
                    help="an earlier lowram.json: the cases not run are taken from it")
    args = ap.parse_args(argv)
    args.deadline = time.time() + args.deadline_s
    selected = [c for c in args.cases.split(",") if c]
    if any(c not in CASES for c in selected):
        ap.error("--cases: pick from " + ",".join(CASES))
    args.ddo = native_tool(args.ddo)
    layout = layout_path(args.model)
    if args.limit_gib is None:
        args.limit_gib = MODELS[args.model][1]
    scale = 1.0
    args.common = []
    headroom = 2.0  # the process's own: the tool's bench buffers, activations, the runtime
    if args.tiny:  # ~0.1 GiB: every limit scaled by the same factor
        scale, args.tokens, args.steps = MODELS[args.model][2], 4, 2
        args.limit_gib, args.card_gib, headroom = 0.16, 0.05, 0.03
        args.common = ["--ddo-execution-device", "cpu", "--bus-gib", "0.25"]
    os.makedirs(args.dir, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    args.work = os.path.join(args.dir, "work")
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    path = os.path.join(args.dir, f"{args.model}-{scale:g}.safetensors")
    cache_dir = os.path.join(args.dir, "sidecars")  # the last run's, gone before a synth
    shutil.rmtree(cache_dir, ignore_errors=True)
    t0 = time.time()
    disk = None
    if not os.path.exists(path):
        with open(layout) as f:  # the checkpoint, and its sidecar at 0.7 x at most
            full = json.load(f)["total_bytes"] * scale * scale
        disk = make_room(args, path, int(1.7 * full))
        subprocess.run([args.ddo, "synth", "--layout", layout, "--out", path + ".part",
                        "--scale", str(scale), "--values", "normal"], check=True)
        os.replace(path + ".part", path)
    synth_s = time.time() - t0
    model = os.path.getsize(path)
    os.makedirs(cache_dir)
    low = ["--ddo-available-system-ram-gb", f"{args.limit_gib:g}",
           "--ddo-system-ram-headroom-gb", f"{headroom:g}",
           "--ddo-device-memory-limit-gb", f"{args.card_gib:g}"]
    codec = ["--ddo-weight-codec-cache-dir", cache_dir]
    log = []
    ref, ref_rss, _ = run_case(args, path, "reference", [], ["--direct-gib", "4" if not args.tiny
                                                             else "0.05"], log)
    base = case_of(ref, "resident")
    out = {"schema": "ddo-lowram/1", "tiny": args.tiny, "model": args.model,
           "layout": MODELS[args.model][0], "checkpoint_bytes": model, "disk": disk,
           "synth_s": synth_s, "host_limit_gib": args.limit_gib, "card_gib": args.card_gib,
           "host_limit_kind": "available_system_ram_gb (no cgroup set by the bench)",
           "bus_bytes_per_s": (ref or {}).get("bus_bytes_per_s"),
           "direct_read_bytes_per_s": (ref or {}).get("direct_read_bytes_per_s"),
           "resident_step_s": (ref or {}).get("resident_step_s"),
           "reference_checksum": base and base["checksum"], "cases": {}, "log": log}
    # The later cases' bounds use the reference's bus and disk figures (passed on, so that
    # every bound is computed alike). Each also reads the file's head with O_DIRECT just before
    # its own steps (ratio_adjacent): these machines' virtual disks moved by a quarter between
    # cases of one call (docs/benchmarks.md).
    nobus = ["--no-resident", "--direct-gib", "2" if not args.tiny else "0.05",
             "--no-page-cache-read"]
    if out["direct_read_bytes_per_s"]:  # what auto asks "disk-bound?" with (docs/codec.md)
        nobus += ["--file-read-gbps", "%.6g" % (out["direct_read_bytes_per_s"] / 1e9)]
    ddoc1 = low + ["--ddo-weight-codec", "ddoc1"] + codec
    previous = {}
    if args.previous:
        with open(args.previous) as f:
            previous = json.load(f).get("cases", {})
    for name, flags in (("raw", low), ("sidecar-build", ddoc1),
                        ("sidecar", ddoc1),
                        ("auto", low + ["--ddo-weight-codec", "auto"] + codec)):
        if name not in selected:
            if name in previous:
                out["cases"][name] = dict(previous[name], from_previous=args.previous)
            continue
        if time.time() > args.deadline - 30:
            out["cases"][name] = {"rc": None, "skipped": "deadline"}
            continue
        res, rss, wall = run_case(args, path, name, flags, nobus, log,
                                  0 if args.tiny else int(args.limit_gib * GIB))
        c = case_of(res, name)
        cg_peak = log[-1]["cgroup_peak_bytes"]
        r = {"rc": log[-1]["rc"], "peak_rss_bytes": rss, "wall_s": wall,
             "rss_ok": rss <= args.limit_gib * GIB, "cgroup": log[-1]["cgroup"],
             "cgroup_peak_bytes": cg_peak,
             "cgroup_ok": None if cg_peak is None else cg_peak <= args.limit_gib * GIB}
        if c is not None and ref is not None:
            bus, disk, rs = ref["bus_bytes_per_s"], ref["direct_read_bytes_per_s"], \
                ref["resident_step_s"]
            fed = c["file_fed_bytes_per_step"] + c.get("sidecar_fed_bytes_per_step", 0.0)
            bound = max(rs, c["copy_bytes_per_step"] / bus if bus else 0.0,
                        fed / disk if disk else 0.0)
            keys = ("step_s", "weight_codec", "read_engine", "file_fed_bytes_per_step",
                    "sidecar_fed_bytes_per_step", "copy_bytes_per_step", "stall_s_per_step",
                    "setup_s", "checksum")
            r.update({k: c.get(k) for k in keys})
            r.update({"bound_s": bound, "ratio": c["step_s"] / bound if bound else None,
                      "step_ok": c["step_s"] <= 1.1 * bound,
                      "bit_identical": c["checksum"] == out["reference_checksum"]})
            near = res.get("direct_read_bytes_per_s")
            if near:
                b2 = max(rs, c["copy_bytes_per_step"] / bus if bus else 0.0, fed / near)
                r.update({"direct_read_bytes_per_s_adjacent": near,
                          "ratio_adjacent": c["step_s"] / b2})
        out["cases"][name] = r
        with open(os.path.join(args.out, "lowram.json"), "w") as f:  # what a kill would lose
            json.dump(out, f, indent=1)
    read_ok = sidecar_check(out)
    out["total_s"] = time.time() - t0
    with open(os.path.join(args.out, "lowram.json"), "w") as f:
        json.dump(out, f, indent=1)
    for name, r in out["cases"].items():
        if r.get("skipped"):
            print(f"{name:14s} skipped: {r['skipped']}")
            continue
        print(f"{name:14s} rc {r['rc']} step {r.get('step_s') or 0:.3f} s bound "
              f"{r.get('bound_s') or 0:.3f} s ratio {r.get('ratio') or 0:.3f} "
              f"(adjacent disk {r.get('ratio_adjacent') or 0:.3f}) "
              f"rss {r['peak_rss_bytes'] / GIB:.2f} GiB identical {r.get('bit_identical')}")
    for name, r in out["cases"].items():
        if "sidecar_read_ok" in r:
            how = "read from the sidecar" if r["sidecar_read_ok"] else "NOT from the sidecar"
            print(f"{name:14s} raw share of its disk bytes {r['raw_share_of_disk_bytes']:.3f}: "
                  f"{how}")
    print(f"sidecar disk bytes (checkpoint + sidecar) / raw's: "
          f"{out['sidecar_over_raw_file_bytes']}; ok {out['sidecar_ok']}; "
          f"total {out['total_s']:.0f} s")
    return 0 if all(r["rc"] == 0 for r in out["cases"].values()) and ref is not None and \
        read_ok else 1


if __name__ == "__main__":
    sys.exit(main())
