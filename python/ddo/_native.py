"""The loaded library, its errors, and small wrappers over C handles (internal)."""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib

_LIB: Any = None


def lib() -> Any:
    """The checked libddo (loaded on first use; ddo.load_library chooses the path)."""
    global _LIB
    if _LIB is None:
        _LIB = _lib.load()
    return _LIB


def set_library(path: Union[str, "os.PathLike[str]", None]) -> Any:
    global _LIB
    _LIB = _lib.load(path)
    return _LIB


def exc_line(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


class DdoError(Exception):
    """An error from libddo: ``code`` is its name ("DDO_E_BUDGET"), ``detail`` its one line."""

    def __init__(self, code: str, detail: Optional[str]) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class UnknownOptionError(DdoError, TypeError):
    """An override that is not an option of the catalog (a TypeError, as upstream raises)."""


class ConfigError(DdoError, ValueError):
    """DDO_E_CONFIG: a bad value, preset, route or option word (a ValueError, as upstream
    raises for an invalid preset or route)."""


def error(code: str, detail: Optional[str]) -> DdoError:
    """The exception for a library error name: ConfigError for DDO_E_CONFIG, else DdoError."""
    return (ConfigError if code == "DDO_E_CONFIG" else DdoError)(code, detail)


def error_name(rc: int) -> str:
    name: str = lib().ddo_errname(rc).decode()
    return name


def check(rc: int, detail: Union[str, bytes, None] = None) -> None:
    """Raises DdoError for a negative return code (detail: the handle's, else the thread's)."""
    if rc == 0:
        return
    if detail is None:
        detail = lib().ddo_last_error()
    if isinstance(detail, bytes):
        detail = detail.decode(errors="replace")
    raise error(error_name(rc), detail or "")


def take_text(ptr: Any) -> str:
    """A library-allocated C string as str, freed."""
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        lib().ddo_free(ptr)


def dtype_names() -> Dict[int, str]:
    """ddo dtype index -> safetensors name ("BF16"), from the library."""
    out: Dict[int, str] = {}
    i = 0
    while True:
        n = lib().ddo_dtype_name(i)
        if n is None:
            return out
        out[i] = n.decode()
        i += 1


class Config:
    """An owned ddo_config handle."""

    def __init__(self, handle: Any = None) -> None:
        if handle is None:
            h = ctypes.c_void_p()
            check(lib().ddo_config_create(ctypes.byref(h)))
            handle = h
        self.h = handle

    def __del__(self) -> None:
        h = getattr(self, "h", None)
        if h is not None and h.value and _LIB is not None:
            _LIB.ddo_config_destroy(h)
            self.h = None

    def _check(self, rc: int) -> None:
        if rc != 0:
            check(rc, lib().ddo_config_error(self.h))

    def apply_preset(self, backend: Optional[str], preset: Optional[str]) -> None:
        self._check(lib().ddo_config_apply_preset(
            self.h, backend.encode() if backend else None, (preset or "auto").encode()))

    def apply_env(self, environ: Optional[Mapping[str, str]]) -> None:
        self._check(lib().ddo_config_apply_env(self.h, env_array(environ)))

    def override(self, key: str, value: Any) -> None:
        """value at argument rank (it wins over DDO_*); a list or tuple element by element."""
        self._store(key, value, lib().ddo_config_override, lib().ddo_config_override_list)

    def set(self, key: str, value: Any) -> None:
        """value at API rank (DDO_* wins over it, as over from_env's keyword arguments)."""
        self._store(key, value, lib().ddo_config_set, lib().ddo_config_set_list)

    def _store(self, key: str, value: Any, set_text: Any, set_list: Any) -> None:
        if isinstance(value, (list, tuple)):
            items = [_element(v).encode() for v in value]
            arr = (ctypes.c_char_p * max(1, len(items)))(*items)
            rc = set_list(self.h, key.encode(), arr, len(items))
        else:
            rc = set_text(self.h, key.encode(), to_text(value).encode())
        if rc != 0:
            detail = lib().ddo_config_error(self.h).decode(errors="replace")
            name = error_name(rc)
            if name == "DDO_E_NOT_FOUND":
                raise UnknownOptionError(name, detail)
            raise error(name, detail)

    def component_value(self, component: str, option: str) -> Optional[Tuple[str, str]]:
        """(value, source) of a component option by the library's lookup (policy, DDO_*,
        preset); None when nothing sets it (DDO_E_NOT_FOUND)."""
        v = ctypes.c_char_p()
        src = ctypes.create_string_buffer(96)
        rc = lib().ddo_config_component_value(self.h, str(component).encode(),
                                              str(option).encode(), ctypes.byref(v), src,
                                              len(src))
        if rc != 0 and error_name(rc) == "DDO_E_NOT_FOUND":
            return None
        self._check(rc)
        return (v.value or b"").decode(), src.value.decode()

    def get(self, key: str) -> str:
        v = ctypes.c_char_p()
        self._check(lib().ddo_config_get(self.h, key.encode(), ctypes.byref(v)))
        return v.value.decode() if v.value is not None else ""

    def source(self, key: str) -> str:
        v = ctypes.c_char_p()
        self._check(lib().ddo_config_source(self.h, key.encode(), ctypes.byref(v)))
        return v.value.decode() if v.value is not None else ""

    def validate(self) -> None:
        self._check(lib().ddo_config_validate(self.h))

    def to_json(self) -> Dict[str, Any]:
        p = ctypes.c_void_p()
        self._check(lib().ddo_config_to_json(self.h, ctypes.byref(p)))
        doc: Dict[str, Any] = json.loads(take_text(p))
        return doc

    def warnings(self) -> List[str]:
        n = lib().ddo_config_warning_count(self.h)
        return [lib().ddo_config_warning(self.h, i).decode() for i in range(n)]

    def items(self) -> List[Tuple[str, int, str, str, str, str, str]]:
        """(key, type, value text, source, help, env, flag) of every option, catalog order."""
        it = _lib.ConfigItem()
        out: List[Tuple[str, int, str, str, str, str, str]] = []
        for i in range(lib().ddo_config_count()):
            self._check(lib().ddo_config_entry(self.h, i, ctypes.byref(it)))
            out.append((it.key.decode(), it.type, it.value.decode(), it.source.decode(),
                        (it.help or b"").decode(), (it.env or b"").decode(),
                        (it.flag or b"").decode()))
        return out


def _element(v: Any) -> str:
    """One element of a list option: a class is its name (target_module_classes=(nn.Linear,)
    is "Linear", the catalog's word), anything else its str."""
    return v.__name__ if isinstance(v, type) else str(v)


def to_text(value: Any, key: Optional[str] = None) -> str:
    """A Python value as the catalog's text form (for a flag or a policy value).

    A str is the text itself (a list option's text is split on ',' and ';', as DDO_*); a list
    or tuple is joined with ',', so an element holding ',' or ';' is refused here (key names
    the option): Config.override and Config.set pass lists element by element instead."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        items = [_element(v) for v in value]
        bad = next((t for t in items if "," in t or ";" in t), None)
        if bad is not None:
            raise ConfigError("DDO_E_CONFIG", f"{key or 'a list option'}: pattern '{bad}' holds "
                              f"',' or ';', which a text list value is split on; pass the "
                              f"option through enable_offload or DynamicOffloadConfig, which "
                              f"take list elements as they are")
        return ",".join(items)
    if value is None:
        return ""
    if isinstance(value, type):
        return value.__name__
    return str(value)


def c_strings(items: Sequence[Optional[bytes]]) -> Any:
    """A NULL-terminated char *[] of items (bytes), as libddo takes argv and environ blocks."""
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def env_array(environ: Optional[Mapping[str, str]] = None) -> Any:
    """environ (default os.environ) as the NULL-terminated NAME=VALUE block libddo takes."""
    return c_strings([f"{k}={v}".encode() for k, v in environ_block(environ).items()])


def environ_block(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    return dict(os.environ if environ is None else environ)
