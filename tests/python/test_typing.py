"""The public Python API carries type hints (the package ships py.typed, so type checkers
read them): every exported function and the public methods of the exported result, report,
settings and config classes annotate their return and every parameter, and the hints
resolve (typing.get_type_hints) to real objects. Drop one annotation and this fails."""

import inspect
import sys
import typing

import pytest

import ddo
from ddo import routing, staging

FUNCTIONS = ["enable_offload", "enable_dynamic_offload", "enable_pipeline_offload",
             "close_pipeline_offload", "pipeline_offload", "from_pretrained_with_dynamic_offload",
             "load_dynamic_offload_settings_from_env", "is_wsl_environment",
             "add_dynamic_offload_arguments", "build_config_from_args",
             "add_dynamic_offload_lifecycle_arguments", "maybe_purge_windows_standby_cache",
             "detect_quantized_backend_modules", "load_library", "library_version"]

METHODS = {
    ddo.OffloadResult: ["metrics_snapshot", "budgets", "stable_addresses", "cleanup_on_error",
                        "unload", "reload", "close", "__enter__", "__exit__"],
    ddo.RouteResult: ["unload", "reload", "close", "cleanup_on_error", "metrics_snapshot",
                      "profile_run"],
    ddo.MetricsReport: ["as_dict", "get", "format_profile", "record"],
    ddo.MetricsTracker: ["__init__", "record_ddo_metrics", "records"],
    ddo.DynamicOffloadConfig: ["__init__", "fields", "explicit", "to_dict", "replace",
                               "apply_to", "validate"],
    ddo.DynamicOffloadSettings: ["__init__", "warnings", "source", "preset_value",
                                 "preset_bool", "as_metrics", "from_env"],
    ddo.DynamicOffloadLoadResult: ["__init__", "profile_run"],
    ddo.DdoError: ["__init__"],
    staging.PipelineStager: ["__init__", "added", "unloaded", "install", "remove", "enter",
                             "make_room", "in_use"],
}


def _cases():
    for name in FUNCTIONS:
        yield name, getattr(ddo, name)
    for cls, names in METHODS.items():
        for name in names:
            yield f"{cls.__name__}.{name}", getattr(cls, name)


CASES = list(_cases())


def test_the_lists_name_every_exported_function():
    exported = {n for n in ddo.__all__ if inspect.isfunction(getattr(ddo, n))}
    assert exported <= set(FUNCTIONS), sorted(exported - set(FUNCTIONS))


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_annotated(name, fn):
    fn = inspect.unwrap(fn)
    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty, f"{name}: no return type"
    missing = [p.name for i, p in enumerate(sig.parameters.values())
               if p.annotation is inspect.Parameter.empty
               and not (i == 0 and p.name in ("self", "cls"))]
    assert not missing, f"{name}: parameters without a type: {missing}"


@pytest.mark.skipif(sys.version_info < (3, 9), reason="os.PathLike[str] is subscriptable "
                    "from Python 3.9 (the hints are never evaluated at runtime)")
@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_hints_resolve(name, fn):
    hints = typing.get_type_hints(inspect.unwrap(fn))
    assert "return" in hints


def test_properties_and_fields_are_typed():
    assert typing.get_type_hints(ddo.DynamicOffloadSettings.execution_mode.fget)["return"]
    fields = typing.get_type_hints(ddo.DynamicOffloadSettings)
    assert fields["config"] is ddo.DynamicOffloadConfig and fields["enabled"] is bool
    stager = typing.get_type_hints(routing.PipelineOffload)["stager"]
    assert staging.PipelineStager in typing.get_args(stager)
