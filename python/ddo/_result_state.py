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
from typing import Any, Callable, Dict, Optional, TypeVar, Union

import torch

from . import _enums, _lease, _lib, _native, _talk
from ._native import DdoError

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
    def run(*args, **kwargs):
        with _lease.shield():
            return fn(*args, **kwargs)
    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    run.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    run.__wrapped__ = fn  # type: ignore[attr-defined]  # inspect.signature: the real one
    return run  # type: ignore[return-value]


def _managed_by(p):
    """The tag of the result that manages Parameter p (None: none)."""
    entry = _MANAGED.get(id(p))
    return entry[1] if entry is not None and entry[0]() is p else None


class MetricsReport:
    """A metrics snapshot: ``as_dict()`` (the versioned JSON) and ``format_profile()``."""

    def __init__(self, handle, component=None, binding=None):
        self._h = handle
        self._component = component
        self._binding = binding  # what the binding itself did (unmanaged tensors)

    def __del__(self):
        if getattr(self, "_h", None) is not None and _native._LIB is not None:
            _native._LIB.ddo_metrics_destroy(self._h)
            self._h = None

    def as_dict(self) -> Dict[str, Any]:
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_metrics_to_json(
            self._h, self._component.encode() if self._component else None, ctypes.byref(p)))
        d = json.loads(_native.take_text(p))
        if self._binding is not None:
            d["binding"] = dict(self._binding)
        return d

    def get(self, name: str) -> float:
        v = ctypes.c_double()
        _native.check(_native.lib().ddo_metrics_get(self._h, name.encode(), ctypes.byref(v)))
        return v.value

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
def cleanup_boundary(unload, value=None):
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
                e.add_note(note)
            else:
                e.__ddo_cleanup_error__ = ce
        raise


class _Param:
    """One ddo tensor and the Parameters (tied ones included) that show it."""
    __slots__ = ("index", "params", "dtype_name", "torch_dtype", "shape", "host", "placement",
                 "unit", "name")

    def __init__(self, index, name, host, dtype_name):
        self.index = index
        self.name = name
        self.params = []
        self.host = host
        self.dtype_name = dtype_name
        self.torch_dtype = host.dtype
        self.shape = tuple(host.shape)
        self.placement = _PLACEMENT_STREAMED
        self.unit = None


def _nbytes(t):
    """The bytes of ddo tensor t (its shape and dtype)."""
    n = 1
    for d in t.shape:
        n *= d
    return n * torch.empty(0, dtype=t.torch_dtype).element_size()


class ResultState:
    """The fields of an OffloadResult (set in OffloadResult.__init__ and its setup) and the
    plan's queries."""

    def _label(self):
        return self._talk.get("label") or type(self.module).__name__

    def _alive(self, what):
        if self._state == "closed":
            raise DdoError("DDO_E_STATE", f"{what}: this OffloadResult is closed")

    def _plan_json(self):
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
        out = {}
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
