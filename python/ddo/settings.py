"""DynamicOffloadSettings: the resolved settings object of the compatible API, resolved by the library.

Every rule (presets, the DDO_* vocabulary, set-even-empty wins, lists, the from_env defaults,
the WSL pinning rule, the DDO_SAFETENSORS_BACKEND alias, component policies) is libddo's
(src/config*.c, src/config/components.c); this module only hands it the environment block, the
caller's values and the host's WSL fact, and reads back the result.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Mapping, Optional

from . import _lib, _native
from .config import DynamicOffloadConfig

def host_info() -> Dict[str, Any]:
    """The library's facts about this machine: RAM, cgroup limit, WSL, kernel release."""
    h = _lib.HostInfo()
    _native.check(_native.lib().ddo_host_info_get(ctypes.byref(h)))
    return {"ram_total_bytes": h.ram_total_bytes, "ram_available_bytes": h.ram_available_bytes,
            "cgroup_limit_bytes": h.cgroup_limit_bytes, "running_on_wsl": h.running_on_wsl,
            "kernel_release": h.kernel_release.decode(errors="replace")}


def is_wsl_environment() -> bool:
    """True when the library detects WSL from the kernel release (upstream's name)."""
    return bool(host_info()["running_on_wsl"])


def _text(b: Optional[bytes]) -> str:
    return b.decode(errors="replace") if b is not None else ""


def set_component_policies(cfg: _native.Config,
                           policies: Optional[Mapping[str, Mapping[str, Any]]]) -> None:
    """Sets {component: {option: value}} on a C config (API rank: over environment/preset).

    Option names are tried as upstream does (lowercased, '-' as '_'); an unknown one is
    refused by the library with its one line (which lists the options).
    """
    for comp, opts in (policies or {}).items():
        if not isinstance(opts, dict):
            raise TypeError(f"component_policies[{comp!r}] must be a mapping of options, "
                            f"not {type(opts).__name__}")
        for opt, value in opts.items():
            key = str(opt).strip().lower().replace("-", "_")
            text = _native.to_text(value, key)
            rc = _native.lib().ddo_config_set_component_policy(
                cfg.h, str(comp).encode(), key.encode(), text.encode())
            if rc != 0:
                L = _native.lib()
                detail = _text(L.ddo_config_error(cfg.h)) or _text(L.ddo_last_error())
                raise _native.error(_native.error_name(rc),
                                    f"component_policies[{comp!r}][{opt!r}]: {detail}")


def same_component(name: str, other: str) -> bool:
    """True when the library takes name and other for one component (its normalisation:
    "Text-Encoder" is text_encoder), asked through a scratch config's API policy."""
    cfg = _native.Config()
    L = _native.lib()
    if L.ddo_config_set_component_policy(cfg.h, str(name).encode(), b"route", b"auto") != 0:
        return False
    try:
        found = cfg.component_value(other, "route")
    except _native.DdoError:  # a name the library refuses is no component
        return False
    return found is not None and found[1] == "api"


def resolve_config(*, preset: Optional[str] = "", backend: Optional[str] = None,
                   environ: Optional[Mapping[str, str]] = None, use_environment: bool = True,
                   running_on_wsl: Optional[bool] = None,
                   fields: Optional[Mapping[str, Any]] = None,
                   config: Optional[DynamicOffloadConfig] = None,
                   overrides: Optional[Mapping[str, Any]] = None,
                   component_policies: Optional[Mapping[str, Mapping[str, Any]]] = None,
                   base: Optional[_native.Config] = None) -> _native.Config:
    """A C config: base (cloned) or preset; then the environment; then the caller's values.

    fields are applied with API rank (the environment wins over them, as from_env does with
    its keyword arguments); config and overrides with argument rank (they win).
    """
    L = _native.lib()
    if base is not None:
        h = ctypes.c_void_p()
        _native.check(L.ddo_config_clone(base.h, ctypes.byref(h)))
        cfg = _native.Config(h)
    else:
        cfg = _native.Config()
        if not use_environment:
            cfg._check(L.ddo_config_set(cfg.h, b"use_environment", b"false"))
        if preset or backend:
            cfg.apply_preset(backend, preset)
        wsl = host_info()["running_on_wsl"] if running_on_wsl is None else bool(running_on_wsl)
        L.ddo_config_set_running_on_wsl(cfg.h, wsl)
        for k, v in (fields or {}).items():
            if v is None:  # upstream's None defaults: not given (the built-in value stays)
                continue
            cfg.set(str(k), v)
        cfg.apply_env(_native.environ_block(environ) if use_environment else {})
    if config is not None:
        if not isinstance(config, DynamicOffloadConfig):
            raise TypeError(f"config must be a ddo.DynamicOffloadConfig, not "
                            f"{type(config).__name__}")
        config.apply_to(cfg)
    bad: List[str] = []
    for k, v in (overrides or {}).items():
        if v is None:  # not given, as upstream's None parameter defaults
            continue
        try:
            cfg.override(k, v)
        except _native.UnknownOptionError as e:
            bad.append(e.detail or "")
    if bad:
        raise _native.UnknownOptionError(
            "DDO_E_NOT_FOUND", "Unknown DynamicOffloadConfig override(s): " + "; ".join(bad))
    set_component_policies(cfg, component_policies)
    cfg.validate()
    return cfg


def config_snapshot(cfg: _native.Config) -> DynamicOffloadConfig:
    """A DynamicOffloadConfig holding every resolved value of cfg (no field marked explicit)."""
    c = DynamicOffloadConfig()
    values = object.__getattribute__(c, "_values")
    for k, v in cfg.to_json()["options"].items():
        if k in values:
            values[k] = tuple(v["value"]) if isinstance(v["value"], list) else v["value"]
    return c


class DynamicOffloadSettings:
    """The resolved settings (the compatible API's fields); most users never build one by hand.

    Fields: requested_preset, effective_preset, enabled, plan, config (a DynamicOffloadConfig
    of every resolved value), requested_pin_cpu_memory, effective_pin_cpu_memory,
    disable_pin_on_wsl, running_on_wsl, component_policies; plus backend and route (ddo's
    route family and the route the settings select). Immutable; the C config it came from is
    kept so a later enable_offload resolves from exactly these settings.
    """

    requested_preset: str
    effective_preset: str
    enabled: bool
    plan: bool
    config: DynamicOffloadConfig
    requested_pin_cpu_memory: bool
    effective_pin_cpu_memory: bool
    disable_pin_on_wsl: bool
    running_on_wsl: bool
    component_policies: Dict[str, Dict[str, Any]]
    backend: str
    route: str
    _cfg: _native.Config

    _FIELDS = ("requested_preset", "effective_preset", "enabled", "plan", "config",
               "requested_pin_cpu_memory", "effective_pin_cpu_memory", "disable_pin_on_wsl",
               "running_on_wsl", "component_policies", "backend", "route")

    def __init__(self, cfg: _native.Config,
                 component_policies: Optional[Mapping[str, Mapping[str, Any]]] = None) -> None:
        s = _lib.Settings()
        _native.check(_native.lib().ddo_config_settings(cfg.h, ctypes.byref(s)),
                      _native.lib().ddo_config_error(cfg.h))
        d = {"requested_preset": _text(s.requested_preset),
             "effective_preset": _text(s.effective_preset), "enabled": bool(s.enabled),
             "plan": bool(s.plan), "config": config_snapshot(cfg),
             "requested_pin_cpu_memory": bool(s.requested_pin_cpu_memory),
             "effective_pin_cpu_memory": bool(s.effective_pin_cpu_memory),
             "disable_pin_on_wsl": bool(s.disable_pin_on_wsl),
             "running_on_wsl": bool(s.running_on_wsl),
             "component_policies": {k: dict(v) for k, v in (component_policies or {}).items()},
             "backend": _text(s.backend), "route": _text(s.route)}
        for k, v in d.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_cfg", cfg)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("DynamicOffloadSettings is immutable: build new settings with "
                             "from_env(...) or pass overrides to enable_offload")

    @property
    def execution_mode(self) -> Any:
        return self.config.execution_mode

    def warnings(self) -> List[str]:
        """The library's warnings about the environment block (unknown DDO_* variables)."""
        return self._cfg.warnings()

    def source(self, key: str) -> str:
        """Where an option's value came from ("default", "preset:X", "env:DDO_X", ...)."""
        return self._cfg.source(key)

    def preset_value(self, name: str, default: str = "",
                     environ: Optional[Mapping[str, str]] = None) -> str:
        """A DDO_* variable as a host phase reads it (upstream's preset_value): environ's value
        when it sets name (even to ""), else the effective preset's, else default
        (ddo_config_preset_value)."""
        v = ctypes.c_char_p()
        env = _native.env_array(environ)  # *v may point into it: read it while env lives
        _native.check(_native.lib().ddo_config_preset_value(
            self._cfg.h, str(name).encode(), env, ctypes.byref(v)))
        return default if v.value is None else v.value.decode()

    def preset_bool(self, name: str, default: str = "0",
                    environ: Optional[Mapping[str, str]] = None) -> bool:
        """preset_value read with the boolean vocabulary (1/true/yes/on, any case; default
        when nothing sets name) (ddo_config_preset_bool)."""
        b = ctypes.c_bool()
        _native.check(_native.lib().ddo_config_preset_bool(
            self._cfg.h, str(name).encode(), _native.env_array(environ), str(default).encode(),
            ctypes.byref(b)))
        return bool(b.value)

    def as_metrics(self) -> Dict[str, Any]:
        """The settings as a flat dict for event payloads: upstream's keys (all prefixed
        dynamic_offload_; empty presets, cache namespace and safetensors backend as None),
        plus ddo's dynamic_offload_backend and dynamic_offload_route."""
        c = self.config
        out: Dict[str, Any]  # (the typed option fields differ in type)
        out = {"requested_preset": self.requested_preset or None,
               "effective_preset": self.effective_preset or None,
               "execution_mode": c.execution_mode,
               "linear_runtime_strategy": c.linear_runtime_strategy,
               "pin_cpu_memory": self.requested_pin_cpu_memory,
               "effective_pin_cpu_memory": self.effective_pin_cpu_memory,
               "allow_pin_memory_fallback": c.allow_pin_memory_fallback,
               "disable_pin_on_wsl": self.disable_pin_on_wsl}
        for k in ("pin_cpu_workers", "cache_plan", "cache_pinned_weights"):
            out[k] = getattr(c, k)
        out["pinned_weight_cache_namespace"] = c.pinned_weight_cache_namespace or None
        for k in ("auto_budget_policy", "max_resident_module_budget_gb",
                  "auto_vram_headroom_gb", "profile_vram_headroom_gb", "profile_name",
                  "build_profile", "auto_full_pin_min_model_to_vram_ratio",
                  "profile_resident_module_budget_gb", "max_pin_weight_budget_gb",
                  "available_system_ram_gb", "system_ram_headroom_gb", "pin_weight_budget_gb",
                  "pin_weight_budget_ratio", "pin_weight_selection"):
            out[k] = getattr(c, k)
        out["small_tensor_threshold_kb"] = int(c.small_tensor_threshold_bytes) // 1024
        for k in ("resident_module_budget_gb", "resident_module_patterns",
                  "resident_module_selection"):
            out[k] = getattr(c, k)
        out["load_safetensors_backend"] = c.load_safetensors_backend or None
        out["show_profile"] = c.show_profile
        out["component_policies"] = {k: dict(v) for k, v in self.component_policies.items()}
        out["backend"] = self.backend
        out["route"] = self.route
        return {f"dynamic_offload_{k}": v for k, v in out.items()}

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, *, default_preset: str = "",
                 backend: Optional[str] = None, running_on_wsl: Optional[bool] = None,
                 component_policies: Optional[Mapping[str, Mapping[str, Any]]] = None,
                 use_environment: bool = True, **fields: Any) -> DynamicOffloadSettings:
        """Settings from DDO_* variables (environ, default os.environ) over default_preset.

        default_preset "" means no preset unless DDO_PRESET is set (upstream's from_env).
        running_on_wsl None asks the library (ddo_host_info_get). fields are option keys
        (execution_device="cpu", always_resident_modules_pattern=...) given by the caller;
        a recognised DDO_* variable wins over them, by the override order (docs/options.md). A
        field given as None is not given (always_resident_modules_pattern=None keeps the
        built-in list, as upstream); classes are their names (target_module_classes=
        (nn.Linear, nn.Embedding) is "Linear,Embedding"); a list is element by element.
        component_policies: {component: {option: value}}, which win over the environment.
        """
        cfg = resolve_config(preset=default_preset, backend=backend, environ=environ,
                             use_environment=use_environment, running_on_wsl=running_on_wsl,
                             fields=fields, component_policies=component_policies)
        return cls(cfg, component_policies)

    def __repr__(self) -> str:
        return (f"DynamicOffloadSettings(requested_preset={self.requested_preset!r}, "
                f"effective_preset={self.effective_preset!r}, route={self.route!r}, "
                f"enabled={self.enabled}, effective_pin_cpu_memory="
                f"{self.effective_pin_cpu_memory}, running_on_wsl={self.running_on_wsl})")


def load_dynamic_offload_settings_from_env(**kwargs: Any) -> DynamicOffloadSettings:
    """Upstream's function name for DynamicOffloadSettings.from_env."""
    return DynamicOffloadSettings.from_env(**kwargs)
