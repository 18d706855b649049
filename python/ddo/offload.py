"""enable_offload: a torch.nn.Module's weights streamed through a ddo session.

How it works (docs/python.md has the whole story):
  - The module's CPU tensors become a ddo checkpoint in host memory (one tensor per storage:
    tied weights are one). The session registers them in place (no second host copy), so the
    copy engine reads the module's own pages; they stay the module's, 1 x the model in RAM.
    With weight_codec the session codes them into host memory of its own instead, and the
    module's copies of the coded tensors are let go (close() reads them back, decoded).
  - The plan's units (blocks or leaves) are found in the module tree. A forward pre-hook on
    each unit's module acquires the unit on torch's current stream and binds its parameters
    to views of ddo's device memory (``param.data = view``: every Parameter keeps its
    identity); the forward hook puts empty placeholders back and releases the unit. Resident
    tensors are bound once; buffers and skipped tensors are moved to the device once.
  - The execution order is declared from the plan; the session prefetches ahead.

The result is composed in layers, one module per responsibility (each an internal module):
_result_state (the shared record and the plan's queries), _result_ownership (host memory),
_result_views (views and placeholders), _result_leases (the hooks' run-time work: acquire,
release), _result_hooks (installing hooks and refusals), _result_setup (config, plan,
session), _result_lifecycle (unload, reload, close, teardown, GC, fork).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, ContextManager, Dict, Literal, Optional

import torch

from . import _lease, _native
from ._result_lifecycle import Lifecycle
# Kept importable from here: profiles.py (_collect), _source.py (_Param), tests (_nbytes).
from ._result_ownership import _collect as _collect  # noqa: F401
from ._result_state import _MANAGED
from ._result_state import MetricsReport as MetricsReport  # noqa: F401
from ._result_state import _nbytes as _nbytes  # noqa: F401
from ._result_state import _Param as _Param  # noqa: F401
from ._result_state import cleanup_boundary as cleanup_boundary


class OffloadResult(Lifecycle):
    """A module whose weights ddo streams (routing.py: enable_offload, enable_dynamic_offload)."""

    def __init__(self, module: torch.nn.Module, cfg: _native.Config, source: Any = None,
                 profile: Any = None,
                 before_session: Optional[Callable[[OffloadResult], None]] = None,
                 talk: Optional[Dict[str, Any]] = None) -> None:
        self.module = module
        # talk: what the binding says (_talk): {"label", "progress", "trace", "trace_owner"}.
        self._talk = dict(talk or {})
        self._trace = self._talk.get("trace")
        self._trace_pid = 0
        # before_session(self): called once the plan is built, before the session takes any
        # device memory (enable_pipeline_offload's stager makes room for it there).
        self._before_session = before_session
        self._cfg = cfg
        # read now: close() can run from __del__, after the config's own handle is gone
        self._show_profile = (cfg.get("show_profile") == "true", cfg.get("verbose") == "true")
        # profile: what profiles.prepare() found (measured rates and per-unit compute feed
        # the plan's cost model); profile_run() times every unit's forward (_timing).
        self._profile = profile
        self._timing = None
        # source: a checkpoint path (file, sharded index, folder) the module's parameters
        # (meta tensors) are read from, instead of the module's CPU tensors (_source.py).
        self._source = source
        self._lock = threading.Lock()
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
        self._state = "new"
        self._ck = self._dev = self._plan = self._session = self._setup_h = None
        self._store = None  # donor mode's store device (_devices.py)
        self._streams = {}
        self._views = {}
        self._placeholders = {}
        self._moved = []
        self._versions = {}
        # Upstream's result fields (the route layer, routing.py, sets them for its routes).
        self.hook = self
        self.route = "dynamic_offload"
        self.settings = None
        self.should_move_to_execution_device = False
        self.event_payload = {}
        self.device = None
        self.unmanaged_bytes = 0
        self.host_bytes_released = 0
        self.device_bytes_after_close = None
        self.device_note = ""
        self._grad_hooks_armed = False
        self._pid = os.getpid()  # the process whose session this is (fork: _lease)
        self._pinned = {}  # units kept leased in C while a view of them escaped (_release)
        self._entered = set()  # the hooked unit groups entered in this root forward
        self._hooked = []  # (module name, units) of every hooked module but the root
        self._view_ptrs = {}  # storage address of every live view -> its tensor's name
        self._unit_cuts = {}  # per unit: its tensors cut from one unit view (_result_views)
        self._unit_ps = {}  # per unit: its Parameters, their ids and placeholders
        _lease.sweep()
        # Setup and commit in one shield: an interrupt anywhere in them is raised at its end,
        # inside this try, and the teardown leaves the module exactly as it was.
        try:
            with _lease.shield():
                self._setup()
                setattr(module, "_ddo_offload", self)  # (torch's Module.__setattr__ types)
                self._managed_tag = f"{type(module).__name__} at 0x{id(self):x} " \
                                    f"(enable_offload)"
                for t in self._tensors:
                    for p in t.params:
                        _MANAGED[id(p)] = (weakref.ref(p), self._managed_tag)
                self._state = "ready"
        except BaseException:
            with _lease.shield():
                self._state = "closed"  # never torn down twice (__del__ included)
                self._teardown()
            raise

    def cleanup_on_error(self) -> ContextManager[OffloadResult]:
        """On an exception: unload once, re-raise the original (a cleanup error becomes a note)."""
        return cleanup_boundary(self.unload, self)

    def __enter__(self) -> OffloadResult:
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return (f"<OffloadResult {type(self.module).__name__} route={self.plan.get('route')} "
                f"device={self.device} units={self._unit_count} state={self._state}>")
