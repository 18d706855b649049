"""The activation reserve measured on the first forward (cpu device: the measurement, which reads
torch's CUDA allocator on a GPU, is replaced): with no budget given, a measured reserve that
differs from the plan's estimate re-plans once, with more units resident when it is smaller
(before the second forward, or, where the units' compute is timed as on a CUDA device, before
the third, with the compute the second forward timed); one within the threshold keeps the plan
unless the timed compute changes it; a budget the user gave, or activation_replan=False, is
never re-planned for the reserve; outputs stay bit-identical throughout."""

import pytest
import torch

import ddo
import ddo._result_replan as replan
import ddo._result_setup as result_setup
import models

CPU = dict(execution_device="cpu")
GIB = 1 << 30


class Stack(torch.nn.Module):
    """Five float32 blocks of 256 MiB (1.25 GiB): above the 1 GiB floor of a device limit."""

    def __init__(self, n=5, dim=8192):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.utils.skip_init(torch.nn.Linear, dim, dim, bias=False) for _ in range(n))
        g = torch.Generator().manual_seed(3)
        for b in self.blocks:  # (random columns repeated: cheap to make, not all equal)
            b.weight.data.copy_(torch.randn(dim, 64, generator=g).repeat(1, dim // 64) / 90)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


@pytest.fixture
def measured(monkeypatch):
    """measure_activation replaced: the forward's need is what the test sets; calls counted."""
    state = {"need": 0, "calls": 0}

    def fake(device, baseline, call):
        state["calls"] += 1
        return call(), state["need"]
    monkeypatch.setattr(replan, "measure_activation", fake)
    return state


@pytest.fixture
def idle_device(monkeypatch):
    """The cpu device's free memory is the machine's available memory (other processes, and
    this test's own model, use some of it): reported as the device's size, so that the limits
    are the test's own."""
    first = result_setup.Setup._first_inputs

    def idle(self, inputs):
        inputs.device_free_bytes = inputs.device_total_bytes
        first(self, inputs)
    monkeypatch.setattr(result_setup.Setup, "_first_inputs", idle)


def steps(module, x, n=3):
    with torch.no_grad():
        return [module(x) for _ in range(n)]


def flux():
    m = models.FluxLike(dim=256, double=4, single=8, seed=7)
    x = torch.randn(1, 4, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    return m, x


@pytest.mark.parametrize("timing", [False, True])
def test_replanned_once_with_more_resident(measured, idle_device, monkeypatch, timing):
    """timing: the units' compute timed as on a CUDA device (times_compute), on the second
    forward only (the first, slower, is not), and the re-plan before the third with it."""
    monkeypatch.setattr(replan, "times_compute", lambda device: timing)
    m = Stack()
    x = torch.randn(2, 8192, generator=torch.Generator().manual_seed(2))
    ref = steps(m, x)
    r = ddo.enable_offload(m, device_memory_limit_gb=1.6, **CPU)
    timers = []  # per forward into the first block: whether a UnitTimer was running
    m.blocks[0].register_forward_pre_hook(lambda mod, a: timers.append(r._timing is not None))
    try:
        before = r.budgets()
        first_plan_compute = {"source": r.plan["planner_decisions"]["unit_compute_source"],
                              "values": {u["compute_s"] for u in r.plan["units"]}}
        assert r.activation_replan["state"] == "measuring" and not r.replanned
        assert r.activation_replan["unit_compute"] is None
        est = r.activation_replan["estimated_bytes"]
        assert est > GIB // 2  # 512 MiB + 4 x tokens x the widest row
        first = steps(m, x, 1)  # measured: 0 bytes + the margin, well under the estimate
        if timing:
            assert r.activation_replan["state"] == "timing" and not r.replanned
            assert "timed on the second forward" in r.activation_replan["note"]
            first += steps(m, x, 1)
        assert r.activation_replan["state"] == "due" and not r.replanned
        assert r.budgets() == before  # never inside a forward: before the next one
        rest = steps(m, x, 4)
        assert r.replanned and r.activation_replan["state"] == "replanned"
        assert measured["calls"] == 1  # measured once, re-planned once
        assert timers == [False, timing, False, False, False, False][:len(timers)]
        after = r.budgets()
        assert after["device_weights_limit"] > before["device_weights_limit"]
        assert after["resident_bytes"] > before["resident_bytes"]
        dec = r.plan["planner_decisions"]
        assert dec["device_activation_reserve_gb"] == replan.MARGIN / GIB  # the margin over 0 bytes
        assert dec["device_activation_reserve_source"].startswith("measured on the first forward")
        src = r.plan["budgets"]["device_weights"]["limit_source"]
        assert "activation reserve measured on the first forward" in src
        assert r.activation_replan["reserve_bytes"] == replan.MARGIN
        assert r.activation_replan["plan_before"]["limit"] == before["device_weights_limit"]
        assert all(torch.equal(a, b) for a, b in zip(ref, first + rest[:2]))
        assert first_plan_compute["source"] == "flops"
        if not timing:  # the cpu device's clock is no planning figure: the estimates stay
            assert dec["unit_compute_source"] == "flops"
            assert r.activation_replan["unit_compute"] is None
            return
        # The re-plan planned with the compute the second forward timed (one kind of unit:
        # their median, the same for each), not with the FLOP estimates of the first plan.
        assert dec["unit_compute_source"] == "measured"
        assert r.activation_replan["unit_compute"] == "second_forward"
        assert "compute timed on the second forward" in r.activation_replan["note"]
        timed = {u["compute_s"] for u in r.plan["units"]}
        assert len(timed) == 1 and timed != first_plan_compute["values"]
    finally:
        r.close()
    assert r.device_bytes_after_close == 0
    assert all(p.device.type == "cpu" and p.numel() > 0 for p in m.parameters())
    assert torch.equal(steps(m, x, 1)[0], ref[0])


def test_larger_need_replans_too(measured, idle_device, capsys):
    m, x = flux()
    ref = steps(m, x)
    r = ddo.enable_offload(m, device_memory_limit_gb=2, verbose=True, **CPU)
    try:
        measured["need"] = GIB
        out = steps(m, x)
        assert r.replanned
        err = capsys.readouterr().err
        assert "re-planned before the next forward" in err and err.count("route") == 2
        assert r.plan["planner_decisions"]["device_activation_reserve_gb"] == 1.25  # + 1/4
        assert all(torch.equal(a, b) for a, b in zip(ref, out))
    finally:
        r.close()


def test_a_failed_replan_keeps_the_first_plan(measured, monkeypatch):
    m, x = flux()
    ref = steps(m, x)
    r = ddo.enable_offload(m, device_memory_limit_gb=1.25, **CPU)
    setup = result_setup.Setup._setup

    def refused(self):
        if self._cfg.get("activation_reserve_gb") not in ("0", "0.0", "0.00"):
            raise ddo.DdoError("DDO_E_BUDGET", "refused by the test")
        setup(self)
    monkeypatch.setattr(result_setup.Setup, "_setup", refused)
    try:
        plan = r.plan
        out = steps(m, x)
        assert not r.replanned and r.activation_replan["state"] == "kept"
        assert "the re-plan failed" in r.activation_replan["note"]
        assert "refused by the test" in r.activation_replan["note"]
        assert r.plan["budgets"] == plan["budgets"]
        assert all(torch.equal(a, b) for a, b in zip(ref, out))
    finally:
        r.close()
    assert r.device_bytes_after_close == 0


def test_within_threshold_keeps_the_plan(measured):
    m, x = flux()
    ref = steps(m, x)
    r = ddo.enable_offload(m, device_memory_limit_gb=1.25, **CPU)
    try:
        est = r.activation_replan["estimated_bytes"]
        measured["need"] = est - replan.MARGIN + replan.THRESHOLD // 2
        assert replan.margin(measured["need"]) == replan.MARGIN
        plan = r.plan
        out = steps(m, x)
        assert not r.replanned and r.activation_replan["state"] == "kept"
        assert "the plan stays" in r.activation_replan["note"]
        assert r.plan == plan and measured["calls"] == 1
        assert all(torch.equal(a, b) for a, b in zip(ref, out))
    finally:
        r.close()


@pytest.mark.parametrize("given", [dict(device_budget_gb=1), dict(auto_vram_headroom_gb=0.5),
                                   dict(backend="vmm"),  # (its preset gives a budget)
                                   dict(activation_reserve_gb=0.3), dict(activation_replan=False)])
def test_never_when_the_user_decided(measured, given):
    m, x = flux()
    r = ddo.enable_offload(m, device_memory_limit_gb=1.25, **given, **CPU)
    try:
        assert r.activation_replan["state"] == "off" and r.activation_replan["note"]
        steps(m, x)
        assert not r.replanned and measured["calls"] == 0
    finally:
        r.close()
    if "activation_reserve_gb" in given:
        assert r.plan["planner_decisions"]["device_activation_reserve_gb"] == 0.3


@pytest.fixture
def timed(monkeypatch):
    """A budgeted plan is timed as on a CUDA device (times_compute), and the second forward's
    timings are replaced: each unit takes its FLOP estimate times state["scale"]."""
    state = {"scale": 1.0}
    monkeypatch.setattr(replan, "times_compute", lambda device: True)
    # What the plans read of the machine, fixed: the bus and compute rates at what the cpu
    # device measures on an idle 2-core machine (6.5 GB/s, 64 GFLOP/s) and 16 GiB of host
    # memory available. Measured, the rates follow the load of the process's first setup and
    # the host memory CI's parallel jobs (the suite once ended "kept" instead of "due" there,
    # not reproduced in 20 runs alone); the shapes below are the plans' for these figures.
    first = result_setup.Setup._first_inputs

    def rates(self, inputs):
        inputs.bus_bytes_per_s, inputs.flops_per_s = 6.5e9, 6.4e10
        inputs.host_available_bytes = 16 << 30
        first(self, inputs)
    monkeypatch.setattr(result_setup.Setup, "_first_inputs", rates)
    monkeypatch.setattr(replan, "timed_compute", lambda units, measured: {
        u["name"]: float(u["compute_s"]) * state["scale"] for u in units})
    return state


def test_a_budget_replans_with_the_timed_compute(measured, timed):
    """A budget given: the limit stays, and the second forward's compute (here a thousandth of
    the estimate: the step becomes copy-bound) plans again with two resident blocks and two
    slots where the estimate kept one and three."""
    m = Stack()
    x = torch.randn(2, 8192, generator=torch.Generator().manual_seed(2))
    ref = steps(m, x)
    timed["scale"] = 1e-3
    r = ddo.enable_offload(m, device_memory_limit_gb=1.25, device_budget_gb=1, **CPU)
    try:
        before = r.budgets()
        assert replan.plan_shape(r._plan) == (3, ("blocks.0",), 5)
        rp = r.activation_replan
        assert rp["state"] == "measuring" and rp["mode"] == "compute"
        first = steps(m, x, 1)  # (warm-up: not timed)
        assert r.activation_replan["state"] == "timing" and measured["calls"] == 0
        first += steps(m, x, 1)
        rp = r.activation_replan
        assert rp["state"] == "due" and "3 -> 2 slots, 1 -> 2 resident units" in rp["note"], rp
        rest = steps(m, x, 1)
        assert r.replanned and r.activation_replan["unit_compute"] == "second_forward"
        assert replan.plan_shape(r._plan) == (2, ("blocks.0", "blocks.1"), 5)
        assert r.budgets()["device_weights_limit"] == before["device_weights_limit"]
        dec = r.plan["planner_decisions"]
        assert dec["unit_compute_source"] == "measured"
        assert not str(dec.get("device_activation_reserve_source", "")).startswith("measured")
        assert r.plan["budgets"]["device_weights"]["limit_source"].startswith("device_budget_gb")
        assert all(torch.equal(a, b) for a, b in zip(ref, first + rest))
    finally:
        r.close()


def test_a_budget_keeps_its_plan_when_the_compute_changes_nothing(measured, timed):
    m = Stack()
    x = torch.randn(2, 8192, generator=torch.Generator().manual_seed(2))
    ref = steps(m, x)
    timed["scale"] = 100.0
    r = ddo.enable_offload(m, device_memory_limit_gb=1.25, device_budget_gb=1, **CPU)
    try:
        shape = replan.plan_shape(r._plan)
        out = steps(m, x)
        rp = r.activation_replan
        assert rp["state"] == "kept" and not r.replanned
        assert "the same slots, units and resident units" in rp["note"]
        assert replan.plan_shape(r._plan) == shape
        # The plan that runs keeps its figures; the trial's step (a hundred times the units'
        # estimated compute: a longer step) is said beside them.
        first_s = r.budgets()["predicted_step_s"]
        assert rp["trial_predicted_step_s"] > 10 * first_s > 0, rp
        assert f"its predicted step {first_s:.4f} s; with the timed compute " in rp["note"]
        assert all(torch.equal(a, b) for a, b in zip(ref, out))
    finally:
        r.close()


def test_a_reserve_within_the_threshold_replans_for_the_timed_compute(
        measured, timed, idle_device):
    """No budget, and the first forward's reserve within the threshold of the estimate: the
    second forward's compute (a thousandth of the estimate) still calls for the re-plan, which
    keeps the estimated reserve (the one its trial planned with)."""
    m = Stack()
    x = torch.randn(2, 8192, generator=torch.Generator().manual_seed(2))
    ref = steps(m, x)
    timed["scale"] = 1e-3
    r = ddo.enable_offload(m, device_memory_limit_gb=1.6, **CPU)
    try:
        before, shape = r.budgets(), replan.plan_shape(r._plan)
        est = r.activation_replan["estimated_bytes"]
        measured["need"] = est - replan.MARGIN - replan.THRESHOLD // 2
        out = steps(m, x, 2)
        rp = r.activation_replan
        assert rp["state"] == "due" and rp["mode"] == "reserve", rp
        assert rp["note"].startswith("measured on the first forward") and "within" in rp["note"]
        assert "the units' compute timed on the second forward changes the plan" in rp["note"]
        out += steps(m, x, 1)
        assert r.replanned and r.activation_replan["unit_compute"] == "second_forward"
        assert replan.plan_shape(r._plan) != shape
        dec = r.plan["planner_decisions"]
        assert not str(dec["device_activation_reserve_source"]).startswith("measured")
        assert r.budgets()["device_weights_limit"] == before["device_weights_limit"]
        assert all(torch.equal(a, b) for a, b in zip(ref, out))
    finally:
        r.close()


def test_the_note_names_what_the_timed_compute_changed():
    """The re-plan's note: slots and resident counts that change, or a same-sized resident set
    whose members change (said as such, not "13 -> 13 resident units")."""
    a = (3, ("blocks.0", "blocks.1", "blocks.2"), 12)
    assert replan.shape_change(a, a) == ""
    assert replan.shape_change(a, (2, a[1], 12)) == "3 -> 2 slots"
    assert replan.shape_change(a, (3, ("blocks.0",), 12)) == "3 -> 1 resident units"
    assert replan.shape_change(a, (3, ("blocks.0", "blocks.5", "blocks.6"), 12)) == \
        "2 of the 3 resident units swapped for others"
    assert replan.shape_change(a, (2, ("blocks.0", "blocks.1", "blocks.9"), 12)) == \
        "3 -> 2 slots, 1 of the 3 resident units swapped for others"
    # Only the packing differs: blocks packed in one plan and not in the other.
    assert replan.shape_change(a, (3, a[1], 9)) == "12 -> 9 units"


def test_no_statistics_keeps_the_estimate():
    m, x = flux()  # the real measurement: the cpu device has no allocator statistics
    r = ddo.enable_offload(m, device_memory_limit_gb=1.25, **CPU)
    try:
        steps(m, x)
        assert not r.replanned and r.activation_replan["state"] == "kept"
        assert "no allocator statistics" in r.activation_replan["note"]
    finally:
        r.close()


def test_the_facts_survive_a_saved_plan():
    """ddo_plan_info's activation_reserve_bytes and activation_reserve_estimated, read back from
    a saved plan (ddo_plan_from_json) as the planner set them."""
    import ctypes
    from ddo import _lib, _native
    m, _ = flux()
    for given, estimated in (({}, True), ({"activation_reserve_gb": 0.3}, False)):
        r = ddo.enable_offload(m, device_memory_limit_gb=1.25, **given, **CPU)
        try:
            mine = r._plan_info
            assert bool(mine.activation_reserve_estimated) is estimated
            if not estimated:
                assert mine.activation_reserve_bytes == int(0.3 * GIB)
            L = _native.lib()
            p = ctypes.c_void_p()
            _native.check(L.ddo_plan_from_json(r._plan_json().encode(), ctypes.byref(p)))
            info = _lib.PlanInfo()
            try:
                _native.check(L.ddo_plan_info_get(p, ctypes.byref(info)))
            finally:
                L.ddo_plan_destroy(p)
            assert bool(info.activation_reserve_estimated) is estimated
            assert abs(info.activation_reserve_bytes - mine.activation_reserve_bytes) < (1 << 20)
        finally:
            r.close()


def test_timed_compute_takes_each_kinds_median_and_scales_the_rest():
    """timed_compute: blocks of one kind take their median (a first launch's slow unit does not
    count); a unit not timed keeps its estimate times what the timed units took against
    theirs; a unit of no compute stays at 0; nothing timed gives nothing."""
    units = [dict(name="embed", compute_s=0.001, flops_per_token=10, bytes=100)] + [
        dict(name=f"b{i}", compute_s=0.002, flops_per_token=50, bytes=900) for i in range(5)] + [
        dict(name="norm", compute_s=0.0, flops_per_token=0, bytes=8)]
    timed = {"b0": 0.030, "b1": 0.003, "b2": 0.003, "b3": 0.0031, "b4": 0.0029, "norm": 0.001}
    got = replan.timed_compute(units, timed)
    assert {got[f"b{i}"] for i in range(5)} == {0.003}  # b0's first launch is not its cost
    scale = sum(timed[f"b{i}"] for i in range(5)) / (5 * 0.002)
    assert got["embed"] == pytest.approx(0.001 * scale)  # not timed (resident): scaled
    assert got["norm"] == 0.0
    assert replan.timed_compute(units, {}) == {}
    assert replan.timed_compute(units, {"norm": 0.5, "missing": 1.0}) == {}
