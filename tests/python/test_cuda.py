"""ddo.enable_offload on a CUDA device (skipped without one: CI has none; bench/gpu_suite.sh
runs these on the H200 with torch 2.x)."""

import copy

import pytest
import torch

import ddo
import models

ZERO = dict(always_resident_modules_pattern="^$", small_tensor_threshold_bytes=0,
            resident_module_budget_gb=0, execution_device="cuda:0")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def resident_reference(m, x, n=3):
    ref = copy.deepcopy(m).cuda()
    with torch.no_grad():
        out = [ref(x) for _ in range(n)]
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("backend", ["vmm", "linear"])
def test_bit_identical_on_cuda(backend):
    m = models.FluxLike(dim=256, heads=4, double=3, single=5, seed=21)
    x = torch.randn(2, 64, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x = x.cuda()
    ref = resident_reference(m, x)
    r = ddo.enable_offload(m, backend=backend, **ZERO)
    assert r.device.type == "cuda"
    with torch.no_grad():
        out = [r.module(x) for _ in range(3)]
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):  # torch's current stream is what the leases wait on
            out.append(r.module(x))
        s.synchronize()
    for a in out:
        assert torch.equal(a, ref[0])
    snap = r.metrics_snapshot(collect_completed=True)
    assert snap.get("copy_bytes") > 0
    r.close()
    assert all(p.device.type == "cpu" for p in m.parameters())


def test_stable_addresses_on_cuda():
    m = models.FluxLike(dim=256, heads=4, double=2, single=3, seed=22)
    x = torch.randn(1, 32, 256).to(torch.bfloat16).cuda()
    r = ddo.enable_offload(m, backend="vmm", **ZERO)
    stable = r.stable_addresses()
    seen = {}
    names = {id(p): n for n, p in m.named_parameters()}

    def record(mod, args):
        for p in mod.parameters(recurse=False):
            seen.setdefault(names[id(p)], set()).add(p.data_ptr())

    hs = [sub.register_forward_pre_hook(record) for sub in m.transformer_blocks.modules()]
    with torch.no_grad():
        for _ in range(3):
            r.module(x)
    for h in hs:
        h.remove()
    assert seen and all(len(v) == 1 and next(iter(v)) == stable[k] for k, v in seen.items())
    r.close()


def test_acquire_inside_a_graph_capture_is_refused():
    m = models.FluxLike(dim=128, heads=4, double=1, single=2, seed=23)
    x = torch.randn(1, 16, 128).to(torch.bfloat16).cuda()
    r = ddo.enable_offload(m, backend="vmm", **ZERO)
    with torch.no_grad():
        r.module(x)  # warm
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with pytest.raises(Exception) as e:
            with torch.cuda.graph(g):
                r.module(x)
    assert "CUDA-graph capture" in str(e.value) or "CUDA-graph capture" in repr(e.value.__context__)
    r.close()


def test_activation_reserve_measured_on_cuda():
    """The zero-config call measures the first forward on torch's allocator (the real
    measure_activation) and re-plans at most once; bit-identical throughout."""
    m = models.FluxLike(dim=256, heads=4, double=3, single=5, seed=23)
    x = torch.randn(2, 64, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    x = x.cuda()
    ref = resident_reference(m, x)
    r = ddo.enable_offload(m, device_memory_limit_gb=8, execution_device="cuda:0")
    try:
        rp = r.activation_replan
        assert rp["state"] == "measuring" and rp["estimated_bytes"] > 0, rp
        with torch.no_grad():
            out = [r.module(x) for _ in range(4)]
        rp = r.activation_replan
        assert rp["state"] in ("kept", "replanned"), rp
        assert rp["measured_bytes"] is not None and rp["measured_bytes"] >= 0, rp
        assert rp["reserve_bytes"] == rp["measured_bytes"] + rp["margin_bytes"]
        if r.replanned:
            assert r.plan["planner_decisions"]["device_activation_reserve_source"].startswith(
                "measured on the first forward")
        for a in out:
            assert torch.equal(a, ref[0])
    finally:
        r.close()
    assert all(p.device.type == "cpu" for p in m.parameters())
