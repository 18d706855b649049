"""enable_offload / enable_pipeline_offload / enable_dynamic_offload: each component routed by
the library's rules (enable_dynamic_offload: the dynamic route, no route selection); a
pipeline's components staged within the device budget (staging.py).

The route of a component comes from the library (ddo_config_component_policy: an explicit
route, then API component policies, then DDO_<COMPONENT>_* and DDO_RUNNER_<COMPONENT>_* from
the environment or the preset, then auto): ``dynamic_offload`` streams it through a ddo
session (ddo.offload.OffloadResult), ``diffusers_group_offload`` hands it to Diffusers'
``apply_group_offloading`` with the policy's arguments (Diffusers is imported only then), and
``none`` moves it to the execution device.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import time
from typing import (Any, Callable, ContextManager, Dict, Iterator, Mapping, Optional, Sequence,
                    Tuple, Union, overload)

import torch

from . import _lib, _native, _talk, offload, ownership, profiles, staging
from .config import DynamicOffloadConfig
from .settings import DynamicOffloadSettings, resolve_config, same_component

# progress=: True/False/None or a tqdm-compatible class; trace=: a file path.
Progress = Union[bool, Callable[..., Any], None]
TracePath = Union[str, "os.PathLike[str]", None]

ROUTES = ("dynamic_offload", "diffusers_group_offload", "none")
DEFAULT_PIPELINE_COMPONENTS = ("text_encoder", "text_encoder_2", "transformer", "unet", "vae")
PROFILE_ROUTE_ERROR = "Profile calibration requires the dynamic_offload route."
# enable_offload's per-component policy arguments (the earlier design's names).
POLICY_ARGS = ("group_offload", "dynamic_offload", "offload_type", "use_stream",
               "record_stream", "group_low_cpu_mem_usage", "num_blocks_per_group")
# Named parameters of the earlier design's enable_offload that are not config overrides: they
# do not bypass the preset's VAE route.
DEVICE_PARAMS = ("execution_device", "offload_device")


def check_args(fn: str, preset: Any = "auto", component: Any = "model", route: Any = None,
               config: Any = None, progress: Any = None, trace: Any = None) -> None:
    """Argument types, checked at the door: a wrong one is a TypeError naming the parameter
    (not an AttributeError from deep inside)."""
    from .config import DynamicOffloadConfig
    if preset is not None and not isinstance(preset, str):
        raise TypeError(f"{fn}: the argument after the module is preset, a name such as "
                        f"'auto', not {type(preset).__name__} {preset!r}; options are "
                        f"keywords (a device budget in GiB: vmm_resident_weight_budget_gb="
                        f"{preset!r})")
    for name, value in (("component", component), ("route", route)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{fn}: {name} must be a str, not {type(value).__name__}")
    if config is not None and not isinstance(config, DynamicOffloadConfig):
        raise TypeError(f"{fn}: config must be a ddo.DynamicOffloadConfig, not "
                        f"{type(config).__name__}")
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"{fn}: progress must be True, False, None or a tqdm-compatible "
                        f"class, not {type(progress).__name__}")
    if trace is not None and not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"{fn}: trace must be a file path (str or os.PathLike), not "
                        f"{type(trace).__name__}")


def _talk_of(component: str, progress: Progress,
             trace: Union[TracePath, _talk.Trace]) -> Dict[str, Any]:
    """OffloadResult's talk: a Trace it owns (writes at close) when trace is a path."""
    if isinstance(trace, _talk.Trace):
        return {"label": component, "progress": progress, "trace": trace}
    return {"label": component, "progress": progress,
            "trace": _talk.Trace(trace) if trace is not None else None, "trace_owner": True}


def _import_apply_group_offloading() -> Callable[..., Any]:
    """Diffusers' apply_group_offloading (imported only when a component needs it)."""
    try:
        from diffusers.hooks import apply_group_offloading
    except Exception as e:  # not only ImportError: a broken install raises anything on import
        raise _native.DdoError(
            "DDO_E_UNSUPPORTED", f"route diffusers_group_offload needs Diffusers' "
            f"apply_group_offloading, which cannot be imported ({_native.exc_line(e)}): install "
            f"or repair diffusers, or choose route='dynamic_offload' or 'none'") from None
    fn: Callable[..., Any] = apply_group_offloading
    return fn


def _diffusers_available() -> bool:
    """Whether the diffusers_group_offload route can run here."""
    try:
        _import_apply_group_offloading()
    except _native.DdoError:
        return False
    return True


def detect_quantized_backend_modules(module: torch.nn.Module) -> Dict[str, Any]:
    """the earlier design's SDNQ detection: submodules (root included) with an sdnq_dequantizer;
    and the quantized parameters ddo cannot stream as stored bytes (_quant.refusal: torch's
    qint dtypes, wrapper subclasses, parameters keeping tensors in an attribute), which send
    the module to the compatibility route.
    GGUF-style Parameter subclasses and float8 weights are streamed by ddo: not listed."""
    from . import _quant
    out: Dict[str, Any] = {}
    n = sum(1 for m in module.modules() if hasattr(m, "sdnq_dequantizer"))
    if n:
        out.update({"sdnq_module_count": n, "sdnq_status": "detected_forward_preserved"})
    bad = _quant.unstreamable(module)
    if bad:
        out["unstreamable_parameters"] = [name for name, _why in bad]
        out["unstreamable_reason"] = bad[0][1]
    return out


def _name_unstreamable(pol: Dict[str, Any], module: torch.nn.Module) -> None:
    """The route's reason names what sent a quantized module to Diffusers' group offload."""
    found = detect_quantized_backend_modules(module)
    names = found.get("unstreamable_parameters")
    if not pol["route_source"].endswith("quantized backend"):
        return
    if names:
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        pol["route_source"] += f" ({', '.join(names[:3])}{more}: {found['unstreamable_reason']})"
    elif found.get("sdnq_module_count"):
        pol["route_source"] += f" (SDNQ: {found['sdnq_module_count']} modules)"


def _execution_device(cfg: _native.Config) -> torch.device:
    """The torch device of the config's execution_device (a default cuda:0 without a GPU
    becomes cpu, the library's fallback rule; an explicit cuda:N is kept)."""
    spec = cfg.get("execution_device") or "cuda:0"
    if spec.startswith("cuda") and not torch.cuda.is_available() and \
            cfg.source("execution_device") == "default":
        return torch.device("cpu")
    return torch.device(spec)


class _RouteReport:
    """What a non-dynamic route reports (no ddo session): as_dict / format_profile / record."""

    def __init__(self, component: str, route: str, payload: Mapping[str, Any]) -> None:
        self._d: Dict[str, Any] = {"schema_version": 1, "component": component, "route": route,
                   "binding": dict(payload)}

    def as_dict(self) -> Dict[str, Any]:
        return dict(self._d)

    def format_profile(self) -> str:
        return f"ddo: component {self._d['component']}: route {self._d['route']} " \
               f"(not streamed by ddo; no ddo metrics)"

    def record(self, path: Union[str, "os.PathLike[str]"],
               component: Optional[str] = None) -> None:
        from .metrics import MetricsTracker
        MetricsTracker(path).record_ddo_metrics(self, component=component)


class RouteResult:
    """A component on a non-dynamic route, or any route with apply_hook=False: the same
    lifecycle methods as OffloadResult, and the earlier design's result fields (hook None,
    should_move_to_execution_device, event_payload, settings, route).

    route "none": unload() moves the module to the CPU, reload() back to the device, close()
    leaves it where it is. route "diffusers_group_offload": Diffusers' hooks keep the weights
    on the CPU between uses, so unload/reload only record the phase; close() removes the
    hooks when Diffusers' registry is there. Not attached (apply_hook=False): the module was
    not touched, should_move_to_execution_device is True and every method is a no-op.
    """

    route_policy: Dict[str, Any]

    def __init__(self, module: torch.nn.Module, route: str, component: str,
                 device: torch.device, settings: Any, payload: Mapping[str, Any],
                 group_hooks: Optional[Callable[[torch.nn.Module], None]] = None,
                 attached: bool = True) -> None:
        self.module = module
        self.route = route
        self.component = component
        self.device = device
        self.settings = settings
        self.event_payload = dict(payload)
        self.hook: Any = None
        self.should_move_to_execution_device = not attached
        self.attached = attached
        self._group_hooks = group_hooks if attached else None
        self._state = "ready"
        first = next(iter(module.parameters()), None)
        self._origin = first.device if first is not None else torch.device("cpu")

    def unload(self) -> None:
        if self._state == "closed":
            raise _native.DdoError("DDO_E_STATE", f"unload: component {self.component} is "
                                   f"closed")
        if self.route == "none" and self.attached and self._state == "ready":
            self.module.to("cpu")
        self._state = "unloaded"

    def reload(self) -> None:
        if self._state == "closed":
            raise _native.DdoError("DDO_E_STATE", f"reload: component {self.component} is "
                                   f"closed")
        if self.route == "none" and self.attached and self._state == "unloaded":
            self.module.to(self.device)
        self._state = "ready"

    def close(self, restore: bool = False) -> None:
        """Ends ddo's management; restore=True also moves a "none" module back where it was
        (enable_pipeline_offload's rollback)."""
        if self._state == "closed":
            return
        if restore and self.route == "none" and self.attached:
            self.module.to(self._origin)
        if self._group_hooks is not None:
            self._group_hooks(self.module)
        self._state = "closed"
        if getattr(self.module, "_ddo_offload", None) is self:
            del self.module._ddo_offload

    def cleanup_on_error(self) -> ContextManager["RouteResult"]:
        """On an exception: unload once, re-raise the original (a cleanup error: a note)."""
        return offload.cleanup_boundary(self.unload, self)

    def metrics_snapshot(self, collect_completed: bool = False,
                         component: Optional[str] = None) -> _RouteReport:
        return _RouteReport(component or self.component, self.route, self.event_payload)

    def profile_run(self) -> ContextManager["RouteResult"]:
        """No profile on this route (a request was refused at enable_offload): a no-op."""
        return contextlib.nullcontext(self)

    def __repr__(self) -> str:
        return f"<RouteResult {self.component} route={self.route} state={self._state}>"


def _remove_group_hooks(module: torch.nn.Module) -> None:
    """Removes Diffusers' group-offload hooks from every submodule that has its registry."""
    for m in module.modules():
        reg = getattr(m, "_diffusers_hook", None)
        if reg is None:
            continue
        for name in ("group_offloading", "layer_execution_tracker",
                     "lazy_prefetch_group_offloading"):
            try:
                reg.remove_hook(name, recurse=False)
            except Exception:  # a hook this Diffusers version does not have
                pass


def _policy(cfg: _native.Config, component: str, route: Optional[str], quantized: Any,
            overrides_given: bool = False) -> Dict[str, Any]:
    """The library's policy (ddo_config_component_policy_with_overrides: overrides_given says
    the caller gave an explicit config or runtime overrides, for the earlier design's VAE rule)."""
    p = _lib.ComponentPolicy()
    rc = _native.lib().ddo_config_component_policy_with_overrides(
        cfg.h, component.encode(), route.encode() if route is not None else None,
        bool(quantized), bool(overrides_given), ctypes.byref(p))
    if rc != 0:
        detail = _native.lib().ddo_config_error(cfg.h).decode(errors="replace")
        if "Profile calibration requires the dynamic_offload route" in detail:
            raise ValueError(PROFILE_ROUTE_ERROR)
        raise _native.error(_native.error_name(rc), detail)
    return {"route": p.route.decode(), "route_source": p.route_source.decode(),
            "offload_type": p.offload_type.decode(),
            "unit_granularity": (p.unit_granularity or b"").decode(),
            "use_stream": bool(p.use_stream), "record_stream": bool(p.record_stream),
            "low_cpu_mem_usage": bool(p.low_cpu_mem_usage),
            "num_blocks_per_group": int(p.num_blocks_per_group)}


def _explicit_policy_args(group_offload: Any, dynamic_offload: Any, offload_type: Any,
                          use_stream: Any, record_stream: Any, group_low_cpu_mem_usage: Any,
                          num_blocks_per_group: Any) -> Dict[str, Any]:
    vals = {"group_offload": group_offload, "dynamic_offload": dynamic_offload,
            "offload_type": offload_type, "offload_stream": use_stream,
            "offload_record_stream": record_stream,
            "offload_low_cpu_mem_usage": group_low_cpu_mem_usage,
            "num_blocks_per_group": num_blocks_per_group}
    return {k: v for k, v in vals.items() if v is not None}


def _component_cfg(settings: Optional[DynamicOffloadSettings], preset: Optional[str],
                   backend: Optional[str], config: Optional[DynamicOffloadConfig],
                   use_environment: bool, environ: Optional[Mapping[str, str]],
                   running_on_wsl: Optional[bool], overrides: Dict[str, Any],
                   policies: Dict[str, Dict[str, Any]]
                   ) -> Tuple[_native.Config, Dict[str, Dict[str, Any]]]:
    if settings is not None:
        if not isinstance(settings, DynamicOffloadSettings):
            raise TypeError(f"settings must be a ddo.DynamicOffloadSettings, not "
                            f"{type(settings).__name__}")
        merged = {k: dict(v) for k, v in settings.component_policies.items()}
        for comp, opts in (policies or {}).items():
            merged.setdefault(comp, {}).update(opts)
        return resolve_config(base=settings._cfg, config=config, overrides=overrides,
                              component_policies=policies), merged
    cfg = resolve_config(preset=preset, backend=backend, environ=environ,
                         use_environment=use_environment, running_on_wsl=running_on_wsl,
                         config=config, overrides=overrides, component_policies=policies)
    return cfg, policies or {}


def resolve_route(module: torch.nn.Module, preset: Optional[str] = "auto", *,
                  component: str = "model", route: Optional[str] = None,
                  settings: Optional[DynamicOffloadSettings] = None,
                  component_policies: Optional[Mapping[str, Mapping[str, Any]]] = None,
                  use_environment: bool = True, environ: Optional[Mapping[str, str]] = None,
                  backend: Optional[str] = None, config: Optional[DynamicOffloadConfig] = None,
                  running_on_wsl: Optional[bool] = None, quantized_backend: Any = None,
                  low_cpu_mem_usage: bool = True, **kw: Any
                  ) -> Tuple[Dict[str, Any], _native.Config, DynamicOffloadSettings]:
    """(route policy dict, C config, settings) for one component, without touching it.

    low_cpu_mem_usage: the earlier design's default of the group route's low_cpu_mem_usage,
    used when
    no policy, environment variable or preset sets offload_low_cpu_mem_usage."""
    explicit = _explicit_policy_args(*(kw.pop(k, None) for k in (
        "group_offload", "dynamic_offload", "offload_type", "use_stream", "record_stream",
        "group_low_cpu_mem_usage", "num_blocks_per_group")))
    policies = {k: dict(v) for k, v in (component_policies or {}).items()}
    if explicit:
        policies.setdefault(component, {}).update(explicit)
    cfg, merged = _component_cfg(settings, preset, backend, config, use_environment, environ,
                                 running_on_wsl, kw, policies)
    quant = quantized_backend
    if quant is None:
        quant = bool(detect_quantized_backend_modules(module))
    # the earlier design's VAE policy (the library's rule): an explicit config or runtime overrides,
    # without policy arguments, bypass the preset's VAE route. The devices are named
    # parameters the earlier design, not overrides; None is not given; a config's preset and
    # backend (--ddo-preset, --ddo-backend) select the preset whose route fallback applies.
    overridden = any(v is not None and k not in DEVICE_PARAMS for k, v in kw.items())
    configured = config is not None and any(k not in ("preset", "backend")
                                            for k in config.explicit())
    given = (configured or overridden) and not explicit
    pol = _policy(cfg, component, route, quant, overrides_given=given)
    if quant and quantized_backend is None:
        _name_unstreamable(pol, module)
    if pol["route"] == "diffusers_group_offload" and route is None and not explicit and \
            pol["route_source"].startswith(("auto", "default", "preset:")) and \
            not _diffusers_available():
        # A default, not a request: without Diffusers the component is streamed by ddo.
        why = pol["route_source"]
        pol = _policy(cfg, component, "dynamic_offload", quant, overrides_given=given)
        pol["route_source"] = f"{why}; Diffusers not importable: dynamic_offload"
    if not low_cpu_mem_usage and not _option_set(cfg, component, "offload_low_cpu_mem_usage"):
        pol["low_cpu_mem_usage"] = False
    # Nothing changed the given settings: the same object (the earlier design's identity rule).
    unchanged = (settings is not None and config is None and not policies and
                 all(v is None for v in kw.values()))
    if unchanged and settings is not None:
        return pol, cfg, settings
    return pol, cfg, DynamicOffloadSettings(cfg, merged)


def _option_set(cfg: _native.Config, component: str, option: str) -> bool:
    """Whether anything (a policy, DDO_*, the preset) sets a component option (the library's
    lookup, ddo_config_component_value)."""
    return cfg.component_value(component, option) is not None


@overload
def enable_offload(module_or_pipeline: torch.nn.Module, preset: Optional[str] = ...,
                   **kwargs: Any) -> Union[offload.OffloadResult, RouteResult]: ...


@overload
def enable_offload(module_or_pipeline: Any, preset: Optional[str] = ...,
                   **kwargs: Any) -> Union[offload.OffloadResult, RouteResult, PipelineOffload]:
    ...


def enable_offload(module_or_pipeline: Any, preset: Optional[str] = "auto", *,
                   component: str = "model", route: Optional[str] = None,
                   settings: Optional[DynamicOffloadSettings] = None,
                   component_policies: Optional[Mapping[str, Mapping[str, Any]]] = None,
                   use_environment: bool = True, environ: Optional[Mapping[str, str]] = None,
                   backend: Optional[str] = None, config: Optional[DynamicOffloadConfig] = None,
                   running_on_wsl: Optional[bool] = None, quantized_backend: Any = None,
                   group_offload: Optional[bool] = None, dynamic_offload: Optional[bool] = None,
                   offload_type: Optional[str] = None, use_stream: Optional[bool] = None,
                   record_stream: Optional[bool] = None,
                   group_low_cpu_mem_usage: Optional[bool] = None,
                   num_blocks_per_group: Optional[int] = None, low_cpu_mem_usage: bool = True,
                   apply_hook: bool = True, record_event: Optional[Callable[..., Any]] = None,
                   dynamic_event_name: Optional[str] = None,
                   group_event_name: Optional[str] = None, progress: Progress = None,
                   trace: TracePath = None, **overrides: Any,
                   ) -> Union[offload.OffloadResult, RouteResult, PipelineOffload]:
    """Routes a module (or every module component of a pipeline): each gets its route from the
    library's rules (a ddo session, Diffusers' group offload, or none).

    Returns an OffloadResult (route dynamic_offload) or a RouteResult (diffusers_group_offload,
    none, or any route with apply_hook=False: nothing attached, the module untouched). A
    pipeline (an object with a ``components`` mapping) gets enable_pipeline_offload, with
    ``route`` for every component; the arguments that describe one component (component,
    the group/dynamic policy arguments, quantized_backend) are refused there with one line.
    component_policies must name the component routed (the library's normalisation:
    "Transformer" is transformer); a policy for another one is refused. record_event(name,
    seconds, **payload), as the earlier design: "setup_<component>_dynamic_offload"
    (dynamic_event_name),
    "setup_<component>_group_offload" (group_event_name), "move_<component>_to_execution_device"
    (route none, when the module was moved).

    progress: a bar per setup phase (read, register, allocate, resident) on stderr; None: on
    when stderr is a terminal; a tqdm-compatible class draws it. trace="file.json": the
    Perfetto trace ``ddo bench --trace`` writes, written at close() (ui.perfetto.dev opens it).
    """
    check_args("enable_offload", preset, None if component == "model" else component, route,
               config, progress, trace)
    if not isinstance(module_or_pipeline, torch.nn.Module):
        if isinstance(getattr(module_or_pipeline, "components", None), dict):
            pipeline = module_or_pipeline
            one = {"component": None if component == "model" else component,
                   "group_offload": group_offload, "dynamic_offload": dynamic_offload,
                   "offload_type": offload_type, "use_stream": use_stream,
                   "record_stream": record_stream,
                   "group_low_cpu_mem_usage": group_low_cpu_mem_usage,
                   "num_blocks_per_group": num_blocks_per_group,
                   "quantized_backend": quantized_backend,
                   "dynamic_event_name": dynamic_event_name,
                   "group_event_name": group_event_name}
            given = [k for k, v in one.items() if v is not None]
            if given:
                raise TypeError(
                    f"enable_offload({type(pipeline).__name__}): {', '.join(given)}: "
                    f"per-component arguments, and a pipeline has several components: pass "
                    f"component_policies={{name: {{option: value}}}} (or routes={{name: "
                    f"route}} to ddo.enable_pipeline_offload), or enable_offload each module")
            routes = None
            if route is not None:
                routes = {n: route for n in _pipeline_components(pipeline, None)}
            return enable_pipeline_offload(
                pipeline, preset, settings=settings, component_policies=component_policies,
                routes=routes, use_environment=use_environment, environ=environ,
                backend=backend, config=config, running_on_wsl=running_on_wsl,
                low_cpu_mem_usage=low_cpu_mem_usage, apply_hook=apply_hook,
                record_event=record_event, progress=progress, trace=trace, **overrides)
        raise TypeError(f"enable_offload takes a torch.nn.Module or a pipeline with a "
                        f"components mapping, not {type(module_or_pipeline).__name__}")
    module = module_or_pipeline
    _refuse_managed(module)
    for name in (component_policies or {}):
        if not same_component(name, component):
            raise _native.DdoError(
                "DDO_E_NOT_FOUND", f"enable_offload: component_policies names {name!r}, not "
                f"the component routed ({component!r}): key the policy {component!r} or pass "
                f"component={name!r}")
    pol, cfg, st = resolve_route(
        module, preset, component=component, route=route, settings=settings,
        component_policies=component_policies, use_environment=use_environment,
        environ=environ, backend=backend, config=config, running_on_wsl=running_on_wsl,
        quantized_backend=quantized_backend, group_offload=group_offload,
        dynamic_offload=dynamic_offload, offload_type=offload_type, use_stream=use_stream,
        record_stream=record_stream, group_low_cpu_mem_usage=group_low_cpu_mem_usage,
        num_blocks_per_group=num_blocks_per_group, low_cpu_mem_usage=low_cpu_mem_usage,
        **overrides)
    return apply_route(module, pol, cfg, st, component, apply_hook=apply_hook,
                       record_event=record_event,
                       event_names={"dynamic_offload": dynamic_event_name,
                                    "diffusers_group_offload": group_event_name},
                       talk=_talk_of(component, progress, trace))


def enable_dynamic_offload(module: torch.nn.Module, preset: Optional[str] = "auto", *,
                           settings: Optional[DynamicOffloadSettings] = None,
                           config: Optional[DynamicOffloadConfig] = None,
                           backend: Optional[str] = None, use_environment: bool = True,
                           environ: Optional[Mapping[str, str]] = None,
                           running_on_wsl: Optional[bool] = None, apply_hook: bool = True,
                           record_event: Optional[Callable[..., Any]] = None,
                           event_name: str = "setup_dynamic_offload", progress: Progress = None,
                           trace: TracePath = None, **overrides: Any,
                           ) -> Union[offload.OffloadResult, RouteResult]:
    """Streams module through a ddo session: enable_offload's route ``dynamic_offload``.

    The low-level entry point: no component route is selected, everything else is
    enable_offload's: settings= (or preset, backend, the DDO_*
    environment when use_environment, running_on_wsl), config= and ``overrides`` (option keys
    of the catalog, which win; None is not given, so always_resident_modules_pattern=None keeps
    the built-in list), the ownership preflight, named profiles (profile_name=,
    build_profile=). Returns an OffloadResult (hook: the result itself,
    should_move_to_execution_device False, event_payload, settings, route), or with
    apply_hook=False a RouteResult that attached nothing (hook None,
    should_move_to_execution_device True). record_event(event_name, seconds, **event_payload)
    is called once, as the earlier design.
    """
    check_args("enable_dynamic_offload", preset, config=config, progress=progress, trace=trace)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"enable_dynamic_offload takes a torch.nn.Module, not "
                        f"{type(module).__name__}")
    routing = [k for k in overrides if k in POLICY_ARGS or k in (
        "route", "component", "component_policies", "quantized_backend", "low_cpu_mem_usage",
        "dynamic_event_name", "group_event_name")]
    if routing:
        raise _native.UnknownOptionError(
            "DDO_E_NOT_FOUND", f"Unknown DynamicOffloadConfig override(s): "
            f"{', '.join(routing)} (enable_dynamic_offload selects no component route: use "
            f"ddo.enable_offload)")
    _refuse_managed(module)
    pol, cfg, st = resolve_route(module, preset, route="dynamic_offload", settings=settings,
                                 use_environment=use_environment, environ=environ,
                                 backend=backend, config=config,
                                 running_on_wsl=running_on_wsl, **overrides)
    return apply_route(module, pol, cfg, st, "model", apply_hook=apply_hook,
                       record_event=record_event,
                       event_names={"dynamic_offload": event_name},
                       talk=_talk_of("model", progress, trace))


def _refuse_managed(module: Any) -> None:
    if getattr(module, "_ddo_offload", None) is not None:
        raise _native.DdoError("DDO_E_STATE", f"{type(module).__name__} is already managed "
                               f"by ddo: close() its result first")


def apply_route(module: torch.nn.Module, pol: Dict[str, Any], cfg: _native.Config, st: Any,
                component: str, *, apply_hook: bool = True, source: Any = None,
                record_event: Optional[Callable[..., Any]] = None,
                event_names: Optional[Mapping[str, Optional[str]]] = None,
                stager: Optional[staging.PipelineStager] = None,
                talk: Optional[Dict[str, Any]] = None) -> Union[offload.OffloadResult, RouteResult]:
    """Applies a resolved route to module (the second half of enable_offload).

    apply_hook=False attaches nothing and leaves the module as it is (the earlier design's
    rule): a RouteResult with should_move_to_execution_device True on every route.
    record_event(name, seconds, **payload) is the host's event callback (the earlier design's)."""
    t0 = time.perf_counter()
    res = _apply_route(module, pol, cfg, st, component, apply_hook, source, stager, talk)
    try:
        _record(res, record_event, event_names, component, t0)
    except BaseException:  # a failing callback leaves the module as it was, not managed
        res.close(**({"restore": True} if isinstance(res, RouteResult) else {}))
        raise
    return res


def _record(res: Union[offload.OffloadResult, RouteResult], record_event: Optional[Callable[..., Any]],
            event_names: Optional[Mapping[str, Optional[str]]], component: str,
            t0: float) -> None:
    if record_event is not None:
        names = event_names or {}
        r = res.route
        if r == "dynamic_offload":
            record_event(names.get(r) or f"setup_{component}_dynamic_offload",
                         time.perf_counter() - t0, **res.event_payload)
        elif r == "diffusers_group_offload":
            record_event(names.get(r) or f"setup_{component}_group_offload",
                         time.perf_counter() - t0, **res.event_payload)
        elif "unmanaged_module_moved_to_execution_device" in res.event_payload:
            record_event(f"move_{component}_to_execution_device", time.perf_counter() - t0,
                         route="none", execution_device=str(res.device))


def _apply_route(module: torch.nn.Module, pol: Dict[str, Any], cfg: _native.Config, st: Any,
                 component: str, apply_hook: bool, source: Any,
                 stager: Optional[staging.PipelineStager] = None,
                 talk: Optional[Dict[str, Any]] = None) -> Union[offload.OffloadResult, RouteResult]:
    r = pol["route"]
    if r not in ROUTES:
        raise ValueError(f"component {component}: route {r!r}: expected one of "
                         f"{', '.join(ROUTES)}")
    quantized = detect_quantized_backend_modules(module)
    device = _execution_device(cfg)
    payload: Dict[str, Any] = {"route": r, "route_source": pol["route_source"]}
    if r == "dynamic_offload":
        payload["execution_mode"] = cfg.get("execution_mode")
    if quantized and r != "none":
        payload["quantized_backend"] = quantized  # the earlier design's key
    if not apply_hook:
        if r == "dynamic_offload" and cfg.get("build_profile") == "true":
            raise ValueError("build_profile needs apply_hook=True (the ddo session measures "
                             "the calibration run)")
        if r == "diffusers_group_offload":
            payload.update(_group_kwargs(pol, device, with_devices=False))
        unattached = RouteResult(module, r, component, device, st, payload, attached=False)
        unattached.route_policy = pol
        return unattached
    if source is None:
        source = getattr(module, "_ddo_source", None)  # from_pretrained_with_dynamic_offload
    if source is not None and r != "dynamic_offload":
        from .loading import materialize
        materialize(module, source)  # only ddo streams from the files: host tensors here
        source = None
    if r == "dynamic_offload":
        if pol["unit_granularity"] and pol["unit_granularity"] != cfg.get("unit_granularity"):
            cfg.override("unit_granularity", pol["unit_granularity"])
        owned = ownership.preflight(module, cfg, component)
        prof = profiles.prepare(module, cfg, source=source)
        res = offload.OffloadResult(
            module, cfg, profile=prof, **({"source": source} if source else {}),
            before_session=stager.before_session(component) if stager is not None else None,
            device_room=functools.partial(stager.reclaimable, component)
            if stager is not None else None,
            talk=talk)
        res.ownership = owned
        res.route = r
        res.component = component
        res.settings = st
        res.route_policy = pol
        res._profile = prof
        res.profile_run = lambda res=res: profiles.profile_run(res)  # type: ignore[misc]
        # The earlier design's result fields (DynamicOffloadApplyResult): the session is the
        # hook, and
        # the module runs on the device through it.
        res.hook = res
        res.should_move_to_execution_device = False
        res.event_payload = payload
        return res
    if r == "diffusers_group_offload":
        try:
            apply_group = _import_apply_group_offloading()
        except _native.DdoError as e:
            raise _native.DdoError(e.code, f"component {component}: {e.detail}") from None
        kwargs = _group_kwargs(pol, device, with_devices=True)
        payload.update({k: v for k, v in kwargs.items() if k not in ("onload_device",
                                                                      "offload_device")})
        apply_group(module, **kwargs)
        routed = RouteResult(module, r, component, device, st, payload, _remove_group_hooks)
    else:  # none
        first = next(iter(module.parameters()), None)
        origin = first.device if first is not None else torch.device("cpu")
        if stager is not None:
            stager.before_move(component, module)
        module.to(device)
        payload["unmanaged_module_moved_to_execution_device"] = str(device)
        routed = RouteResult(module, r, component, device, st, payload)
        routed._origin = origin
    routed.route_policy = pol
    setattr(module, "_ddo_offload", routed)  # (torch's Module.__setattr__ types)
    return routed


def _group_kwargs(pol: Dict[str, Any], device: torch.device,
                 with_devices: bool) -> Dict[str, Any]:
    """apply_group_offloading's arguments from the library's policy."""
    kwargs: Dict[str, Any] = dict(onload_device=device, offload_device=torch.device("cpu")) \
        if with_devices else {}
    kwargs.update(offload_type=pol["offload_type"], use_stream=pol["use_stream"],
                  record_stream=pol["record_stream"],
                  low_cpu_mem_usage=pol["low_cpu_mem_usage"])
    if pol["offload_type"] == "block_level":
        kwargs["num_blocks_per_group"] = pol["num_blocks_per_group"]
    return kwargs


def _pipeline_components(pipeline: Any, components: Union[Mapping[str, Any], Sequence[str], None]
                         ) -> Dict[str, Any]:
    if isinstance(components, dict):
        return dict(components)
    if components is not None:
        names = list(components)
        missing = [n for n in names if getattr(pipeline, n, None) is None and
                   n not in (getattr(pipeline, "components", None) or {})]
        if missing:
            raise _native.DdoError("DDO_E_NOT_FOUND", f"enable_pipeline_offload: the pipeline "
                                   f"({type(pipeline).__name__}) has no component "
                                   f"{', '.join(map(repr, missing))}")
    elif isinstance(getattr(pipeline, "components", None), dict):
        names = list(pipeline.components)
    else:
        names = list(DEFAULT_PIPELINE_COMPONENTS)
    mods = getattr(pipeline, "components", None) or {}
    out: Dict[str, Any] = {}
    for n in names:
        m = getattr(pipeline, n, None)
        if m is None:
            m = mods.get(n)
        out[n] = m
    return out


def enable_pipeline_offload(pipeline: Any, preset: Optional[str] = "auto", *,
                            settings: Optional[DynamicOffloadSettings] = None,
                            components: Union[Mapping[str, Any], Sequence[str], None] = None,
                            component_policies: Optional[Mapping[str, Mapping[str, Any]]] = None,
                            routes: Optional[Mapping[str, str]] = None,
                            use_environment: bool = True,
                            environ: Optional[Mapping[str, str]] = None,
                            backend: Optional[str] = None,
                            config: Optional[DynamicOffloadConfig] = None,
                            running_on_wsl: Optional[bool] = None, low_cpu_mem_usage: bool = True,
                            apply_hook: bool = True,
                            record_event: Optional[Callable[..., Any]] = None,
                            start_unloaded: bool = False, staged: bool = True,
                            progress: Progress = None, trace: TracePath = None,
                            component_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
                            **overrides: Any) -> PipelineOffload:
    """Routes every torch.nn.Module component of pipeline; returns {name: result}.

    staged (the default): ``pipe(...)`` runs within the device budget with no hand-written
    phases. Each component is loaded when it is first called, and the components used least
    recently are unloaded when their device memory is needed (ddo.staging); where everything
    fits, nothing is unloaded. The results' reload()/unload(), metrics and close() still work
    as explicit phases; ``results.stager.events`` lists what was loaded and unloaded.
    staged=False: nothing is loaded or unloaded for you (a forward after unload() raises).
    component_options: {name: {option: value}}, catalog options for one component on top of
    ``overrides`` (a budget or resident pattern of its own). progress and trace as
    enable_offload's (one trace for the whole pipeline, a process per component, written by
    close_pipeline_offload).

    start_unloaded: every ddo session is unloaded as soon as it is set up, so the device holds
    one component's weights at a time while the pipeline is set up (the peak is the largest
    component's, not their sum, as a small card needs); reload() each before its phase.

    components: a mapping used as is, a list of names, else pipeline.components' keys, else
    the earlier design's fixed list. Non-module components (schedulers, tokenizers) are skipped.
    component_policies and routes ({name: route}) must name components of the pipeline.
    Every route is resolved before any component is touched; on an error the components
    already set up are closed (the pipeline is left as it was). A second call on the same
    pipeline is refused while a result of the first is open (ddo.close_pipeline_offload
    closes them all); apply_hook=False attaches nothing and is never in the way.
    """
    check_args("enable_pipeline_offload", preset, config=config, progress=progress,
               trace=trace)
    earlier = getattr(pipeline, "_ddo_pipeline_offload", None)
    if earlier is not None:
        still = [n for n, r in earlier.items() if getattr(r, "_state", "closed") != "closed"]
        if still:
            raise _native.DdoError(
                "DDO_E_STATE", f"enable_pipeline_offload: this {type(pipeline).__name__} is "
                f"already offloaded by ddo (still open: {', '.join(still)}): call "
                f"ddo.close_pipeline_offload(pipe) first")
        close_pipeline_offload(pipeline)  # every result was closed one by one: forget them
    comps = _pipeline_components(pipeline, components)
    modules = {n: m for n, m in comps.items() if isinstance(m, torch.nn.Module)}
    for what, given in (("component_policies", component_policies), ("routes", routes),
                        ("component_options", component_options)):
        unknown = [k for k in (given or {}) if k not in comps]
        if unknown:
            raise _native.DdoError(
                "DDO_E_NOT_FOUND", f"enable_pipeline_offload: {what} names "
                f"{', '.join(map(repr, unknown))}, not a component of this "
                f"{type(pipeline).__name__} (components: {', '.join(comps) or 'none'})")
    if settings is None:
        settings = DynamicOffloadSettings(resolve_config(
            preset=preset, backend=backend, environ=environ, use_environment=use_environment,
            running_on_wsl=running_on_wsl), component_policies)
    plans: Dict[str, Tuple[Dict[str, Any], _native.Config, DynamicOffloadSettings]] = {}
    for name, m in modules.items():
        if getattr(m, "_ddo_offload", None) is not None:
            raise _native.DdoError("DDO_E_STATE", f"enable_pipeline_offload: component "
                                   f"{name} is already managed by ddo")
        plans[name] = resolve_route(m, preset, component=name,
                                    route=(routes or {}).get(name), settings=settings,
                                    component_policies=component_policies, config=config,
                                    low_cpu_mem_usage=low_cpu_mem_usage,
                                    **dict(overrides, **(component_options or {}).get(name, {})))
    results = PipelineOffload()
    results.trace = _talk.Trace(trace) if trace is not None else None
    stager = staging.PipelineStager() if staged and apply_hook else None
    try:
        for name, (pol, cfg, st) in plans.items():
            results[name] = apply_route(modules[name], pol, cfg, st, name,
                                        apply_hook=apply_hook, record_event=record_event,
                                        stager=stager,
                                        talk={"label": name, "progress": progress,
                                              "trace": results.trace})
            if stager is not None:
                stager.added(name, results[name])
            if start_unloaded and isinstance(results[name], offload.OffloadResult):
                results[name].unload()
                if stager is not None:
                    stager.unloaded(name)
    except BaseException:
        for r in reversed(list(results.values())):
            try:
                r.close(restore=True) if isinstance(r, RouteResult) else r.close()
            except Exception:  # the original error is what the caller needs
                pass
        raise
    if stager is not None:
        stager.install()
        results.stager = stager
    if apply_hook:
        try:
            pipeline._ddo_pipeline_offload = results
        except AttributeError:
            pass
    return results


class PipelineOffload(Dict[str, Union["offload.OffloadResult", "RouteResult"]]):
    """enable_pipeline_offload's {component: result}; ``stager`` is its PipelineStager (None
    with staged=False), ``trace`` the trace written by close_pipeline_offload (trace=)."""

    stager: Optional[staging.PipelineStager] = None
    trace: Optional[_talk.Trace] = None


@contextlib.contextmanager
def pipeline_offload(pipeline: Any, preset: Optional[str] = "auto",
                     **kwargs: Any) -> Iterator[PipelineOffload]:
    """enable_pipeline_offload as a ``with`` block: every result is closed at its end; on an
    error the original is raised (a failing close is a note on it)."""
    results = enable_pipeline_offload(pipeline, preset, **kwargs)
    try:
        yield results
    except BaseException as e:
        try:
            close_pipeline_offload(pipeline)
        except Exception as ce:  # the original error is what the caller needs
            if hasattr(e, "add_note"):
                e.add_note(f"ddo cleanup (close) also failed: {ce}")
        raise
    close_pipeline_offload(pipeline)


def close_pipeline_offload(pipeline: Any) -> None:
    """Closes every result enable_pipeline_offload made; the pipeline can be offloaded again."""
    results: Any = getattr(pipeline, "_ddo_pipeline_offload", None) or {}
    stager = getattr(results, "stager", None)
    if stager is not None:
        stager.remove()
    for r in reversed(list(results.values())):
        r.close()
    if getattr(results, "trace", None) is not None:
        results.trace.write()
    try:
        del pipeline._ddo_pipeline_offload
    except AttributeError:
        pass
