"""LoRA on a module ddo streams: load, switch, fuse and unfuse (docs/lora.md).

An unmerged LoRA needs nothing from ddo: its layers add ``lora_B(lora_A(x)) * scaling`` to the
base layer's output, and the base weight is bound as any other. A merge (Diffusers'
``fuse_lora``, PEFT's ``merge_adapter`` / ``LoraLayer.merge``) writes the delta into the base
weight through ``p.data``; on a managed module that weight is an empty placeholder outside its
forward, and the checkpoint ddo uploads from never changes. So ddo takes over the merge and
unmerge of every LoRA layer whose base weight it manages (device-side replay):

  - Each merge or unmerge is recorded in a log per base weight (adapter, sign, safe or not, the
    scaling and the adapter's own A/B modules at that moment), in order.
  - Whenever the weight's device copy is bound (a lease, or a resident binding), the ops of the
    log that copy has not had are applied to it in order, with the layer's own
    ``get_delta_weight`` and PEFT's arithmetic (``w += delta`` / ``w += delta.to(dtype)`` /
    ``w -= delta.to(dtype)``): a copy fresh from the checkpoint gets the whole log, a copy
    that stayed in its slot only the new ops. ``ddo_session_tensor_loads`` says which: it counts
    the writes of a weight's device copy from the host. A log, not a sum: in floating point
    (w + dA + dB) - dB is not w + dA, and the bytes must equal the unmanaged module's.
  - The replay writes through ``p.data`` (its own version counter): the write detection of
    the binding (version counters at release) never sees it.

Nothing is read from the checkpoint for a merge or a switch; a merge costs the delta's compute
once (validation), and every fresh device copy of a merged weight costs its deltas' compute
(one ``B @ A`` per op in the log) on the device. close() gives a host-memory module host copies
with the log applied (one host copy of each merged weight).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import threading
import warnings
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, NoReturn, Optional,
                    Protocol, Sequence, Tuple)

import torch
from torch.utils.hooks import RemovableHandle

from . import _enums, _native, _quant, _torch
from ._native import DdoError

_STREAMED = _enums.DDO_PLACEMENT_STREAMED
_RESIDENT = _enums.DDO_PLACEMENT_RESIDENT
_SKIPPED = _enums.DDO_PLACEMENT_SKIPPED

# The module's own methods that merge adapters (Diffusers' PeftAdapterMixin, PEFT's tuner): with
# no LoRA layer over a managed weight they are refused as before (they would write through
# p.data into an empty placeholder); with one, they run, and the layers' merges are ddo's.
MERGES = ("fuse_lora", "merge_adapter")
# The module's own methods that load, switch or unmerge adapters: refused inside a forward; the
# LoRA layers they add are taken over when they return.
OTHERS = ("unfuse_lora", "unmerge_adapter", "load_lora_adapter", "load_adapter", "add_adapter",
          "set_adapters",
          "set_adapter", "delete_adapters", "delete_adapter", "unload_lora", "enable_lora",
          "disable_lora", "enable_adapters", "disable_adapters")

# A PEFT LoraLayer (a torch.nn.Module with base_layer, lora_A / lora_B ModuleDicts, scaling,
# merged_adapters, get_delta_weight, merge, unmerge; is_lora_layer), duck-typed: PEFT is no
# dependency of ddo, and its layer classes differ between PEFT versions.
LoraLayer = Any


class _Entry(Protocol):
    """The parts of a ddo tensor (offload.py's _Param) that the replay reads."""
    index: int
    name: str
    params: List[torch.nn.Parameter]  # the Parameters (tied ones included) that show it
    torch_dtype: torch.dtype
    shape: Tuple[int, ...]
    host: Optional[torch.Tensor]
    placement: int


class _Result(Protocol):
    """The parts of an OffloadResult (offload.py) that Lora uses (read-only properties: the
    result's own attributes are of its own, narrower types)."""
    @property
    def module(self) -> torch.nn.Module: ...
    @property
    def device(self) -> Optional[torch.device]: ...  # set before Lora is made
    @property
    def _handles(self) -> List[RemovableHandle]: ...
    @property
    def _entry_of(self) -> Mapping[int, _Entry]: ...  # id(Parameter) -> its ddo tensor
    @property
    def _tensors(self) -> Sequence[_Entry]: ...
    @property
    def _lock(self) -> threading.Lock: ...
    @property
    def _owner(self) -> Optional[List[int]]: ...  # [thread ident, depth] while a forward runs
    @property
    def _state(self) -> str: ...
    @property
    def _session(self) -> Optional[ctypes.c_void_p]: ...

    def _alive(self, what: str) -> None: ...
    def _not_in_forward(self, what: str) -> None: ...
    def _host_value(self, t: Any) -> torch.Tensor: ...  # t: the result's record of a tensor


def is_lora_layer(m: object) -> bool:
    """m has the parts of PEFT's LoraLayer that a merge uses."""
    return all(hasattr(m, a) for a in ("base_layer", "lora_A", "lora_B", "merged_adapters",
                                       "scaling", "get_delta_weight", "merge", "unmerge"))


class _Op:
    """One merge (+1) or unmerge (-1) of adapter on a base weight, as it was when made."""
    __slots__ = ("layer", "name", "sign", "safe", "scaling", "a_mod", "b_mod", "cast")

    def __init__(self, layer: LoraLayer, name: str, sign: int, safe: bool) -> None:
        self.layer, self.name, self.sign, self.safe = layer, name, sign, safe
        self.scaling: float = layer.scaling[name]
        self.a_mod: torch.nn.Module = layer.lora_A[name]
        self.b_mod: torch.nn.Module = layer.lora_B[name]
        # PEFT's unsafe merge adds the delta as computed in its Linear layer (``w += delta``)
        # and cast to the weight's dtype in its conv layers (``w += delta.to(dtype)``).
        self.cast = not isinstance(self.a_mod, torch.nn.Linear)


def _base_weight(layer: LoraLayer) -> Optional[torch.Tensor]:
    base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer.base_layer
    w: Optional[torch.Tensor] = getattr(base, "weight", None)
    return w


class Lora:
    """The LoRA state of one OffloadResult: wrapped layers and the op log of each weight."""

    def __init__(self, result: _Result) -> None:
        self.r = result
        # ddo tensor index -> [_Op]
        self.logs: Dict[int, List[_Op]] = {}
        # ddo tensor index -> (loads of the bound copy, ops applied to it)
        self.seen: Dict[int, Tuple[int, int]] = {}
        # id(layer) -> (layer, ddo tensor; None: a layer whose merge is refused)
        self.layers: Dict[int, Tuple[LoraLayer, Optional[_Entry]]] = {}
        # method name -> the module's own __dict__ entry (None: none)
        self.own_root: Dict[str, object] = {}
        self.batch = 0       # inside a module-level call: bound copies caught up at its end

    # ---- installing ----

    def install(self) -> None:
        m = self.r.module
        for name in MERGES + OTHERS:
            fn = getattr(m, name, None)
            if not callable(fn):
                continue
            self.own_root[name] = m.__dict__.get(name)
            setattr(m, name, self._root_method(name, fn))
        self.sweep(adopt=False)  # merged before enable_offload: the checkpoint holds it
        # PEFT's inject_adapter_in_model / get_peft_model on the managed module leave its
        # peft_config changed: the next root forward takes the new layers over (a dict lookup
        # per forward; the tree is walked only when it changed).
        self.peft_state: Optional[Tuple[str, ...]] = self._peft_state()
        self.r._handles.append(m.register_forward_pre_hook(_torch.no_compile(self._pre_forward)))

    def _peft_state(self) -> Optional[Tuple[str, ...]]:
        cfg = self.r.module.__dict__.get("peft_config")
        return tuple(cfg) if isinstance(cfg, dict) else None

    def _pre_forward(self, module: torch.nn.Module, args: Tuple[object, ...]) -> None:
        state = self._peft_state()
        if state != self.peft_state:
            self.peft_state = state
            self.sweep()

    def sweep(self, adopt: bool = True) -> None:
        """Takes over the merges of every LoRA layer over a weight ddo manages. adopt: a layer
        found merged already (PEFT merged it before ddo saw the layer) has its merges logged
        where they reached a device copy that lasts (a resident one)."""
        for lname, layer in self.r.module.named_modules():
            if "base_layer" not in layer._modules or id(layer) in self.layers or \
                    not is_lora_layer(layer):
                continue
            w = _base_weight(layer)
            t = self.r._entry_of.get(id(w)) if w is not None else None
            if t is None or t.placement == _SKIPPED:
                self._refuse_other(layer, lname or "(root)")
                continue
            self.layers[id(layer)] = (layer, t)
            own_merge, own_unmerge = layer.merge, layer.unmerge
            layer.__dict__["merge"] = functools.wraps(own_merge)(
                functools.partial(self._merge, layer, lname or "(root)", own_merge))
            layer.__dict__["unmerge"] = functools.wraps(own_unmerge)(
                functools.partial(self._unmerge, layer, lname or "(root)"))
            if adopt and layer.merged_adapters and t.placement == _RESIDENT and self._bound(t):
                self._adopt(layer, t)

    def _adopt(self, layer: LoraLayer, t: _Entry) -> None:
        """PEFT merged layer into t's resident copy before ddo took the layer over: the merges
        are in that copy; logged (at the layer's scaling now, unsafe, as PEFT merges by
        default) so a fresh copy after a reload gets them too. (On a streamed weight PEFT's
        merge fails: the weight is an empty placeholder outside its forward.)"""
        log = self.logs.setdefault(t.index, [])
        loads = self._loads(t)
        if log and self.seen.get(t.index) != (loads, len(log)):
            return  # that copy does not hold the log: nothing to build on
        log.extend(_Op(layer, n, +1, False) for n in layer.merged_adapters
                   if n in layer.lora_A.keys())
        self.seen[t.index] = (loads, len(log))

    def _managed(self, p: torch.Tensor) -> bool:
        """Parameter p is streamed or resident under ddo (a wrapper subclass: through its
        inner tensors, _quant.stored_parts)."""
        held = [h for _s, _d, h in _quant.stored_parts(p)] if _quant.is_wrapper(p) else [p]
        return any(id(h) in self.r._entry_of and self.r._entry_of[id(h)].placement != _SKIPPED
                   for h in held)

    def _refuse_other(self, layer: LoraLayer, lname: str) -> None:
        """A LoRA layer over managed weights other than one ``weight`` (PEFT's
        MultiheadAttention LoRA replaces in_proj_weight), or over a wrapper subclass weight
        (TorchAO style, streamed as its inner tensors): its merge is refused by name."""
        base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer.base_layer
        if not any(self._managed(p) for p in base.parameters(recurse=False)):
            return
        self.layers[id(layer)] = (layer, None)
        w = _base_weight(layer)
        why = (f"over a {type(w).__name__} weight (a wrapper tensor subclass, stored quantized: "
               f"ddo does not dequantize, merge and requantize on the device)"
               if w is not None and _quant.is_wrapper(w) else
               f"over {type(base).__name__} (no single weight to merge into)")

        def refused(*args: object, **kwargs: object) -> NoReturn:
            raise DdoError("DDO_E_UNSUPPORTED", f"{lname}: a {type(layer).__name__} LoRA layer "
                           f"{why}, whose merge ddo does not replay; use it unmerged or merge it "
                           f"before enable_offload")
        layer.__dict__["merge"] = refused
        layer.__dict__["unmerge"] = refused

    def _root_method(self, name: str, fn: Callable[..., object]) -> Callable[..., object]:
        r = self.r
        kind = type(r.module).__name__

        @functools.wraps(fn)
        def run(*args: object, **kwargs: object) -> object:
            r._alive(name)
            r._not_in_forward(name)
            self.sweep()
            if name in MERGES and not self.layers:
                raise DdoError("DDO_E_STATE", f"{kind}.{name}: no LoRA layer (PEFT's "
                               f"LoraLayer: base_layer, lora_A, lora_B, merge) over a weight "
                               f"ddo manages, and a write into the weights in place would be "
                               f"lost (ddo uploads them from the checkpoint): {name} before "
                               f"enable_offload (or close(), {name}, enable_offload again)")
            saved = {k: len(v) for k, v in self.logs.items()}
            merged = [(layer, list(layer.merged_adapters))
                      for layer, _ in self.layers.values()]
            self.batch += 1
            try:
                with self._loading():
                    out = fn(*args, **kwargs)
            except BaseException:
                # The whole call is undone (ddo wrote nothing yet: bound copies catch up at the
                # end of a call), so a refused merge in one layer leaves no other merged.
                for k in list(self.logs):
                    del self.logs[k][saved.get(k, 0):]
                for layer, before in merged:
                    layer.merged_adapters[:] = before
                raise
            finally:
                self.batch -= 1
            self.sweep()
            if not self.batch:  # the outermost call (Diffusers' methods call one another)
                self.flush()
            return out
        return run

    @contextlib.contextmanager
    def _loading(self) -> Iterator[None]:
        """Inside the module's own LoRA methods, its load_state_dict (refused on a managed
        module: it would write into weights ddo uploads from the checkpoint) loads what touches
        no managed weight: the adapter's weights, as PEFT's set_peft_model_state_dict loads
        them (strict=False, on the module ddo manages)."""
        m = self.r.module
        refused: Optional[Callable[..., object]] = m.__dict__.get("load_state_dict")
        if refused is None:
            yield
            return
        refuse = refused  # not None: typed so for the function below
        managed = {n for n, p in m.named_parameters() if self._managed(p)}

        # strict (and torch 2's assign) passed on as given
        def load_state_dict(state_dict: Mapping[str, object], *args: Any,
                            **kwargs: Any) -> object:
            if any(k in managed for k in state_dict):
                return refuse(state_dict, *args, **kwargs)
            return type(m).load_state_dict(m, state_dict, *args, **kwargs)
        m.__dict__["load_state_dict"] = load_state_dict
        try:
            yield
        finally:
            m.__dict__["load_state_dict"] = refused

    def teardown(self) -> None:
        """The wrappers removed (close)."""
        m = self.r.module
        for name, own in self.own_root.items():
            m.__dict__.pop(name, None)
            if own is not None:
                setattr(m, name, own)
        self.own_root = {}
        for layer, _t in self.layers.values():
            layer.__dict__.pop("merge", None)
            layer.__dict__.pop("unmerge", None)
        self.layers = {}

    def host_copies(self) -> None:
        """After close restored the host tensors: a host-memory module's merged weights get a
        copy with the log applied (the checkpoint's tensors stay as they are)."""
        for idx, log in self.logs.items():
            t = self.r._tensors[idx]
            if not log or t.host is None or not t.params or \
                    idx in getattr(self.r, "_file_backed", ()):
                continue
            h = t.host.clone()
            for op in log:
                self._apply(h, op)
            for p in t.params:
                p.data = h
        self.logs, self.seen = {}, {}

    # ---- the layers' merge and unmerge ----

    def _forward_running(self) -> bool:
        with self.r._lock:
            return self.r._owner is not None

    def _bound(self, t: _Entry) -> bool:
        p = t.params[0]
        return self.r._state == "ready" and tuple(p.data.shape) == t.shape and \
            p.data.device == self.r.device

    def _merge(self, layer: LoraLayer, lname: str, own: Callable[..., object], *args: object,
               **kwargs: object) -> None:
        _, t = self.layers[id(layer)]
        assert t is not None  # sweep() wraps the merge of a layer over a managed weight only
        ba = inspect.signature(own).bind(*args, **kwargs)  # PEFT's own TypeError if not
        safe = bool(ba.arguments.get("safe_merge", False))
        names: Optional[Sequence[str]] = ba.arguments.get("adapter_names")
        self._in_forward_check(t, lname, "merge")
        if names is None:
            names = layer.active_adapters
        if isinstance(names, str):
            raise ValueError(f"adapter_names should be a list of strings, got {names!r}.")
        todo = [n for n in names if n not in layer.merged_adapters]
        if layer.merged_adapters:
            warnings.warn(f"Already following adapters were merged "
                          f"{','.join(layer.merged_adapters)}. You are now additionally merging "
                          f"{','.join(todo)}." if todo else
                          "All adapters are already merged, nothing to do.")
        todo = [n for n in todo if n in layer.lora_A.keys() or
                n in getattr(layer, "lora_embedding_A", {})]
        ops: List[_Op] = []
        for n in todo:
            self._refuse_variants(layer, lname, n, t)
            op = _Op(layer, n, +1, safe)
            self._check_delta(op, lname, t)
            ops.append(op)
        for op in ops:
            self.logs.setdefault(t.index, []).append(op)
            layer.merged_adapters.append(op.name)
        if ops and not self.batch and self._bound(t):
            self.catch_up(t)

    def _unmerge(self, layer: LoraLayer, lname: str, *args: object, **kwargs: object) -> None:
        _, t = self.layers[id(layer)]
        assert t is not None  # sweep() wraps the unmerge of a layer over a managed weight only
        if args or kwargs:
            raise DdoError("DDO_E_INVALID_ARGUMENT", f"{lname}.unmerge() takes no adapter "
                           f"names: PEFT's unmerge takes every merged adapter out of the "
                           f"layer, newest first ({', '.join(layer.merged_adapters) or 'none'});"
                           f" unmerge, then merge again the ones to keep")
        self._in_forward_check(t, lname, "unmerge")
        if not layer.merged_adapters:
            warnings.warn("Already unmerged. Nothing to do.")
            return
        ops: List[_Op] = []
        for n in reversed(layer.merged_adapters):
            if n in layer.lora_A.keys():
                ops.append(_Op(layer, n, -1, False))
        layer.merged_adapters.clear()
        if ops:
            self.logs.setdefault(t.index, []).extend(ops)
            if not self.batch and self._bound(t):
                self.catch_up(t)

    def _in_forward_check(self, t: _Entry, lname: str, what: str) -> None:
        if self._forward_running() and not self._bound(t):
            raise DdoError("DDO_E_BUSY", f"{lname}.{what}: a forward of "
                           f"{type(self.r.module).__name__} is running and this layer's base "
                           f"weight is off the device; {what} after the forward returns")

    def _refuse_variants(self, layer: LoraLayer, lname: str, n: str, t: _Entry) -> None:
        """What a replay cannot reproduce faithfully: refused by name, nothing changed."""
        variant = getattr(layer, "lora_variant", {}).get(n)
        if variant is not None or getattr(layer, "use_dora", {}).get(n):
            kind = type(variant).__name__ if variant is not None else "DoRA"
            raise DdoError("DDO_E_UNSUPPORTED", f"{lname}: adapter {n!r} is a LoRA variant "
                           f"({kind}) whose merge ddo cannot replay on its device copies; "
                           f"use it unmerged (its forward works while streaming) or merge it "
                           f"before enable_offload")
        if getattr(layer, "lora_bias", {}).get(n):
            raise DdoError("DDO_E_UNSUPPORTED", f"{lname}: adapter {n!r} has lora_bias=True "
                           f"(its merge writes the base bias too), which ddo does not replay; "
                           f"use it unmerged or merge it before enable_offload")
        if n in getattr(layer, "lora_embedding_A", {}):
            raise DdoError("DDO_E_UNSUPPORTED", f"{lname}: adapter {n!r} is an embedding LoRA, "
                           f"whose merge ddo does not replay; use it unmerged or merge it "
                           f"before enable_offload")
        base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer.base_layer
        if getattr(base, "groups", 1) > 1:  # as PEFT's conv layers refuse it
            raise NotImplementedError("Merging is not supported for _ConvNd layers with "
                                      "groups > 1!")
        p = t.params[0]
        if not t.torch_dtype.is_floating_point or \
                torch.empty(0, dtype=t.torch_dtype).element_size() < 2 or \
                type(p) is not torch.nn.Parameter:
            raise DdoError("DDO_E_UNSUPPORTED", f"{lname}: adapter {n!r}: the base weight "
                           f"{t.name} is stored quantized ({type(p).__name__}, "
                           f"{t.torch_dtype}), and ddo does not dequantize, merge and "
                           f"requantize on the device; use the adapter unmerged (applied after "
                           f"the layer's dequantization)")

    def _check_delta(self, op: _Op, lname: str, t: _Entry) -> None:
        """The merge's delta computed once, as PEFT computes it: its shape must be the
        weight's (else one line, nothing merged); a safe merge refuses a non-finite one."""
        try:
            delta = self._delta(op)
        except (RuntimeError, KeyError) as e:
            raise DdoError("DDO_E_INVALID_ARGUMENT", f"{lname}: adapter {op.name!r} cannot "
                           f"be merged into {t.name} {list(t.shape)}: its delta weight failed "
                           f"({_native.exc_line(e)}); "
                           f"nothing was merged") from None
        if tuple(delta.shape) != t.shape or delta.device != self.r.device:
            raise DdoError("DDO_E_INVALID_ARGUMENT", f"{lname}: adapter {op.name!r} does not "
                           f"match its base weight: delta {list(delta.shape)} on {delta.device}"
                           f", weight {t.name} {list(t.shape)} on {self.r.device} (a LoRA made "
                           f"for another model?); nothing was merged")
        if op.safe:
            w = t.params[0].data if self._bound(t) else None
            merged = delta if w is None else w + delta.to(w.dtype)
            if not torch.isfinite(merged).all():
                raise ValueError(f"NaNs detected in the merged weights. The adapter "
                                 f"{op.name} seems to be broken")

    # ---- replay ----

    @contextlib.contextmanager
    def _as_at(self, op: _Op) -> Iterator[None]:
        """The layer as it was when op was made: its scaling, its A/B modules (put back for
        the call where the adapter was deleted since), their weights on the device."""
        layer, n = op.layer, op.name
        undo: List[Tuple[torch.nn.ModuleDict, Optional[torch.nn.Module]]] = []
        had = n in layer.scaling
        old_scaling = layer.scaling.get(n)
        layer.scaling[n] = op.scaling
        for md, mod in ((layer.lora_A, op.a_mod), (layer.lora_B, op.b_mod)):
            prev = md[n] if n in md.keys() else None
            if prev is not mod:
                md[n] = mod
                undo.append((md, prev))
        shown: List[Tuple[torch.nn.Parameter, torch.Tensor]] = []
        for mod in (op.a_mod, op.b_mod):
            for p in mod.parameters(recurse=True):
                t = self.r._entry_of.get(id(p))
                if t is not None and t.placement != _SKIPPED and tuple(p.data.shape) != t.shape:
                    shown.append((p, p.data))
                    p.data = self.r._host_value(t).to(self.r.device)
        try:
            yield
        finally:
            for p, before in shown:
                p.data = before
            for md, prev in undo:
                if prev is None:
                    del md[n]
                else:
                    md[n] = prev
            if had:
                layer.scaling[n] = old_scaling
            else:
                del layer.scaling[n]

    def _delta(self, op: _Op) -> torch.Tensor:
        with self._as_at(op), torch.no_grad():
            delta: torch.Tensor = op.layer.get_delta_weight(op.name)
            return delta

    def _apply(self, w: torch.Tensor, op: _Op) -> None:
        """PEFT's arithmetic on w: unsafe merge ``w += delta`` (Linear; conv layers cast the
        delta first), safe merge ``w + delta.to(dtype)`` (the same bits as its clone, add and
        assign), unmerge ``w -= delta.to(dtype)``."""
        delta = self._delta(op)
        if delta.device != w.device:
            delta = delta.to(w.device)
        with torch.no_grad():
            if op.sign < 0:
                w.sub_(delta.to(w.dtype))
            elif op.safe or op.cast:
                w.add_(delta.to(w.dtype))
            else:
                w.add_(delta)

    def _loads(self, t: _Entry) -> int:
        n = ctypes.c_uint64()
        L = _native.lib()
        _native.check(L.ddo_session_tensor_loads(self.r._session, t.index, ctypes.byref(n)),
                      L.ddo_session_error(self.r._session))
        return n.value

    def catch_up(self, t: _Entry) -> None:
        """t's bound device copy gets the ops of its log it has not had (all of them when it
        is fresh from the checkpoint), each once."""
        log = self.logs.get(t.index)
        if not log:
            return
        loads = self._loads(t)
        seen_loads, applied = self.seen.get(t.index, (None, 0))
        if seen_loads != loads:
            applied = 0
        w = t.params[0].data  # an alias with its own version counter: no write detected
        for op in log[applied:]:
            self._apply(w, op)
        self.seen[t.index] = (loads, len(log))

    def bound(self, tensors: Iterable[_Entry]) -> None:
        """Called after tensors were bound to their device copies (a lease, the residents)."""
        if not self.logs:
            return
        for t in tensors:
            if t.index in self.logs and t.placement != _SKIPPED and self._bound(t):
                self.catch_up(t)

    def flush(self) -> None:
        """The end of a module-level call: bound copies (residents) catch up."""
        for idx in list(self.logs):
            t = self.r._tensors[idx]
            if self._bound(t):
                self.catch_up(t)
