"""The compatibility tier of the binding: the names kept for programs written against the
compatible settings surface (the ``dynamic_offload`` names, the ``--ddo-*`` argparse helpers,
the environment-driven settings object) and the Windows-only standby purge. The package ``ddo``
re-exports every one of them, so ``ddo.<name>`` keeps working; new code needs none of them
(``ddo.enable_offload`` with a ``DynamicOffloadConfig`` or keyword options is the API).
The C side of the tier is ``include/ddo_compat.h``.
"""

from __future__ import annotations

from ..loading import DynamicOffloadLoadResult, from_pretrained_with_dynamic_offload
from ..metrics import MetricsTracker
from ..routing import enable_dynamic_offload
from ..settings import (DynamicOffloadSettings, is_wsl_environment,
                        load_dynamic_offload_settings_from_env)
from .cli import (LIFECYCLE_PHASES, add_dynamic_offload_arguments,
                  add_dynamic_offload_lifecycle_arguments, build_config_from_args,
                  build_native_config, maybe_purge_windows_standby_cache)

__all__ = ["DynamicOffloadSettings", "load_dynamic_offload_settings_from_env",
           "is_wsl_environment", "add_dynamic_offload_arguments",
           "add_dynamic_offload_lifecycle_arguments", "build_config_from_args",
           "build_native_config", "maybe_purge_windows_standby_cache", "LIFECYCLE_PHASES",
           "enable_dynamic_offload", "from_pretrained_with_dynamic_offload",
           "DynamicOffloadLoadResult", "MetricsTracker"]
