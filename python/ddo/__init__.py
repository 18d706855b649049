"""ddo: stream a PyTorch module's weights into GPU memory just before they are needed.

    import ddo
    result = ddo.enable_offload(model, backend="vmm", vmm_resident_weight_budget_gb=4)
    out = result.module(x)                  # weights stream through a ddo session
    print(result.metrics_snapshot().format_profile())
    result.close()                          # hooks removed, host tensors back

A thin ctypes layer over libddo (include/ddo.h): the options, presets, planner and runtime are
the library's. See docs/python.md.
"""

from ._lib import LibraryError
from ._native import DdoError, UnknownOptionError, set_library as load_library
from ._native import lib as _lib_handle
from .config import DynamicOffloadConfig
from .offload import MetricsReport, OffloadResult, enable_dynamic_offload, enable_offload

__all__ = ["enable_offload", "enable_dynamic_offload", "OffloadResult", "MetricsReport", "DynamicOffloadConfig",
           "DdoError", "UnknownOptionError", "LibraryError", "load_library", "library_version"]


def library_version():
    """The loaded libddo's version and path."""
    lib = _lib_handle()
    return lib.ddo_version, lib.ddo_path


__version__ = "0.1.0"
