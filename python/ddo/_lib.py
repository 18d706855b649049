"""Loading libddo and declaring its C functions and structs (ctypes), on first use.

The declarations are generated from the public headers into ``_ffi.py`` by
``python/tools/gen_ffi.py`` (CTest check_py_ffi fails when the file is not current); this
module only finds, checks and loads the library, which ``import ddo`` never does by itself
(``_native.lib()`` calls ``load`` when a function is first needed).

The library is found in this order: an explicit path given to ``load``, the ``DDO_LIBRARY``
environment variable, the copy inside this package (the wheel's), then, in a source checkout,
the build tree (``<repo>/build/libddo.so``). On Windows: the explicit path, ``DDO_LIBRARY``,
``DDO_VMM_LIBRARY_PATH``, the package's ``libddo.dll`` then ``ddo.dll`` (the win_amd64 wheel
carries ``libddo.dll``), then the checkout's ``build/libddo.dll``. A missing library or one whose version or struct
layouts differ from what this module mirrors fails with one line naming the paths tried and
what was found.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from typing import Any, List, Sequence, Tuple, Union

try:
    from . import _enums, _ffi
    from ._ffi import *  # noqa: F401,F403  (the structs, P, PP, ... by their names)
except ImportError:  # loaded on its own by file (python/ddo_vmm_bootstrap.py, without torch)
    import importlib.util

    def _sibling(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(
            "_ddo_bootstrap" + name, pathlib.Path(__file__).with_name(name + ".py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    _enums = _sibling("_enums")
    _ffi = _sibling("_ffi")
    globals().update({n: getattr(_ffi, n) for n in _ffi.__all__})

# The library version this binding mirrors (major, minor): another minor may change layouts.
ABI_VERSION = (_enums.DDO_VERSION_MAJOR, _enums.DDO_VERSION_MINOR)

# The declarations, generated from the headers (python/tools/gen_ffi.py writes _ffi.py).
STRUCTS = _ffi.STRUCTS
FUNCTIONS = _ffi.FUNCTIONS
# The callback types of ddo_session_options, by the names the binding uses.
PROGRESS_FN = _ffi.ProgressFn
TRACE_FN = _ffi.TraceFn


class LibraryError(ImportError):
    """libddo could not be loaded, or it is not the library this binding mirrors."""


def _on_windows() -> bool:
    """Whether the Windows discovery order applies (tests replace this to check it on Linux)."""
    return os.name == "nt"


def _package_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent


def _library_name() -> str:
    return "libddo.dll" if _on_windows() else "libddo.so"


# Where the path comes from the caller or the environment: a failure to load it is an error,
# never a reason to try the next candidate.
_EXPLICIT = ("argument", "DDO_LIBRARY", "DDO_VMM_LIBRARY_PATH")


def _candidates(path: Union[str, "os.PathLike[str]", None]) -> List[Tuple[str, str]]:
    here = _package_dir()
    windows = _on_windows()
    out: List[Tuple[str, str]] = []
    if path:
        out.append(("argument", str(path)))
    for var in ("DDO_LIBRARY", "DDO_VMM_LIBRARY_PATH") if windows else ("DDO_LIBRARY",):
        env = os.environ.get(var, "")
        if env:
            out.append((var, env))
    names = ("libddo.dll", "ddo.dll") if windows else ("libddo.so",)
    out += [("package", str(here / n)) for n in names]
    checkout = here.parent.parent
    if here.parent.name == "python" and (checkout / "CMakeLists.txt").is_file():
        out.append(("build tree", str(checkout / "build" / _library_name())))
    return out


def _check(lib: Any, where: str, tried: Sequence[str] = ()) -> str:
    try:
        version: str = lib.ddo_version_string().decode()
        size_of = lib.ddo_struct_size
    except AttributeError as e:
        raise LibraryError(f"ddo: {where} is not a libddo this binding can use ({e})") from None
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) != ABI_VERSION:
        before = f" (tried before: {'; '.join(tried)})" if tried else ""
        raise LibraryError(f"ddo: {where} is libddo {version}; this binding "
                           f"({pathlib.Path(__file__).resolve().parent}) needs "
                           f"{ABI_VERSION[0]}.{ABI_VERSION[1]}.x{before}: install the matching "
                           f"wheel or rebuild (`make`)")
    for cname, py in STRUCTS.items():
        n = size_of(cname.encode())
        if n != ctypes.sizeof(py):
            raise LibraryError(f"ddo: {where} (libddo {version}): struct {cname} is {n} bytes "
                               f"there and {ctypes.sizeof(py)} here: rebuild the library or "
                               f"the binding")
    return version


def _declare(lib: Any) -> None:
    missing: List[str] = []
    for name, (res, args) in FUNCTIONS.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        f.restype = res
        f.argtypes = args
    if missing:
        raise LibraryError("ddo: the library lacks " + ", ".join(missing[:5]) +
                           (" ..." if len(missing) > 5 else ""))


def load(path: Union[str, "os.PathLike[str]", None] = None) -> Any:
    """Loads libddo (see the module's docstring for the search order) and checks it."""
    tried: List[str] = []
    for origin, p in _candidates(path):
        if origin in _EXPLICIT or os.path.exists(p):
            try:
                lib: Any = ctypes.CDLL(p)
            except OSError as e:
                if origin in _EXPLICIT:
                    raise LibraryError(f"ddo: cannot load libddo from {p} ({origin}): {e}") \
                        from None
                tried.append(f"{p} ({origin}: {e})")
                continue
            try:
                lib.ddo_version_string.restype = ctypes.c_char_p
                lib.ddo_struct_size.restype = ctypes.c_size_t
                lib.ddo_struct_size.argtypes = [ctypes.c_char_p]
            except AttributeError:
                raise LibraryError(f"ddo: {p} ({origin}) is not libddo (it has no "
                                   f"ddo_version_string / ddo_struct_size)") from None
            version = _check(lib, f"{p} ({origin})", tried)
            _declare(lib)
            lib.ddo_path = p
            lib.ddo_version = version
            return lib
        tried.append(f"{p} ({origin}: absent)")
    raise LibraryError(f"ddo: {_library_name()} not found; tried " + "; ".join(tried) +
                       ": install the wheel (pip install ddo-*.whl; `make wheel` builds it), "
                       "build it in this checkout (`make`), or set DDO_LIBRARY")
