"""OffloadResult's lifecycle (internal): unload and reload (the device weights dropped and
uploaded again), close and the teardown (the module holds its host tensors again; a session
whose views escaped is buried until they die), garbage collection and fork."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional

import torch

from . import _lease, _lib, _native
from ._native import DdoError
from ._result_setup import Setup
from ._result_state import _MANAGED, _managed_by, _shielded


class Lifecycle(Setup):
    """unload, reload, close, and what ends a result that was never closed."""

    @_shielded
    def unload(self, release_host: bool = False) -> None:
        """Frees device weights; a forward raises until reload(). release_host=True frees the
        retained host store too (an inactive expert holds no RAM); reload() reads it again."""
        if self._state == "unloaded":
            if release_host:
                self._alive("unload")
                L = _native.lib()
                _native.check(L.ddo_session_release_host(self._session),
                              L.ddo_session_error(self._session))
            return
        self._alive("unload")
        self._not_in_forward("unload")
        for u in list(self._leases):
            self._release(u, check=False, whole=True)
        with self._lock:  # a unit's module that raised outside a forward left its claim
            self._owner, self._frames, self._in_root = None, [], 0
        self._unbind_all()
        self._release_pins()
        escaped = self._escaped_views()
        if escaped:  # never free under a live view: refused, the weights bound again
            self._make_views()
            self._bind_residents()
            raise DdoError("DDO_E_BUSY", f"unload: {escaped} view(s) of ddo's weight memory "
                           f"are still alive (a tensor derived from a weight, kept by a hook, "
                           f"a cache or an autograd graph); unloading would free memory they "
                           f"read: drop them (or keep .clone()s) and call unload() again")
        self._dirty = False  # reload() uploads every weight from the host copy again
        L = _native.lib()
        fn = L.ddo_session_release_host if release_host else L.ddo_session_unload
        _native.check(fn(self._session), L.ddo_session_error(self._session))
        self._state = "unloaded"

    @_shielded
    def reload(self) -> None:
        """Restores the device weights after unload(); forwards are bit-identical again."""
        if self._state == "ready":
            return
        self._alive("reload")
        L = _native.lib()
        _native.check(L.ddo_session_reload(self._session), L.ddo_session_error(self._session))
        self._state = "ready"
        self._make_views()
        self._bind_residents()  # raises, bound, if a weight was written while unloaded

    @_shielded
    def close(self) -> None:
        """Removes the hooks, ends the session; the module holds its host tensors again."""
        if self._state == "closed":
            return
        if not _lease.forked(self._pid):
            self._not_in_forward("close")
        if self._session is not None and self._state == "ready" and not _lease.forked(self._pid):
            for u in list(self._leases):
                self._release(u, check=False, whole=True)
        if self._session is not None and self._show_profile[0]:
            rep = self.metrics_snapshot(True).format_profile(self._show_profile[1])
            print(f"[{self._label()}]\n{rep}", file=sys.stderr)
        self._teardown()
        self._state = "closed"
        if self._trace is not None and self._talk.get("trace_owner"):
            self._trace.write()

    def __del__(self) -> None:
        """A result dropped without close() (its module dropped too): its session, threads
        and device memory end here."""
        try:
            if getattr(self, "_state", "closed") != "closed" and _native._LIB is not None:
                self.close()
        except Exception:
            pass

    def _teardown(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if getattr(self, "_orig_forward", None) is not None:
            try:
                del self.module.forward
            except AttributeError:
                pass
            if self._own_forward is not None:  # a forward the user had installed
                self.module.forward = self._own_forward
            self._orig_forward = None
        lora = getattr(self, "_lora", None)
        if lora is not None:
            lora.teardown()
        for m, name, own in reversed(self._own_methods):
            m.__dict__.pop(name, None)
            if own is not None:
                m.__dict__[name] = own
        self._own_methods = []
        tag = getattr(self, "_managed_tag", None)
        for t in getattr(self, "_tensors", []):
            for p in t.params:
                if tag is not None and _managed_by(p) == tag:
                    del _MANAGED[id(p)]
        lost: Optional[BaseException] = None
        for t in getattr(self, "_tensors", []):
            if t.host is None and t.params:  # the session's own copy (weight_codec)
                try:
                    t.host = self._host_back(t)
                except DdoError as e:  # the rest is still torn down; this is raised after
                    lost = lost or e
                    continue
            for p in t.params:
                p.data = t.host
        if lora is not None and not _lease.forked(self._pid):
            try:
                lora.host_copies()  # merged LoRAs: host copies with them (_lora.py)
            except Exception as e:  # the rest is still torn down; this is raised after
                lost = lost or e
        for item in self._moved:
            if item[0] == "buffer":
                _, m, bname, b = item
                m._buffers[bname] = b
        self._moved = []
        self._views.clear()
        self._placeholders.clear()
        self._unit_ps.clear()
        if self.device is not None and self.device.type == "cuda" and self._session is not None:
            stream: Any = torch.cuda.current_stream(self.device)  # (unannotated in torch 1.13)
            stream.synchronize()
        self._view_ptrs.clear()
        if _lease.forked(self._pid):  # the parent's session: its threads are not here; let it be
            self._session = self._plan = self._ck = self._dev = self._setup_h = None
            self._streams = {}
        L = _native.lib()
        alive = L.ddo_session_view_count(self._session) if self._session is not None else 0
        for st in self._streams.values():
            L.ddo_stream_destroy(st)
        self._streams = {}
        if alive:
            # A view escaped (someone kept p.data of a lease): its session lives on until the
            # view dies, with its plan, checkpoint and setup (its device; and the host
            # tensors); the next enable, close or exit after that frees them (_lease.sweep).
            _lease.bury((self._session, self._plan, self._ck, self._setup_h,
                         (self._tensors, self._store)))  # the store closes after the session
        else:
            if self._session is not None:
                L.ddo_session_destroy(self._session)
            if self._plan is not None:
                L.ddo_plan_destroy(self._plan)
            if self._ck is not None:
                L.ddo_checkpoint_destroy(self._ck)
            if self._dev is not None:
                caps = _lib.DeviceCaps()
                if L.ddo_device_caps_get(self._dev, ctypes.byref(caps)) == 0 and caps.is_cpu:
                    # The cpu device knows exactly what is still allocated: tests check 0.
                    self.device_bytes_after_close = caps.total_bytes - caps.free_bytes
            if self._setup_h is not None:
                L.ddo_setup_destroy(self._setup_h)  # and its device
            if self._store is not None:
                self._store.close()
        self._store = None
        self._session = self._plan = self._ck = self._dev = self._setup_h = None
        restore = getattr(self, "_source_restore", None)
        if restore is not None:  # file-backed: meta again
            restore()
            self._source_restore = None
        if getattr(self.module, "_ddo_offload", None) is self:
            del self.module._ddo_offload
        if lost is not None:
            raise lost
