"""weight_codec on a module already in host RAM (ddo_checkpoint_create_from_memory), on the cpu
device whose C decoder is the reference (docs/codec.md, docs/python.md "weight_codec").

The session codes each streamed tensor that shrinks into host memory of its own; the binding
then lets the module's copies go (host RAM holds the coded bytes, not both) and close() reads
them back, decoded, bit for bit.
"""

import os
import subprocess
import sys

import pytest
import torch

import ddo
import models
from conftest import PYTHON_DIR, ZERO_RESIDENT

ROUTES = [("linear", "auto", "one_shot_fast"), ("vmm", "auto", "vmm_fast_runtime")]


def steps(module, x, n=3):
    with torch.no_grad():
        return [module(x) for _ in range(n)]


@pytest.mark.parametrize("backend,preset,route", ROUTES)
@pytest.mark.parametrize("granularity", ["block", "leaf"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_coded_host_module_is_bit_identical(backend, preset, route, granularity, dtype):
    m = models.FluxLike(dtype=dtype, seed=5)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(6)).to(dtype)
    ref = steps(m, x)
    before = {n: p for n, p in m.named_parameters()}
    values = {n: p.detach().clone() for n, p in m.named_parameters()}
    r = ddo.enable_offload(m, preset, backend=backend, unit_granularity=granularity,
                           weight_codec="ddoc1", **ZERO_RESIDENT)
    try:
        d = r.plan["planner_decisions"]
        assert d["weight_codec"] == "ddoc1" and d["retained_store"] == "host_memory_coded"
        for a, b in zip(steps(r.module, x), ref):
            assert torch.equal(a, b)
        snap = r.metrics_snapshot(collect_completed=True).as_dict()
        codec = snap["codec"]
        assert 0 < codec["setup_coded_bytes"] < codec["setup_encode_bytes"]
        assert codec["bytes_decoded"] > codec["bytes_coded_uploaded"] > 0
        # the module's copies of every streamed tensor were let go (coded, or kept raw in the
        # session's store where coding did not shrink them)
        streamed = [t for t in r._tensors if t.placement == 1]
        assert r.host_bytes_released == sum(ddo.offload._nbytes(t) for t in streamed)
        assert r.host_bytes_released >= codec["setup_encode_bytes"]
        assert snap["binding"]["host_bytes_released"] == r.host_bytes_released
        budgets = r.budgets()
        assert 0 < snap["capacities"]["retained_peak_bytes"] <= budgets["retained_peak"]
    finally:
        r.close()
    assert r.device_bytes_after_close == 0
    for n, p in m.named_parameters():  # the same Parameters, host tensors again, same bits
        assert p is before[n] and p.device.type == "cpu"
        assert torch.equal(p.data, values[n])
    assert torch.equal(steps(m, x, 1)[0], ref[0])


def test_vmm_runtime_moves_host_tensors_raw():
    m = models.FluxLike(seed=7)
    x = torch.randn(1, 4, 64).to(torch.bfloat16)
    ref = steps(m, x, 1)
    r = ddo.enable_offload(m, "nvme_baseline", backend="vmm", weight_codec="ddoc1",
                           **ZERO_RESIDENT)
    try:
        d = r.plan["planner_decisions"]
        assert d["retained_store"] == "host_memory"
        assert "nothing to code" in d["weight_codec_note"]
        assert torch.equal(steps(r.module, x, 1)[0], ref[0])
        assert r.host_bytes_released == 0
    finally:
        r.close()


CHILD = r"""
import ctypes, gc, sys, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import ddo, test_pipeline_loading as T


def data():  # anonymous and shared pages: what holds data (code pages are file-backed)
    try:
        return T.proc_status("RssAnon:") + T.proc_status("RssShmem:")
    except KeyError:  # a kernel without the split (before 4.5)
        return T.proc_status("VmRSS:")


if T.reset_peak() is None:  # not Linux's accounting (gVisor counts pages allocated, never touched)
    print("SKIP")
    sys.exit(0)


def trim():  # glibc keeps freed heap pages until trimmed: what is left is what is in use
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def warm_up():  # torch's and ddo's lazily made state (imports, DLPack, the codec's tables) first,
    w = T.TinyDiT(64, 2, torch.bfloat16)  # in both processes, so the base holds it: what is
    r = ddo.enable_offload(w, component="transformer", environ={}, backend="vmm",  # measured
                           weight_codec="ddoc1", **T.CPU_STREAM)  # after is the weights' only
    with torch.no_grad():
        r.module(torch.randn(1, 4, 64).to(torch.bfloat16))
    r.close()
    del w, r
    trim()


warm_up()
base = data()
m = T.TinyDiT(1024, 40, torch.bfloat16)
g = torch.Generator().manual_seed(3)
with torch.no_grad():  # values shaped like trained weights (the codec's case)
    for p in m.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.02)
model = sum(p.numel() * p.element_size() for p in m.parameters())
x = torch.randn(1, 4, 1024).to(torch.bfloat16)
with torch.no_grad():
    want = m(x)
held = data() - base
if sys.argv[3] == "control":  # the same process with the weights simply dropped, no ddo
    for p in m.parameters():
        p.data = torch.empty(0, dtype=p.dtype)
    trim()  # the floor is what is still in use
    print(model, held, data() - base, 0)
    sys.exit(0)
r = ddo.enable_offload(m, component="transformer", environ={}, backend="vmm",
                       weight_codec="ddoc1", **T.CPU_STREAM)
after = data() - base
with torch.no_grad():  # (the test model's float32 temporaries then refill malloc's heap)
    out = [r.module(x) for _ in range(2)]
coded = r.metrics_snapshot().get("setup_coded_bytes")
r.close()
with torch.no_grad():
    assert torch.equal(out[0], want) and torch.equal(out[1], want) and torch.equal(m(x), want)
print(model, held, after, int(coded))
"""


def child(mode):
    out = subprocess.run([sys.executable, "-c", CHILD, str(PYTHON_DIR),
                          os.path.dirname(__file__), mode], capture_output=True, text=True,
                         env=dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    if out.stdout.strip().splitlines()[-1] == "SKIP":
        pytest.skip("this kernel does not reset VmHWM through /proc/self/clear_refs")
    return tuple(map(int, out.stdout.split()[-4:]))


def test_host_ram_holds_the_coded_bytes():
    """The module's 340 MB of Gaussian bf16 weights: after enable_offload the process holds the
    coded bytes in place of the module's copies (without the release it held both, 1.6 x the
    model). Measured in data pages (anonymous and shared: library code faulted in is not host
    RAM holding weights) above what a control process holds once it simply drops the same
    weights (torch's own memory and the heap's leftovers differ between torch versions: 2.11
    left 70 MB more in malloc's heap than 1.13, docs/benchmarks.md). Both processes first run a
    tiny module through the same call, so the state torch and ddo make once per process
    (imports, DLPack, the codec's tables) is in their base, not counted as weights: on torch
    2.11 this test failed with 115 MB above the coded bytes where 48 MiB are allowed, with the
    module's copies let go (not yet run there since)."""
    model, held, after, coded = child("ddo")
    _, control_held, floor, _ = child("control")
    assert model > 300 << 20 and held >= 0.95 * model  # the module's copies were in RAM
    assert control_held >= 0.95 * model and floor < 0.25 * model  # dropping them frees them
    assert coded < 0.75 * model, (coded, model)
    # the coded bytes, the cpu device's slots and decode areas, the small tensors
    extra = after - floor
    assert extra < coded + (48 << 20) and extra < 0.85 * model, (after, floor, model, coded)


def slow_bus_profile(tmp_path, name, module, bus_bytes_per_s):
    """A saved profile of module under name whose measured bus is bus_bytes_per_s: the plan
    inputs take it (ddo_setup_plan_inputs) in place of the rate this process measured."""
    import ctypes
    import json
    from ddo import _native, profiles
    ctx = profiles._context(name, module, None)
    obs = {"status": "success", "peak_vram_gb": 0.0, "total_vram_gb": 1.0, "headroom_gb": 0.0}
    rec = {"profile_resident_module_budget_gb": 0.0, "bus_bytes_per_s": bus_bytes_per_s}
    p = ctypes.c_void_p()
    _native.check(_native.lib().ddo_profile_record(
        str(tmp_path).encode(), ctx.encode(), json.dumps(obs).encode(),
        json.dumps(rec).encode(), ctypes.byref(p)))
    _native.take_text(p)
    return dict(profile_name=name, profile_dir=str(tmp_path))


def test_a_store_over_the_retained_limit(tmp_path):
    """A set vmm_source_cache_gb the coded store (at its raw size until coded) exceeds: ddoc1
    is refused naming the option, auto falls back to raw with a note. (A measured bus slow
    enough for the step to be bus-bound, 10 kB/s from a profile against the cpu device's long
    compute, makes coding pay in the cost model: the host limit is what stops it.)"""
    opts = dict(backend="vmm", vmm_source_registered_gb=0.0625, vmm_source_cache_gb=0.0625,
                **ZERO_RESIDENT)
    m = models.FluxLike(dim=1024, seed=1)  # 116 MiB of bf16
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, weight_codec="ddoc1", **opts)
    assert e.value.code == "DDO_E_BUDGET" and "vmm_source_cache_gb" in str(e.value)
    # On the measured cpu device coding does not pay: auto says so.
    r = ddo.enable_offload(m, weight_codec="auto", **opts)
    try:
        d = r.plan["planner_decisions"]
        assert d["weight_codec"] == "none" and "would not pay" in d["weight_codec_note"]
    finally:
        r.close()
    r = ddo.enable_offload(m, weight_codec="auto", **opts,
                           **slow_bus_profile(tmp_path, "slow-bus", m, 1e4))
    try:
        d = r.plan["planner_decisions"]
        assert d["weight_codec"] == "none" and "host limits" in d["weight_codec_note"]
    finally:
        r.close()
