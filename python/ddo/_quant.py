"""Quantized and subclassed parameters (internal): what ddo streams as stored bytes, what it
refuses, and the dequantization scratch the plan reserves (docs/formats.md, "From Python").

ddo moves a parameter's stored bytes and never looks at their meaning:
  - a torch.nn.Parameter subclass over a plain tensor (Diffusers' GGUFParameter: uint8 bytes
    plus ``quant_type``) is moved as its plain data; the Parameter object itself is kept and
    only its ``.data`` is rebound, so its type and every attribute survive each swap;
  - float8 dtypes (torch >= 2.1) are moved as bytes, and uint8 storage standing for them too;
    their scales are ordinary parameters or buffers of the same module;
  - a wrapper tensor subclass (TorchAO style: ``__tensor_flatten__`` names its inner tensors,
    e.g. float8 data and a scale) is moved as its inner tensors, each a tensor of the layer's
    unit; the wrapper object is kept and only its inner tensors' ``.data`` is rebound at each
    swap (stored_parts()), so its type and attributes survive; the wrapper's own metadata
    (its device) stays as made.
What ddo cannot move faithfully is refused with one line (refusal()).
"""

from typing import Callable, ContextManager, Dict, List, Optional, Tuple, Type, TypeVar

import torch

from . import _native

# GGML type id -> (name, elements per block, bytes per block): the block types of the GGUF
# reader (docs/formats.md); the plain ones are listed for the scratch estimate only.
GGML_BLOCKS: Dict[int, Tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
}
_BY_NAME: Dict[str, Tuple[str, int, int]] = {v[0]: v for v in GGML_BLOCKS.values()}
# Names of a layer's scale in the ComfyUI layouts (newer, older) and TorchAO-style modules.
SCALE_NAMES = ("weight_scale", "scale_weight")
_ROUTE_HINT = ("use the compatibility route (route='diffusers_group_offload' or 'none'), which "
               "keeps the module on the host's own path")
# torch's stubs declare DisableTorchFunction without types (1.13: a bare def); it is a context
# manager class: bound once through getattr, typed here.
_no_torch_function: Callable[[], ContextManager[None]] = getattr(torch._C, "DisableTorchFunction")
_P = TypeVar("_P", bound=torch.nn.Parameter)
_MAX_NESTING = 4  # inner wrappers inside a wrapper, at most (TorchAO's: 1)


def is_param_subclass(p: torch.Tensor) -> bool:
    """p is an instance of a strict subclass of torch.nn.Parameter (GGUFParameter)."""
    return type(p) is not torch.nn.Parameter and isinstance(p, torch.nn.Parameter) and \
        issubclass(type(p), torch.nn.Parameter)


def plain_data(p: torch.Tensor) -> torch.Tensor:
    """p's data as a plain torch.Tensor over the same storage, read without the subclass's
    __torch_function__ (Diffusers' GGUFParameter wraps every result in its own type)."""
    if type(p) is torch.nn.Parameter:
        return p.data
    with _no_torch_function():
        return p.data


def refusal(name: str, p: torch.Tensor, to_ddo: Dict[torch.dtype, int]) -> Optional[str]:
    """None when ddo can move p's stored bytes faithfully; else one line saying why not and
    what to do."""
    kind = type(p).__name__
    if is_wrapper(p):
        return _wrapper_refusal(name, p, to_ddo)
    if type(p) is not torch.nn.Parameter and not is_param_subclass(p):
        return (f"parameter {name}: {kind} is a tensor subclass without a plain data tensor "
                f"or the flatten protocol: ddo cannot move it as plain bytes: {_ROUTE_HINT}")
    held = _held_tensors(p) if is_param_subclass(p) else ""
    if held:
        return (f"parameter {name}: {kind} keeps tensors in its attribute {held} (a quantization "
                f"state, bitsandbytes style) that ddo would not move with its bytes: "
                f"{_ROUTE_HINT}")
    return _plain_refusal(name, plain_data(p), to_ddo, kind)


def _plain_refusal(name: str, data: torch.Tensor, to_ddo: Dict[torch.dtype, int],
                   kind: str = "it") -> Optional[str]:
    """refusal() of the plain tensor data that ddo would move for parameter name."""
    if type(data) is not torch.Tensor:
        return (f"parameter {name}: {kind} holds a {type(data).__name__}, not a plain tensor: "
                f"ddo cannot move it as plain bytes: {_ROUTE_HINT}")
    if data.is_sparse or data.layout != torch.strided:
        return (f"parameter {name}: a {data.layout} tensor: ddo moves dense stored bytes "
                f"(make it dense first, or {_ROUTE_HINT})")
    if data.is_quantized:
        return (f"parameter {name}: torch quantized dtype {data.dtype} (its quantizer is not "
                f"in the bytes ddo moves): {_ROUTE_HINT}")
    if data.dtype not in to_ddo:
        return (f"parameter {name}: dtype {data.dtype} has no ddo dtype and cannot be moved "
                f"as plain bytes: {_ROUTE_HINT}")
    return None


def is_wrapper(p: torch.Tensor) -> bool:
    """p's type follows the flatten protocol (a wrapper subclass, TorchAO style)."""
    return hasattr(type(p), "__tensor_flatten__")


def wrapper_inner(p: torch.Tensor) -> Tuple[List[Tuple[str, torch.Tensor]], str]:
    """([(attribute, inner tensor)] named by wrapper p's __tensor_flatten__(), "") or ([], why
    they cannot be read)."""
    try:
        flat = getattr(p, "__tensor_flatten__")()
        names = list(flat[0])
    except Exception as e:  # the protocol is a convention: whatever it raises is named
        return [], f"its __tensor_flatten__() failed ({_native.exc_line(e)})"
    if not names:
        return [], "its __tensor_flatten__() names no inner tensors"
    out: List[Tuple[str, torch.Tensor]] = []
    for attr in names:
        t = getattr(p, attr, None) if isinstance(attr, str) else None
        if not isinstance(attr, str) or not attr.isidentifier():
            return [], f"its __tensor_flatten__() names {attr!r}, not an attribute name"
        if not isinstance(t, torch.Tensor):
            return [], f"its inner attribute {attr} is not a tensor"
        out.append((attr, t))
    return out, ""


def _nested(t: torch.Tensor) -> bool:
    """Inner tensor t is itself a wrapper (TorchAO's AffineQuantizedTensor holds its data and
    scales in a tensor_impl wrapper)."""
    return type(t) is not torch.Tensor and is_wrapper(t)


def wrapper_leaves(p: torch.Tensor, path: str = "", depth: int = 0
                   ) -> Tuple[List[Tuple[str, torch.Tensor]], str]:
    """([(path, plain inner tensor)], "") of wrapper p, through inner wrappers (the path joins
    the attribute names with ':', "tensor_impl:float8_data"), or ([], why not)."""
    inner, why = wrapper_inner(p)
    if why:
        return [], (f"its inner tensor {path} (a {type(p).__name__}): {why[4:]}" if path
                    else why)
    out: List[Tuple[str, torch.Tensor]] = []
    for attr, t in inner:
        sub = f"{path}:{attr}" if path else attr
        if not _nested(t):
            out.append((sub, t))
            continue
        if depth >= _MAX_NESTING:
            return [], f"its inner tensor {sub} nests wrappers more than {_MAX_NESTING} deep"
        got, why = wrapper_leaves(t, sub, depth + 1)
        if why:
            return [], why
        out.extend(got)
    for i, (sub, t) in enumerate(out):
        if any(u is t for _s, u in out[:i]):
            return [], f"its inner tensor {sub} is the same tensor as another"
    return out, ""


def _wrapper_refusal(name: str, p: torch.Tensor, to_ddo: Dict[torch.dtype, int]
                     ) -> Optional[str]:
    """refusal() of wrapper p: None when each inner tensor (through inner wrappers) is a plain
    dense contiguous tensor of a ddo dtype (ddo rebinds it in place); else one line naming the
    first that is not."""
    kind = type(p).__name__
    leaves, why = wrapper_leaves(p)
    for sub, t in leaves:
        if type(t) is not torch.Tensor:
            why = (f"its inner tensor {sub} is a {type(t).__name__}, itself a subclass without "
                   f"the flatten protocol (ddo rebinds plain inner tensors only)")
        elif t.is_sparse or t.layout != torch.strided:
            why = f"its inner tensor {sub} is a {t.layout} tensor (ddo moves dense bytes)"
        elif t.is_quantized or t.dtype not in to_ddo:
            why = f"its inner tensor {sub} has dtype {t.dtype}, which ddo cannot move as bytes"
        elif not t.is_contiguous():
            why = (f"its inner tensor {sub} is not contiguous (ddo moves whole contiguous "
                   f"tensors)")
        if why:
            break
    if not why:
        return None
    return (f"parameter {name}: {kind} is a wrapper tensor subclass (__tensor_flatten__, "
            f"TorchAO style) whose inner tensors ddo cannot rebind faithfully: {why}: "
            f"{_ROUTE_HINT}")


def stored_parts(p: torch.Tensor) -> List[Tuple[str, torch.Tensor, torch.Tensor]]:
    """[(name suffix, the plain tensor ddo stores, the tensor whose .data ddo rebinds)] of a
    parameter that refusal() passed: ("", its data, p itself) for a Parameter (a subclass
    over a plain tensor included); (":" + path, inner, inner) for each plain inner tensor of a
    wrapper, through inner wrappers (the suffix keeps the layer's module name: ddo's units are
    named by module)."""
    if is_wrapper(p):  # (t.data: an alias of its own, which the rebinding of t leaves be)
        return [(":" + sub, t.data, t) for sub, t in wrapper_leaves(p)[0]]
    return [("", plain_data(p), p)]


def rebuilt_wrapper(w: torch.Tensor, value_of: Callable[[torch.Tensor], Optional[torch.Tensor]]
                    ) -> Optional[torch.Tensor]:
    """A new wrapper of w's type (its __tensor_unflatten__ with its flatten context, through
    inner wrappers) over value_of(each plain inner tensor), or None where a type has no
    __tensor_unflatten__ or value_of gives None. w itself is not touched."""
    unflatten = getattr(type(w), "__tensor_unflatten__", None)
    if unflatten is None:
        return None
    names, ctx = getattr(w, "__tensor_flatten__")()
    inner: Dict[str, torch.Tensor] = {}
    for attr in names:
        t = getattr(w, attr)
        v = rebuilt_wrapper(t, value_of) if _nested(t) else value_of(t)
        if v is None:
            return None
        inner[attr] = v
    try:  # torch >= 2.1's signature (outer size and stride), then the older one
        out: torch.Tensor = unflatten(inner, ctx, w.shape, w.stride())
    except TypeError:
        out = unflatten(inner, ctx)
    return out


def _held_tensors(p: torch.Tensor) -> str:
    """The name of an attribute of Parameter subclass p that holds tensors (directly, or in an
    object's attributes, one level down), or ""."""
    attrs: Dict[str, object] = getattr(p, "__dict__", {})
    for k, v in attrs.items():
        if isinstance(v, torch.Tensor):
            return k
        inner = getattr(v, "__dict__", None)
        if isinstance(inner, dict) and any(isinstance(x, torch.Tensor) for x in inner.values()):
            return k
    return ""


def unstreamable(module: torch.nn.Module,
                 to_ddo: Optional[Dict[torch.dtype, int]] = None) -> List[Tuple[str, str]]:
    """[(parameter name, one line)] of module's quantized parameters ddo cannot stream (a
    tensor subclass or torch's qint dtypes; routing.py names them in the route's reason).
    to_ddo (torch dtype -> ddo dtype) is asked of the library only when such a parameter is
    there: a plain model needs no library for this."""
    out: List[Tuple[str, str]] = []
    for name, p in module.named_parameters():
        if type(p) is torch.nn.Parameter and not p.is_quantized:
            continue  # a plain tensor: enable_offload's own checks name what is wrong
        if to_ddo is None:
            from . import _torch
            to_ddo = _torch.dtype_tables()[0]
        why = refusal(name, p, to_ddo)
        if why is not None:
            out.append((name, why))
    return out


def _block_of(p: torch.Tensor) -> Optional[Tuple[int, int]]:
    """(elements, bytes) per block of a GGUF-like Parameter's quant_type, or None."""
    qt = getattr(p, "quant_type", None)
    if qt is None:
        return None
    qname = getattr(qt, "name", None)  # an enum member's (GGMLQuantizationType); an int has none
    entry = _BY_NAME.get(qname) if isinstance(qname, str) else None
    if entry is None:
        try:
            entry = GGML_BLOCKS.get(int(qt))
        except (TypeError, ValueError):
            return None
    return None if entry is None else entry[1:]


def _compute_bytes(module: torch.nn.Module) -> int:
    """Bytes per element of the dtype module computes in: its compute_dtype attribute
    (Diffusers' GGUF and layerwise-casting layers), else its scale's float dtype, else 2
    (bf16/f16, what the hosts compute quantized layers in)."""
    dt = getattr(module, "compute_dtype", None)
    if isinstance(dt, torch.dtype):
        return torch.empty(0, dtype=dt).element_size()
    for s in SCALE_NAMES:
        t = getattr(module, s, None)
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            return max(2, t.element_size())
    return 2


def dequantized_bytes(module: torch.nn.Module, pname: str, p: torch.Tensor) -> int:
    """The bytes of parameter pname of module dequantized at the compute dtype, or 0 when it
    is not a quantized weight: a GGUF-like Parameter (quant_type), a float8 dtype, or the
    ComfyUI layout's weight (uint8 or float8 bytes with a weight_scale / scale_weight), or a
    wrapper subclass (its own shape at its own dtype: what its dequantize makes)."""
    if is_wrapper(p):
        return p.numel() * torch.empty(0, dtype=p.dtype).element_size()
    data = plain_data(p)
    n = data.numel()
    blk = _block_of(p)
    if blk is not None:
        elems, nbytes = blk
        if nbytes == 0 or (n * data.element_size()) % nbytes:
            return 0
        n = n * data.element_size() // nbytes * elems
    elif not (str(data.dtype).startswith("torch.float8") or
              (pname == "weight" and data.element_size() == 1 and
               any(isinstance(getattr(module, s, None), torch.Tensor) for s in SCALE_NAMES))):
        return 0
    return n * _compute_bytes(module)


def largest_scratch(module: torch.nn.Module) -> Tuple[int, str]:
    """(bytes, parameter name) of the largest quantized weight dequantized at its compute
    dtype: what the host's dequantization allocates on the device beside ddo's slots."""
    best, where = 0, ""
    for mname, m in module.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            b = dequantized_bytes(m, pname, p)
            if b > best:
                best, where = b, f"{mname}.{pname}" if mname else pname
    return best, where


def detached_like(p: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    """What an unmanaged module's state_dict() holds for a Parameter subclass p whose values
    are host: the same type with p's attributes (torch's p.detach() keeps the subclass)."""
    if not isinstance(p, torch.nn.Parameter) or not is_param_subclass(p):
        return host
    return subclass_like(p, host, False)


def subclass_like(p: _P, t: torch.Tensor, requires_grad: bool) -> _P:
    """A Parameter over t of p's own type (a Parameter subclass) with p's attributes."""
    # torch's stubs disagree on _make_subclass (1.13: a method of the instance returning
    # Tensor; 2.x: a static method returning the class given): reached through getattr.
    make: Callable[[Type[_P], torch.Tensor, bool], _P] = getattr(torch.Tensor, "_make_subclass")
    q = make(type(p), t, requires_grad)
    q.__dict__.update(p.__dict__)
    return q
