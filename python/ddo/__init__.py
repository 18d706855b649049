"""ddo: stream a PyTorch module's weights into GPU memory just before they are needed.

    import ddo
    result = ddo.enable_offload(model, backend="vmm", vmm_resident_weight_budget_gb=4)
    out = result.module(x)                  # weights stream through a ddo session
    print(result.metrics_snapshot().format_profile())
    result.close()                          # hooks removed, host tensors back

A whole pipeline (Diffusers or any object with a ``components`` mapping) in one line: each
component is loaded when the pipeline first calls it, the least recently used unloaded when the
device budget needs the room:

    ddo.enable_pipeline_offload(pipe, vmm_resident_weight_budget_gb=8)   # {name: result}
    image = pipe("a red fox").images[0]
    ddo.close_pipeline_offload(pipe)

A thin ctypes layer over libddo (include/ddo.h): the options, presets, component routes,
planner and runtime are the library's. See docs/python.md.
"""

from __future__ import annotations

from typing import Tuple

from . import _tool

_tool.exec_if_command()  # the `ddo` command and `python -m ddo` start the C tool (no torch needed)
_tool.require_torch()    # else one line naming what to install

from . import _enums  # noqa: E402
from ._lib import LibraryError  # noqa: E402
from ._native import ConfigError, DdoError, UnknownOptionError, set_library as load_library
from ._native import lib as _lib_handle
from .config import DynamicOffloadConfig
from .offload import MetricsReport, OffloadResult
from .routing import (RouteResult, close_pipeline_offload, detect_quantized_backend_modules,
                      enable_offload, enable_pipeline_offload, pipeline_offload)
# The compatibility tier (ddo.compat), re-exported: the names programs of the compatible
# surface call as ddo.<name>.
from .compat import (DynamicOffloadLoadResult, DynamicOffloadSettings, MetricsTracker,
                     add_dynamic_offload_arguments, add_dynamic_offload_lifecycle_arguments,
                     build_config_from_args, enable_dynamic_offload,
                     from_pretrained_with_dynamic_offload, is_wsl_environment,
                     load_dynamic_offload_settings_from_env, maybe_purge_windows_standby_cache)

__all__ = ["enable_offload", "enable_dynamic_offload", "enable_pipeline_offload",
           "close_pipeline_offload", "pipeline_offload", "OffloadResult", "RouteResult", "MetricsReport",
           "MetricsTracker", "DynamicOffloadConfig", "DynamicOffloadSettings",
           "load_dynamic_offload_settings_from_env", "is_wsl_environment",
           "add_dynamic_offload_arguments", "build_config_from_args",
           "add_dynamic_offload_lifecycle_arguments", "maybe_purge_windows_standby_cache",
           "detect_quantized_backend_modules", "from_pretrained_with_dynamic_offload",
           "DynamicOffloadLoadResult", "DdoError", "ConfigError", "UnknownOptionError",
           "LibraryError", "load_library", "library_version"]


def library_version() -> Tuple[str, str]:
    """The loaded libddo's version and path."""
    lib = _lib_handle()
    return lib.ddo_version, lib.ddo_path


# The version is written once, in include/ddo.h (read through the generated _enums).
__version__ = f"{_enums.DDO_VERSION_MAJOR}.{_enums.DDO_VERSION_MINOR}.{_enums.DDO_VERSION_PATCH}"
