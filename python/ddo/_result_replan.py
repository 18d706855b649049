"""OffloadResult's activation re-plan (internal).

With no budget given, the plan's device weights limit is the device's free memory minus an
activation reserve estimated from the plan's units (decision device_activation_reserve_gb). The
first complete root forward measures what the forward really needed on the device
(measure_activation: on a CUDA device, torch's allocator); when that need plus its margin
(margin()) differs from the plan's reserve by more than THRESHOLD, the result is planned once
more (never inside a forward) with activation_reserve_gb set to it: the module's host tensors
are registered again in place (no copy; on a GPU the driver pins their pages again), the
resident weights are uploaded again, and more (or fewer) units are resident.
``result.activation_replan`` says what happened, ``result.replanned`` whether it did;
activation_replan=False keeps the first plan.

On a CUDA device the second forward times each streamed unit's compute (profiles.UnitTimer, as
a profile's calibration does); the first is not timed, since it runs well above the later ones
(GGUF Q8_0 Flux on an H100: its units summed 0.349 s where the later steps' summed 0.256 s,
docs/benchmarks.md). Until something measured them, the plan's cost model estimates the units'
compute from their FLOPs, which leaves out attention and runs low (Flux on an H200: a
predicted step below the resident step itself); the re-plan plans with the timed compute
instead (timed_compute()), so its resident set and slot count are chosen for the step the
device really runs. A profile that already measured the units keeps its figures. Where the
units are timed, the re-plan (if any) happens before the third forward, once, with the reserve
the first forward measured and the compute the second timed; elsewhere before the second.

Where a budget was given (the limit is the user's: nothing to re-plan for the reserve), the
second forward on a CUDA device still times the units (mode "compute"): a trial plan with that
compute (nothing allocated) calls for the one re-plan only where its slot count or resident
units differ from the first plan's. Without a budget, a reserve within the threshold is put to
the same trial.
"""

from __future__ import annotations

import ctypes
import json
import sys
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from . import _lease, _lib, _native, _torch, profiles
from ._native import DdoError
from ._result_lifecycle import Lifecycle
from ._result_state import _MANAGED

MIB = 1 << 20
GIB = 1 << 30
# The least margin over the measured need (see margin()).
MARGIN = 256 * MIB
# A re-plan costs the resident weights' registration and upload once; a limit moved by more
# than this pays it back within a few steps (128 MiB more resident are 2.4 ms less copying per
# step on a 55 GB/s bus where the step is bus-bound).
THRESHOLD = 128 * MIB


def margin(need: int) -> int:
    """Added to the measured need: a quarter of it, at least MARGIN, for the kernels' workspaces
    and the allocator's blocks that vary from one call to the next (the measured peak already
    holds the cache's rounding and fragmentation of the first forward). On the H200 an eighth
    and 128 MiB were too little: Flux on an emulated 8 GiB card, re-planned from a measured
    0.32 GiB, peaked 50 MiB above the card over the later steps (docs/benchmarks.md)."""
    return max(MARGIN, need // 4)


def measure_activation(device: Optional[torch.device], baseline: int,
                       call: Callable[[], Any]) -> Tuple[Any, Optional[int]]:
    """Runs call() (the first complete root forward) and returns (its output, the device memory
    it needed in bytes): on a CUDA device, the peak of torch's reserved bytes during the call
    above baseline (the bytes torch held when the plan read the device's free memory); None
    where the device has no allocator statistics (the cpu device). Tests replace this function.

    Reserved, not allocated: ddo's memory comes from the driver beside torch's caching
    allocator, so what the forward takes from ddo's share is what torch reserves (its cache and
    fragmentation included), not only the tensors alive at its peak. torch's peak statistics
    are reset (torch.cuda.reset_peak_memory_stats) only when an earlier peak of reserved bytes
    is above the bytes reserved now (torch.cuda.empty_cache() ran since): the earlier peaks,
    allocated included, are then lost."""
    if device is None or device.type != "cuda":
        return call(), None
    cuda: Any = torch.cuda  # (torch 1.13 leaves parts unannotated)
    cuda.synchronize(device)
    if cuda.max_memory_reserved(device) > cuda.memory_reserved(device):
        cuda.reset_peak_memory_stats(device)
    out = call()
    cuda.synchronize(device)
    return out, max(0, int(cuda.max_memory_reserved(device)) - baseline)


def timed_compute(units: List[Dict[str, Any]], measured: Mapping[str, float]) -> Dict[str, float]:
    """Every unit's compute for the re-plan ({unit name: seconds}; {} when nothing usable was
    measured), from the plan's units (their estimated compute_s, flops_per_token and bytes) and
    the second forward's timings. Units of one kind (the same FLOPs and bytes: a transformer's
    blocks) take their kind's median, so a unit that ran a kernel for the first time (its
    loading, a library's set-up) does not count as slow; a unit the forward did not time (a
    resident one, a kind never streamed) keeps its estimate scaled by what the measured units
    took against theirs."""
    est = {u["name"]: float(u.get("compute_s") or 0.0) for u in units}
    kind = {u["name"]: (u.get("flops_per_token"), u.get("bytes")) for u in units}
    by_kind: Dict[Any, List[float]] = {}
    took = planned = 0.0
    for name, sec in measured.items():
        if name in est and sec > 0.0 and est[name] > 0.0:
            by_kind.setdefault(kind[name], []).append(sec)
            took, planned = took + sec, planned + est[name]
    if planned <= 0.0:
        return {}
    scale = took / planned
    median = {k: sorted(v)[len(v) // 2] for k, v in by_kind.items()}
    return {name: median.get(kind[name], e * scale) for name, e in est.items()}


def times_compute(device: Optional[torch.device]) -> bool:
    """Whether the second forward times the units' compute for the re-plan (a budgeted plan's
    trial, or the reserve's re-plan): on a CUDA device (CUDA events time the units); the cpu
    device's host clock is the reference device's, not a planning figure. Tests replace this
    function."""
    return device is not None and device.type == "cuda"


Shape = Tuple[int, Tuple[str, ...], int]


def shape_change(mine: Shape, theirs: Shape) -> str:
    """What differs between two plan_shape()s, in words ("" when nothing does): the slot count,
    the unit count (blocks packed or not), and the resident units' count, or how many of them
    a same-sized set swapped."""
    said = []
    if mine[0] != theirs[0]:
        said.append(f"{mine[0]} -> {theirs[0]} slots")
    if mine[2] != theirs[2]:
        said.append(f"{mine[2]} -> {theirs[2]} units")
    if len(mine[1]) != len(theirs[1]):
        said.append(f"{len(mine[1])} -> {len(theirs[1])} resident units")
    elif mine[1] != theirs[1]:
        moved = len(set(mine[1]) - set(theirs[1]))
        said.append(f"{moved} of the {len(mine[1])} resident units swapped for others")
    return ", ".join(said)


def predicted_step(plan: ctypes.c_void_p) -> float:
    """A plan's predicted step (seconds; 0 without a cost model)."""
    b = _lib.PlanBudgets()
    _native.check(_native.lib().ddo_plan_budgets_get(plan, ctypes.byref(b)))
    return float(b.predicted_step_s)


def plan_shape(plan: ctypes.c_void_p) -> Shape:
    """A plan's slot count, the names of its resident units and its unit count."""
    L = _native.lib()
    b = _lib.PlanBudgets()
    _native.check(L.ddo_plan_budgets_get(plan, ctypes.byref(b)))
    info = _lib.UnitInfo()
    names = []
    count = int(L.ddo_plan_unit_count(plan))
    for u in range(count):
        _native.check(L.ddo_plan_unit(plan, u, ctypes.byref(info)))
        if info.resident:
            names.append(info.name.decode())
    return int(b.slot_count), tuple(names), count


class Replan(Lifecycle):
    """The first forward's activation need, the second's compute, and the one re-plan they can
    call for."""

    _replan: Dict[str, Any]

    def _fresh(self) -> None:
        """The fields of one session and its bindings, as before its setup
        (OffloadResult.__init__, and a re-plan's second setup)."""
        self._owner = None  # [thread ident, depth] while a forward or a unit's hook runs
        self._in_root = 0   # root forwards running on the owner thread
        self._frames = []   # the owner's unit frames whose pre-hook succeeded (_enter)
        self._dirty = False  # a device copy was written: restored when no lease is held
        self._handles = []
        self._leases = {}
        self._root_units = ()
        # The first root forward's acquire order (each unit's first acquire): the plan's unit
        # order is declared at setup, and where the forward calls its units in another order
        # (a model's embedders often run in another order than they are declared) the
        # observed one is declared after that forward (_declare_observed). None: not observing.
        self._observed = None
        self._ph_versions = {}  # id(Parameter) -> its version when it got a placeholder
        self._res_versions = []  # (Parameter, version) of the resident tensors bound
        self._own_forward = None
        self._trace_t = {}  # units -> when their compute began (trace=)
        self._own_methods = []  # (module, name, own) of the methods refused while managed
        self._ck = self._dev = self._plan = self._session = self._setup_h = None
        self._store = None  # donor mode's store device (_devices.py)
        self._share = None  # share mode's rank (_devices.py)
        self._unit_shares = {}  # per unit: its share (ddo_session_unit_share), once asked
        self._streams = {}
        self._views = {}
        self._placeholders = {}
        self._moved = []
        self._versions = {}
        self.device = None
        self.unmanaged_bytes = 0
        self.host_bytes_released = 0
        self.device_bytes_after_close = None
        self.device_note = ""
        self._grad_hooks_armed = False
        self._pinned = {}  # units kept leased in C while a view of them escaped (_release)
        self._entered = set()  # the hooked unit groups entered in this root forward
        self._hooked = []  # (module name, units) of every hooked module but the root
        self._view_ptrs = {}  # storage address of every live view -> its tensor's name
        self._unit_cuts = {}  # per unit: its tensors cut from one unit view (_result_views)
        self._unit_ps = {}  # per unit: its Parameters, their ids and placeholders

    def _commit(self) -> None:
        """The setup made: the module and its Parameters marked as managed by this result."""
        setattr(self.module, "_ddo_offload", self)  # (torch's Module.__setattr__ types)
        self._managed_tag = f"{type(self.module).__name__} at 0x{id(self):x} (enable_offload)"
        for t in self._tensors:
            for p in t.params:
                _MANAGED[id(p)] = (weakref.ref(p), self._managed_tag)
        self._state = "ready"

    @property
    def replanned(self) -> bool:
        """True once the result was planned again with the reserve measured on the first
        forward or the compute timed on the second (activation_replan says why or why not)."""
        return bool(self._replan["state"] == "replanned")

    @property
    def activation_replan(self) -> Dict[str, Any]:
        """The activation reserve: state (measuring: the first forward is next; timing: the
        second; due, replanned, kept, off), the plan's estimated reserve, the measured need,
        the reserve planned with, the margin, the threshold (bytes), a note, and unit_compute:
        "second_forward" when the re-plan took the units' compute the second forward timed
        (else None); where a trial with that compute kept the plan, trial_predicted_step_s."""
        return dict(self._replan, replanned=self.replanned)

    def _arm_replan(self) -> None:
        """After the first setup: whether the first forward is measured (and the second
        timed)."""
        info = self._plan_info  # (the plan's typed facts)
        est = int(info.activation_reserve_bytes)
        self._reserve_due = False  # the first forward's reserve calls for the re-plan
        self._reserve_said = ""  # what the first forward's reserve said (the note's start)
        self._replan = {"state": "off",
                        "estimated_bytes": est if info.activation_reserve_estimated else None,
                        "measured_bytes": None, "reserve_bytes": None, "margin_bytes": None,
                        "threshold_bytes": THRESHOLD, "note": "", "unit_compute": None}
        why = ""
        compute = False  # only the units' compute is to be measured (a budget was given)
        if self._cfg.get("activation_replan") != "true":
            why = "activation_replan=False: the first plan stays"
        elif self._share is not None:
            why = ("device_mode='split' over torch.distributed: every rank runs rank 0's plan, "
                   "and a re-plan on one rank would part them, so the first plan stays")
        elif self._source is not None or self.host_bytes_released or self._store is not None:
            why = ("the session holds weights it read or coded itself (a checkpoint file, "
                   "weight_codec or a store device): a re-plan would read them again, so the "
                   "first plan stays")
        elif not info.activation_reserve_estimated:
            b = self.budgets()
            compute = times_compute(self.device) and self._compute_measured is None and \
                b["slot_count"] > 0 and b["predicted_step_s"] > 0.0
            if not compute:
                why = ("the device weights limit was not sized from the device with an "
                       "estimated activation reserve (a budget, yours or a preset's, "
                       "auto_vram_headroom_gb or activation_reserve_gb was given), and the "
                       "units' compute is not re-measured here (a profile measured it, nothing "
                       "streams, no cost model, or not a CUDA device): nothing to re-plan")
        if why:
            self._replan["note"] = why
        else:
            self._replan["state"] = "measuring"
            self._replan["mode"] = "compute" if compute else "reserve"

    def _root_call(self, fn: Callable[..., Any], args: Tuple[Any, ...],
                   kwargs: Dict[str, Any]) -> Any:
        rp = self._replan
        with self._lock:
            busy = self._owner is not None  # a forward (or a unit's hook) is running
        if busy or rp["state"] not in ("measuring", "timing", "due"):
            return fn(*args, **kwargs)
        if rp["state"] == "due":
            self._replan_now()
            return fn(*args, **kwargs)
        if rp["state"] == "measuring":  # the first forward
            if rp.get("mode") == "compute":  # (warm-up: kernels loaded, caches filled)
                out = fn(*args, **kwargs)
                rp["state"] = "timing"
                rp["note"] = "the units' compute is timed on the second forward"
                return out
            out, need = measure_activation(self.device, getattr(self, "_torch_reserved", 0),
                                           lambda: fn(*args, **kwargs))
            self._measured(need)
            return out
        # The second forward: each unit's compute timed (unless a calibration times them).
        timer = None
        if self._timing is None:
            timer = self._timing = profiles.UnitTimer()
        try:
            out = fn(*args, **kwargs)
        finally:
            if timer is not None and self._timing is timer:
                self._timing = None
        if timer is not None:
            units = self.plan.get("units") or []
            took = timer.medians(self._unit_names, self.device)
            self._timed_compute = timed_compute(units, took)
        self._compute_timed()
        return out

    def _measured(self, need: Optional[int]) -> None:
        """The first forward's activation need: a re-plan due (or not) for the reserve, and
        the units timed on the second forward where no profile measured them."""
        rp = self._replan
        if need is None:
            rp["state"] = "kept"
            rp["note"] = (f"no allocator statistics on the {self.device} device: the "
                          f"estimated reserve stays")
            return
        need = int(need)
        pad = margin(need)
        reserve = need + pad
        rp["measured_bytes"], rp["margin_bytes"], rp["reserve_bytes"] = need, pad, reserve
        est = rp["estimated_bytes"] or 0
        said = (f"measured on the first forward: {need / GIB:.2f} GiB + {pad / GIB:.2f} GiB "
                f"margin against the estimated {est / GIB:.2f} GiB")
        self._reserve_due = abs(reserve - est) > THRESHOLD
        self._reserve_said = (f"{said}: a re-plan is due" if self._reserve_due else
                              f"{said}: within {THRESHOLD / GIB:.3f} GiB")
        if getattr(self, "_compute_measured", None) is None and times_compute(self.device):
            rp["state"] = "timing"
            rp["note"] = f"{self._reserve_said}; the units' compute is timed on the second forward"
            return
        rp["state"] = "due" if self._reserve_due else "kept"
        rp["note"] = self._reserve_said + (" before the next forward" if self._reserve_due else
                                           ", the plan stays")

    def _compute_timed(self) -> None:
        """After the second forward: the re-plan is due for the reserve (it plans with the
        timed compute too), or, where the reserve is not (or a budget was given), only where a
        trial plan with the timed compute (nothing allocated) differs from this one (its slot
        count, unit count or resident units)."""
        rp = self._replan
        said = f"{self._reserve_said}; " if self._reserve_said else ""
        rp["state"] = "kept"
        uc = getattr(self, "_timed_compute", None)
        if self._reserve_due:
            rp["state"] = "due"
            rp["note"] = f"{self._reserve_said} before the next forward"
            return
        if not uc:
            rp["note"] = f"{said}the second forward timed no streamed unit: the plan stays"
            return
        try:
            change, first_s, trial_s = self._trial_differs(uc)
        except DdoError as e:
            rp["note"] = f"{said}a plan with the units' compute timed on the second forward " \
                         f"failed ({_native.exc_line(e)}): the plan stays"
            return
        if not change:
            # The plan that runs keeps its own figures: the trial's step, said beside them.
            rp["trial_predicted_step_s"] = trial_s
            rp["note"] = (f"{said}planned again with the units' compute timed on the second "
                          f"forward: the same slots, units and resident units, the plan stays "
                          f"(its predicted step {first_s:.4f} s; with the timed compute "
                          f"{trial_s:.4f} s)")
            return
        rp["state"] = "due"
        rp["note"] = (f"{said}the units' compute timed on the second forward changes the plan "
                      f"({change}): a re-plan is due before the next forward")

    def _trial_differs(self, uc: Dict[str, float]) -> Tuple[str, float, float]:
        """The plan the setup would make with compute uc against this one: what differs ("" when
        its slot count, unit count and resident units are the same), and the predicted step of
        this plan and of the trial."""
        if self._plan is None:
            return "", 0.0, 0.0
        L = _native.lib()
        inputs = _lib.PlanInputs()
        _native.check(L.ddo_setup_plan_inputs(self._setup_h, ctypes.byref(inputs)),
                      L.ddo_setup_error(self._setup_h))
        self._first_inputs(inputs)
        text = json.dumps(uc).encode()
        inputs.unit_compute_json = text
        trial = ctypes.c_void_p()
        _native.check(L.ddo_setup_plan(self._setup_h, self._ck, self._cfg.h, ctypes.byref(inputs),
                                       ctypes.byref(trial)), L.ddo_setup_error(self._setup_h))
        try:
            mine, theirs = plan_shape(self._plan), plan_shape(trial)
            steps = predicted_step(self._plan), predicted_step(trial)
        finally:
            L.ddo_plan_destroy(trial)
        return shape_change(mine, theirs), steps[0], steps[1]

    def _replan_now(self) -> None:
        """The re-plan, between two forwards: the session torn down (the module holds its host
        tensors again) and set up again with activation_reserve_gb; once only."""
        rp = self._replan
        rp["state"] = "kept"
        if self._state != "ready":
            rp["note"] += " (not done: the result was unloaded)"
            return
        if self.device is not None and _torch.capturing(self.device):
            rp["note"] += " (not done: the forward due to re-plan ran inside a CUDA-graph capture)"
            return
        lora = getattr(self, "_lora", None)
        if lora is not None and any(lora.logs.values()):
            rp["note"] += " (not done: a LoRA was merged into the managed weights)"
            return
        if self._escaped_views():
            rp["note"] += " (not done: views of the device weights are still alive)"
            return
        before, first_cfg = self.plan, self._cfg
        with _lease.shield():
            self._teardown()
            # A copy: a pipeline's components can share one configuration.
            h = ctypes.c_void_p()
            _native.check(_native.lib().ddo_config_clone(first_cfg.h, ctypes.byref(h)))
            cfg = _native.Config(h)
            setattr(cfg, "_ddo_auto_scratch", getattr(first_cfg, "_ddo_auto_scratch", False))
            if self._reserve_due:  # (a budget given keeps its limit; a reserve within the
                # threshold, its estimate: the trial that called for this re-plan kept it)
                cfg.override("activation_reserve_gb", f"{rp['reserve_bytes'] / GIB:.6f}")
            self._cfg = cfg
            try:
                self._rebuild(last=False)
            except Exception as e:  # the first plan again (the same inputs: it fitted)
                self._teardown()
                self._cfg = first_cfg
                self._timed_compute = {}  # (the first plan's estimates too)
                rp["note"] += f" (the re-plan failed, {_native.exc_line(e)}; the first plan " \
                              f"again)"
                self._rebuild(last=True)
                return
            rp["state"] = "replanned"
            rp["note"] = rp["note"].replace("a re-plan is due", "re-planned")
            if self._compute_measured == "second_forward":
                rp["unit_compute"] = "second_forward"
                rp["note"] += " with the units' compute timed on the second forward"
            rp["plan_before"] = {k: before["budgets"]["device_weights"][k]
                                 for k in ("limit", "limit_source", "resident_bytes")}
            if self._cfg.get("verbose") == "true":  # (the plan's summary was printed above)
                print(f"ddo: {self._label()}: {rp['note']}", file=sys.stderr)

    def _rebuild(self, last: bool) -> None:
        """A second setup (with the first plan's device memory in use: _result_setup). Where
        it fails and is the last try (or an interrupt stops it), the result is closed, torn
        down as __init__ would, and the error raised."""
        keep = self._before_session
        self._before_session = None  # (a pipeline's stager made room once)
        self._fresh()
        try:
            self._setup()
            self._commit()
        except BaseException as e:
            if last or not isinstance(e, Exception):
                self._state = "closed"
                self._teardown()
            raise
        finally:
            self._before_session = keep
