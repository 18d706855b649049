"""OffloadResult's leases (internal): what the forward hooks do at run time.

One thread at a time works on the session: the owner, from the first hook or forward that
claims it to the last that lets go (depth). The root forward acquires the units hooked on the
root module itself around the whole call; other units are acquired by their modules'
pre-hooks and released by their forward hooks. A pre-hook that succeeded pushes its units on
the owner's frame stack, and only the forward hook of a frame on the stack releases anything
(torch >= 2.1 calls always_call hooks after a failed pre-hook too). Any error in a root
forward aborts: every lease released, a written device copy restored while the owner still
holds the session, then the owner cleared.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable, Dict, Iterable, List, NoReturn, Optional, Sequence, Tuple

import torch

from . import _lease, _native, _talk, _torch
from ._native import DdoError
from ._quant import _no_torch_function
from ._result_state import _PLACEMENT_SKIPPED, _shielded
from ._result_views import Views

_FORWARD_CODE: Optional[CodeType] = None  # the code of the forward enable_offload installs (_root_on_stack)


class Leases(Views):
    """Claims, acquires and releases; the root forward's begin and end."""

    def _stream(self) -> ctypes.c_void_p:
        assert self.device is not None  # (set by the setup, before any lease)
        native = _torch.current_stream_handle(self.device)
        st = self._streams.get(native)
        if st is None:
            st = ctypes.c_void_p()
            _native.check(_native.lib().ddo_stream_wrap(
                self._dev, ctypes.c_void_p(native) if native else None, ctypes.byref(st)))
            self._streams[native] = st
        return st

    def _claim(self) -> None:
        me = threading.get_ident()
        with self._lock:
            if self._owner is not None and self._owner[0] != me:
                raise DdoError("DDO_E_BUSY", "a forward of this module is already running on "
                               "another thread: one forward at a time per OffloadResult")
            if self._owner is None:
                self._owner = [me, 0]
                self._frames = []
            self._owner[1] += 1

    def _unclaim(self) -> None:
        """Ends one claim; the outermost restores a written copy (no lease held) and then lets
        the session go."""
        with self._lock:
            if self._owner is None or self._owner[0] != threading.get_ident():
                return
            self._owner[1] -= 1
            if self._owner[1] > 0:
                return
        self._let_go()

    def _let_go(self) -> None:
        """The owner's last step: a written copy restored while it still holds the session,
        then the owner, its frames and root depth cleared."""
        try:
            if self._dirty and not self._leases and self._state == "ready":
                self._restore()
        finally:
            with self._lock:
                self._owner = None
                self._frames = []
                self._in_root = 0

    @_shielded
    def _abort(self) -> None:
        """After an error in a root forward: every lease released unchecked, then _let_go."""
        with self._lock:
            mine = self._owner is not None and self._owner[0] == threading.get_ident()
        if not mine or _lease.forked(self._pid):  # another thread's, or a parent's
            return
        if self._observed:
            self._observed = []  # a forward that raised: its order is observed again
        try:
            for u in list(self._leases):
                self._release(u, check=False, whole=True)
        finally:
            self._let_go()

    def _restore(self) -> None:
        """A device copy was written in place (refused): the session drops and uploads its
        weights again from the host copy (unload + reload), so later forwards read the
        checkpoint's values, not the refused write. A failed reload leaves the result
        unloaded (reload() tries again)."""
        self._dirty = False
        self._unbind_all()
        self._release_pins()
        if self._pinned or self._escaped_views():  # never free under a live view: later
            self._dirty = True
            self._bind_residents()
            return
        L = _native.lib()
        _native.check(L.ddo_session_unload(self._session), L.ddo_session_error(self._session))
        self._state = "unloaded"
        _native.check(L.ddo_session_reload(self._session), L.ddo_session_error(self._session))
        self._state = "ready"
        self._make_views()
        self._bind_residents()

    def _not_in_forward(self, what: str) -> None:
        """Refuses what while a forward of the module runs (on any thread)."""
        with self._lock:
            owner = self._owner
        if owner is None:
            return
        if owner[0] == threading.get_ident() and not self._root_on_stack():
            self._abort()  # a claim left by an interrupt or a unit called alone: no forward
            return
        raise DdoError("DDO_E_BUSY", f"{what}: a forward of {type(self.module).__name__} "
                       f"is running; call {what}() after it returns")

    def _root_forward(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """The module's forward as enable_offload installs it: the root units acquired
        around orig (_begin, _end), any error aborting every lease (_abort)."""
        result = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            try:  # _begin inside: an interrupt right after it still aborts
                result._begin()
                if torch.is_grad_enabled():  # no view of ddo's memory saved for backward
                    result._arm_grad_hooks()
                    with _lease.saved_tensors(result):
                        out = orig(*args, **kwargs)
                else:
                    out = orig(*args, **kwargs)
            except BaseException as e:
                result._abort()
                result._note_unentered(e)
                raise
            result._end()
            return out

        def root(*args: Any, **kwargs: Any) -> Any:
            return result._root_call(forward, args, kwargs)

        global _FORWARD_CODE
        _FORWARD_CODE = forward.__code__  # one def: the same code for every result
        return _torch.no_compile(root)

    def _root_call(self, fn: Callable[..., Any], args: Tuple[Any, ...],
                   kwargs: Dict[str, Any]) -> Any:
        """One root forward (fn: _root_forward's); _result_replan measures the first one and
        re-plans before the next where that forward calls for it."""
        return fn(*args, **kwargs)

    def _root_on_stack(self) -> bool:
        """A root forward of this result is running on this thread's stack (its frame is
        live): else a root depth left over (an interrupt that landed where no handler could
        release) is stale."""
        f: Optional[FrameType] = sys._getframe(2)
        while f is not None:
            if f.f_code is _FORWARD_CODE and f.f_locals.get("result") is self:
                return True
            f = f.f_back
        return False

    @_shielded
    def _begin(self) -> None:
        _lease.check_fork(self._pid, f"{type(self.module).__name__} forward")
        with self._lock:
            mine = self._owner is not None and self._owner[0] == threading.get_ident()
        stale = mine and (self._in_root == 0 or not self._root_on_stack())
        if stale:  # a unit's module called directly raised (torch without always_call)
            self._abort()
        if self._state != "ready":
            self._refuse()
        self._claim()
        self._in_root += 1
        try:
            if self._in_root == 1:
                self._entered = set()
                if self._timing is not None:
                    self._timing.next_pass()
                L = _native.lib()  # a unit's later leases of this pass move no window
                _native.check(L.ddo_session_begin_pass(self._session),
                              L.ddo_session_error(self._session))
                self._release_pins()
                if self._dirty and not self._leases:  # a restore a live view put off
                    self._restore()
                self._check_residents()  # a write between forwards, before this one computes
            for u in self._root_units:
                self._acquire(u)
        except BaseException:
            self._abort()
            raise

    @_shielded
    def _end(self) -> None:
        """The root forward returned: its units released (checked), the residents checked; the
        outermost root forward ends every claim made inside it (a unit's module that raised
        inside and was caught keeps none)."""
        try:
            self._release_all(reversed(self._root_units))
            self._in_root -= 1
            if self._in_root > 0:
                self._unclaim()
                return
            for u in list(self._leases):  # left by a hook that did not run
                self._release(u, check=False, whole=True)
            if getattr(self, "_recast", False):
                self._rebind_recast()
            self._check_residents()
            if self._observed is not None:
                self._declare_observed()
        except BaseException:
            self._abort()
            raise
        self._let_go()

    def _refuse(self) -> NoReturn:
        if self._state == "unloaded":
            raise DdoError("DDO_E_STATE", f"{type(self.module).__name__}: ddo unloaded its "
                           f"weights: call reload() before a forward")
        raise DdoError("DDO_E_STATE", f"{type(self.module).__name__}: this OffloadResult is "
                       f"closed: its module runs unmanaged again only through its own forward")

    @_shielded
    def _enter(self, units: Tuple[int, ...], args: Sequence[Any] = ()) -> None:
        _lease.check_fork(self._pid, f"{type(self.module).__name__} forward")
        if self._in_root == 0 and _lease.needs_grad(
                args, [p for u in units for t in self._unit_tensors[u] for p in t.params]):
            raise DdoError("DDO_E_UNSUPPORTED", f"unit {self._unit_names[units[0]]} called "
                           f"outside its module's forward with grad mode on: "
                           f"{_lease.INFERENCE_ONLY}")
        self._claim()
        acquired: List[int] = []
        try:
            if self._state != "ready":
                self._refuse()
            if self.device is not None and _torch.capturing(self.device):
                raise DdoError("DDO_E_STATE", "acquire inside a CUDA-graph capture: ddo cannot "
                               "upload weights while a graph is captured (capture the compiled "
                               "blocks, not the hooks)")
            for u in units:
                self._acquire(u)
                acquired.append(u)
        except BaseException:
            for u in reversed(acquired):
                self._release(u, check=False)
            self._unclaim()
            raise
        self._frames.append(units)
        self._entered.add(units)
        if self._trace is not None:
            self._trace_t[units] = time.monotonic_ns()
        if self._timing is not None and len(units) == 1:
            self._timing.begin(units[0], self.device)

    @_shielded
    def _leave(self, units: Tuple[int, ...], out: Any = None) -> None:
        with self._lock:
            mine = self._owner is not None and self._owner[0] == threading.get_ident()
        if not mine or not self._frames or self._frames[-1] is not units:
            return  # its pre-hook did not succeed (refused, or an earlier pre-hook raised)
        self._frames.pop()
        if self._trace is not None and units in self._trace_t:
            self._trace.span(self._trace_pid, _talk.TID_COMPUTE,
                             "+".join(self._unit_names[u] for u in units), "compute",
                             self._trace_t.pop(units), time.monotonic_ns())
        failed = out is None and sys.exc_info()[0] is not None  # always_call after a raise
        if self._timing is not None and len(units) == 1 and not failed:
            self._timing.end(units[0], self.device)
        try:
            self._release_all(reversed(units), check=not failed)
        finally:
            self._unclaim()

    def _release_all(self, units: Iterable[int], check: bool = True) -> None:
        """Releases each unit once; the first refusal is raised after all were released."""
        first: Optional[DdoError] = None
        for u in units:
            try:
                self._release(u, check=check)
            except DdoError as e:
                first = first or e
        if first is not None:
            raise first

    def _acquire(self, u: int) -> None:
        n = self._leases.get(u, 0)
        if n > 0:
            self._leases[u] = n + 1
            return
        err = self._unit_placeholder_writes(u)
        if err is not None:
            raise err
        L = _native.lib()
        if self._pinned.pop(u, None) is None:  # a pinned unit is still leased in C
            t0 = time.monotonic_ns() if self._trace is not None else 0
            rc = L.ddo_session_acquire(self._session, u, self._stream())
            if rc != 0 and self._pinned and _native.error_name(rc) == "DDO_E_BUSY":
                raise DdoError("DDO_E_BUSY", f"acquire {self._unit_names[u]}: every execution "
                               f"slot is leased, {len(self._pinned)} of them by units whose "
                               f"weights are still viewed outside their forward "
                               f"({', '.join(self._unit_names[k] for k in self._pinned)}): drop "
                               f"those tensors (or keep .clone()s)")
            _native.check(rc, L.ddo_session_error(self._session) if rc else None)
            if self._trace is not None:
                self._trace.span(self._trace_pid, _talk.TID_ACQUIRE, self._unit_names[u],
                                 "acquire", t0, time.monotonic_ns())
        self._leases[u] = 1
        if self._share is not None:
            self._gather(u)
        if self._observed is not None and u not in self._observed:
            self._observed.append(u)
        self._bind_unit(u)
        if getattr(self, "_lora", None) is not None:
            self._lora.bound(self._unit_tensors[u])  # merged LoRAs replayed on fresh copies
        with _no_torch_function():  # (see _result_views._unit_to_placeholder)
            self._versions[u] = [p._version for p in self._unit_params(u)[0]]

    def _gather(self, u: int) -> None:
        """Share mode: the group's all-gather completes the unit this rank holds a share of
        (on every first lease, so every rank issues the same collectives in the same order)."""
        share = self._unit_shares.get(u)
        if share is None:
            n = ctypes.c_uint64(0)
            _native.check(_native.lib().ddo_session_unit_share(self._session, u, ctypes.byref(n)),
                          _native.lib().ddo_session_error(self._session))
            share = self._unit_shares[u] = n.value
        if share:
            assert self._share is not None  # (called in share mode only)
            self._share.gather(_torch.unit_view(self._session, u), share)

    def _release(self, u: int, check: bool = True, whole: bool = False) -> None:
        """One lease of u ends (whole: every one); the last checks the unit's versions."""
        n = self._leases.get(u, 0)
        if n == 0:
            return
        if n > 1 and not whole:
            self._leases[u] = n - 1
            return
        del self._leases[u]
        before = self._versions.pop(u, None)
        with _no_torch_function():  # (see _result_views._unit_to_placeholder)
            changed = before is not None and \
                [p._version for p in self._unit_params(u)[0]] != before
        self._unit_to_placeholder(u)
        if changed:
            self._dirty = True  # restored when no lease is held (_unclaim, _abort)
        L = _native.lib()
        if L.ddo_session_unit_view_count(self._session, u):
            # A view of the unit escaped its lease (a hook, a cache kept p.data): the unit
            # stays leased in C, so its memory is neither reused nor remapped while the view
            # lives; released once it died (_release_pins), or re-leased by its next forward.
            self._pinned[u] = True
        else:
            rc = L.ddo_session_release(self._session, u, self._stream())
            _native.check(rc, L.ddo_session_error(self._session) if rc else None)
        if changed and check:
            raise DdoError("DDO_E_STATE", f"unit {self._unit_names[u]}: a streamed weight was "
                           f"written in place during the forward; ddo re-uploads weights from "
                           f"the host copy, so the change would be lost (merge such changes "
                           f"into the host module before enable_offload); the device copy is "
                           f"restored")

    def _release_pins(self) -> None:
        """Units kept leased for an escaped view: released in C once their views died."""
        L = _native.lib()
        for u in list(self._pinned):
            if not L.ddo_session_unit_view_count(self._session, u):
                del self._pinned[u]
                _native.check(L.ddo_session_release(self._session, u, self._stream()),
                              L.ddo_session_error(self._session))

    def _arm_grad_hooks(self) -> None:
        """A gradient for a managed weight raises one clear error (_lease.INFERENCE_ONLY).
        Registered at the first forward run with grad mode on, so a module used for inference
        only (torch.compile included) never carries a tensor hook."""
        if self._grad_hooks_armed:
            return
        with _lease.shield():
            for t in self._tensors:
                if t.placement != _PLACEMENT_SKIPPED:
                    for p in t.params:
                        if p.requires_grad:
                            param: Any = p  # (torch 1.13 leaves register_hook unannotated)
                            self._handles.append(param.register_hook(_lease.refuse_grad))
            self._grad_hooks_armed = True

    def _note_unentered(self, e: BaseException) -> None:
        """A failed forward in which hooked modules never ran: their weights were off the
        device (empty placeholders) if a parent read them itself; the error says which."""
        if not isinstance(e, RuntimeError) or isinstance(e, DdoError):
            return
        missing = [name for name, units in self._hooked if units not in self._entered]
        if not missing:
            return
        note = (f"ddo: the forward failed while these modules' forwards had not run, so their "
                f"streamed weights were off the device: {', '.join(missing[:6])}"
                f"{' ...' if len(missing) > 6 else ''}; if a parent module reads their weights "
                f"itself (a functional call), enable_offload with unit_granularity='block' "
                f"so the unit is the parent, or list the parent in always_resident_modules_pattern")
        if hasattr(e, "add_note"):
            e.add_note(note)  # (Python >= 3.11)
        else:
            e.args = (f"{e.args[0] if e.args else ''}\n{note}",) + tuple(e.args[1:])

    def _declare(self, units: Iterable[int]) -> None:
        order_list = list(units)
        order = (ctypes.c_size_t * len(order_list))(*order_list)
        _native.check(_native.lib().ddo_session_declare_order(self._session, order,
                                                              len(order_list)),
                      _native.lib().ddo_session_error(self._session))

    def _declare_observed(self) -> None:
        """After the first root forward that acquired units: where they were acquired in
        another order than the plan's, that order is declared (the units no forward acquired
        after it, in the plan's order). Else the session prefetches by the plan's order at
        every pass: on the VMM routes a unit then misses its prefetch where the order differs,
        and the slots its range maps shift each pass (remaps)."""
        seen, self._observed = self._observed, None
        if not seen:
            self._observed = []  # nothing acquired yet (every unit resident, or none called)
            return
        if seen == sorted(seen):
            return  # the plan's order (units no forward acquired, resident ones, aside)
        seen_set = set(seen)
        self._declare(seen + [u for u in range(self._unit_count) if u not in seen_set])
