"""File-backed tensor sources (internal): a module built on the meta device, each parameter
associated with its immutable checkpoint slice, the names, dtypes and shapes checked.

OffloadResult(module, cfg, source=PATH) takes its checkpoint from here instead of the
module's CPU tensors: the session then reads the files (retained store, staging) and no CPU
copy of a streamed or resident weight is ever made. Tensors the plan skips, and persistent
buffers the checkpoint holds, are read into host tensors (they are moved to the device once,
like every unmanaged tensor).
"""

import ctypes
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import _native

_BACKENDS = {"": 0, "pread": 1, "mmap": 2}

# (name, ddo dtype index, shape, nbytes) of a checkpoint tensor
Entry = Tuple[str, int, Tuple[int, ...], int]
# a persistent buffer to read: (tensor index, module, buffer name, torch dtype, shape)
Load = Tuple[int, torch.nn.Module, str, torch.dtype, Tuple[int, ...]]


def open_checkpoint(path: Any, backend: Optional[str] = "") -> ctypes.c_void_p:
    """An owned ddo_checkpoint handle for a file, a sharded index or a Diffusers folder."""
    ck = ctypes.c_void_p()
    _native.check(_native.lib().ddo_checkpoint_create(str(path).encode(),
                                                      _BACKENDS.get(backend or "", 0),
                                                      ctypes.byref(ck)))
    return ck


def table(ck: Any) -> List[Entry]:
    """[(name, ddo dtype index, shape tuple, nbytes)] in checkpoint order."""
    L = _native.lib()
    out: List[Entry] = []
    for i in range(L.ddo_checkpoint_tensor_count(ck)):
        t = L.ddo_checkpoint_tensor(ck, i).contents
        out.append((t.name.decode(), t.dtype, tuple(t.shape[k] for k in range(t.ndim)),
                    t.nbytes))
    return out


def read_tensor(ck: Any, index: int, torch_dtype: torch.dtype,
                shape: Tuple[int, ...]) -> torch.Tensor:
    """Tensor index of ck as a new CPU tensor (ddo_checkpoint_read: identity re-checked)."""
    t = torch.empty(shape, dtype=torch_dtype)
    n = t.numel() * t.element_size()
    if n:
        _native.check(_native.lib().ddo_checkpoint_read(ck, index, 0,
                                                        ctypes.c_void_p(t.data_ptr()), n),
                      _native.lib().ddo_checkpoint_error(ck))
    return t


def _parameters(module: torch.nn.Module) -> Tuple[Dict[str, torch.nn.Parameter],
                                                  Dict[str, Tuple[Any, str, torch.Tensor]]]:
    """name -> Parameter (tied ones under every name), and the buffers by name."""
    params: Dict[str, torch.nn.Parameter] = {}
    for mname, m in module.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is not None:
                params[f"{mname}.{pname}" if mname else pname] = p
    buffers: Dict[str, Tuple[Any, str, torch.Tensor]] = {}
    for mname, m in module.named_modules(remove_duplicate=False):
        for bname, b in m._buffers.items():
            if b is not None and bname not in m._non_persistent_buffers_set:
                buffers[f"{mname}.{bname}" if mname else bname] = (m, bname, b)
    return params, buffers


def match(module: torch.nn.Module, ck: Any, where: str,
          check_dtype: bool = True) -> Tuple[Dict[int, List[torch.nn.Parameter]], List[Load]]:
    """Checks module against the checkpoint; returns (params by tensor index, buffers to load).

    Every parameter must have a tensor of the same dtype and shape (a tied parameter needs
    one of its names); every tensor must be a parameter or a persistent buffer. One line
    names the first mismatch and the file.
    """
    to_ddo, to_torch = _torch_tables()
    names = {n: i for i, (n, *_r) in enumerate(table(ck))}
    tab = table(ck)
    params, buffers = _parameters(module)
    kind = type(module).__name__
    by_param: Dict[int, int] = {}
    by_index: Dict[int, List[torch.nn.Parameter]] = {}
    for name, p in params.items():
        if id(p) in by_param and name not in names:
            continue  # a tied name whose partner is in the file
        i = names.get(name)
        if i is None:
            if any(q is p and n in names for n, q in params.items()):
                continue
            raise _native.DdoError("DDO_E_NOT_FOUND", f"{where}: {kind} parameter {name} has "
                                   f"no tensor in the checkpoint (it does not match the model "
                                   f"class)")
        _n, dt, shape, _nb = tab[i]
        if block_bytes_shape(p, dt, shape) is not None:
            pass  # a GGUF-style Parameter holding the block type's bytes (uint8, byte shape)
        elif tuple(p.shape) != shape or (check_dtype and to_ddo.get(p.dtype) != dt and
                                         not as_bytes(p.dtype, dt, to_torch)):
            why = "it does not match the model class"
            if tuple(p.shape) == shape and dt in to_torch:  # the dtype alone differs
                why = (f"pass torch_dtype={to_torch[dt]} to build the model in the "
                       f"checkpoint's dtype")
            raise _native.DdoError(
                "DDO_E_FORMAT", f"{where}: tensor {name} is {_dtype_name(dt)} "
                f"{list(shape)} in the checkpoint but {kind} declares {p.dtype} "
                f"{list(p.shape)} ({why})")
        by_param[id(p)] = i
        by_index.setdefault(i, []).append(p)
    loads: List[Load] = []
    for name, i in names.items():
        if i in by_index:
            continue
        if name in buffers:
            m, bname, b = buffers[name]
            _n, dt, shape, _nb = tab[i]
            if tuple(b.shape) != tuple(shape) or (check_dtype and to_ddo.get(b.dtype) != dt):
                raise _native.DdoError(
                    "DDO_E_FORMAT", f"{where}: buffer {name} is {_dtype_name(dt)} "
                    f"{list(shape)} in the checkpoint but {kind} declares {b.dtype} "
                    f"{list(b.shape)} (it does not match the model class)")
            loads.append((i, m, bname, to_torch[tab[i][1]], tab[i][2]))
            continue
        if name not in params:
            raise _native.DdoError("DDO_E_FORMAT", f"{where}: checkpoint tensor {name} is not "
                                   f"a parameter or buffer of {kind} (it does not match the "
                                   f"model class)")
    return by_index, loads


# One-byte checkpoint dtypes a torch without them (torch < 2.1: no float8) reads as uint8:
# the module stands the bytes in a uint8 tensor, and ddo moves them as stored.
_BYTE_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ")


def as_bytes(torch_dtype: torch.dtype, dt: int, to_torch: Dict[int, torch.dtype]) -> bool:
    """A uint8 parameter standing for one-byte checkpoint dtype dt (FP8) as its raw bytes: what
    a torch without float8 must declare, and what a model may declare on any torch."""
    return torch_dtype == torch.uint8 and _dtype_name(dt) in _BYTE_DTYPES


def block_bytes_shape(p: torch.Tensor, dt: int,
                      shape: Optional[Sequence[int]] = None) -> Optional[Tuple[int, ...]]:
    """The byte shape of p when p is a uint8 parameter holding checkpoint tensor dt's GGML
    blocks as stored (Diffusers' GGUFParameter: [rows..., blocks x block bytes]) and shape
    (the tensor's element shape, when given) matches it; else None."""
    from . import _quant
    geo = _quant._BY_NAME.get(_dtype_name(dt))
    if geo is None or geo[1] == 1 or p.dtype != torch.uint8 or p.dim() == 0:
        return None
    if shape is not None:
        _name, elems, nbytes = geo
        if len(shape) != p.dim() or tuple(shape[:-1]) != tuple(p.shape[:-1]) or \
                shape[-1] % elems or shape[-1] // elems * nbytes != p.shape[-1]:
            return None
    return tuple(p.shape)


def stored_shape(dt: int, shape: Sequence[int]) -> Tuple[int, ...]:
    """The shape a checkpoint tensor is read as: its own, or for a GGML block type the byte
    shape a GGUF-style Parameter holds ([rows..., blocks x block bytes], uint8)."""
    from . import _quant
    geo = _quant._BY_NAME.get(_dtype_name(dt))
    if geo is None or geo[1] == 1 or not shape:
        return tuple(shape)
    return tuple(shape[:-1]) + (shape[-1] // geo[1] * geo[2],)


def torch_dtype_of(dt: int, to_torch: Dict[int, torch.dtype]) -> torch.dtype:
    """The torch dtype a checkpoint dtype is read as (uint8 for the _BYTE_DTYPES it lacks and
    for GGML's block types)."""
    from . import _quant
    if dt in to_torch:
        return to_torch[dt]
    name = _dtype_name(dt)
    if name in _BYTE_DTYPES or name in _quant._BY_NAME:
        return torch.uint8
    return to_torch[dt]


def _torch_tables() -> Tuple[Dict[torch.dtype, int], Dict[int, torch.dtype]]:
    from . import _torch
    return _torch.dtype_tables()


def _dtype_name(idx: int) -> str:
    return _native.dtype_names().get(idx, str(idx))


def replace_params(module: torch.nn.Module, make: Callable[[torch.nn.Parameter], Optional[torch.Tensor]]
                   ) -> Tuple[Dict[int, Optional[torch.nn.Parameter]], List[Tuple[Any, str, Any]]]:
    """Replaces every Parameter p of module for which make(p) gives a tensor by a Parameter
    over that tensor (tied names keep sharing one); returns [(module, name, old)] to undo.
    (torch cannot assign a CPU or CUDA tensor to a meta Parameter's .data.)"""
    new: Dict[int, Optional[torch.nn.Parameter]] = {}
    undo: List[Tuple[Any, str, Any]] = []
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            if id(p) not in new:
                t = make(p)
                new[id(p)] = None if t is None else _like(p, t)
            if new[id(p)] is not None:
                m._parameters[name] = new[id(p)]
                undo.append((m, name, p))
    return new, undo


def _like(p: torch.nn.Parameter, t: torch.Tensor) -> torch.nn.Parameter:
    """A Parameter over t of p's type with p's attributes (a GGUF-style Parameter subclass
    keeps quant_type); a plain Parameter for a plain one."""
    from . import _quant
    if not _quant.is_param_subclass(p):
        return torch.nn.Parameter(t, requires_grad=p.requires_grad)
    return _quant.subclass_like(p, t, p.requires_grad)


def _quant_subclass(p: torch.Tensor) -> bool:
    from . import _quant
    return _quant.is_param_subclass(p)


def _quant_plain(p: torch.Tensor) -> torch.Tensor:
    from . import _quant
    return _quant.plain_data(p)


def load_buffers(module: torch.nn.Module, source: Any) -> None:
    """Reads the persistent buffers the checkpoint holds into module (host tensors)."""
    ck = open_checkpoint(source)
    try:
        _by, loads = match(module, ck, str(source), check_dtype=False)
        for i, m, bname, dt, shape in loads:
            m._buffers[bname] = read_tensor(ck, i, dt, shape)
    finally:
        _native.lib().ddo_checkpoint_destroy(ck)


def file_checkpoint(result: Any, module: torch.nn.Module, source: Any,
                    backend: Optional[str]) -> Tuple[List[Any], Dict[str, str], Dict[int, List[Any]], Any]:
    """(tensors, ddo_path, modules_of, checkpoint) for OffloadResult's file-backed setup.

    The meta Parameters are swapped for Parameters over empty host placeholders (torch binds
    device views to those); close() puts the meta ones back (result._source_restore).
    """
    from .offload import _Param  # the same record the in-memory path builds
    _, to_torch = _torch_tables()
    ck = open_checkpoint(source, backend)
    try:
        by_index, loads = match(module, ck, str(source))
        for i, m, bname, dt, shape in loads:
            m._buffers[bname] = read_tensor(ck, i, dt, shape)
        index_of = {id(p): i for i, ps in by_index.items() for p in ps}
        new, undo = replace_params(module, lambda p: torch.empty(0, dtype=p.dtype)
                                   if id(p) in index_of else None)
        params: Dict[int, List[torch.nn.Parameter]] = {}
        for old_id, i in index_of.items():
            q = new[old_id]
            if q is not None and all(q is not x for x in params.get(i, [])):
                params.setdefault(i, []).append(q)
        modules_of: Dict[int, List[Any]] = {}
        for m in module.modules():
            for _pn, p in m._parameters.items():
                if p is not None:
                    modules_of.setdefault(id(p), []).append(m)
        tensors: List[Any] = []
        record: Any = _Param  # offload.py's record (not annotated)
        for i, (name, di, tshape, _nb) in enumerate(table(ck)):
            ps = params.get(i, [])
            td = torch_dtype_of(di, to_torch)
            if ps and as_bytes(ps[0].dtype, di, to_torch):
                td = torch.uint8  # the model declares the FP8 bytes as uint8 (any torch)
            entry = record(i, name, torch.empty(0, dtype=td), _dtype_name(di))
            entry.shape = stored_shape(di, tshape)
            entry.params = list(ps)
            tensors.append(entry)
        ddo_path = {n: n for n, _m in module.named_modules()}

        def restore() -> None:
            for m, name, old in reversed(undo):
                m._parameters[name] = old

        result._source_restore = restore
        result._file_backed = set(params)
        result._source_ck_reader = lambda t: read_tensor(ck, t.index, t.torch_dtype, t.shape)
        return tensors, ddo_path, modules_of, ck
    except BaseException:
        _native.lib().ddo_checkpoint_destroy(ck)
        raise
