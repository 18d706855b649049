"""Whole-component ownership (vmm_component_tensor_ownership): the preflight.

With the option on (native fast route only; the library refuses it elsewhere), ddo takes
every tensor of a component such as a text encoder: every parameter becomes a ddo tensor
(streamed or resident), and the buffers are copied to the device once, within
vmm_component_buffer_limit_mb. Before anything is set up the component must pass:

  - immutable plain tensors: every parameter a torch.nn.Parameter over a plain dense tensor of
    a dtype ddo moves (a GGUF-style Parameter subclass over one counts; no wrapper or other
    tensor subclass, quantized or sparse tensor);
  - no partial aliases: parameters may share one tensor (tied weights), but a parameter that
    is a view into another's storage (another offset, shape or stride) is refused;
  - nothing left out: skip_modules_pattern must be empty (ownership means every tensor);
  - bounded buffers: the buffers' bytes at most vmm_component_buffer_limit_mb MiB.

Each refusal is one line naming the component, the tensor and the option.
"""

from typing import Any, Dict, NoReturn, Set, Tuple

import torch

from . import _native, _quant, _talk, _torch


def _refuse(component: str, what: str) -> NoReturn:
    raise _native.DdoError("DDO_E_UNSUPPORTED", f"component {component}: whole-component "
                           f"ownership (vmm_component_tensor_ownership) refused: {what}")


def _check_tensors(module: torch.nn.Module, component: str, to_ddo: Dict[torch.dtype, int]) -> int:
    spans: Dict[int, Tuple[str, Any]] = {}
    seen: Set[int] = set()
    named = [(f"{mn}.{pn}" if mn else pn, p)
             for mn, m in module.named_modules(remove_duplicate=False)
             for pn, p in m._parameters.items() if p is not None]
    for name, p in named:
        if type(p) is not torch.nn.Parameter and _quant.refusal(name, p, to_ddo) is not None:
            _refuse(component, f"parameter {name} is a {type(p).__name__}, not a plain "
                    f"tensor (use the compatibility route)")
        if _quant.is_wrapper(p):  # streamed as its inner tensors on the default ownership
            _refuse(component, f"parameter {name} is a {type(p).__name__}, a wrapper tensor "
                    f"subclass whose inner tensors ddo rebinds one by one (leave "
                    f"vmm_component_tensor_ownership off)")
        d = _quant.plain_data(p)  # a GGUF-style Parameter subclass: its bytes, as streamed
        if d.is_quantized or d.is_sparse or d.dtype not in to_ddo:
            _refuse(component, f"parameter {name} ({d.dtype}) cannot be moved as plain bytes")
        if d.device.type == "meta":
            seen.add(id(p))
            continue  # file-backed: the checkpoint slices are immutable and disjoint
        # untyped_storage: torch >= 2.0; storage (torch 1.13) is not annotated there
        st = d.untyped_storage() if hasattr(d, "untyped_storage") else getattr(d, "storage")()
        key = st.data_ptr()
        me = (d.data_ptr(), tuple(d.shape), tuple(d.stride()), d.dtype)
        other = spans.get(key)
        if other is not None and other[1] != me:
            _refuse(component, f"parameter {name} is a partial alias of {other[0]} (a view "
                    f"into the same storage with another offset or shape): shared tensors "
                    f"must be whole (tied weights)")
        spans.setdefault(key, (name, me))
        seen.add(id(p))
    return len(seen)


def preflight(module: torch.nn.Module, cfg: _native.Config, component: str) -> Dict[str, Any]:
    """Checks module for whole-component ownership when cfg asks for it; returns a summary
    dict ({} when the option is off). Raises DdoError (one line) on a refusal."""
    if cfg.get("vmm_component_tensor_ownership") != "true":
        return {}
    to_ddo, _ = _torch.dtype_tables()
    skip = cfg.get("skip_modules_pattern")
    if skip:
        _refuse(component, f"skip_modules_pattern={skip!r} leaves tensors out; ownership "
                f"takes every tensor of the component")
    tensors = _check_tensors(module, component, to_ddo)
    limit = float(cfg.get("vmm_component_buffer_limit_mb") or 0) * (1 << 20)
    total, largest = 0, ("", 0)
    for name, b in module.named_buffers():
        n = b.numel() * b.element_size()
        total += n
        if n > largest[1]:
            largest = (name, n)
    if total > limit:
        _refuse(component, f"its buffers hold {_talk.size(total)} (largest {largest[0]}, "
                f"{_talk.size(largest[1])}), over vmm_component_buffer_limit_mb="
                f"{cfg.get('vmm_component_buffer_limit_mb')} MiB")
    return {"tensors": tensors, "buffer_bytes": total, "buffer_limit_bytes": int(limit)}
