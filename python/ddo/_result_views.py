"""OffloadResult's views and placeholders (internal): a managed Parameter shows a DLPack view
of ddo's device memory while its unit is leased (resident ones: always), else an empty
placeholder; writes to either are noticed by the Parameters' versions and refused."""

from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import _native, _torch
from ._quant import _no_torch_function
from ._native import DdoError
from ._result_ownership import Ownership
from ._result_state import _PLACEMENT_RESIDENT, _PLACEMENT_SKIPPED, _PLACEMENT_STREAMED, _Param

# How a unit's tensors are cut from one view of the unit's bytes: per tensor (its record, its
# dtype, its offset in elements of that dtype (-1: no bytes), its shape, its strides).
UnitCut = List[Tuple[_Param, torch.dtype, int, Tuple[int, ...], Tuple[int, ...]]]
# A unit's Parameters, their ids and their placeholders (_unit_params).
UnitParams = Tuple[List[torch.Tensor], List[int], List[torch.Tensor]]


class Views(Ownership):
    """The Parameters' bindings: views, placeholders, and the checks of their versions."""

    def _view(self, t: _Param) -> torch.Tensor:
        if 0 in t.shape:  # no bytes to back: no DLPack view (torch never frees an empty one)
            v = self._views.get((t.index, None))
            if v is None:
                v = self._views[(t.index, None)] = torch.empty(t.shape, dtype=t.torch_dtype,
                                                              device=self.device)
            return v
        L = _native.lib()
        addr = ctypes.c_void_p()
        if self.vmm or t.placement == _PLACEMENT_RESIDENT:
            key: Tuple[int, Optional[int]] = (t.index, 0)
        else:
            _native.check(L.ddo_session_tensor_address(self._session, t.index,
                                                       ctypes.byref(addr)),
                          L.ddo_session_error(self._session))
            key = (t.index, addr.value)
        v = self._views.get(key)
        if v is None:
            # Every caller holds a shield (_acquire, _bind_residents): the view and its
            # record change together.
            v = _torch.view(self._session, t.index, t.dtype_name, t.torch_dtype, t.shape)
            if t.placement == _PLACEMENT_RESIDENT:
                self._views[key] = v
            # A streamed tensor's view is made per lease and never kept here: at release the
            # binding drops it, and a view still alive then escaped the lease (_release).
            self._view_ptrs[v.data_ptr()] = t.name  # a fresh view starts its storage
        return v

    def _unit_cut(self, u: int) -> Optional[UnitCut]:
        """How u's tensors are cut from one view of the unit (made once; None: a tensor's
        offset is not a multiple of its element size, so each tensor gets its own view)."""
        cut: UnitCut = []
        for t in self._unit_tensors[u]:
            if 0 in t.shape:
                cut.append((t, t.torch_dtype, -1, t.shape, ()))
                continue
            size = torch.empty((), dtype=t.torch_dtype).element_size()
            if t.offset % size:
                return None
            strides = [1] * len(t.shape)
            for k in range(len(t.shape) - 2, -1, -1):
                strides[k] = strides[k + 1] * t.shape[k + 1]
            cut.append((t, t.torch_dtype, t.offset // size, t.shape, tuple(strides)))
        return cut

    def _bind_unit(self, u: int) -> None:
        """u's Parameters show its leased bytes: one DLPack view of the whole unit per lease
        (ddo_session_unit_dlpack), each tensor a strided view of it, so the C calls and the
        DLPack import are per unit, not per tensor. Every view shares the unit view's storage:
        one kept past the lease keeps it alive, and ddo_session_unit_view_count sees it at
        release. Routes that map each weight apart get a view per tensor (_view)."""
        cut = self._unit_cuts.get(u, False)
        if cut is False:
            cut = self._unit_cuts[u] = self._unit_cut(u)
        base: Optional[torch.Tensor] = None
        if cut is not None:
            try:
                base = _torch.unit_view(self._session, u)
            except DdoError as e:
                if e.code not in ("DDO_E_UNSUPPORTED", "DDO_E_NOT_FOUND"):
                    raise
                cut = self._unit_cuts[u] = None
        with _no_torch_function():  # (see _unit_to_placeholder)
            if cut is None or base is None:
                for t in self._unit_tensors[u]:
                    v = self._view(t)
                    for p in t.params:
                        p.data = v
                return
            typed: Dict[torch.dtype, torch.Tensor] = {}
            for t, dt, off, shape, strides in cut:
                if off < 0:
                    v = self._view(t)
                else:
                    whole = typed.get(dt)
                    if whole is None:
                        size = torch.empty((), dtype=dt).element_size()
                        whole = typed[dt] = base[:base.numel() - base.numel() % size].view(dt)
                    v = whole.as_strided(shape, strides, off)
                for p in t.params:
                    p.data = v
        self._view_ptrs[base.data_ptr()] = self._unit_names[u]  # (saved-tensor hooks)

    def _make_views(self) -> None:
        """Nothing now: a streamed tensor's view is made per lease (on every route), so a view
        kept past its lease is seen at release (_release); resident views are made when bound.
        (Made once per session on VMM before, 1,200 views cost 7 ms on the build machine's
        CPU: that host time now falls in each pass.)"""

    def _placeholder(self, t: _Param) -> torch.Tensor:
        ph = self._placeholders.get((t.torch_dtype,))
        if ph is None:
            ph = torch.empty(0, dtype=t.torch_dtype, device=self.device)
            self._placeholders[(t.torch_dtype,)] = ph
        return ph

    def _to_placeholder(self, t: _Param) -> None:
        """t's Parameters show the empty placeholder; their versions are noted, so a write to
        one outside its lease (it would do nothing) is refused at its next binding."""
        ph = self._placeholder(t)
        for p in t.params:
            p.data = ph
            self._ph_versions[id(p)] = p._version

    def _unit_params(self, u: int) -> UnitParams:
        """u's Parameters, their ids and their placeholders, in one flat list each (made at
        its first lease, after the setup bound every Parameter)."""
        got: Optional[UnitParams] = self._unit_ps.get(u)
        if got is None:
            ps: List[Tuple[torch.Tensor, torch.Tensor]] = [
                (p, self._placeholder(t)) for t in self._unit_tensors[u] for p in t.params]
            made: UnitParams = ([p for p, _ in ps], [id(p) for p, _ in ps], [ph for _, ph in ps])
            self._unit_ps[u] = got = made
        return got

    def _unit_to_placeholder(self, u: int) -> None:
        """_to_placeholder for every tensor of u, over its flat lists. The per-lease loops
        rebind .data and read ._version with torch-function dispatch off: a Parameter subclass
        with its own __torch_function__ (Diffusers' GGUFParameter wraps every result) would
        otherwise run it for each access, several microseconds a tensor and lease on the
        host; both are plain attribute work on the Parameter object, the same either way."""
        ps, ids, phs = self._unit_params(u)
        with _no_torch_function():
            for p, ph in zip(ps, phs):
                p.data = ph
            self._ph_versions.update(zip(ids, [p._version for p in ps]))

    def _unit_placeholder_writes(self, u: int) -> Optional[DdoError]:
        """_placeholder_writes for u's tensors: the versions of its Parameters compared in one
        pass; the per-tensor check only where one differs."""
        ps, ids, _ = self._unit_params(u)
        get = self._ph_versions.get
        with _no_torch_function():  # (see _unit_to_placeholder)
            now = [p._version for p in ps]
        if [get(i) for i in ids] == now:
            return None
        return self._placeholder_writes(self._unit_tensors[u])

    def _placeholder_writes(self, tensors: Sequence[_Param]) -> Optional[DdoError]:
        """The refusal of writes to tensors' Parameters while they showed the placeholder
        (None: none); each write is refused once."""
        written: List[str] = []
        for t in tensors:
            for p in t.params:
                before = self._ph_versions.get(id(p))
                if before is not None and p._version != before:
                    written.append(t.name)
                    self._ph_versions[id(p)] = p._version  # refused once, not forever
        if not written:
            return None
        return DdoError("DDO_E_STATE", f"{', '.join(sorted(set(written)))}: written in place "
                        f"while ddo held the weight off the device (outside its forward, where "
                        f"it is an empty placeholder): the write did nothing; merge such "
                        f"changes into the host module before enable_offload")

    def _bind_residents(self) -> None:
        err = self._placeholder_writes(
            [t for t in self._tensors if t.placement == _PLACEMENT_RESIDENT])
        self._res_versions = []
        for t in self._tensors:
            if t.placement == _PLACEMENT_RESIDENT:
                v = self._view(t)
                for p in t.params:
                    p.data = v
                    self._res_versions.append((p, p._version, t.name))
            elif t.placement == _PLACEMENT_STREAMED:
                self._to_placeholder(t)
        if getattr(self, "_lora", None) is not None:
            self._lora.bound(self._tensors)  # merged LoRAs replayed on fresh resident copies
        if err is not None:
            raise err

    def _unbind_all(self) -> None:
        """Every managed Parameter shows its placeholder (no lease may be held)."""
        for t in self._tensors:
            if t.placement != _PLACEMENT_SKIPPED:
                self._to_placeholder(t)
        self._views.clear()
        self._view_ptrs.clear()

    def _escaped_views(self) -> int:
        """DLPack views of the session alive beyond the binding's own (self._views): a tensor
        derived from a weight that someone (a hook, a cache, autograd) still holds."""
        if self._session is None:
            return 0
        own = sum(1 for k in self._views if k[1] is not None)
        return max(0, int(_native.lib().ddo_session_view_count(self._session)) - own)

    def _rebind_recast(self) -> None:
        """Resident Parameters a per-layer cast left on torch's converted copies show ddo's
        resident views again (the copies are freed; the values are the same bytes)."""
        self._recast = False
        for t in self._tensors:
            if t.placement != _PLACEMENT_RESIDENT:
                continue
            v = self._views.get((t.index, 0))
            for p in t.params:
                if v is not None and (p.dtype != v.dtype or p.data_ptr() != v.data_ptr()):
                    p.data = v

    def _check_residents(self) -> None:
        written = sorted({name for p, v, name in self._res_versions if p._version != v})
        if written:
            self._res_versions = [(p, p._version, name) for p, _v, name in self._res_versions]
            self._dirty = True
            raise DdoError("DDO_E_STATE", f"{', '.join(written)}: a resident weight was written "
                           f"in place; ddo uploads weights from the host copy, so the change "
                           f"would be lost at the next reload (merge such changes into the "
                           f"host module before enable_offload); the device copy is restored")
