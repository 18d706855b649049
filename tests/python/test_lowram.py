"""Larger than RAM from Python: a file-backed model (from_pretrained_with_dynamic_offload, then
enable_offload on the default route) under a host limit below the model's size. The limit is a
cgroup's (faked through DDOTEST_CGROUP_MEMORY_FILE, which only tests use): the retained store
takes what the limit leaves after the headroom and two staging windows, the rest is re-read
from the file every step, the process's peak RSS stays under the limit for the whole run, and
the outputs are bit-identical to the model read into host tensors. A two-transformer
mixture-of-experts stand-in: only the active expert holds its retained store."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import PYTHON_DIR

HERE = os.path.dirname(__file__)

CHILD = r"""
import json, os, sys, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import ddo, test_pipeline_loading as T
x = torch.randn(1, 4, 1024).to(torch.bfloat16)
base = T.reset_peak()
if base is None:
    print("SKIP")
    sys.exit(0)
retained = int(sys.argv[4])
# The headroom: this process as it is now, its cpu device (the resident set and slots are host
# memory here) and 96 MiB of growth; the limit: that, two staging windows and the retained
# store's share.
headroom = base + (160 << 20)
limit = headroom + (64 << 20) + retained
open(sys.argv[5], "w").write(str(limit))
os.environ["DDOTEST_CGROUP_MEMORY_FILE"] = sys.argv[5]
res = ddo.from_pretrained_with_dynamic_offload(sys.argv[3], model_loader=lambda p: T.TinyDiT(
    1024, 24, torch.bfloat16))
r = ddo.enable_offload(res.module, component="transformer", environ={},
                       execution_device="cpu", device_budget_gb=0.0625,
                       system_ram_headroom_gb=headroom / 2**30, vmm_staging_buffer_gb=0.0625)
with torch.no_grad():
    out = [r.module(x) for _ in range(3)]
m = r.metrics_snapshot(collect_completed=True)
d = r.plan["planner_decisions"]
info = dict(peak=T.proc_status("VmHWM:"), limit=limit, route=r.plan["route"],
            retained=m.get("retained_peak_bytes"), from_file=m.get("bytes_staged_from_file"),
            budget=float(d["host_budget_gb"]), left=float(d["host_left_for_process_gb"]),
            store=d["retained_store"])
r.close()
ref = ddo.loading.materialize(res.module, sys.argv[3])
with torch.no_grad():
    info["identical"] = all(torch.equal(ref(x), o) for o in out)
print(json.dumps(info))
"""


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    import test_pipeline_loading as T
    path = tmp_path_factory.mktemp("lowram") / "big.safetensors"
    return path, T.write_big_checkpoint(path, depth=24, seed=5)


@pytest.mark.parametrize("retained_mib", [0, 128])
def test_rss_stays_under_a_cgroup_limit_below_the_model(big, tmp_path, retained_mib):
    path, model_bytes = big
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDO")}
    env["DDO_LIBRARY"] = os.environ.get("DDO_LIBRARY", "")
    out = subprocess.run([sys.executable, "-c", CHILD, str(PYTHON_DIR), HERE, str(path),
                          str(retained_mib << 20), str(tmp_path / "memory.max")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    if last == "SKIP":
        pytest.skip("this kernel does not reset VmHWM through /proc/self/clear_refs")
    import json
    info = json.loads(last)
    assert model_bytes > (retained_mib + 64) << 20  # the limit is below the model
    assert info["identical"], info
    assert abs(info["budget"] * 2**30 - info["limit"]) < 1e-4 * 2**30, info
    # the retained store within what the limit leaves, below the model; the rest from the file
    assert info["retained"] <= retained_mib << 20, info
    assert info["store"] == ("insufficient_ram" if retained_mib == 0 else "partial"), info
    assert info["from_file"] >= 3 * (model_bytes - (retained_mib << 20) - (64 << 20)), info
    assert info["limit"] - info["peak"] > 0, info  # the whole run's peak RSS under the limit


# What both expert children start with (argv: the package's directory, this one's, the two
# checkpoints, the store's size, the fake cgroup file): a limit with room for one expert's store.
_EXPERT_CHILD_HEAD = r"""
import json, os, sys, types, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import ddo, test_pipeline_loading as T
x = torch.randn(1, 4, 1024).to(torch.bfloat16)
base = T.reset_peak()
if base is None:
    print("SKIP")
    sys.exit(0)
high, low, store = sys.argv[3], sys.argv[4], int(sys.argv[5])
headroom = base + (160 << 20)
limit = headroom + (64 << 20) + store  # room for one expert's store, not two
open(sys.argv[6], "w").write(str(limit))
os.environ["DDOTEST_CGROUP_MEMORY_FILE"] = sys.argv[6]
"""


MOE_CHILD = _EXPERT_CHILD_HEAD + r"""
opts = dict(execution_device="cpu", device_budget_gb=0.0625,
            system_ram_headroom_gb=headroom / 2**30, vmm_staging_buffer_gb=0.0625)
experts = {}
for name, path in (("transformer", high), ("transformer_2", low)):
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=lambda p: T.TinyDiT(
        1024, 24, torch.bfloat16))
    r = ddo.enable_offload(res.module, component=name, environ={}, **opts)
    r.unload(release_host=True)  # set up one after the other: one store at a time
    experts[name] = (res, r)
held = {n: r.metrics_snapshot().get("retained_bytes") for n, (_m, r) in experts.items()}
# The pipeline's loop: the high-noise expert for the first steps, the low-noise one after the
# boundary; at the switch the active one lets its store go and the next reloads (its first
# units start loading at once).
outs, boundary, steps, info = [], 2, 4, {"held_while_inactive": held}
active = None
for i in range(steps):
    name = "transformer" if i < boundary else "transformer_2"
    if name != active:
        if active is not None:
            experts[active][1].unload(release_host=True)
        r = experts[name][1]
        before = r.metrics_snapshot().get("prefetch_issued")
        r.reload()
        info[name + "_prefetched_at_switch"] = r.metrics_snapshot().get("prefetch_issued") - before
        info[name + "_retained_active"] = r.metrics_snapshot().get("retained_bytes")
        active = name
    with torch.no_grad():
        outs.append(experts[name][0].module(x))
other = "transformer"
info["inactive_after_switch"] = experts[other][1].metrics_snapshot().get("retained_bytes")
info["peak"], info["limit"] = T.proc_status("VmHWM:"), limit
for n, (res, r) in experts.items():
    r.close()
refs = {n: ddo.loading.materialize(res.module, p) for (n, (res, _r)), p in
        zip(experts.items(), (high, low))}
with torch.no_grad():
    info["identical"] = all(torch.equal(o, refs["transformer" if i < boundary else
                                                 "transformer_2"](x)) for i, o in enumerate(outs))
print(json.dumps(info))
"""


def _experts(tmp_path):
    """Two expert checkpoints (a high-noise and a low-noise stand-in) of 24 blocks each."""
    import test_pipeline_loading as T
    dim, depth = 1024, 24
    paths = []
    for seed, name in ((7, "high"), (8, "low")):
        g = torch.Generator().manual_seed(seed)
        shapes = {"embed.weight": (dim, dim), "embed.bias": (dim,),
                  "proj_out.weight": (dim, dim), "proj_out.bias": (dim,), "scale": (dim,)}
        for i in range(depth):
            shapes.update({f"blocks.{i}.up.weight": (2 * dim, dim),
                           f"blocks.{i}.up.bias": (2 * dim,),
                           f"blocks.{i}.down.weight": (dim, 2 * dim),
                           f"blocks.{i}.down.bias": (dim,)})
        p = tmp_path / f"{name}.safetensors"
        T.write_safetensors(p, {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16)
                                for k, s in shapes.items()})
        paths.append(str(p))
    return paths


def _run_experts(child, tmp_path, store):
    """Runs an expert child (its own process: its peak RSS is the run's) on two expert
    checkpoints; its JSON report (skips where VmHWM cannot be reset)."""
    paths = _experts(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDO")}
    env["DDO_LIBRARY"] = os.environ.get("DDO_LIBRARY", "")
    out = subprocess.run([sys.executable, "-c", child, str(PYTHON_DIR), HERE, *paths,
                          str(store), str(tmp_path / "memory.max")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    if last == "SKIP":
        pytest.skip("this kernel does not reset VmHWM through /proc/self/clear_refs")
    import json
    return json.loads(last)


def test_moe_only_the_active_expert_holds_its_store(tmp_path):
    """Two transformers (a Wan 2.2 A14B stand-in) under a limit with room for one expert's
    retained store: the inactive one holds none (unload(release_host=True)), the switch
    reloads the next one with its first units loading at once, the peak RSS stays under the
    limit, the outputs are each expert's, bit-identical."""
    store = 128 << 20
    info = _run_experts(MOE_CHILD, tmp_path, store)
    assert info["identical"], info
    assert info["held_while_inactive"] == {"transformer": 0, "transformer_2": 0}, info
    for n in ("transformer", "transformer_2"):
        assert 0 < info[n + "_retained_active"] <= store, info
        assert info[n + "_prefetched_at_switch"] > 0, info
    assert info["inactive_after_switch"] == 0, info
    assert info["peak"] < info["limit"], info


PIPE_CHILD = _EXPERT_CHILD_HEAD + r"""
mods = {n: ddo.from_pretrained_with_dynamic_offload(p, model_loader=lambda p: T.TinyDiT(
            1024, 24, torch.bfloat16)).module for n, p in (("transformer", high),
                                                         ("transformer_2", low))}
pipe = types.SimpleNamespace(components=dict(mods))
# available_system_ram_gb as well as the cgroup file: the plans then never depend on what the
# machine's MemAvailable happens to be (other processes share it).
res = ddo.enable_pipeline_offload(pipe, environ={}, execution_device="cpu",
                                  device_budget_gb=0.0625, system_ram_headroom_gb=headroom / 2**30,
                                  vmm_staging_buffer_gb=0.0625, available_system_ram_gb=limit / 2**30)
st = res.stager
def held(n):
    return res[n].metrics_snapshot().get("retained_bytes")
def file_bytes(n):
    return res[n].metrics_snapshot().get("bytes_staged_from_file")
def not_retained(n):
    return sum(u["bytes"] for u in res[n].plan["units"] if not u["resident"] and not u["retained"])
info = {"after_setup": {n: held(n) for n in mods}, "steps": []}
outs, boundary, steps = [], 3, 6
for i in range(steps):
    name = "transformer" if i < boundary else "transformer_2"
    if i == boundary:  # the pipeline's step callback at the boundary: the switch, planned
        st.prepare(name)
        info["prepared"] = {"prefetch_issued": res[name].metrics_snapshot().get("prefetch_issued"),
                            "held": {n: held(n) for n in mods}}
    f0 = file_bytes(name)
    with torch.no_grad():
        outs.append(mods[name](x))
    info["steps"].append({"active": name, "file": file_bytes(name) - f0,
                          "held": {n: held(n) for n in mods}})
info["not_retained"] = {n: not_retained(n) for n in mods}
info["slots"] = {n: res[n].budgets()["slot_count"] * res[n].budgets()["slot_bytes"] for n in mods}
info["events"] = st.events
info["peak"], info["limit"] = T.proc_status("VmHWM:"), limit
ddo.close_pipeline_offload(pipe)
refs = {n: ddo.loading.materialize(ddo.from_pretrained_with_dynamic_offload(
            p, model_loader=lambda p: T.TinyDiT(1024, 24, torch.bfloat16)).module, p)
        for n, p in (("transformer", high), ("transformer_2", low))}
with torch.no_grad():
    info["identical"] = all(torch.equal(o, refs["transformer" if i < boundary else
                                                 "transformer_2"](x)) for i, o in enumerate(outs))
print(json.dumps(info))
"""


def test_moe_pipeline_staged_under_a_host_limit(tmp_path):
    """The same two experts through enable_pipeline_offload (ddo.staging) under a limit with
    room for one expert's store: only the active expert holds retained memory (the stager
    releases the other's), stager.prepare() at the boundary reads the next expert's store and
    starts its first units before its first forward, every step reads from the file the bytes
    its expert does not retain (less what its slots still hold), the peak RSS stays under the
    limit, and the outputs are bit-identical to each expert's."""
    store = 128 << 20
    info = _run_experts(PIPE_CHILD, tmp_path, store)
    assert info["identical"], info
    # setup: the second expert's session released the first's store
    assert info["after_setup"]["transformer"] == 0 < info["after_setup"]["transformer_2"], info
    for s in info["steps"]:
        other = "transformer_2" if s["active"] == "transformer" else "transformer"
        assert s["held"][other] == 0 < s["held"][s["active"]] <= store, info
        nr, slots = info["not_retained"][s["active"]], info["slots"][s["active"]]
        assert nr > 0 and nr - slots <= s["file"] <= nr, info
    p = info["prepared"]
    assert p["prefetch_issued"] > 0 and p["held"]["transformer"] == 0 < p["held"]["transformer_2"]
    assert ("release_host", "transformer") in [tuple(e) for e in info["events"]], info
    assert info["peak"] < info["limit"], info
