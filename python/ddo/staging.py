"""One line for a pipeline: components loaded when first called, others unloaded when their
device memory is needed.

enable_pipeline_offload (staged=True, the default) hands its results to a PipelineStager. It
puts a forward pre-hook on each staged component's module and on that module's direct
children (Diffusers' ``vae.decode`` calls ``vae.decoder`` and ``post_quant_conv``, not
``vae.forward``). When a hook finds its component unloaded, the stager unloads the least
recently used other components until the component's device weights fit beside the ones
still loaded, then reloads it: the chain of hooks Diffusers' ``enable_model_cpu_offload``
builds, applied to ddo's sessions. When everything fits, nothing is ever unloaded.

The budget is the largest ``device_weights_limit`` of the components' plans (the device
budget; a component given a lower limit of its own through component_options still shares the
device's); a component's need is its plan's
``device_weights_peak`` (dynamic_offload) or its parameters' and buffers' bytes (route
none). Components on the diffusers_group_offload route keep their weights on the host between
uses (Diffusers' hooks) and are not staged. The same rule runs during setup: before a session
is created (its plan is known then) or a module is moved to the device, room is made for it.

Host memory, the same way (larger than RAM; a mixture of experts such as Wan 2.2 A14B's
transformer and transformer_2): a dynamic_offload component holds its retained host store
(its plan's ``retained_peak``) from its setup until it is unloaded with release_host=True. The
host budget is the largest ``retained_limit`` of the components' plans (what the host limit
leaves one store beside the headroom and staging; 0 everywhere: no limit, nothing is released).
Before a component's session is created and when it is called, the stores of the least recently
used other components are released (``unload(release_host=True)``) until its store fits beside
the ones still held: only the active expert holds retained memory. ``prepare(name)`` does the
switch ahead of the first forward (at the boundary step, from the pipeline's step callback):
room made, the store read and the first units loading, so the forward finds them on their way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, TypeVar

if TYPE_CHECKING:
    import torch

_STAGED_ROUTES = ("dynamic_offload", "none")
_F = TypeVar("_F", bound=Callable[..., Any])


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (the device memory route none takes)."""
    n = 0
    for t in list(module.parameters()) + list(module.buffers()):
        n += t.numel() * t.element_size()
    return n


class PipelineStager:
    """Loads, unloads and accounts the staged components of one pipeline.

    events: ("load" | "unload", component) in the order they happened (setup included);
    limit: the device budget in bytes (None: not known yet, nothing is unloaded);
    need: component -> device bytes while it is loaded.
    """

    def __init__(self) -> None:
        self.results: Dict[str, Any] = {}
        self.need: Dict[str, int] = {}
        self.limit: Optional[int] = None
        self.active: List[str] = []  # loaded components, least recently used first
        self.events: List[Tuple[str, str]] = []
        # host: component -> retained store bytes; the budget (None: no limit); the components
        # holding their store, least recently used first
        self.host_need: Dict[str, int] = {}
        self.host_limit: Optional[int] = None
        self.host_held: List[str] = []
        self._handles: List[Any] = []

    # ---- setup (enable_pipeline_offload) ----

    def before_session(self, name: str) -> Callable[[Any], None]:
        """A callback for OffloadResult: its plan is built, its session not yet created."""
        def make_room(result: Any) -> None:
            b = result.budgets()
            limit = b["device_weights_limit"]
            if limit > 0:
                self.limit = limit if self.limit is None else max(self.limit, limit)
            self.need[name] = b["device_weights_peak"]
            self._host_budget(name, b)
            self.make_room(name)
            self.make_host_room(name)
        return make_room

    def _host_budget(self, name: str, b: Dict[str, int]) -> None:
        self.host_need[name] = b["retained_peak"]
        if b["retained_limit"] > 0:
            self.host_limit = (b["retained_limit"] if self.host_limit is None
                               else max(self.host_limit, b["retained_limit"]))

    def before_move(self, name: str, module: torch.nn.Module) -> None:
        """Route none: room for the module's bytes before it is moved to the device."""
        self.need[name] = module_bytes(module)
        self.make_room(name)

    def added(self, name: str, result: Any) -> None:
        """A component was set up (loaded, unless its session was unloaded at once)."""
        if result.route not in _STAGED_ROUTES or not getattr(result, "attached", True):
            return
        self.results[name] = result
        if name not in self.need:
            self.need[name] = _need(result)
        if result.route == "dynamic_offload" and name not in self.host_held:
            if name not in self.host_need:
                self._host_budget(name, result.budgets())
            self.host_held.append(name)
        if _loaded(result):
            self.active.append(name)
            self.events.append(("load", name))

    def unloaded(self, name: str) -> None:
        """A component was unloaded by its caller (start_unloaded)."""
        if name in self.active:
            self.active.remove(name)
            self.events.append(("unload", name))

    # ---- the hooks ----

    def install(self) -> None:
        for name, r in self.results.items():
            mods = [r.module] + list(r.module.children())
            for m in mods:
                h = m.register_forward_pre_hook(_no_compile(
                    lambda mod, args, name=name: self.enter(name)))
                # First among the module's pre-hooks: ddo's own unit hook (on a module that is
                # a unit) must find the component loaded.
                m._forward_pre_hooks.move_to_end(h.id, last=False)
                self._handles.append(h)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def enter(self, name: str) -> None:
        """The component is called: loaded if it is not (room made first)."""
        r = self.results[name]
        if self.active and self.active[-1] == name and r._state == "ready":
            return
        if _loaded(r):  # loaded by its caller (reload()) or used earlier: now the newest
            if name in self.active:
                self.active.remove(name)
            self.active.append(name)
            self._hold(name)
            return
        if getattr(r, "_state", None) == "closed":
            return  # its own forward (or RouteResult) says what a closed result means
        if name in self.active:
            self.active.remove(name)  # unloaded by its caller
        self.make_room(name)
        self.make_host_room(name)
        r.reload()
        self._hold(name)
        self.active.append(name)
        self.events.append(("load", name))

    def prepare(self, name: str) -> None:
        """The switch to component name, planned ahead of its first forward (a mixture of
        experts at its boundary step): room made on the device and in host memory (the other
        experts' stores released), name reloaded, its store read and its first units loading."""
        if name not in self.results:
            raise KeyError(f"prepare: {name!r} is not a staged component "
                           f"(staged: {', '.join(self.results) or 'none'})")
        self.enter(name)

    def make_room(self, name: str) -> None:
        """Unloads the least recently used other components until name's need fits."""
        if self.limit is None:
            return
        need = self.need.get(name, 0)
        for other in list(self.active):
            if self.in_use(besides=name) + need <= self.limit:
                return
            if self.results[other]._state == "closed":  # closed by its caller: holds nothing
                self.active.remove(other)
                continue
            if other == name or _busy(self.results[other]):
                continue
            self.results[other].unload()
            self.active.remove(other)
            self.events.append(("unload", other))

    def make_host_room(self, name: str) -> None:
        """Releases the least recently used other components' retained stores until name's
        fits beside the ones still held (unload(release_host=True); a loaded one leaves the
        device too)."""
        if self.host_limit is None:
            return
        need = self.host_need.get(name, 0)
        for other in list(self.host_held):
            held = sum(self.host_need.get(n, 0) for n in self.host_held if n != name)
            if held + need <= self.host_limit:
                return
            r = self.results.get(other)
            if other == name or r is None or (r._state != "closed" and _busy(r)):
                continue
            if r._state != "closed":
                r.unload(release_host=True)
            self.host_held.remove(other)
            if other in self.active:
                self.active.remove(other)
                self.events.append(("unload", other))
            self.events.append(("release_host", other))

    def _hold(self, name: str) -> None:
        """name holds its store again (reloaded), the most recently used."""
        if self.results[name].route != "dynamic_offload":
            return
        if name in self.host_held:
            self.host_held.remove(name)
        self.host_held.append(name)

    def reclaimable(self, name: str) -> int:
        """Device bytes the loaded other components hold that make_room can unload for name
        (a busy one is not): name's plan counts them as free (ddo_plan_inputs'
        device_reclaimable_bytes), so a component set up beside a loaded one plans for the
        card, not for what the other leaves."""
        return sum(self.need.get(n, 0) for n in self.active
                   if n != name and self.results[n]._state != "closed"
                   and not _busy(self.results[n]))

    def in_use(self, besides: Optional[str] = None) -> int:
        """Device bytes of the loaded components (besides: one left out)."""
        return sum(self.need.get(n, 0) for n in self.active if n != besides)


def _need(result: Any) -> int:
    if result.route == "dynamic_offload":
        return int(result.budgets()["device_weights_peak"])
    return module_bytes(result.module)


def _loaded(result: Any) -> bool:
    if result.route == "none":
        return bool(getattr(result, "_state", "ready") == "ready")
    return bool(result._state == "ready")


def _busy(result: Any) -> bool:
    """A forward of the component runs now (a component calling another): never unloaded."""
    owner = getattr(result, "_owner", None)
    return owner is not None and bool(getattr(result, "_in_root", 0) > 0)


def _no_compile(fn: _F) -> _F:
    from . import _torch
    return _torch.no_compile(fn)


def stager_of(pipeline: Any) -> Optional[PipelineStager]:
    """The PipelineStager enable_pipeline_offload gave pipeline (None: not staged)."""
    stager: Optional[PipelineStager] = getattr(pipeline, "_ddo_pipeline_stager", None)
    return stager
