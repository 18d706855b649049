"""The host argument helpers of the compatible surface: every --ddo-* flag of the catalog on an
argparse parser, the config built from the parsed namespace (by the library's own flag parser),
the lifecycle phase booleans and the Windows standby purge (ddo_purge_standby, ddo_compat.h).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .. import _enums, _lib, _native
from ..config import DynamicOffloadConfig, catalog
from ..settings import DynamicOffloadSettings

_BOOL = _enums.DDO_OPTION_BOOL
# Phase boundaries a staged host has (the presets' DDO_PURGE_WINDOWS_STANDBY_<PHASE>).
LIFECYCLE_PHASES = ("before_run", "after_text_encoder", "before_transformer")


def _flags() -> List[Tuple[str, str, int, str]]:
    """(key, flag, type, help) of every catalog option that has a flag, catalog order."""
    return [(k, m["flag"], m["type"], m["help"]) for k, m in catalog().items() if m["flag"]]


def _bool_word(text: Any) -> str:
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return word
    raise argparse.ArgumentTypeError(f"expected a boolean (1/0, true/false, yes/no, on/off), "
                                     f"got {text!r}")


def dest_of(key: str) -> str:
    """The namespace attribute of option key's flag: ddo_<key> (--ddo-show-profile is
    args.ddo_show_profile), so that a host's own --show-profile or --verbose keeps its dest."""
    return f"ddo_{key}"


def add_dynamic_offload_arguments(parser: argparse.ArgumentParser) -> Any:
    """Adds every --ddo-* flag of the catalog (help from the catalog) to parser; returns the
    argument group. Each lands in ddo_<key> (dest_of). Values stay text: build_config_from_args
    hands them to the library, which checks them. An option not given is absent from the
    namespace (default SUPPRESS)."""
    group = parser.add_argument_group("ddo", "ddo offload options (`ddo config --list`)")
    for key, flag, typ, help_ in _flags():
        kw: Dict[str, Any] = dict(dest=dest_of(key), default=argparse.SUPPRESS,
                                  help=help_.replace("%", "%%"))
        if typ == _BOOL:
            group.add_argument(flag, nargs="?", const="true", type=_bool_word,
                               metavar="BOOL", **kw)
        else:
            group.add_argument(flag, metavar=key.rsplit("_", 1)[-1].upper()
                               if key.endswith(("_gb", "_mb")) else "VALUE", **kw)
    return group


def _argv_from(args: Union[argparse.Namespace, Dict[str, Any]]) -> List[str]:
    values = vars(args) if not isinstance(args, dict) else args
    argv: List[str] = []
    for key, flag, _typ, _help in _flags():
        v = values.get(dest_of(key))
        if v is not None:
            argv += [flag, _native.to_text(v, key)]
    return argv


def build_native_config(args: Union[argparse.Namespace, Dict[str, Any]]) -> _native.Config:
    """The C config the flags in args describe (ddo_config_parse_args: no DDO_* merge)."""
    argv = _argv_from(args)
    cfg = _native.Config()
    items = [b"host"] + [a.encode() for a in argv]
    arr = _native.c_strings(items)
    argc = ctypes.c_int(len(items))
    cfg._check(_native.lib().ddo_config_parse_args(cfg.h, ctypes.byref(argc), arr))
    if argc.value != 1:
        left = [arr[i].decode() for i in range(1, argc.value)]
        raise _native.ConfigError("DDO_E_CONFIG", f"build_config_from_args: arguments not "
                                  f"understood: {' '.join(left)}")
    cfg.validate()
    return cfg


def build_config_from_args(args: argparse.Namespace) -> DynamicOffloadConfig:
    """A DynamicOffloadConfig from the namespace alone (no DDO_* merge).

    Only what the flags gave is explicit in the result: --ddo-backend and --ddo-preset (first,
    so that where the config is applied the library applies that route family and preset
    again, at the config's rank) and the values whose source is a flag (those the library
    derives from flags included, such as --ddo-vmm-total-staging-gb's staging size). A value
    the selected preset fills is not copied: omission keeps the route-specific defaults and
    the preset route fallback (the VAE policy), and an empty namespace gives an empty
    config that leaves enable_offload's preset= alone. The flags are still checked together
    (ddo_config_parse_args, ddo_config_validate).
    """
    cfg = build_native_config(args)
    values = cfg.to_json()["options"]  # typed values (true, 3, 0.5, lists)
    given = [key for key, _t, _text, source, _h, _e, _f in cfg.items()
             if source == "flag" and key in DynamicOffloadConfig.fields()
             and key != "use_environment"]
    given.sort(key=lambda k: {"backend": 0, "preset": 1}.get(k, 2))  # stable otherwise
    out = DynamicOffloadConfig()
    for key in given:
        setattr(out, key, values[key]["value"])
    return out


def add_dynamic_offload_lifecycle_arguments(parser: argparse.ArgumentParser,
                                            phases: Sequence[str] = LIFECYCLE_PHASES) -> Any:
    """Adds --ddo-purge-windows-standby-<phase> / --no-ddo-... for each phase boundary
    (dest purge_windows_standby_<phase>, default None: inherit environment/preset)."""
    group = parser.add_argument_group("ddo lifecycle", "phase-boundary memory actions")
    for ph in phases:
        name = ph.replace("_", "-")
        dest = f"purge_windows_standby_{ph}"
        group.add_argument(f"--ddo-purge-windows-standby-{name}", dest=dest,
                           action="store_true", default=None,
                           help=f"purge the Windows standby list at {ph} (a no-op elsewhere)")
        group.add_argument(f"--no-ddo-purge-windows-standby-{name}", dest=dest,
                           action="store_false",
                           help=f"never purge at {ph}, whatever DDO_* or the preset say")
    return group


def maybe_purge_windows_standby_cache(
        settings_or_phase: Union[DynamicOffloadSettings, str, None] = None,
        phase: Optional[str] = None, *, settings: Optional[DynamicOffloadSettings] = None,
        preset: str = "auto", execution_device: Any = "cuda:0", offload_device: Any = "cpu",
        running_on_wsl: Optional[bool] = None, record_event: Optional[Callable[..., Any]] = None,
        event_name: Optional[str] = None, default: str = "0", print_message: bool = True,
        ignore_errors: bool = True, environ: Optional[Mapping[str, str]] = None,
        enabled: Optional[bool] = None) -> Dict[str, Any]:
    """The Windows standby purge for a phase (upstream's signature), through ddo_purge_standby.

    Call maybe_purge_windows_standby_cache(settings, "before_run") or
    maybe_purge_windows_standby_cache("before_run", preset="auto"); without settings they are
    built from the environment with default_preset=preset (and the devices, running_on_wsl).
    enabled (the lifecycle flag): None inherits DDO_PURGE_WINDOWS_STANDBY_<PHASE> (set,
    even empty, wins), then the settings' preset, then default; True/False win and leave the
    environment alone. Returns {"purged", "reason", "phase", "variable"}: reason "disabled",
    off Windows "non_windows" (checked after the enable check), "purged", or a failure's class
    (with "error"; raised instead when not ignore_errors). An attempted purge is recorded as
    record_event(event_name or "purge_windows_standby_<phase>", seconds, **result) and printed
    ("[windows-memory] ...") when print_message.
    """
    if isinstance(settings_or_phase, str):
        phase = settings_or_phase if phase is None else phase
    elif settings_or_phase is not None and settings is None:
        settings = settings_or_phase
    if phase is None:
        raise TypeError("maybe_purge_windows_standby_cache: phase is required")
    if not isinstance(phase, str):
        raise TypeError(f"maybe_purge_windows_standby_cache: phase must be a str, "
                        f"not {type(phase).__name__}")
    env = _native.environ_block(environ)
    if settings is None:
        settings = DynamicOffloadSettings.from_env(
            env, default_preset=preset, running_on_wsl=running_on_wsl,
            execution_device=str(execution_device), offload_device=str(offload_device))
    cfg = getattr(settings, "_cfg", None)
    flag = -1 if enabled is None else (1 if enabled else 0)
    t0 = time.perf_counter()
    out = _purge(cfg, phase, flag, env)
    if out["reason"] == "disabled" and flag < 0 and out["variable"] not in env:
        # Neither the environment nor the preset enables this phase (presets only ever set a
        # phase to 1): default decides, parsed by the library as a DDO_* value would be.
        t0 = time.perf_counter()
        out = _purge(cfg, phase, flag, dict(env, **{out["variable"]: str(default)}))
    seconds = time.perf_counter() - t0
    if out["reason"] in ("disabled", "non_windows"):
        return out
    name = event_name or out["variable"].lower()[len("ddo_"):]
    if not out["purged"]:
        if not ignore_errors:
            raise (PermissionError if out["reason"] == "PermissionError" else OSError)(
                f"standby cache purge for phase {out['phase']}: {out['reason']}")
        out["error"] = out["reason"]
        if record_event is not None:
            record_event(name, 0.0, **out)
        if print_message:
            print(f"  [windows-memory] {name}: standby cache purge skipped ({out['reason']})",
                  flush=True)
        return out
    if record_event is not None:
        record_event(name, seconds, **out)
    if print_message:
        print(f"  [windows-memory] {name}: standby cache purge requested", flush=True)
    return out


def _purge(cfg: Optional[_native.Config], phase: str, flag: int,
           env: Mapping[str, str]) -> Dict[str, Any]:
    arr = _native.env_array(env)
    out = _lib.PurgeResult()
    _native.check(_native.lib().ddo_purge_standby(cfg.h if cfg is not None else None,
                                                  phase.encode(), flag, arr, ctypes.byref(out)))
    return {"purged": bool(out.purged), "reason": (out.reason or b"").decode(),
            "phase": out.phase.decode(), "variable": out.variable.decode()}
