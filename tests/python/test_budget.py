"""A device budget is used from Python too (cpu device): a model that fits streams nothing and
the plan says so; a budget smaller than the model fills it with resident blocks and streams the
rest; both bit-identical to the plain module; the budget's two names refused when they differ;
device_memory_limit_gb caps the device the plan sizes itself from."""

import pytest
import torch

import ddo
import models

CPU = dict(execution_device="cpu")


def steps(module, x, n=2):
    with torch.no_grad():
        return [module(x) for _ in range(n)]


def model_bytes(m):
    return sum(p.numel() * p.element_size() for p in m.parameters())


@pytest.mark.parametrize("backend", ["linear", "vmm"])
@pytest.mark.parametrize("name", ["device_budget_gb", "vmm_resident_weight_budget_gb"])
def test_model_that_fits_streams_nothing(backend, name):
    m = models.FluxLike(dim=256, double=4, single=8, seed=4)
    x = torch.randn(1, 4, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = steps(m, x)
    r = ddo.enable_offload(m, backend=backend, **{name: 4}, **CPU)
    try:
        dec = r.plan["planner_decisions"]
        assert dec["resident_set_rule"] == "fill_all_fits"
        assert dec["plan_note"] == "the whole model fits the device budget: nothing streams"
        assert r.plan["budgets"]["device_weights"]["slot_count"] == 0
        assert not [t for t in r._tensors if t.placement == 1]
        for a, b in zip(steps(r.module, x), ref):
            assert torch.equal(a, b)
    finally:
        r.close()


@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_budget_smaller_than_the_model_is_filled(backend):
    m = models.FluxLike(dim=256, double=4, single=8, seed=5)
    x = torch.randn(1, 4, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    ref = steps(m, x)
    budget = model_bytes(m) * 0.6
    r = ddo.enable_offload(m, backend=backend, device_budget_gb=budget / 2**30, **CPU)
    try:
        dw = r.plan["budgets"]["device_weights"]
        units = r.plan["units"]
        assert dw["peak"] <= dw["limit"]
        # Used to within one unit (its slot: the unit's span rounded to the 2 MiB page).
        assert dw["peak"] + dw["slot_bytes"] >= dw["limit"]
        resident = [u for u in units if u["resident"]]
        assert resident and len(resident) < len(units)
        assert r.plan["planner_decisions"]["resident_set_rule"].startswith("fill")
        for a, b in zip(steps(r.module, x, 3), ref + steps(m, x, 1)):
            assert torch.equal(a, b)
        snap = r.metrics_snapshot(collect_completed=True)
        assert 0 < snap.get("device_weights_peak_bytes") <= dw["peak"]
    finally:
        r.close()


def test_two_budgets_refused_naming_both():
    m = models.FluxLike(seed=6)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, device_budget_gb=2, vmm_resident_weight_budget_gb=3, **CPU)
    assert "device_budget_gb=2 and vmm_resident_weight_budget_gb=3" in str(e.value)


def test_device_memory_limit_sizes_the_plan():
    m = models.FluxLike(dim=256, double=4, single=8, seed=7)
    r = ddo.enable_offload(m, device_memory_limit_gb=0.75, **CPU)
    try:
        assert r.plan["inputs"]["device_total_bytes"] == int(0.75 * 2**30)
        src = r.plan["budgets"]["device_weights"]["limit_source"]
        assert src.startswith("device memory 0.75 GiB") and "activation reserve" in src
        assert r.plan["planner_decisions"]["resident_set_rule"].startswith("fill")
    finally:
        r.close()
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(models.FluxLike(seed=8), device_memory_limit_gb=1e6, **CPU)
    assert "device_memory_limit_gb=1000000 is above the device's memory" in str(e.value)
