"""The one-line form for a pipeline (enable_pipeline_offload, staged by default) on the cpu
device: ``pipe(...)`` runs in a device budget that holds one component at a time.

StandInPipeline below IS A STAND-IN for a Diffusers pipeline (Diffusers is not installed in
CI): an object with a ``components`` mapping whose ``__call__`` runs encoder -> denoiser
(several steps) -> decoder, as FluxPipeline.__call__ does. The device peak is measured, not
taken from the stager: a forward hook on every module of every component sums the device
weight bytes every session reports (metric device_weights_bytes) at that moment.
"""

import pytest
import torch
from torch import nn

import ddo
from ddo import staging
import models
from conftest import ZERO_RESIDENT

# ddo's own staging, with the routes of a machine without Diffusers (CI's; the GPU machine has it)
pytestmark = pytest.mark.usefixtures("without_diffusers")

STEPS = 3


class StandInPipeline:
    """Stands in for a Diffusers pipeline: encoder -> denoiser (STEPS steps) -> decoder."""

    def __init__(self, seed=0):
        torch.manual_seed(seed)
        self.text_encoder = models.FluxLike(dim=128, double=2, single=0, seed=seed + 1)
        self.transformer = models.FluxLike(dim=128, seed=seed + 2)
        self.vae = nn.Sequential(nn.Linear(128, 512), nn.Tanh(), nn.Linear(512, 128)).to(
            torch.bfloat16)
        self.scheduler = object()  # not a module: skipped

    @property
    def components(self):
        return {"text_encoder": self.text_encoder, "transformer": self.transformer,
                "vae": self.vae, "scheduler": self.scheduler}

    def __call__(self, seed=0, steps=STEPS):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randn(1, 8, 128, generator=g).to(torch.bfloat16)
        with torch.no_grad():
            ctx = self.text_encoder(ids)
            lat = torch.randn(1, 8, 128, generator=g).to(torch.bfloat16)
            for _ in range(steps):
                lat = lat - 0.1 * self.transformer(lat + ctx)
            return self.vae(lat)


def budget_for_one(pipe):
    """A device budget (GiB) that holds the largest component's plan but no two of them."""
    peaks = []
    for name in ("text_encoder", "transformer", "vae"):
        m = getattr(pipe, name)
        r = ddo.enable_offload(m, **ZERO_RESIDENT)
        peaks.append(r.budgets()["device_weights_peak"])
        r.close()
    peaks.sort()
    assert peaks[-1] < peaks[0] + peaks[1]
    return (peaks[-1] + (peaks[0] + peaks[1] - peaks[-1]) // 2) / 2**30, peaks


class PeakMeter:
    """The sum of every session's device weight bytes, sampled at every module's forward."""

    def __init__(self, pipe, results):
        self.results = results
        self.peak = 0
        self.handles = []
        for name in results:
            for m in getattr(pipe, name).modules():
                self.handles.append(m.register_forward_hook(lambda *a: self.sample()))

    def now(self):
        return sum(int(r.metrics_snapshot().get("device_weights_bytes"))
                   for r in self.results.values() if r._state != "closed")

    def sample(self):
        self.peak = max(self.peak, self.now())

    def remove(self):
        for h in self.handles:
            h.remove()


@pytest.fixture
def staged():
    pipe = StandInPipeline()
    want = pipe(seed=1)
    gb, peaks = budget_for_one(pipe)
    results = ddo.enable_pipeline_offload(pipe, vmm_resident_weight_budget_gb=gb,
                                          **ZERO_RESIDENT)
    meter = PeakMeter(pipe, results)
    yield pipe, results, want, meter
    meter.remove()
    ddo.close_pipeline_offload(pipe)
    for r in results.values():
        assert r.device_bytes_after_close == 0  # no device byte left behind


def test_one_line_runs_one_component_at_a_time(staged):
    pipe, results, want, meter = staged
    assert {r.route for r in results.values()} == {"dynamic_offload"}  # no Diffusers needed
    limit = results.stager.limit
    assert limit == results["transformer"].budgets()["device_weights_limit"]
    setup = list(results.stager.events)
    # Setup: room is made for each component before its session takes device memory.
    assert setup == [("load", "text_encoder"), ("unload", "text_encoder"),
                     ("load", "transformer"), ("unload", "transformer"), ("load", "vae")]
    assert meter.now() <= limit
    got = pipe(seed=1)
    assert torch.equal(got, want)
    assert 0 < meter.peak <= limit
    assert results.stager.events[len(setup):] == [
        ("unload", "vae"), ("load", "text_encoder"), ("unload", "text_encoder"),
        ("load", "transformer"), ("unload", "transformer"), ("load", "vae")]
    n = len(results.stager.events)
    assert torch.equal(pipe(seed=1), want)  # a second call: the same bits, the same plan
    assert results.stager.events[n:] == results.stager.events[len(setup):n]
    assert meter.peak <= limit
    # Metrics and explicit phases stay available.
    assert results["transformer"].metrics_snapshot().get("reloads") == 2
    results["vae"].unload()
    assert meter.now() == 0
    assert torch.equal(pipe(seed=1), want)


def test_each_component_plans_for_the_card(staged):
    """A component set up beside a loaded one counts that one's device weights as free (the
    stager unloads it before the new session takes memory): the plan sizes from the card,
    not from what the other left (Wan 2.2's second expert on a small card was refused)."""
    pipe, results, want, meter = staged
    need = results.stager.need
    dec = {n: r.plan["planner_decisions"] for n, r in results.items()}
    assert "device_reclaimable_gb" not in dec["text_encoder"]  # nothing loaded before it
    for name, before in (("transformer", "text_encoder"), ("vae", "transformer")):
        assert float(dec[name]["device_reclaimable_gb"]) == pytest.approx(
            need[before] / 2**30, abs=1e-4)
    assert torch.equal(pipe(seed=1), want)
    # The stager's reclaimable bytes: the loaded others', never a busy or closed one.
    st = results.stager
    assert st.reclaimable("transformer") == sum(need[n] for n in st.active if n != "transformer")


def test_route_none_is_staged_too():
    """A component on route none (moved to the device whole) is loaded and unloaded by the same
    rule, its need being its bytes."""
    pipe = StandInPipeline()
    want = pipe(seed=4)
    gb, _ = budget_for_one(pipe)
    results = ddo.enable_pipeline_offload(pipe, vmm_resident_weight_budget_gb=gb,
                                          routes={"vae": "none"}, **ZERO_RESIDENT)
    try:
        st = results.stager
        assert results["vae"].route == "none" and st.need["vae"] == staging.module_bytes(pipe.vae)
        n = len(st.events)
        assert torch.equal(pipe(seed=4), want)
        assert ("load", "vae") in st.events[n:] and ("unload", "transformer") in st.events[n:]
        assert st.in_use() <= st.limit
    finally:
        ddo.close_pipeline_offload(pipe)


def test_everything_fits_nothing_unloaded():
    pipe = StandInPipeline()
    want = pipe(seed=2)
    results = ddo.enable_pipeline_offload(pipe, **ZERO_RESIDENT)
    try:
        assert torch.equal(pipe(seed=2), want)
        assert torch.equal(pipe(seed=2), want)
        assert [e for e, _ in results.stager.events] == ["load"] * 3
    finally:
        ddo.close_pipeline_offload(pipe)


class Trip:
    """Raises exc from a module's forward once armed (a forward pre-hook)."""

    def __init__(self, module, exc):
        self.armed = False
        self.exc = exc
        self.h = module.register_forward_pre_hook(self)

    def __call__(self, module, args):
        if self.armed:
            self.armed = False
            raise self.exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("decoder blew up")])
@pytest.mark.parametrize("where", ["transformer", "vae"])
def test_interrupt_or_error_inside_a_component(staged, exc, where):
    pipe, results, want, meter = staged
    comp = getattr(pipe, where)
    inner = comp.transformer_blocks[1] if where == "transformer" else comp[2]
    trip = Trip(inner, exc)
    trip.armed = True
    with pytest.raises(type(exc)) as e:
        pipe(seed=1)
    assert e.value is exc  # the original error, not a cleanup error
    trip.h.remove()
    assert results.stager.in_use() <= results.stager.limit
    assert meter.now() <= results.stager.limit
    assert torch.equal(pipe(seed=1), want)  # the next call works
    assert meter.peak <= results.stager.limit


def test_a_component_closed_by_hand(staged):
    """Closing one result by hand: it runs unmanaged again and the others keep being staged."""
    pipe, results, want, meter = staged
    assert results.stager.active == ["vae"]  # loaded last at setup
    results["vae"].close()
    assert torch.equal(pipe(seed=1), want)
    assert torch.equal(pipe(seed=1), want)
    assert "vae" not in results.stager.active


def test_staged_false_keeps_explicit_phases():
    pipe = StandInPipeline()
    results = ddo.enable_pipeline_offload(pipe, staged=False, **ZERO_RESIDENT)
    try:
        assert results.stager is None
        results["vae"].unload()
        with pytest.raises(ddo.DdoError, match="reload"), torch.no_grad():
            pipe.vae(torch.zeros(1, 128, dtype=torch.bfloat16))
    finally:
        ddo.close_pipeline_offload(pipe)


def test_enable_offload_of_a_pipeline_is_staged():
    pipe = StandInPipeline()
    want = pipe(seed=3)
    results = ddo.enable_offload(pipe, **ZERO_RESIDENT)
    try:
        assert results.stager is not None
        assert torch.equal(pipe(seed=3), want)
    finally:
        ddo.close_pipeline_offload(pipe)
    assert torch.equal(pipe(seed=3), want)  # closed: the pipeline runs unmanaged again
