"""OffloadResult's host memory (internal): the module's CPU tensors as a ddo checkpoint
(registered in place: no second host copy), the copies the session codes into memory of its
own (weight_codec: the module's are let go, read back at close), and the buffers and skipped
tensors moved to the device once."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Dict, List, Tuple

import torch

from . import _lib, _native, _quant
from ._native import DdoError
from ._result_state import _PLACEMENT_SKIPPED, _PLACEMENT_STREAMED, ResultState, _nbytes, _Param


def _trim_host_heap() -> None:
    """Gives the pages of freed host tensors back to the system where the C library can
    (glibc's malloc_trim): torch's tensors of a few MiB live in malloc's heap, whose free
    pages below its top stay in RSS until trimmed. A no-op elsewhere (on Windows
    ``ctypes.CDLL(None)`` itself raises TypeError)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # another C library (musl has no malloc_trim)
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


def _collect(module: torch.nn.Module, to_ddo: Dict[torch.dtype, int]
             ) -> Tuple[List[_Param], Dict[str, str], Dict[int, List[torch.nn.Module]]]:
    """The module's parameters as ddo tensors, deduplicated by storage, with their names.

    Children of an nn.Sequential / nn.ModuleList are named by their index for ddo (so they form
    a block group even when an OrderedDict gave them other names); ddo_names maps back.
    """
    ddo_path = {"": ""}
    for name, m in module.named_modules():
        base = ddo_path.get(name, name)
        if isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList)):
            for i, (cname, _child) in enumerate(m.named_children()):
                full = f"{name}.{cname}" if name else cname
                ddo_path[full] = f"{base}.{i}" if base else str(i)
        for cname, _child in m.named_children():
            full = f"{name}.{cname}" if name else cname
            ddo_path.setdefault(full, f"{base}.{cname}" if base else cname)
    tensors: List[_Param] = []
    by_storage: Dict[Tuple[Any, ...], _Param] = {}
    modules_of: Dict[int, List[torch.nn.Module]] = {}
    for mname, m in module.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            _check_param(full, p, to_ddo)
            # A subclass's bytes (the Parameter is kept), or each inner tensor of a wrapper
            # (the wrapper is kept; its inner tensors are what ddo rebinds: _quant).
            for suffix, data, holder in _quant.stored_parts(p):
                key = (data.data_ptr(), data.dtype, tuple(data.shape), tuple(data.stride()))
                entry = by_storage.get(key)
                if entry is None:
                    base = ddo_path.get(mname, mname)
                    ddo_name = (f"{base}.{pname}" if base else pname) + suffix
                    entry = _Param(len(tensors), ddo_name, data,
                                   _native.dtype_names()[to_ddo[data.dtype]])
                    tensors.append(entry)
                    by_storage[key] = entry
                if not any(q is holder for q in entry.params):
                    entry.params.append(holder)  # type: ignore[arg-type]  # (an inner tensor)
                modules_of.setdefault(id(holder), []).append(m)
    return tensors, ddo_path, modules_of


def _check_param(name: str, p: torch.nn.Parameter, to_ddo: Dict[torch.dtype, int]) -> None:
    """One line for a parameter ddo cannot move faithfully (_quant.refusal): Parameter
    subclasses over a plain tensor (GGUFParameter) and float8 dtypes pass."""
    why = _quant.refusal(name, p, to_ddo)
    if why is not None:
        raise DdoError("DDO_E_UNSUPPORTED", why)
    for suffix, data, _holder in _quant.stored_parts(p):
        if data.device.type != "cpu":
            raise DdoError("DDO_E_INVALID_ARGUMENT",
                           f"parameter {name}{suffix} is on {data.device}: enable_offload takes "
                           f"a module whose tensors are on the CPU (call module.to('cpu') first)")
    if not _quant.is_wrapper(p) and not p.is_contiguous():  # (a wrapper's: _quant.refusal)
        raise DdoError("DDO_E_INVALID_ARGUMENT",
                       f"parameter {name} is not contiguous: ddo moves whole contiguous tensors "
                       f"(make it contiguous: p.data = p.data.contiguous())")


class Ownership(ResultState):
    """Who holds the host bytes of each managed tensor."""

    def _host_checkpoint(self, to_ddo: Dict[torch.dtype, int]) -> None:
        descs = (_lib.TensorDesc * max(1, len(self._tensors)))()
        self._names = []
        self._shapes = []
        for i, t in enumerate(self._tensors):
            shape = (ctypes.c_uint64 * max(1, len(t.shape)))(*t.shape)
            name = t.name.encode()
            self._names.append(name)
            self._shapes.append(shape)
            descs[i].name = name
            descs[i].dtype = to_ddo[t.torch_dtype]
            descs[i].ndim = len(t.shape)
            descs[i].shape = shape
            host = t.host
            assert host is not None  # the module's own tensors (no session yet)
            descs[i].data = host.data_ptr() if host.numel() > 0 else None
        ck = ctypes.c_void_p()
        _native.check(_native.lib().ddo_checkpoint_create_from_memory_sized(
            descs, len(self._tensors), ctypes.sizeof(_lib.TensorDesc), ctypes.byref(ck)))
        self._ck = ck

    def _drop_owned_host(self) -> None:
        """weight_codec: the tensors the session coded into host memory of its own are never
        read from the module's copies again, so those copies are let go (host RAM then holds
        the coded bytes, not both); close() reads them back, decoded (_host_back)."""
        if self._source is not None:
            return
        L = _native.lib()
        owned = ctypes.c_bool()
        for t in self._tensors:
            if t.placement != _PLACEMENT_STREAMED:
                continue
            _native.check(L.ddo_session_tensor_host_owned(self._session, t.index,
                                                          ctypes.byref(owned)),
                          L.ddo_session_error(self._session))
            if owned.value:
                t.host = None
                self.host_bytes_released += _nbytes(t)

    def _host_back(self, t: _Param) -> torch.Tensor:
        """A host tensor with t's bytes, read from the session (ddo_session_tensor_read_host)."""
        host = torch.empty(t.shape, dtype=t.torch_dtype)
        L = _native.lib()
        _native.check(L.ddo_session_tensor_read_host(self._session, t.index,
                                                     ctypes.c_void_p(host.data_ptr()),
                                                     _nbytes(t)),
                      L.ddo_session_error(self._session))
        return host

    def _host_value(self, t: _Param) -> torch.Tensor:
        """t's real values on the host: the module's copy, the session's (weight_codec), or
        the file's (a module loaded from files holds only empty placeholders)."""
        if t.index in getattr(self, "_file_backed", ()):
            return self._source_ck_reader(t)
        return t.host if t.host is not None else self._host_back(t)

    def _move_unmanaged(self) -> None:
        """Buffers and skipped tensors: moved to the device once (reported in stats())."""
        self.unmanaged_bytes = 0
        for t in self._tensors:
            if t.placement == _PLACEMENT_SKIPPED:
                if t.index in getattr(self, "_file_backed", ()):  # from the file, once
                    t.host = self._source_ck_reader(t)
                host = t.host
                assert host is not None  # skipped tensors are never the session's
                dev_t = host.to(self.device)
                for p in t.params:
                    p.data = dev_t
                self.unmanaged_bytes += host.numel() * host.element_size()
                self._moved.append(("param", t))
        for name, m in self.module.named_modules():
            for bname, b in list(m.named_buffers(recurse=False)):
                if b is None or b.device == self.device:
                    continue
                if b.device.type == "meta":
                    full = f"{name}.{bname}" if name else bname
                    raise DdoError("DDO_E_INVALID_ARGUMENT",
                                   f"buffer {full} is on the meta device: ddo moves buffers to "
                                   f"the device once and needs their values (load them first)")
                m._buffers[bname] = b.to(self.device)
                self.unmanaged_bytes += b.numel() * b.element_size()
                self._moved.append(("buffer", m, bname, b))
