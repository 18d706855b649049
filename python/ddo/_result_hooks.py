"""OffloadResult's hooks (internal): which module acquires each unit (where its weights are
read), the pre/post forward hooks and the root forward installed there, and what is refused
on a managed module (dtype or device moves, load_state_dict; LoRA merges are replayed).
The hooks' run-time work is _result_leases'."""

from __future__ import annotations

import inspect
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from . import _enums, _hooks, _lora, _quant, _torch
from ._native import DdoError
from ._result_leases import Leases
from ._result_state import _PLACEMENT_SKIPPED, _PLACEMENT_STREAMED

_Needs = Dict[int, Tuple[torch.nn.Module, List[int]]]  # id(module) -> (module, its units)

# Modules whose forward reads their children's parameters without calling the children
# (MultiheadAttention reads out_proj.weight; TransformerEncoderLayer's eval fast path reads
# every child's weights in one fused op; the decoder layer has no such path).
_FUSED_READERS = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)
# torch >= 2.1 runs a forward hook registered with always_call even when the forward raised.
_ALWAYS_CALL = "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters
_FORWARD_SOURCES: Dict[type, Tuple[str, str]] = {}


def _forward_source(cls: type) -> Tuple[str, str]:
    """(source of cls.forward, its first argument's name); ('', '') where there is none:
    read once per class."""
    if cls not in _FORWARD_SOURCES:
        try:
            fwd = getattr(cls, "forward")
            self_name = next(iter(inspect.signature(fwd).parameters), "self")
            _FORWARD_SOURCES[cls] = (inspect.getsource(fwd), self_name)
        except (OSError, TypeError, ValueError):
            _FORWARD_SOURCES[cls] = ("", "")
    return _FORWARD_SOURCES[cls]


def _reads_params(anc: torch.nn.Module, rel: List[str], params: Set[int]) -> bool:
    """True when anc's forward reads one of params through an attribute chain under its child
    rel (``F.linear(x, self.qkv.weight)``, torchvision's swin attention): the unit must then be
    acquired by anc, whose forward reads it, not by the child, whose forward never runs."""
    src, me = _forward_source(type(anc))
    if not src:
        return False
    head = r"\b%s\.%s((?:\.\w+)+)" % (re.escape(me), re.escape(rel[0]))
    for m in re.finditer(head, src):
        obj: Any = getattr(anc, rel[0], None)
        for part in m.group(1).split(".")[1:]:
            obj = getattr(obj, part, None)
            if isinstance(obj, torch.nn.Parameter):
                if id(obj) in params:
                    return True
                break
            if not isinstance(obj, torch.nn.Module):
                break
    return False


def packed_blocks(name: str) -> Optional[List[str]]:
    """The blocks of a unit that packs several (unit_pack_blocks: "prefix.A-B" names blocks
    prefix.A to prefix.B, docs/plan.md, "Units"), or None for any other unit."""
    head, dot, last = name.rpartition(".")
    first, dash, end = last.partition("-")
    if not dash or not first.isdigit() or not end.isdigit() or int(end) <= int(first):
        return None
    return [f"{head}{dot}{i}" for i in range(int(first), int(end) + 1)]


class Hooks(Leases):
    """Installs the hooks, the root forward and the refusals."""

    def _hook_modules(self) -> List[Tuple[torch.nn.Module, List[int]]]:
        """hook module -> the units its forward needs (a unit is hooked where it is read)."""
        by_ddo = {v: k for k, v in self._ddo_path.items()}
        needs: _Needs = {}
        for u, name in enumerate(self._unit_names):
            members = self._outside_readers(u) if not name else None
            if members:  # the modules outside the blocks, gathered: hooked where each is read
                for m in members:
                    needs.setdefault(id(m), (m, []))[1].append(u)
                continue
            for block in self._blocks_of(name, by_ddo):
                tname = by_ddo.get(block, block)
                try:
                    m = self.module.get_submodule(tname) if tname else self.module
                except AttributeError:
                    raise DdoError("DDO_E_INTERNAL", f"unit {name}: no module {tname!r} in "
                                   f"{type(self.module).__name__}") from None
                m = self._reader_of(self._caller_of(tname), m)
                needs.setdefault(id(m), (m, []))[1].append(u)
        inside: Dict[int, Set[int]] = {}  # unit -> ids of every module under the modules hooked for it
        for m, units in needs.values():
            ids = {id(x) for x in m.modules()}
            for u in units:
                inside.setdefault(u, set()).update(ids)
        # A tied weight read by a module outside its unit: that module needs the unit too.
        for t in self._tensors:
            if t.placement != _PLACEMENT_STREAMED or t.unit is None:  # (a streamed one has one)
                continue
            for p in t.params:
                for m in self._modules_of.get(id(p), []):
                    if id(m) not in inside.get(t.unit, ()):
                        units = needs.setdefault(id(m), (m, []))[1]
                        if t.unit not in units:
                            units.append(t.unit)
        self._shared_readers(needs)
        return list(needs.values())

    def _blocks_of(self, name: str, by_ddo: Dict[str, str]) -> List[str]:
        """[name], or a packed unit's blocks (unit_pack_blocks) where no module is named so."""
        members = packed_blocks(name)
        if members is None:
            return [name]
        try:
            self.module.get_submodule(by_ddo.get(name, name))
            return [name]  # a module of that very name (a ModuleDict key "1-2")
        except AttributeError:
            return members

    def _outside_readers(self, u: int) -> Optional[List[torch.nn.Module]]:
        """The modules that read unit u's weights, u being the plan's unit named "" (the root):
        the modules outside every block gathered into one (docs/plan.md, "Units"). Each is
        hooked for u, so u loads where its weights are used and goes through the slots like a
        block, not held around the whole forward. None where the root's forward reads one of
        u's weights itself (a Parameter of its own): then the root holds u around the call."""
        names = {id(m): n for n, m in self.module.named_modules()}
        out: Dict[int, torch.nn.Module] = {}
        for t in self._unit_tensors[u]:
            for p in t.params:
                for m in self._modules_of.get(id(p), []):
                    r = m if m is self.module else self._reader_of(self._caller_of(names[id(m)]), m)
                    if r is self.module:
                        return None
                    out[id(r)] = r
        return list(out.values()) or None

    def _shared_readers(self, needs: _Needs) -> None:
        """A submodule object in two hooked modules' trees (one module shared by two blocks) is
        named, and its weights placed, under the first: the second hooked module needs that
        unit too, unless a module inside it is hooked for it."""
        hooked_for: Dict[int, Set[int]] = {}
        for m, units in needs.values():
            for u in units:
                hooked_for.setdefault(u, set()).add(id(m))
        for m, units in list(needs.values()):
            below = {id(x) for x in m.modules()} - {id(m)}
            for p in m.parameters():
                t = self._entry_of.get(id(p))
                if t is None or t.placement != _PLACEMENT_STREAMED or t.unit is None or \
                        t.unit in units or \
                        hooked_for.get(t.unit, set()) & below:
                    continue
                units.append(t.unit)

    def _caller_of(self, name: str) -> str:
        """name, or the nearest ancestor with a forward of its own where name's module has
        none (a ModuleList or ModuleDict block: its parent iterates it, so no hook of its
        own would ever run): the unit is bound where its parameters are used."""
        parts = name.split(".") if name else []
        while parts:
            m = self.module.get_submodule(".".join(parts))
            if getattr(type(m).forward, "__name__", "") != "_forward_unimplemented":
                break
            parts.pop()
        return ".".join(parts)

    def _reader_of(self, name: str, m: torch.nn.Module) -> torch.nn.Module:
        """The outermost ancestor that reads m's parameters itself (MultiheadAttention)."""
        found = self.module.get_submodule(name) if name else self.module
        parts = name.split(".") if name else []
        mine = {id(p) for p in found.parameters()}
        for k in range(len(parts)):
            anc = self.module.get_submodule(".".join(parts[:k])) if k else self.module
            if isinstance(anc, _FUSED_READERS) or _reads_params(anc, parts[k:], mine):
                return anc
        return found

    def _install_hooks(self) -> None:
        root: List[int] = []
        self._entry_of = {id(p): t for t in self._tensors for p in t.params}
        hooks = self._hook_modules()
        slots = self.budgets()["slot_count"] if self._unit_count else 0
        for m, units in hooks:
            if len(units) > max(slots, 1):
                name = next((n for n, x in self.module.named_modules() if x is m), "?")
                leaf = self._plan_info.unit_granularity == _enums.DDO_UNIT_LEAF
                raise DdoError("DDO_E_BUDGET", f"{type(m).__name__} {name or '(root)'} reads "
                               f"the weights of {len(units)} units at once (its forward reads "
                               f"its children's weights itself) and the plan leases at most "
                               f"{slots}: " + ("use unit_granularity='block' or raise "
                                               "execution_slots" if leaf else
                                               f"raise execution_slots to {len(units)}"))
        for m, unit_list in hooks:
            group = tuple(unit_list)
            if m is self.module:  # acquired by the forward itself, around the whole call
                root.extend(group)
                continue
            self._hooked.append((next((n for n, x in self.module.named_modules() if x is m),
                                      "?"), group))
            leave = _torch.no_compile(lambda mod, args, out, units=group: self._leave(units, out))
            hid: int = _hooks.post_hook_last(m, leave, self._handles, _ALWAYS_CALL).id

            def enter(mod: torch.nn.Module, args: Tuple[Any, ...],
                      units: Tuple[int, ...] = group, hid: int = hid) -> None:
                _hooks.keep_last(mod, hid)
                self._enter(units, args)
            _hooks.pre_hook_first(m, _torch.no_compile(enter), self._handles)
        self._root_units = tuple(root)
        holders: Dict[int, Any] = {id(t_m): t_m for t in self._tensors for p in t.params
                                   for t_m in self._modules_of.get(id(p), [])}
        for holder in holders.values():  # (Any: torch 1.13 leaves the method unannotated)
            self._handles.append(holder._register_state_dict_hook(self._state_dict_hook))
        self._refuse_merges()
        self._refuse_moves()
        self._own_forward = self.module.__dict__.get("forward")  # one a user installed
        orig = self.module.forward
        forward = self._root_forward(orig)
        self._orig_forward = orig  # recorded first: an interrupted setup still undoes it
        self.module.forward = forward

    def _refuse_merges(self) -> None:
        """LoRA merges (fuse_lora, merge_adapter, a LoRA layer's merge) are replayed on the
        device copies (_lora.py); other in-place merges stay refused."""
        self._lora = _lora.Lora(self)
        self._lora.install()

    def _refuse_moves(self) -> None:
        """A dtype or device move (.to(), .double(), .cuda(), .half(): torch's _apply) or a
        load_state_dict on a managed module would be undone silently at the next binding
        (ddo binds its own device copies): refused with one line on every module that holds
        a managed weight, until close()."""
        mods = {id(self.module): self.module}
        for t in self._tensors:
            for p in t.params:
                for m in self._modules_of.get(id(p), []):
                    mods.setdefault(id(m), m)
        kind = type(self.module).__name__

        def refuse(what: str) -> Callable[..., Any]:
            def refused(*args: Any, **kwargs: Any) -> Any:
                raise DdoError("DDO_E_STATE", f"{what} of a module ddo manages ({kind}): ddo "
                               f"binds its own device copies of the weights, so the change "
                               f"would be undone silently; close() the OffloadResult first, "
                               f"change the module, then enable_offload again")
            return refused

        dtypes = {t.torch_dtype for t in self._tensors}
        device = self.device

        def moves_nothing(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
            """fn (torch's _apply conversion) leaves every managed dtype on ddo's device."""
            for dt in dtypes:
                out = fn(torch.empty(0, dtype=dt, device=device))
                if out.dtype != dt or out.device != device:
                    return False
            return True

        def casts_in_forward(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
            """fn changes dtypes only, and a forward of this result runs on this thread: a
            per-layer upcast (Diffusers' layerwise casting: storage dtype -> compute dtype
            before the layer's forward, back after it). torch rebinds p.data to the converted
            copies (the Parameters are kept); ddo binds its own views again at the unit's next
            acquire and never reads the copies back."""
            with self._lock:
                mine = self._owner is not None and self._owner[0] == threading.get_ident()
            if not mine:
                return False
            for dt in dtypes:
                out = fn(torch.empty(0, dtype=dt, device=device))
                if out.device != device:
                    return False
            self._recast = True  # resident views are bound again after the forward
            return True

        def guard_apply(m: torch.nn.Module, refused: Callable[..., Any]) -> Callable[..., Any]:
            def _apply(fn: Callable[[torch.Tensor], torch.Tensor], *args: Any,
                       **kwargs: Any) -> Any:  # a move to where the module is: allowed
                if moves_nothing(fn) or casts_in_forward(fn):
                    cls: Any = type(m)  # (torch 1.13 leaves _apply unannotated)
                    return cls._apply(m, fn, *args, **kwargs)
                return refused()
            return _apply

        for m in mods.values():
            for name, what in (("_apply", "a dtype or device move (.to(), .double(), .half(), "
                                "...)"), ("load_state_dict", "load_state_dict")):
                self._own_methods.append((m, name, m.__dict__.get(name)))
                m.__dict__[name] = guard_apply(m, refuse(what)) if name == "_apply" \
                    else refuse(what)

    def _state_dict_hook(self, module: torch.nn.Module, state_dict: Dict[str, Any], prefix: str,
                         local_metadata: Any) -> Dict[str, Any]:
        """state_dict() of a managed module holds the host values (not the placeholders or
        device views the Parameters show), as the unmanaged module's would; with keep_vars the
        Parameters themselves stay."""
        for pname, p in module._parameters.items():
            key = prefix + pname
            if p is not None and _quant.is_wrapper(p) and key in state_dict and \
                    state_dict[key] is not p:
                state_dict[key] = self._wrapper_host(p, state_dict[key])
                continue
            t = self._entry_of.get(id(p))
            if p is None or t is None or t.placement == _PLACEMENT_SKIPPED or \
                    state_dict.get(key) is p:
                continue
            if key in state_dict:
                state_dict[key] = _quant.detached_like(p, self._host_value(t))
        return state_dict

    def _wrapper_host(self, p: torch.Tensor, shown: Any) -> Any:
        """What an unmanaged module's state_dict() holds for wrapper p: a wrapper of its type
        over the host values of its inner tensors (_quant.rebuilt_wrapper), not over the
        placeholders or device views p's inner tensors show now. p itself is not touched; a
        wrapper without __tensor_unflatten__ is left as torch gave it."""
        def host_of(inner: torch.Tensor) -> Optional[torch.Tensor]:
            t = self._entry_of.get(id(inner))
            if t is None or t.placement == _PLACEMENT_SKIPPED:
                return None
            return self._host_value(t)
        out = _quant.rebuilt_wrapper(p, host_of)
        return shown if out is None else out
