"""ddo_vmm_bootstrap: the process bootstrap of the compatible API for the native VMM route, without torch.

    from ddo_vmm_bootstrap import ensure_vmm_fast_process, vmm_fast_requested
    if vmm_fast_requested():
        ensure_vmm_fast_process()
    # only now import torch, diffusers and the pipeline

What it does here. The original native route replaced PyTorch's CUDA allocator, so its bootstrap
had to choose the native library before CUDA was initialised and re-execute the process.
ddo does not replace torch's allocator: it allocates its own device memory through the
driver (slots, VMM mappings) next to torch's caching allocator and binds parameters to views
of it. So no fresh process is needed and none is started; ensure_vmm_fast_process() only
resolves the native library in this order (the explicit library_path, then
DDO_VMM_LIBRARY_PATH, then discovery: the copy inside the ddo package, then the checkout's
build/libddo.so), checks that it is a libddo this binding can use (version and struct
layouts, the same check as ``import ddo``), and passes the resolved path on (DDO_LIBRARY
and DDO_VMM_LIBRARY_PATH in os.environ) so that ddo and any child use the same artifact. It
writes allocator_cache_mib (default 512) to DDO_VMM_TORCH_CACHE_MIB, which has no
effect on ddo (there is no replaced allocator whose cache it would size). It never compiles
or downloads anything, and imports neither torch nor CUDA.
"""

import importlib.util
import os
import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent


class BootstrapError(RuntimeError):
    """The native library is missing or is not a usable libddo (one line)."""


def _arg_value(argv, flag):
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def vmm_fast_requested(argv=None, environ=None):
    """True when the host asks for the native fast route: --ddo-backend vmm (or DDO_BACKEND=vmm)
    with preset auto (or none) or an execution mode of vmm_fast_runtime. Flags win over the
    environment. Reads text only; imports nothing."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    backend = _arg_value(argv, "--ddo-backend") or env.get("DDO_BACKEND", "")
    preset = _arg_value(argv, "--ddo-preset") or env.get("DDO_PRESET", "")
    mode = _arg_value(argv, "--ddo-execution-mode") or env.get("DDO_EXECUTION_MODE", "")
    if mode.strip().lower() == "vmm_fast_runtime":
        return True
    return backend.strip().lower() == "vmm" and \
        preset.strip().lower() in ("", "auto", "vmm_fast_runtime")


def _lib_module():
    """python/ddo/_lib.py loaded on its own (the package's __init__ would import torch)."""
    spec = importlib.util.spec_from_file_location("_ddo_bootstrap_lib", _HERE / "ddo" / "_lib.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _on_windows():
    """Whether the package holds the Windows DLL (tests replace this)."""
    return os.name == "nt"


def resolve_library(library_path=None, environ=None):
    """(path, origin) of the native library in the order above; BootstrapError if none."""
    env = os.environ if environ is None else environ
    if library_path:
        return str(library_path), "library_path"
    if env.get("DDO_VMM_LIBRARY_PATH"):
        return env["DDO_VMM_LIBRARY_PATH"], "DDO_VMM_LIBRARY_PATH"
    tried = []
    names = ("libddo.dll", "ddo.dll") if _on_windows() else ("libddo.so",)
    for origin, p in [("package", _HERE / "ddo" / n) for n in names] + \
            [("checkout build", _HERE.parent / "build" / names[0])]:
        if p.is_file():
            return str(p), origin
        tried.append(f"{p} ({origin})")
    raise BootstrapError("ddo_vmm_bootstrap: no native library: pass library_path or set "
                         "DDO_VMM_LIBRARY_PATH; tried " + "; ".join(tried) +
                         " (nothing is compiled or downloaded)")


DEFAULT_ALLOCATOR_CACHE_MIB = 512
ALLOCATOR_CACHE_NOTE = ("DDO_VMM_TORCH_CACHE_MIB has no effect on ddo: ddo does not replace "
                        "torch's allocator (it is written for a host or child that reads it)")


def ensure_vmm_fast_process(library_path=None, *, allocator_cache_mib=DEFAULT_ALLOCATOR_CACHE_MIB,
                            environ=None):
    """Resolves and checks the native library and passes its path on; returns what it did.

    allocator_cache_mib (the bootstrap control, default 512 MiB): written to
    DDO_VMM_TORCH_CACHE_MIB for the child, replacing a value already there (a
    conflicting pre-existing value is not honoured). It has no effect on ddo, which does not
    replace torch's allocator and so has no allocator cache to size.

    Returns {"library_path", "origin", "version", "fresh_process": False, "reason",
    "allocator_cache_mib", "allocator_cache_note"}. Raises BootstrapError (one line) for a
    missing or invalid library, ValueError for an allocator_cache_mib that is not a whole
    number of MiB >= 0.
    """
    env = os.environ if environ is None else environ
    if isinstance(allocator_cache_mib, bool) or not isinstance(allocator_cache_mib, int) or \
            allocator_cache_mib < 0:
        raise ValueError(f"ddo_vmm_bootstrap: allocator_cache_mib must be a whole number of "
                         f"MiB >= 0, not {allocator_cache_mib!r}")
    path, origin = resolve_library(library_path, env)
    if not os.path.isfile(path):
        raise BootstrapError(f"ddo_vmm_bootstrap: {path} ({origin}) does not exist")
    lib_mod = _lib_module()
    try:
        lib = lib_mod.load(path)
    except (lib_mod.LibraryError, AttributeError, OSError) as e:
        raise BootstrapError(f"ddo_vmm_bootstrap: {path} ({origin}) is not a usable libddo: "
                             f"{e}") from None
    env["DDO_LIBRARY"] = path
    env["DDO_VMM_LIBRARY_PATH"] = path
    env["DDO_VMM_TORCH_CACHE_MIB"] = str(allocator_cache_mib)
    return {"library_path": path, "origin": origin, "version": lib.ddo_version,
            "fresh_process": False,
            "reason": "ddo does not replace torch's allocator: no fresh process is needed",
            "allocator_cache_mib": allocator_cache_mib,
            "allocator_cache_note": ALLOCATOR_CACHE_NOTE}
