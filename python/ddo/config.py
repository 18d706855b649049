"""DynamicOffloadConfig: every option of libddo's catalog as a field, built from the library.

The fields, their defaults and their types come from the C catalog, read from the library on
first use (``import ddo`` loads no library; ``ddo config --list`` is the same catalog); nothing
here lists an option by hand. Validation is the
library's: ``DynamicOffloadConfig(...).validate()`` or any use raises ``ddo.DdoError`` with the
library's one-line message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _native
from ._options import OptionFields

_Catalog = Tuple[Dict[str, Any], Dict[str, Dict[str, Any]]]
_CACHE: Optional[_Catalog] = None


def _catalog() -> _Catalog:
    """(defaults, metadata) of every option, read from the library once, on first use."""
    global _CACHE
    if _CACHE is None:
        cfg = _native.Config()
        values = {k: v["value"] for k, v in cfg.to_json()["options"].items()}
        meta = {}
        for key, typ, _text, _src, help_, env, flag in cfg.items():
            meta[key] = {"type": typ, "help": help_, "env": env, "flag": flag}
        _CACHE = (values, meta)
    return _CACHE


def catalog() -> Dict[str, Dict[str, Any]]:
    """Every option's type, help, environment variable and flag, in catalog order."""
    return _catalog()[1]


def __getattr__(name: str) -> Any:
    # CATALOG and _DEFAULTS as module attributes, computed on first access (the library loads).
    if name == "CATALOG":
        return _catalog()[1]
    if name == "_DEFAULTS":
        return _catalog()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _freeze(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


class DynamicOffloadConfig(OptionFields):
    """Every option of the catalog with its default; set fields by keyword or attribute.

    Only the fields given (or assigned) are applied to a session; the others keep whatever
    the preset and the environment resolve, as upstream's dataclass ``replace`` does.
    Type checkers and editors see every option as a typed field and keyword (OptionFields,
    generated from the catalog by python/tools/gen_options.py).
    """

    __slots__ = ("_values", "_explicit")

    if not TYPE_CHECKING:  # type checkers read OptionFields' typed keywords instead
        def __init__(self, **fields: Any) -> None:
            object.__setattr__(self, "_values",
                               {k: _freeze(v) for k, v in _catalog()[0].items()})
            object.__setattr__(self, "_explicit", [])
            for k, v in fields.items():
                setattr(self, k, v)

    @staticmethod
    def fields() -> List[str]:
        """The option keys, in catalog order."""
        return list(_catalog()[0])

    def __getattr__(self, key: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if key in values:
            return values[key]
        raise AttributeError(f"DynamicOffloadConfig has no option {key!r}"
                             f"{_nearest_hint(key)}")

    def __setattr__(self, key: str, value: Any) -> None:
        if key not in self._values:
            raise _native.UnknownOptionError(
                "DDO_E_NOT_FOUND", f"unknown DynamicOffloadConfig option {key!r}"
                f"{_nearest_hint(key)}")
        self._values[key] = _freeze(value)
        if key not in self._explicit:
            self._explicit.append(key)

    def explicit(self) -> List[str]:
        """The fields set on this object, in the order they were set."""
        return list(self._explicit)

    def to_dict(self) -> Dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self._values.items()}

    def replace(self, **fields: Any) -> DynamicOffloadConfig:
        c = DynamicOffloadConfig()
        for k in self._explicit:
            setattr(c, k, self._values[k])
        for k, v in fields.items():
            setattr(c, k, v)
        return c

    def apply_to(self, cfg: _native.Config) -> None:
        """Sets the explicit fields on a C config (they win over the environment)."""
        for k in self._explicit:
            cfg.override(k, self._values[k])

    def validate(self) -> DynamicOffloadConfig:
        """Checks the explicit fields with the library; raises DdoError."""
        cfg = _native.Config()
        self.apply_to(cfg)
        cfg.validate()
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DynamicOffloadConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self._values[k]!r}" for k in self._explicit)
        return f"DynamicOffloadConfig({shown})"


def _nearest_hint(key: str) -> str:
    """The library's own nearest-key suggestion for an unknown option."""
    try:
        _native.Config().override(key, "")
    except _native.UnknownOptionError as e:
        detail = e.detail or ""
        at = detail.find("(nearest:")
        return " " + detail[at:] if at >= 0 else ""
    except _native.DdoError:
        pass
    return ""
