"""The host argument helpers: every --ddo-* flag of the catalog on an argparse parser, the
config built from the parsed namespace (by the library's own flag parser), the lifecycle
phase booleans and the Windows standby purge (ddo_purge_standby).
"""

import argparse
import ctypes

from . import _lib, _native
from .config import CATALOG, DynamicOffloadConfig

_BOOL = 0  # DDO_OPTION_BOOL
# Phase boundaries a staged host has (the presets' DDO_PURGE_WINDOWS_STANDBY_<PHASE>).
LIFECYCLE_PHASES = ("before_run", "after_text_encoder", "before_transformer")


def _flags():
    """(key, flag, type, help) of every catalog option that has a flag, catalog order."""
    return [(k, m["flag"], m["type"], m["help"]) for k, m in CATALOG.items() if m["flag"]]


def _bool_word(text):
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return word
    raise argparse.ArgumentTypeError(f"expected a boolean (1/0, true/false, yes/no, on/off), "
                                     f"got {text!r}")


def add_dynamic_offload_arguments(parser):
    """Adds every --ddo-* flag of the catalog (help from the catalog) to parser; returns the
    argument group. Values stay text: build_config_from_args hands them to the library, which
    checks them. An option not given is absent from the namespace (default SUPPRESS)."""
    group = parser.add_argument_group("ddo", "ddo offload options (`ddo config --list`)")
    for key, flag, typ, help_ in _flags():
        kw = dict(dest=key, default=argparse.SUPPRESS, help=help_.replace("%", "%%"))
        if typ == _BOOL:
            group.add_argument(flag, nargs="?", const="true", type=_bool_word,
                               metavar="BOOL", **kw)
        else:
            group.add_argument(flag, metavar=key.rsplit("_", 1)[-1].upper()
                               if key.endswith(("_gb", "_mb")) else "VALUE", **kw)
    return group


def _argv_from(args):
    values = vars(args) if not isinstance(args, dict) else args
    argv = []
    for key, flag, _typ, _help in _flags():
        if key in values and values[key] is not None:
            argv += [flag, _native.to_text(values[key])]
    return argv


def build_native_config(args):
    """The C config the flags in args describe (ddo_config_parse_args: no DDO_* merge)."""
    argv = _argv_from(args)
    cfg = _native.Config()
    items = [b"host"] + [a.encode() for a in argv]
    arr = (ctypes.c_char_p * (len(items) + 1))(*items, None)
    argc = ctypes.c_int(len(items))
    cfg._check(_native.lib().ddo_config_parse_args(cfg.h, ctypes.byref(argc), arr))
    if argc.value != 1:
        left = [arr[i].decode() for i in range(1, argc.value)]
        raise _native.DdoError("DDO_E_CONFIG", f"build_config_from_args: arguments not "
                               f"understood: {' '.join(left)}")
    cfg.validate()
    return cfg


def build_config_from_args(args):
    """A DynamicOffloadConfig from the namespace alone (the seed: no DDO_* merge).

    Every value the flags (or the preset they select) set is an explicit field of the result,
    so enable_offload(config=...) applies it over the environment and the preset.
    """
    cfg = build_native_config(args)
    out = DynamicOffloadConfig()
    for key, _typ, text, source, _h, _e, _f in cfg.items():
        if source == "default" or key not in DynamicOffloadConfig.fields():
            continue
        if key in ("use_environment",):
            continue
        setattr(out, key, text)
    return out


def add_dynamic_offload_lifecycle_arguments(parser, phases=LIFECYCLE_PHASES):
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


def maybe_purge_windows_standby_cache(phase, settings=None, enabled=None, *, environ=None):
    """The Windows standby purge for a phase, through ddo_purge_standby.

    enabled None inherits DDO_PURGE_WINDOWS_STANDBY_<PHASE> (set, even empty, wins) and then
    the settings' effective preset; True/False are explicit and leave the environment alone.
    Returns {"purged", "reason", "phase", "variable"}; off Windows a safe no-op whose reason is
    "non_windows" (checked after the enable check, as upstream).
    """
    if not isinstance(phase, str):
        raise TypeError(f"maybe_purge_windows_standby_cache: phase must be a str, "
                        f"not {type(phase).__name__}")
    cfg = getattr(settings, "_cfg", None)
    env = _native.environ_block(environ)
    items = [f"{k}={v}".encode() for k, v in env.items()]
    arr = (ctypes.c_char_p * (len(items) + 1))(*items, None)
    out = _lib.PurgeResult()
    flag = -1 if enabled is None else (1 if enabled else 0)
    _native.check(_native.lib().ddo_purge_standby(cfg.h if cfg is not None else None,
                                                  phase.encode(), flag, arr, ctypes.byref(out)))
    return {"purged": bool(out.purged), "reason": (out.reason or b"").decode(),
            "phase": out.phase.decode(), "variable": out.variable.decode()}
