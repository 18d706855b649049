"""Donor mode on the cpu device (docs/multi-gpu.md): enable_offload(devices=["cpu:0", "cpu:1"])
computes on cpu:0 and keeps every streamed unit on cpu:1, an instance of its own; outputs are
bit-identical to the unmanaged module and each device keeps its budget."""

import pytest
import torch

import ddo
from ddo import _enums
import models
from conftest import ZERO_RESIDENT

ROUTES = [("linear", "auto", "one_shot_fast"), ("vmm", "auto", "vmm_fast_runtime"),
          ("vmm", "nvme_baseline", "vmm_runtime")]
DONOR = dict(ZERO_RESIDENT)
del DONOR["execution_device"]  # the set's first device computes


def steps(module, x, n=3):
    with torch.no_grad():
        return [module(x) for _ in range(n)]


@pytest.mark.parametrize("backend,preset,route", ROUTES)
def test_donor_bit_identical_and_budgets(backend, preset, route):
    m = models.FluxLike(dtype=torch.bfloat16, seed=11)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    ref = steps(m, x)
    r = ddo.enable_offload(m, preset, backend=backend, devices=["cpu:0", "cpu:1"], **DONOR)
    try:
        assert r.plan["route"] == route
        info = r._plan_info
        assert info.device_mode == _enums.DDO_DEVICE_MODE_DONOR
        assert info.devices.decode() == "cpu:0,cpu:1"
        assert info.store_bytes > 0
        assert info.peer_bytes_per_s > 0  # measured on the emulated link at setup
        assert r.plan["device_set"]["store_bytes"] == info.store_bytes
        out = steps(r.module, x)
        for a, b in zip(out, ref):
            assert torch.equal(a, b)
        snap = r.metrics_snapshot(collect_completed=True).as_dict()
        dev = snap["devices"]
        streamed = r.plan["bytes_by_placement"]["streamed"]
        assert streamed > 0
        # every streamed byte came from the store device, none from host memory
        assert dev["bytes_from_store"] >= streamed
        assert snap["bytes"]["bytes_from_registered"] == 0
        assert snap["bytes"]["bytes_staged_from_retained"] == 0
        # the store holds the plan's store bytes; the computing device keeps its own budget
        assert dev["store_device_peak_bytes"] == dev["planned_store_bytes"] == info.store_bytes
        cap = snap["capacities"]
        assert cap["device_weights_peak_bytes"] <= cap["planned_device_weights_bytes"]
        # unload keeps the store; after reload the outputs are the same bits again
        r.unload()
        r.reload()
        for a, b in zip(steps(r.module, x, 2), ref):
            assert torch.equal(a, b)
    finally:
        r.close()
    assert r.device_bytes_after_close == 0
    assert torch.equal(steps(m, x, 1)[0], ref[0])


def test_donor_store_budget_refused():
    m = models.FluxLike(dtype=torch.bfloat16, seed=13)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, backend="vmm", devices=["cpu:0", "cpu:1"],
                           store_device_budget_gb=1e-6, **DONOR)
    assert "store_device_budget_gb" in str(e.value)
    # nothing is left managed: the module works as before
    ddo.enable_offload(m, backend="vmm", devices=["cpu:0", "cpu:1"], **DONOR).close()


def test_devices_must_start_with_the_execution_device():
    m = models.FluxLike(dtype=torch.bfloat16, seed=14)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, backend="vmm", devices=["cpu:0", "cpu:1"], **ZERO_RESIDENT)
    assert "first device" in str(e.value)


def test_split_mode_refused_with_its_reason():
    m = models.FluxLike(dtype=torch.bfloat16, seed=15)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, backend="vmm", devices=["cpu:0", "cpu:1"], device_mode="split",
                           **DONOR)
    assert e.value.code == "DDO_E_UNSUPPORTED" and "split_devices" in str(e.value)
    # nothing is left managed: the module works as before
    ddo.enable_offload(m, backend="vmm", devices=["cpu:0", "cpu:1"], **DONOR).close()


def test_donor_from_files_keeps_no_host_copy(tmp_path):
    """A model built from its files (from_pretrained_with_dynamic_offload) in donor mode: the
    store device holds the streamed units, filled from the file, so the plan retains, registers
    and stages nothing for them; outputs equal the model read into host tensors, before and
    after a reload."""
    import test_pipeline_loading as T
    path = tmp_path / "m.safetensors"
    T.write_big_checkpoint(path, depth=6, seed=7, dim=256)
    def load():
        return ddo.from_pretrained_with_dynamic_offload(
            str(path), model_loader=lambda p: T.TinyDiT(256, 6, torch.bfloat16))

    x = torch.randn(1, 4, 256, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    ref = steps(ddo.loading.materialize(load().module, str(path)), x)  # read into host tensors
    res = load()
    r = ddo.enable_offload(res.module, backend="vmm", devices=["cpu:0", "cpu:1"], environ={},
                           **DONOR)
    try:
        assert r.plan["planner_decisions"]["retained_store"] == "none_donor"
        budgets = r.plan["budgets"]
        assert budgets["retained_host"]["peak"] == budgets["registered_host"]["peak"] == 0
        assert budgets["staging"]["peak"] == 0
        for a, b in zip(steps(r.module, x), ref):
            assert torch.equal(a, b)
        r.unload()
        r.reload()
        for a, b in zip(steps(r.module, x, 2), ref):
            assert torch.equal(a, b)
        snap = r.metrics_snapshot(collect_completed=True).as_dict()
        assert snap["devices"]["bytes_from_store"] > 0
        assert snap["capacities"]["retained_peak_bytes"] == 0
    finally:
        r.close()
