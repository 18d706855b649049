"""Loading libddo and declaring its C functions and structs (ctypes).

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
from typing import Any, Union

try:
    from . import _enums
except ImportError:  # loaded on its own by file (python/ddo_vmm_bootstrap.py, without torch)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_ddo_bootstrap_enums", pathlib.Path(__file__).with_name("_enums.py"))
    _enums = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_enums)

# The library version this binding mirrors (major, minor): another minor may change layouts.
ABI_VERSION = (_enums.DDO_VERSION_MAJOR, _enums.DDO_VERSION_MINOR)

c_size_t = ctypes.c_size_t
c_u64 = ctypes.c_uint64
c_u32 = ctypes.c_uint32
c_int = ctypes.c_int
c_double = ctypes.c_double
c_bool = ctypes.c_bool
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
MAX_DIMS = 8


class Extensible(ctypes.Structure):
    """A struct that grows (ddo.h, the ABI rule): its first field is its size, set here to
    this mirror's size, and every other field starts zero, as the C DDO_<NAME>_INIT macros do."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.size = ctypes.sizeof(self)


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_u32),
                ("shape", c_u64 * MAX_DIMS), ("file_index", c_u32), ("offset", c_u64),
                ("nbytes", c_u64), ("host_data", c_void_p)]


class TensorDesc(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_u32),
                ("shape", ctypes.POINTER(c_u64)), ("data", c_void_p)]


class ConfigItem(ctypes.Structure):
    _fields_ = [("key", c_char_p), ("env", c_char_p), ("flag", c_char_p), ("type", c_int),
                ("value", c_char_p), ("source", c_char_p), ("help", c_char_p)]


class Settings(ctypes.Structure):
    _fields_ = [("requested_preset", c_char_p), ("effective_preset", c_char_p),
                ("backend", c_char_p), ("route", c_char_p), ("enabled", c_bool),
                ("plan", c_bool), ("requested_pin_cpu_memory", c_bool),
                ("effective_pin_cpu_memory", c_bool), ("disable_pin_on_wsl", c_bool),
                ("running_on_wsl", c_bool)]


class DeviceCaps(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 128), ("total_bytes", c_u64), ("free_bytes", c_u64),
                ("granularity", c_size_t), ("vmm_supported", c_bool), ("is_cpu", c_bool),
                ("bus_bytes_per_s", c_double), ("flops_per_s", c_double),
                ("driver_version", c_int), ("ordinal", c_int)]


class CpuOptions(Extensible):
    _fields_ = [("size", c_size_t), ("memory_bytes", c_u64), ("granularity", c_size_t),
                ("bytes_per_s", c_double), ("copy_latency_ns", c_u64), ("flops_per_s", c_double)]


class CudaOptions(Extensible):
    _fields_ = [("size", c_size_t), ("library_path", c_char_p), ("library_env", c_char_p)]


class DeviceOptions(Extensible):
    _fields_ = [("size", c_size_t), ("cpu", ctypes.POINTER(CpuOptions)),
                ("cuda", ctypes.POINTER(CudaOptions))]


class PlanInputs(Extensible):
    _fields_ = [("size", c_size_t), ("device_total_bytes", c_u64), ("device_free_bytes", c_u64),
                ("device_granularity", c_size_t), ("device_is_cpu", c_bool),
                ("device_vmm_supported", c_bool), ("host_available_bytes", c_u64),
                ("bus_bytes_per_s", c_double), ("flops_per_s", c_double), ("tokens", c_u64),
                ("unit_compute_json", c_char_p),
                ("codec_ratio", c_double), ("decode_bytes_per_s", c_double),
                ("file_read_bytes_per_s", c_double)]


class SetupOptions(Extensible):
    _fields_ = [("size", c_size_t), ("device", c_int),
                ("device_options", ctypes.POINTER(DeviceOptions)),
                ("envp", ctypes.POINTER(c_char_p))]


class UnitInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("first_tensor", c_size_t), ("tensor_count", c_size_t),
                ("bytes", c_u64), ("flops_per_token", c_u64), ("resident", c_bool),
                ("retained", c_bool), ("registered", c_bool), ("transfer_s", c_double),
                ("compute_s", c_double), ("hidden", c_bool)]


class PlanBudgets(ctypes.Structure):
    _fields_ = [("device_weights_peak", c_u64), ("device_weights_limit", c_u64),
                ("resident_bytes", c_u64), ("slot_bytes", c_u64), ("slot_count", c_size_t),
                ("retained_peak", c_u64), ("retained_limit", c_u64),
                ("registered_peak", c_u64), ("registered_limit", c_u64),
                ("staging_peak", c_u64), ("staging_window_bytes", c_u64),
                ("staging_windows", c_size_t), ("predicted_step_s", c_double)]


class TensorLocation(ctypes.Structure):
    _fields_ = [("placement", c_int), ("reason", c_int), ("unit", c_size_t),
                ("offset", c_u64), ("nbytes", c_u64)]


class PlanInfo(Extensible):
    _fields_ = [("size", c_size_t), ("route", c_int), ("stable_addresses", c_bool),
                ("route_label", c_char_p), ("host_residents", c_int), ("weight_codec", c_int),
                ("unit_granularity", c_int), ("retained_by_stall", c_bool),
                ("codec_sidecar", c_bool)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_u64, c_u64)
TRACE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_size_t, c_u64, c_u64, c_u64)


class SessionOptions(Extensible):
    _fields_ = [("size", c_size_t), ("progress", PROGRESS_FN), ("progress_user", c_void_p), ("config", c_void_p),
                ("trace", TRACE_FN), ("trace_user", c_void_p)]


class ComponentPolicy(ctypes.Structure):
    _fields_ = [("route", c_char_p), ("route_source", ctypes.c_char * 96),
                ("offload_type", c_char_p), ("unit_granularity", c_char_p),
                ("use_stream", c_bool), ("record_stream", c_bool),
                ("low_cpu_mem_usage", c_bool), ("num_blocks_per_group", ctypes.c_int64)]


class HostInfo(ctypes.Structure):
    _fields_ = [("ram_total_bytes", c_u64), ("ram_available_bytes", c_u64),
                ("cgroup_limit_bytes", c_u64), ("running_on_wsl", c_bool),
                ("kernel_release", ctypes.c_char * 128)]


class PurgeResult(ctypes.Structure):
    _fields_ = [("purged", c_bool), ("reason", c_char_p), ("phase", ctypes.c_char * 64),
                ("variable", ctypes.c_char * 96)]


class ProfileSample(ctypes.Structure):
    _fields_ = [("total_bytes", c_u64), ("free_start_bytes", c_u64), ("free_end_bytes", c_u64),
                ("held_start_bytes", c_u64), ("held_peak_bytes", c_u64),
                ("sampled_used_peak_bytes", c_u64)]


class ProfileMeasured(ctypes.Structure):
    _fields_ = [("bus_bytes_per_s", c_double), ("flops_per_s", c_double),
                ("file_read_bytes_per_s", c_double)]


class ProfileCalibration(Extensible):
    _fields_ = [("size", c_size_t), ("total_bytes", c_u64), ("baseline_used_bytes", c_u64),
                ("used_peak_bytes", c_u64), ("used_end_bytes", c_u64),
                ("weights_peak_bytes", c_u64), ("achieved_bytes_per_s", c_double),
                ("file_read_bytes_per_s", c_double), ("flops_per_s", c_double),
                ("peak_gb", c_double), ("total_gb", c_double), ("headroom_gb", c_double),
                ("budget_gb", c_double), ("decode_bytes_per_s", c_double),
                ("unit_compute_json", c_char_p)]


# Every struct mirrored here, by its C name: the library reports its own sizes.
STRUCTS = {
    "ddo_tensor_info": TensorInfo, "ddo_tensor_desc": TensorDesc,
    "ddo_config_item": ConfigItem, "ddo_settings": Settings, "ddo_device_caps": DeviceCaps,
    "ddo_cpu_options": CpuOptions, "ddo_cuda_options": CudaOptions,
    "ddo_device_options": DeviceOptions, "ddo_plan_inputs": PlanInputs,
    "ddo_unit_info": UnitInfo, "ddo_plan_budgets": PlanBudgets, "ddo_plan_info": PlanInfo,
    "ddo_tensor_location": TensorLocation, "ddo_session_options": SessionOptions,
    "ddo_component_policy": ComponentPolicy, "ddo_host_info": HostInfo,
    "ddo_purge_result": PurgeResult, "ddo_profile_sample": ProfileSample,
    "ddo_profile_measured": ProfileMeasured, "ddo_setup_options": SetupOptions,
    "ddo_profile_calibration": ProfileCalibration,
}

P = c_void_p
PP = ctypes.POINTER(c_void_p)
PSIZE = ctypes.POINTER(c_size_t)
PCHARP = ctypes.POINTER(c_char_p)

# name: (restype, argtypes)
FUNCTIONS = {
    "ddo_version_string": (c_char_p, []),
    "ddo_version_number": (ctypes.c_uint, []),
    "ddo_struct_size": (c_size_t, [c_char_p]),
    "ddo_errname": (c_char_p, [c_int]),
    "ddo_strerror": (c_char_p, [c_int]),
    "ddo_last_error": (c_char_p, []),
    "ddo_free": (None, [P]),
    "ddo_dtype_name": (c_char_p, [c_int]),
    "ddo_dtype_size": (c_size_t, [c_int]),
    "ddo_checkpoint_create": (c_int, [c_char_p, c_int, PP]),
    "ddo_checkpoint_create_from_memory_sized": (c_int, [ctypes.POINTER(TensorDesc), c_size_t,
                                                        c_size_t, PP]),
    "ddo_checkpoint_destroy": (None, [P]),
    "ddo_checkpoint_tensor_count": (c_size_t, [P]),
    "ddo_checkpoint_tensor": (ctypes.POINTER(TensorInfo), [P, c_size_t]),
    "ddo_checkpoint_find": (c_int, [P, c_char_p, PSIZE]),
    "ddo_config_create": (c_int, [PP]),
    "ddo_config_destroy": (None, [P]),
    "ddo_config_clone": (c_int, [P, PP]),
    "ddo_config_apply_preset": (c_int, [P, c_char_p, c_char_p]),
    "ddo_config_set": (c_int, [P, c_char_p, c_char_p]),
    "ddo_config_override": (c_int, [P, c_char_p, c_char_p]),
    "ddo_config_override_list": (c_int, [P, c_char_p, PCHARP, c_size_t]),
    "ddo_config_set_list": (c_int, [P, c_char_p, PCHARP, c_size_t]),
    "ddo_config_preset_value": (c_int, [P, c_char_p, PCHARP, PCHARP]),
    "ddo_config_preset_bool": (c_int, [P, c_char_p, PCHARP, c_char_p,
                                       ctypes.POINTER(ctypes.c_bool)]),
    "ddo_config_get": (c_int, [P, c_char_p, PCHARP]),
    "ddo_config_source": (c_int, [P, c_char_p, PCHARP]),
    "ddo_config_apply_env": (c_int, [P, PCHARP]),
    "ddo_config_validate": (c_int, [P]),
    "ddo_config_count": (c_size_t, []),
    "ddo_config_entry": (c_int, [P, c_size_t, ctypes.POINTER(ConfigItem)]),
    "ddo_config_warning_count": (c_size_t, [P]),
    "ddo_config_warning": (c_char_p, [P, c_size_t]),
    "ddo_config_to_json": (c_int, [P, PP]),
    "ddo_config_settings": (c_int, [P, ctypes.POINTER(Settings)]),
    "ddo_config_set_running_on_wsl": (None, [P, c_bool]),
    "ddo_config_error": (c_char_p, [P]),
    "ddo_device_create": (c_int, [c_char_p, ctypes.POINTER(DeviceOptions), PP]),
    "ddo_device_create_from_config": (c_int, [P, ctypes.POINTER(DeviceOptions), PP,
                                              ctypes.c_char_p, c_size_t]),
    "ddo_device_destroy": (None, [P]),
    "ddo_device_caps_get": (c_int, [P, ctypes.POINTER(DeviceCaps)]),
    "ddo_device_error": (c_char_p, [P]),
    "ddo_stream_wrap": (c_int, [P, P, PP]),
    "ddo_stream_destroy": (None, [P]),
    "ddo_plan_inputs_get": (c_int, [P, ctypes.POINTER(PlanInputs)]),
    "ddo_setup_create": (c_int, [P, ctypes.POINTER(SetupOptions), PP]),
    "ddo_setup_destroy": (None, [P]),
    "ddo_setup_device": (P, [P]),
    "ddo_setup_note": (c_char_p, [P]),
    "ddo_setup_error": (c_char_p, [P]),
    "ddo_setup_plan_inputs": (c_int, [P, ctypes.POINTER(PlanInputs)]),
    "ddo_setup_plan": (c_int, [P, P, P, ctypes.POINTER(PlanInputs), PP]),
    "ddo_setup_profile_apply": (c_int, [P, P, P, ctypes.POINTER(c_int),
                                        ctypes.POINTER(c_double),
                                        ctypes.POINTER(ProfileMeasured)]),
    "ddo_setup_profile_record": (c_int, [P, P, ctypes.POINTER(ProfileCalibration), PP]),
    "ddo_plan_build": (c_int, [P, P, ctypes.POINTER(PlanInputs), PP]),
    "ddo_plan_destroy": (None, [P]),
    "ddo_plan_unit_count": (c_size_t, [P]),
    "ddo_plan_unit": (c_int, [P, c_size_t, ctypes.POINTER(UnitInfo)]),
    "ddo_plan_unit_tensors": (PSIZE, [P, c_size_t, PSIZE]),
    "ddo_plan_tensor_location": (c_int, [P, c_size_t, ctypes.POINTER(TensorLocation)]),
    "ddo_plan_budgets_get": (c_int, [P, ctypes.POINTER(PlanBudgets)]),
    "ddo_plan_info_get": (c_int, [P, ctypes.POINTER(PlanInfo)]),
    "ddo_plan_route": (c_char_p, [P]),
    "ddo_plan_to_json": (c_int, [P, PP]),
    "ddo_plan_error": (c_char_p, [P]),
    "ddo_session_create": (c_int, [P, P, P, ctypes.POINTER(SessionOptions), PP]),
    "ddo_session_destroy": (None, [P]),
    "ddo_session_acquire": (c_int, [P, c_size_t, P]),
    "ddo_session_release": (c_int, [P, c_size_t, P]),
    "ddo_session_declare_order": (c_int, [P, PSIZE, c_size_t]),
    "ddo_session_unit_addresses": (c_int, [P, c_size_t, PP, c_size_t, PSIZE]),
    "ddo_session_tensor_stable_address": (c_int, [P, c_size_t, PP]),
    "ddo_session_tensor_dlpack": (c_int, [P, c_size_t, ctypes.c_uint, PP]),
    "ddo_session_tensor_host_owned": (c_int, [P, c_size_t, ctypes.POINTER(c_bool)]),
    "ddo_session_tensor_read_host": (c_int, [P, c_size_t, P, c_u64]),
    "ddo_session_view_count": (c_size_t, [P]),
    "ddo_session_tensor_view_count": (c_size_t, [P, c_size_t]),
    "ddo_session_unload": (c_int, [P]),
    "ddo_session_reload": (c_int, [P]),
    "ddo_session_release_host": (c_int, [P]),
    "ddo_session_synchronize": (c_int, [P]),
    "ddo_session_metrics": (c_int, [P, c_bool, PP]),
    "ddo_session_error": (c_char_p, [P]),
    "ddo_metrics_destroy": (None, [P]),
    "ddo_metrics_get": (c_int, [P, c_char_p, ctypes.POINTER(c_double)]),
    "ddo_metrics_to_json": (c_int, [P, c_char_p, PP]),
    "ddo_metrics_format_profile": (c_int, [P, PP]),
    "ddo_metrics_record": (c_int, [P, c_char_p, c_char_p]),
    # Settings, argument flags, component policies, host facts (the Diffusers surface).
    "ddo_config_parse_args": (c_int, [P, ctypes.POINTER(c_int), PCHARP]),
    "ddo_config_flags_help": (c_char_p, []),
    "ddo_config_describe": (c_int, [c_int, PP]),
    "ddo_config_set_component_policy": (c_int, [P, c_char_p, c_char_p, c_char_p]),
    "ddo_config_component_value": (c_int, [P, c_char_p, c_char_p, PCHARP, ctypes.c_char_p,
                                           c_size_t]),
    "ddo_config_component_policy": (c_int, [P, c_char_p, c_char_p, c_bool,
                                            ctypes.POINTER(ComponentPolicy)]),
    "ddo_config_component_policy_with_overrides": (
        c_int, [P, c_char_p, c_char_p, c_bool, c_bool, ctypes.POINTER(ComponentPolicy)]),
    "ddo_host_info_get": (c_int, [ctypes.POINTER(HostInfo)]),
    "ddo_purge_standby": (c_int, [P, c_char_p, c_int, PCHARP, ctypes.POINTER(PurgeResult)]),
    # Capacity profiles.
    "ddo_profile_dir": (c_int, [c_char_p, c_char_p, c_char_p, PP]),
    "ddo_profile_path": (c_int, [c_char_p, c_char_p, PP]),
    "ddo_profile_load": (c_int, [c_char_p, c_char_p, PP]),
    "ddo_profile_destroy": (None, [P]),
    "ddo_profile_to_json": (c_int, [P, PP]),
    "ddo_profile_recommendation": (c_int, [P, c_char_p, ctypes.POINTER(c_double)]),
    "ddo_profile_record": (c_int, [c_char_p, c_char_p, c_char_p, c_char_p, PP]),
    "ddo_profile_check_writable": (c_int, [c_char_p]),
    "ddo_profile_recommend_resident_budget": (c_double, [c_double, c_double, c_double]),
    "ddo_profile_peak_gb": (c_double, [ctypes.POINTER(ProfileSample)]),
    "ddo_profile_workload_context": (c_int, [c_char_p, P, PP]),
    "ddo_profile_status_name": (c_char_p, [c_int]),
    "ddo_profile_apply": (c_int, [P, c_char_p, c_char_p, ctypes.POINTER(c_int),
                                  ctypes.POINTER(c_double), ctypes.POINTER(ProfileMeasured)]),
}


class LibraryError(ImportError):
    """libddo could not be loaded, or it is not the library this binding mirrors."""


def _on_windows():
    """Whether the Windows discovery order applies (tests replace this to check it on Linux)."""
    return os.name == "nt"


def _package_dir():
    return pathlib.Path(__file__).resolve().parent


def _library_name():
    return "libddo.dll" if _on_windows() else "libddo.so"


# Where the path comes from the caller or the environment: a failure to load it is an error,
# never a reason to try the next candidate.
_EXPLICIT = ("argument", "DDO_LIBRARY", "DDO_VMM_LIBRARY_PATH")


def _candidates(path):
    here = _package_dir()
    windows = _on_windows()
    out = []
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


def _check(lib, where, tried=()):
    try:
        version = lib.ddo_version_string().decode()
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


def _declare(lib):
    missing = []
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
    tried = []
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
                lib.ddo_version_string.restype = c_char_p
                lib.ddo_struct_size.restype = c_size_t
                lib.ddo_struct_size.argtypes = [c_char_p]
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
