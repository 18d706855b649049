"""Named capacity profiles for the binding: profile_name / build_profile over the C store.

prepare() runs before the plan: the workload's identity (ddo_profile_workload_context: the
name and the tensor table) selects the profile, and ddo_profile_apply either forces a
zero-resident calibration (build_profile) or applies the saved recommendation (source
"profile:NAME"). result.profile_run() measures a calibration run and saves the next run's
resident budget through the host layer, as the tool does (ddo_setup_profile_record: the
peak, ddo_profile_recommend_resident_budget, the measured rates and each unit's compute). The
offload result's setup applies the profile again (ddo_setup_profile_apply), so its measured
rates reach the plan inputs in the host layer's order. The directory: profile_dir, else DDO_PROFILE_DIR, else ~/.ddo/profiles.
"""

import contextlib
import ctypes
import json
import os
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from . import _lib, _native

GIB = float(1 << 30)


class ProfileState:
    """What prepare() did: name, dir, context, status, budget_gb, measured."""

    def __init__(self, name: str, dir_: str, context: str, status: str, budget_gb: float,
                 measured: Any, calibrating: bool) -> None:
        self.name = name
        self.dir = dir_
        self.context = context
        self.status = status
        self.budget_gb = budget_gb
        self.measured = measured
        self.calibrating = calibrating
        self.saved_path: Optional[str] = None
        self.recommendation: Optional[Dict[str, Any]] = None
        self.unit_compute: Optional[Dict[str, float]] = None  # {unit name: seconds} a calibration measured, or None
        self.decode_bytes_per_s = 0.0  # the device decoder's throughput it measured, or 0

    def __repr__(self) -> str:
        return f"<ProfileState {self.name!r} {self.status} budget={self.budget_gb}>"


def profile_dir(explicit: Optional[str] = None,
                environ: Optional[Mapping[str, str]] = None) -> str:
    e = os.environ if environ is None else environ
    # the home the library's setup reads: HOME, else USERPROFILE (Windows)
    home = e.get("HOME") or e.get("USERPROFILE") or os.path.expanduser("~")
    p = ctypes.c_void_p()
    _native.check(_native.lib().ddo_profile_dir(
        (explicit or "").encode() or None, e.get("DDO_PROFILE_DIR", "").encode() or None,
        home.encode(), ctypes.byref(p)))
    return _native.take_text(p)


def _context(name: str, module: Any, source: Any) -> str:
    """The workload identity: the tensor table ddo would build for this module."""
    from . import _torch, offload
    L = _native.lib()
    ck = ctypes.c_void_p()
    if source is not None:
        _native.check(L.ddo_checkpoint_create(str(source).encode(), 0, ctypes.byref(ck)))
    else:
        to_ddo, _ = _torch.dtype_tables()
        collect: Any = offload._collect  # offload.py is not annotated
        tensors, _p, _m = collect(module, to_ddo)
        descs = (_lib.TensorDesc * max(1, len(tensors)))()
        keep = []
        for i, t in enumerate(tensors):
            shape = (ctypes.c_uint64 * max(1, len(t.shape)))(*t.shape)
            nm = t.name.encode()
            keep += [shape, nm]
            descs[i].name, descs[i].dtype, descs[i].ndim = nm, to_ddo[t.torch_dtype], len(t.shape)
            descs[i].shape = shape
            descs[i].data = t.host.data_ptr() if t.host.numel() > 0 else None
        _native.check(L.ddo_checkpoint_create_from_memory_sized(
            descs, len(tensors), ctypes.sizeof(_lib.TensorDesc), ctypes.byref(ck)))
    try:
        p = ctypes.c_void_p()
        _native.check(L.ddo_profile_workload_context(name.encode(), ck, ctypes.byref(p)))
        return _native.take_text(p)
    finally:
        L.ddo_checkpoint_destroy(ck)


def prepare(module: Any, cfg: _native.Config, source: Any = None) -> Optional[ProfileState]:
    """Applies cfg's profile_name / build_profile to cfg before planning; None when off."""
    name = cfg.get("profile_name")
    build = cfg.get("build_profile") == "true"
    if not name:
        if build:
            raise ValueError("build_profile requires profile_name (a workload name)")
        return None
    L = _native.lib()
    d = profile_dir(cfg.get("profile_dir"))
    context = _context(name, module, source)
    if build:
        _native.check(L.ddo_profile_check_writable(d.encode()))
    status = ctypes.c_int()
    budget = ctypes.c_double()
    measured = _lib.ProfileMeasured()
    cfg._check(L.ddo_profile_apply(cfg.h, d.encode(), context.encode(), ctypes.byref(status),
                                   ctypes.byref(budget), ctypes.byref(measured)))
    word = (L.ddo_profile_status_name(status.value) or b"").decode()
    state = ProfileState(name, d, context, word,
                         budget.value, {"bus_bytes_per_s": measured.bus_bytes_per_s,
                                        "flops_per_s": measured.flops_per_s,
                                        "file_read_bytes_per_s": measured.file_read_bytes_per_s},
                         build)
    if not build:
        rec = _saved_recommendation(d, context)
        uc = rec.get("unit_compute_s")
        state.unit_compute = uc if isinstance(uc, dict) and uc else None
        rate = rec.get("decode_bytes_per_s")
        state.decode_bytes_per_s = float(rate) if isinstance(rate, (int, float)) and rate > 0 \
            else 0.0
    return state


def _saved_recommendation(d: str, context: str) -> Dict[str, Any]:
    """The stored profile's recommendation (a dict; {} without a profile). The planner checks
    the per-unit compute it carries (docs/plan.md)."""
    h = ctypes.c_void_p()
    L = _native.lib()
    if L.ddo_profile_load(d.encode(), context.encode(), ctypes.byref(h)) != 0:
        return {}
    try:
        p = ctypes.c_void_p()
        _native.check(L.ddo_profile_to_json(h, ctypes.byref(p)))
        rec: Any = json.loads(_native.take_text(p)).get("recommendation") or {}
    finally:
        L.ddo_profile_destroy(h)
    return rec if isinstance(rec, dict) else {}


def _cuda_event(torch: Any) -> Any:
    """A timing event on the current stream, recorded now (torch is passed in: imported late)."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


class UnitTimer:
    """Times every unit's forward during a calibration: CUDA events on the current stream
    (recorded after the acquire, so a unit's upload wait is not counted, and before the
    release) on a cuda device, the host clock on the cpu device (the forward runs there)."""

    def __init__(self) -> None:
        self._open: Dict[int, Any] = {}
        self._pass = 0
        # unit -> [(pass, start, end)]: a unit leased several times in one pass (the gathered
        # unit, a packed one: hooked on each module it serves) sums its leases of that pass
        self.samples: Dict[int, List[Tuple[int, Any, Any]]] = {}

    def next_pass(self) -> None:
        """A root forward begins: the leases from here on belong to the next pass."""
        self._pass += 1

    def begin(self, unit: int, device: Any) -> None:
        import torch
        ev: Any
        if device.type == "cuda":
            ev = _cuda_event(torch)
        else:
            ev = time.perf_counter()
        self._open[unit] = ev

    def end(self, unit: int, device: Any) -> None:
        import torch
        start = self._open.pop(unit, None)
        if start is None:
            return
        ev: Any
        if device.type == "cuda":
            ev = _cuda_event(torch)
        else:
            ev = time.perf_counter()
        self.samples.setdefault(unit, []).append((self._pass, start, ev))

    def medians(self, names: Sequence[str], device: Any) -> Dict[str, float]:
        """{unit name: median seconds}: the median over the passes measured of each unit's
        time in a pass (all its leases of that pass)."""
        import torch
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out: Dict[str, float] = {}
        for u, pairs in self.samples.items():
            per_pass: Dict[int, float] = {}
            for k, a, b in pairs:
                s = a.elapsed_time(b) / 1e3 if device.type == "cuda" else b - a
                per_pass[k] = per_pass.get(k, 0.0) + s
            xs = sorted(per_pass.values())
            out[names[u]] = xs[len(xs) // 2]
        return out


def _device_used(res: Any) -> Tuple[int, int]:
    caps = _lib.DeviceCaps()
    _native.check(_native.lib().ddo_device_caps_get(res._dev, ctypes.byref(caps)))
    return caps.total_bytes, caps.free_bytes


@contextlib.contextmanager
def profile_run(res: Any) -> Iterator[Any]:
    """A calibration's measured region: on success the peak is saved as the next run's
    budget. Without a calibration (no profile, or one applied) it only yields."""
    prof = getattr(res, "_profile", None)
    if prof is None or not prof.calibrating:
        yield res
        return
    total, free_start = _device_used(res)
    m0 = res.metrics_snapshot(collect_completed=True)
    copied0 = m0.get("copy_bytes")
    decoded0, decode_ns0 = m0.get("codec_decode_timed_bytes"), m0.get("codec_decode_ns")
    res._timing = UnitTimer()
    t0 = time.perf_counter()
    try:
        yield res
    finally:
        timing, res._timing = res._timing, None
    unit_compute = timing.medians(res._unit_names, res.device)  # synchronizes the device
    wall = time.perf_counter() - t0
    _total, free_end = _device_used(res)
    m = res.metrics_snapshot(collect_completed=True)
    held_peak = int(m.get("device_weights_peak_bytes"))
    # Recorded through the host layer as the tool records (ddo_setup_profile_record): what was
    # in use at the region's start and end are the samples of device use (total - free), and
    # nothing is taken as another user's.
    cal = _lib.ProfileCalibration(
        total_bytes=total, baseline_used_bytes=0,
        used_peak_bytes=max(total - free_start, total - free_end),
        used_end_bytes=total - free_end, weights_peak_bytes=held_peak)
    # The rate the session's copies reached over the region's wall time: in a zero-resident
    # calibration the copy engine is the bottleneck, so this is the bus as ddo's copies get it
    # (per-tensor copies from the module's own pages); a lower bound when the region is not
    # bus-bound, which only makes the next plan more careful.
    copied = m.get("copy_bytes") - copied0
    if copied > 0 and wall > 0:
        cal.achieved_bytes_per_s = copied / wall
    # With weight_codec: the decoder's throughput over the region's timed decodes (device time
    # between events around each launch), the cost model's decode_bytes_per_s next time.
    decoded = m.get("codec_decode_timed_bytes") - decoded0
    decode_ns = m.get("codec_decode_ns") - decode_ns0
    if decoded > 0 and decode_ns > 0:
        cal.decode_bytes_per_s = decoded / (decode_ns / 1e9)
    uc_text = json.dumps(unit_compute).encode() if unit_compute else None
    cal.unit_compute_json = uc_text
    p = ctypes.c_void_p()
    L = _native.lib()
    _native.check(L.ddo_setup_profile_record(res._setup_h, res._cfg.h, ctypes.byref(cal),
                                             ctypes.byref(p)),
                  L.ddo_setup_error(res._setup_h))
    prof.saved_path = _native.take_text(p)
    rec: Dict[str, Any] = {"profile_resident_module_budget_gb": cal.budget_gb}
    if cal.achieved_bytes_per_s > 0:
        rec["bus_bytes_per_s"] = cal.achieved_bytes_per_s
    if cal.decode_bytes_per_s > 0:
        rec["decode_bytes_per_s"] = cal.decode_bytes_per_s
    if unit_compute:
        rec["unit_compute_s"] = unit_compute
    prof.recommendation = rec


def load_profile(name_or_context: str, module: Any = None,
                 profile_dir_: Optional[str] = None) -> Dict[str, Any]:
    """The stored profile (as a dict) of a context JSON, or of a name and its module."""
    ctx = name_or_context if module is None else _context(name_or_context, module, None)
    d = profile_dir(profile_dir_)
    h = ctypes.c_void_p()
    rc = _native.lib().ddo_profile_load(d.encode(), ctx.encode(), ctypes.byref(h))
    _native.check(rc)
    try:
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_profile_to_json(h, ctypes.byref(p)))
        doc: Dict[str, Any] = json.loads(_native.take_text(p))
        return doc
    finally:
        _native.lib().ddo_profile_destroy(h)
