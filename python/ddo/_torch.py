"""torch-side helpers (internal): dtypes, DLPack views over ddo memory, streams, compile guards."""

import ctypes
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar

import torch
import torch.utils.dlpack

from . import _enums, _native

VIEW_BYTES = _enums.DDO_VIEW_BYTES

# safetensors dtype name -> torch dtype attribute name (those this torch lacks are skipped).
_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "F16": "float16", "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32",
    "F64": "float64", "I64": "int64", "U64": "uint64", "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
# Dtypes torch 1.13's DLPack import cannot name: passed as bytes and viewed.
_AS_BYTES = {"BOOL", "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
             "F8_E5M2FNUZ"}

F = TypeVar("F", bound=Callable[..., Any])


def dtype_tables() -> Tuple[Dict[torch.dtype, int], Dict[int, torch.dtype]]:
    """(torch dtype -> ddo dtype index, ddo index -> torch dtype)."""
    to_ddo: Dict[torch.dtype, int] = {}
    to_torch: Dict[int, torch.dtype] = {}
    for idx, name in _native.dtype_names().items():
        attr = _TORCH_NAMES.get(name)
        td = getattr(torch, attr, None) if attr else None
        if isinstance(td, torch.dtype):
            to_ddo[td] = idx
            to_torch[idx] = td
    return to_ddo, to_torch


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class _Managed(ctypes.Structure):
    """The head of DLPack's DLManagedTensor, enough to reach its deleter (offset 48)."""
    _fields_ = [("dl_tensor", ctypes.c_byte * 48), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def view(session: Any, tensor: int, dtype_name: str, torch_dtype: torch.dtype,
         shape: Sequence[int]) -> torch.Tensor:
    """A torch tensor over the session's device bytes of `tensor` (no copy).

    The caller runs this inside _lease.shield(), so no interrupt falls between the C view and
    its capsule (_take)."""
    as_bytes = dtype_name in _AS_BYTES or dtype_name not in _TORCH_NAMES  # GGML blocks too
    p = ctypes.c_void_p()
    _native.check(_native.lib().ddo_session_tensor_dlpack(
        session, tensor, VIEW_BYTES if as_bytes else 0, ctypes.byref(p)),
        _native.lib().ddo_session_error(session))
    t = _take(p)
    if as_bytes:
        t = t.view(torch_dtype).view(shape)
    return t


def unit_view(session: Any, unit: int) -> torch.Tensor:
    """A uint8 torch tensor over the session's device bytes of a leased unit, from its start
    (ddo_session_unit_dlpack); its tensors are slices of it at their offsets. Under a shield,
    as view()."""
    p = ctypes.c_void_p()
    _native.check(_native.lib().ddo_session_unit_dlpack(session, unit, ctypes.byref(p)),
                  _native.lib().ddo_session_error(session))
    return _take(p)


def _take(p: ctypes.c_void_p) -> torch.Tensor:
    """torch's tensor over a DLManagedTensor. The DLPack capsule is consumed exactly once:
    torch renames it "used_dltensor" when it takes it (its deleter is then torch's to call);
    only a capsule torch did not take is deleted here."""
    cap = None
    try:
        cap = _PyCapsule_New(p, b"dltensor", None)
        return torch.utils.dlpack.from_dlpack(cap)
    except BaseException:
        if cap is None or _PyCapsule_IsValid(cap, b"dltensor"):
            _Managed.from_address(p.value or 0).deleter(p.value)
        raise


def current_stream_handle(device: torch.device) -> Optional[int]:
    """The native handle of torch's current stream on device (None on the cpu device)."""
    if device.type != "cuda":
        return None
    handle: int = torch.cuda.current_stream(device).cuda_stream
    return handle


def capturing(device: torch.device) -> bool:
    # getattr: torch 1.13 does not annotate it (mypy --strict would refuse the call)
    return device.type == "cuda" and bool(getattr(torch.cuda, "is_current_stream_capturing")())


def no_compile(fn: F) -> F:
    """Keeps fn out of torch.compile (hooks call ctypes, which dynamo cannot trace)."""
    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None) if compiler is not None else None
    if disable is None:
        dynamo = getattr(torch, "_dynamo", None)
        disable = getattr(dynamo, "disable", None) if dynamo is not None else None
    return disable(fn) if disable is not None else fn  # type: ignore[no-any-return]
