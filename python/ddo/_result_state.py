"""OffloadResult's record (internal): the fields every part of the result shares, the plan's
queries, and the small pieces the parts share (the tensor record, the placements, the
managed-Parameter registry, the shield decorator, the metrics report).

OffloadResult (offload.py) is composed, one layer over the other, from: this record;
_result_ownership (host memory: the checkpoint over the module's tensors, the copies the
session owns, buffers moved once); _result_views (device views and empty placeholders);
_result_leases (what the hooks do at run time: claim, acquire, release, restore);
_result_hooks (where the hooks go and the refusals installed with them); _result_setup
(config, plan and session creation); _result_lifecycle (unload, reload, close, teardown).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
from typing import (Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, TypeVar,
                    Union)

import torch

from . import _devices, _enums, _lease, _lib, _native, _talk
from ._lora import Lora
from ._native import DdoError
from ._talk import Trace

_PLACEMENT_RESIDENT = _enums.DDO_PLACEMENT_RESIDENT
_PLACEMENT_STREAMED = _enums.DDO_PLACEMENT_STREAMED
_PLACEMENT_SKIPPED = _enums.DDO_PLACEMENT_SKIPPED
# id of every Parameter a live OffloadResult manages -> (a weak reference to it, a tag naming
# that result): one module tree is managed by one session (its parent or child is refused).
# (Not a WeakKeyDictionary: that compares tensors with ==.)
_MANAGED: Dict[int, Any] = {}


_F = TypeVar("_F", bound=Callable[..., Any])


def _shielded(fn: _F) -> _F:
    """fn's state changes whole: a signal inside it is handled at its end (_lease.shield)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        with _lease.shield():
            return fn(*args, **kwargs)
    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    run.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    run.__wrapped__ = fn  # type: ignore[attr-defined]  # inspect.signature: the real one
    return run  # type: ignore[return-value]


def _managed_by(p: torch.Tensor) -> Optional[str]:
    """The tag of the result that manages Parameter p (or a wrapper's inner tensor p; None:
    none)."""
    entry = _MANAGED.get(id(p))
    return str(entry[1]) if entry is not None and entry[0]() is p else None


class MetricsReport:
    """A metrics snapshot: ``as_dict()`` (the versioned JSON) and ``format_profile()``."""

    def __init__(self, handle: ctypes.c_void_p, component: Optional[str] = None,
                 binding: Optional[Dict[str, Any]] = None) -> None:
        self._h: Optional[ctypes.c_void_p] = handle
        self._component = component
        self._binding = binding  # what the binding itself did (unmanaged tensors)

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None and _native._LIB is not None:
            _native._LIB.ddo_metrics_destroy(self._h)
            self._h = None

    def as_dict(self) -> Dict[str, Any]:
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_metrics_to_json(
            self._h, self._component.encode() if self._component else None, ctypes.byref(p)))
        d: Dict[str, Any] = json.loads(_native.take_text(p))
        if self._binding is not None:
            d["binding"] = dict(self._binding)
        return d

    def get(self, name: str) -> float:
        v = ctypes.c_double()
        _native.check(_native.lib().ddo_metrics_get(self._h, name.encode(), ctypes.byref(v)))
        return float(v.value)

    def format_profile(self, verbose: bool = False) -> str:
        """The profile for people: empty keys dropped; the planner's decisions wrapped under
        verbose=True, else one line saying how many there are."""
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_metrics_format_profile(self._h, ctypes.byref(p)))
        return _talk.tidy_profile(_native.take_text(p), verbose)

    def record(self, path: Union[str, "os.PathLike[str]"],
               component: Optional[str] = None) -> None:
        """Appends the snapshot as one JSON line to path (record_ddo_metrics)."""
        comp = component or self._component
        _native.check(_native.lib().ddo_metrics_record(
            self._h, comp.encode() if comp else None, str(path).encode()))


@contextlib.contextmanager
def cleanup_boundary(unload: Callable[[], Any], value: Any = None) -> Iterator[Any]:
    """An error-only boundary (yields value): on an exception, call unload once and
    re-raise the original; a failing unload is attached to it as a note (never replaces it)."""
    try:
        yield value
    except BaseException as e:
        try:
            unload()
        except Exception as ce:  # the original error is what the caller needs
            note = f"ddo cleanup (unload) also failed: {ce}"
            if hasattr(e, "add_note"):
                e.add_note(note)  # (Python >= 3.11)
            else:
                e.__ddo_cleanup_error__ = ce  # type: ignore[attr-defined]
        raise


class _Param:
    """One ddo tensor and the Parameters (tied ones included) that show it."""
    __slots__ = ("index", "params", "dtype_name", "torch_dtype", "shape", "host", "placement",
                 "unit", "name", "offset")

    index: int
    name: str
    params: List[torch.nn.Parameter]
    host: Optional[torch.Tensor]  # None: the session's own copy (weight_codec), or the file's
    dtype_name: str
    torch_dtype: torch.dtype
    shape: Tuple[int, ...]
    placement: int
    unit: Optional[int]
    offset: int  # its bytes' offset in its unit (streamed)

    def __init__(self, index: int, name: str, host: torch.Tensor, dtype_name: str) -> None:
        self.index = index
        self.name = name
        self.params = []
        self.host = host
        self.dtype_name = dtype_name
        self.torch_dtype = host.dtype
        self.shape = tuple(host.shape)
        self.placement = _PLACEMENT_STREAMED
        self.unit = None
        self.offset = 0


def _nbytes(t: _Param) -> int:
    """The bytes of ddo tensor t (its shape and dtype)."""
    n = 1
    for d in t.shape:
        n *= d
    return n * int(torch.empty(0, dtype=t.torch_dtype).element_size())


class ResultState:
    """The fields of an OffloadResult (set in OffloadResult.__init__ and its setup) and the
    plan's queries. (Declared here, set there: a field some parts set only on one path, such
    as _lora or _file_backed, is read with getattr and a default.)"""

    # ---- public fields ----
    module: torch.nn.Module
    plan: Dict[str, Any]  # the plan as JSON (ddo_plan_to_json)
    device: Optional[torch.device]
    vmm: bool  # tensors keep their device address for the session (the VMM routes)
    dequant_scratch: Dict[str, Any]
    unmanaged_bytes: int
    host_bytes_released: int
    device_bytes_after_close: Optional[int]
    device_note: str
    # Upstream's result fields (the route layer, routing.py, sets them for its routes).
    hook: Any
    route: str
    settings: Any
    should_move_to_execution_device: bool
    event_payload: Dict[str, Any]
    route_policy: Dict[str, Any]
    ownership: Any
    component: str
    profile_run: Callable[[], Any]

    # ---- configuration and talk ----
    _cfg: _native.Config
    _talk: Dict[str, Any]
    _trace: Optional[Trace]
    _trace_pid: int
    _trace_t: Dict[Tuple[int, ...], int]
    _show_profile: Tuple[bool, bool]
    _before_session: Optional[Callable[[Any], None]]
    _device_room: Optional[Callable[[], int]]
    _profile: Any  # profiles.ProfileState
    _timing: Any  # profiles.UnitTimer while profile_run() or the second forward measures
    _timed_compute: Dict[str, float]  # the units' compute the 2nd forward timed (_result_replan)
    _reserve_due: bool  # the first forward's measured reserve calls for the re-plan
    _reserve_said: str  # what the first forward's reserve measurement said ("" if none)
    _compute_measured: Optional[str]  # where the plan's unit compute came from: profile,
    # second_forward, or None (FLOP estimates)
    _source: Any  # a checkpoint path the parameters are read from (_source.py)
    _origin: torch.device  # where the module was (routing.py)
    _unit_compute_text: bytes

    # ---- native handles (None: not made, or handed over) ----
    _setup_h: Optional[ctypes.c_void_p]
    _dev: Optional[ctypes.c_void_p]
    _ck: Optional[ctypes.c_void_p]
    _plan: Optional[ctypes.c_void_p]
    _session: Optional[ctypes.c_void_p]
    _store: Optional[_devices.StoreDevice]
    _share: Optional[_devices.Share]
    _unit_shares: Dict[int, int]
    _streams: Dict[Optional[int], ctypes.c_void_p]
    _plan_info: _lib.PlanInfo
    _names: List[bytes]
    _shapes: List[Any]  # the checkpoint's shape arrays (kept alive with it)

    # ---- the tensors, the units and the module tree ----
    _tensors: List[_Param]
    _ddo_path: Dict[str, str]  # module name -> ddo's name for it
    _modules_of: Dict[int, List[torch.nn.Module]]  # id(Parameter) -> modules holding it
    _entry_of: Dict[int, _Param]  # id(Parameter) -> its tensor
    _unit_count: int
    _unit_names: List[str]
    _unit_tensors: List[List[_Param]]
    _root_units: Tuple[int, ...]
    _hooked: List[Tuple[str, Tuple[int, ...]]]
    _file_backed: Set[int]  # _source.py: tensors read from the file
    _source_ck_reader: Callable[[_Param], torch.Tensor]
    _source_restore: Optional[Callable[[], None]]

    # ---- bindings: views, placeholders, versions ----
    _views: Dict[Tuple[int, Optional[int]], torch.Tensor]
    _view_ptrs: Dict[int, str]
    # unit -> how its tensors are cut from one view of the unit (_result_views.UnitCut; None:
    # a view per tensor, e.g. on a route that maps each weight apart)
    _unit_cuts: Dict[int, Any]
    # unit -> its Parameters (tied ones, wrappers' inner tensors), their ids and placeholders
    _unit_ps: Dict[int, Any]
    _placeholders: Dict[Tuple[torch.dtype], torch.Tensor]
    _ph_versions: Dict[int, int]
    _res_versions: List[Tuple[torch.nn.Parameter, int, str]]
    _versions: Dict[int, List[int]]
    _moved: List[Tuple[Any, ...]]  # ("param", t) or ("buffer", module, name, host buffer)
    _recast: bool

    # ---- leases and their owner ----
    _state: str  # "new", "ready", "unloaded", "closed"
    _lock: threading.Lock
    _owner: Optional[List[int]]  # [thread ident, depth]
    _in_root: int
    _frames: List[Tuple[int, ...]]
    _entered: Set[Tuple[int, ...]]
    _dirty: bool
    _leases: Dict[int, int]
    _pinned: Dict[int, bool]
    _observed: Optional[List[int]]
    _pid: int

    # ---- what setup installed (undone by the teardown) ----
    _handles: List[Any]
    _own_forward: Any
    _orig_forward: Any
    _own_methods: List[Tuple[torch.nn.Module, str, Any]]
    _grad_hooks_armed: bool
    _lora: Lora
    _managed_tag: str

    def _label(self) -> str:
        return str(self._talk.get("label") or type(self.module).__name__)

    def _alive(self, what: str) -> None:
        if self._state == "closed":
            raise DdoError("DDO_E_STATE", f"{what}: this OffloadResult is closed")

    def _plan_json(self) -> str:
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_plan_to_json(self._plan, ctypes.byref(p)))
        return _native.take_text(p)

    def budgets(self) -> Dict[str, int]:
        """The plan's predicted peaks and limits (bytes), as a dict."""
        self._alive("budgets")
        b = _lib.PlanBudgets()
        _native.check(_native.lib().ddo_plan_budgets_get(self._plan, ctypes.byref(b)))
        return {k: getattr(b, k) for k, _ in _lib.PlanBudgets._fields_}

    def metrics_snapshot(self, collect_completed: bool = False,
                         component: Optional[str] = None) -> MetricsReport:
        """A MetricsReport of the session (collect_completed retires finished uploads)."""
        self._alive("metrics_snapshot")
        m = ctypes.c_void_p()
        L = _native.lib()
        _native.check(L.ddo_session_metrics(self._session, bool(collect_completed),
                                            ctypes.byref(m)), L.ddo_session_error(self._session))
        return MetricsReport(m, component, {"unmanaged_bytes": self.unmanaged_bytes,
                                            "unmanaged_tensors": len(self._moved),
                                            "host_bytes_released": self.host_bytes_released})

    def stable_addresses(self) -> Dict[str, Optional[int]]:
        """tensor name -> session-long device address on the VMM routes ({} on linear)."""
        self._alive("stable_addresses")
        if not self.vmm:
            return {}
        out: Dict[str, Optional[int]] = {}
        addr = ctypes.c_void_p()
        L = _native.lib()
        for t in self._tensors:
            if t.placement == _PLACEMENT_SKIPPED:
                continue
            _native.check(L.ddo_session_tensor_stable_address(self._session, t.index,
                                                              ctypes.byref(addr)),
                          L.ddo_session_error(self._session))
            out[t.name] = addr.value
        return out
