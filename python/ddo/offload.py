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
session), _result_lifecycle (unload, reload, close, teardown, GC, fork), _result_replan (the
activation reserve measured on the first forward, and the one re-plan it can call for).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, ContextManager, Dict, Literal, Optional

import torch

from . import _lease, _native
from ._result_replan import Replan
# Kept importable from here: profiles.py (_collect), _source.py (_Param), tests (_nbytes).
from ._result_ownership import _collect as _collect  # noqa: F401
from ._result_state import MetricsReport as MetricsReport  # noqa: F401
from ._result_state import _nbytes as _nbytes  # noqa: F401
from ._result_state import _Param as _Param  # noqa: F401
from ._result_state import cleanup_boundary as cleanup_boundary


class OffloadResult(Replan):
    """A module whose weights ddo streams (routing.py: enable_offload, enable_dynamic_offload)."""

    def __init__(self, module: torch.nn.Module, cfg: _native.Config, source: Any = None,
                 profile: Any = None,
                 before_session: Optional[Callable[[OffloadResult], None]] = None,
                 device_room: Optional[Callable[[], int]] = None,
                 talk: Optional[Dict[str, Any]] = None) -> None:
        self.module = module
        # talk: what the binding says (_talk): {"label", "progress", "trace", "trace_owner"}.
        self._talk = dict(talk or {})
        self._trace = self._talk.get("trace")
        self._trace_pid = 0
        # before_session(self): called once the plan is built, before the session takes any
        # device memory (enable_pipeline_offload's stager makes room for it there).
        self._before_session = before_session
        # device_room(): device bytes the pipeline's other components hold now that the stager
        # unloads before this session takes its memory; the plan counts them as free.
        self._device_room = device_room
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
        self._state = "new"
        # Upstream's result fields (the route layer, routing.py, sets them for its routes).
        self.hook = self
        self.route = "dynamic_offload"
        self.settings = None
        self.should_move_to_execution_device = False
        self.event_payload = {}
        self._pid = os.getpid()  # the process whose session this is (fork: _lease)
        self._fresh()
        _lease.sweep()
        # Setup and commit in one shield: an interrupt anywhere in them is raised at its end,
        # inside this try, and the teardown leaves the module exactly as it was.
        try:
            with _lease.shield():
                self._setup()
                self._commit()
                self._arm_replan()
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
