"""DynamicOffloadSettings.from_env, the argparse helpers and the purge helper, against the C
catalog: every option with an environment variable or a flag round-trips through from_env,
add_dynamic_offload_arguments + build_config_from_args and DynamicOffloadConfig overrides to
the same resolved value, which differs from the default (so each case can fail)."""

import argparse
import ctypes
import re

import pytest

import ddo
from ddo import _native
from ddo.config import CATALOG

BOOL, INT, GB, MB, FLOAT, STRING, ENUM, LIST = range(8)
# A valid non-default text per option that needs one (paired or range-checked options).
SPECIAL = {"preset": None, "backend": None, "use_environment": None,
           "execution_device": "cpu", "offload_device": None,
           "vmm_native_source_cache_slots": None, "vmm_native_source_cache_slot_mb": None,
           "target_module_classes": "Linear", "profile_resident_module_budget_gb": None,
           "vmm_page_mb": "4", "small_tensor_threshold_bytes": "7",
           "devices": "cpu:0;cpu:1"}
# Options that are valid only together with another one (the library refuses them alone).
COMPANIONS = {"build_profile": {"profile_name": "w"},
              "vmm_source_registered_gb": {"vmm_source_cache_gb": "1"},
              "vmm_component_tensor_ownership": {"backend": "vmm",
                                                 "execution_mode": "vmm_fast_runtime"},
              "vmm_execution_backing_reclaim": {"backend": "vmm",
                                                "execution_mode": "vmm_fast_runtime"}}
KIB_KEYS = {"small_tensor_threshold_bytes"}  # env and flag in KiB, the API in bytes


def enum_words():
    """key -> accepted words, parsed from the library's own catalog text."""
    p = ctypes.c_void_p()
    _native.check(_native.lib().ddo_config_describe(0, ctypes.byref(p)))
    text = _native.take_text(p)
    out, key = {}, None
    for line in text.splitlines():
        m = re.match(r"^(\w+) \(enum", line)
        if m:
            key = m.group(1)
        m = re.match(r"^\s+one of: (.*)$", line)
        if m and key:
            out[key] = [w.strip().strip('"') for w in m.group(1).split(",")]
            key = None
    return out


ENUMS = enum_words()


def default_values():
    return {k: v["value"] for k, v in _native.Config().to_json()["options"].items()}


DEFAULTS = default_values()


def candidate(key, typ):
    """A text that the catalog accepts for key and that is not its default."""
    if key in SPECIAL:
        return SPECIAL[key]
    d = DEFAULTS[key]
    if typ == BOOL:
        return "false" if d else "true"
    if typ == INT:
        return str(int(d) + 3)
    if typ in (GB, FLOAT):
        return "0.75" if float(d) != 0.75 else "0.5"
    if typ == MB:
        return "3" if float(d) != 3 else "5"
    if typ == ENUM:
        return next(w for w in ENUMS[key] if w != d and w)
    if typ == LIST:
        return "alpha;beta"
    return f"text_{key}"


CASES = [(k, m) for k, m in CATALOG.items()
         if (m["env"] or m["flag"]) and candidate(k, m["type"]) is not None]


def test_catalog_cases_cover_nearly_every_option():
    assert len(CASES) >= len(CATALOG) - 8  # every option but the few handled on their own
    assert {"vmm_total_staging_gb", "vmm_source_cache_gb", "unit_granularity"} <= \
        {k for k, _ in CASES}


def resolved(cfg_or_settings, key):
    cfg = getattr(cfg_or_settings, "_cfg", cfg_or_settings)
    return cfg.to_json()["options"][key]["value"]


@pytest.mark.parametrize("key,meta", CASES, ids=[k for k, _ in CASES])
def test_env_flag_and_override_agree(key, meta):
    text = candidate(key, meta["type"])
    extra = COMPANIONS.get(key, {})
    got = {}
    if meta["env"]:
        env = {CATALOG[k]["env"]: v for k, v in extra.items()}
        env[meta["env"]] = text
        s = ddo.DynamicOffloadSettings.from_env(env, running_on_wsl=False)
        assert s.source(key) == f"env:{meta['env']}"
        got["env"] = resolved(s, key)
    if meta["flag"]:
        p = argparse.ArgumentParser()
        ddo.add_dynamic_offload_arguments(p)
        argv = [a for k, v in extra.items() for a in (CATALOG[k]["flag"], v)]
        ns = p.parse_args(argv + [meta["flag"], text])
        assert getattr(ns, f"ddo_{key}") is not None
        from ddo.compat.cli import build_native_config
        cfg = build_native_config(ns)
        assert cfg.source(key) == "flag"
        got["flag"] = resolved(cfg, key)
        conf = ddo.build_config_from_args(ns)
        assert key in conf.explicit()
    c = _native.Config()
    api = str(int(text) * 1024) if key in KIB_KEYS else text
    ddo.DynamicOffloadConfig(**dict(extra, **{key: api})).apply_to(c)
    c.validate()
    got["override"] = resolved(c, key)
    values = list(got.values())
    assert all(v == values[0] for v in values), got
    assert values[0] != DEFAULTS[key], (key, values[0])


def test_every_flag_is_added_with_catalog_help():
    p = argparse.ArgumentParser()
    ddo.add_dynamic_offload_arguments(p)
    actions = {a.dest: a for a in p._actions}
    for key, m in CATALOG.items():
        if not m["flag"]:
            continue
        a = actions[f"ddo_{key}"]
        assert m["flag"] in a.option_strings
        assert a.help == m["help"].replace("%", "%%")
        assert a.default is argparse.SUPPRESS
    assert "--ddo-vmm-total-staging-gb" in p.format_help()
    assert vars(p.parse_args([])) == {}  # nothing given: nothing in the namespace


def test_build_config_from_args_ignores_environment(monkeypatch):
    monkeypatch.setenv("DDO_RESIDENT_MODULE_BUDGET_GB", "9")
    p = argparse.ArgumentParser()
    ddo.add_dynamic_offload_arguments(p)
    conf = ddo.build_config_from_args(p.parse_args(["--ddo-preset", "low_ram_safe",
                                                    "--ddo-pin-cpu-workers", "3"]))
    # Only what the flags gave is explicit: the preset (re-applied where the config is used)
    # and the worker count; nothing of DDO_*'s 9 and none of the preset's own values.
    assert conf.explicit() == ["preset", "pin_cpu_workers"]
    assert conf.preset == "low_ram_safe" and conf.pin_cpu_workers in ("3", 3)


def test_total_staging_flag_becomes_two_nvme_slots():
    p = argparse.ArgumentParser()
    ddo.add_dynamic_offload_arguments(p)
    from ddo.compat.cli import build_native_config
    cfg = build_native_config(p.parse_args(["--ddo-backend", "vmm", "--ddo-preset",
                                            "nvme_baseline", "--ddo-vmm-total-staging-gb", "3"]))
    assert float(cfg.get("vmm_staging_buffer_gb")) == 1.5
    cfg = build_native_config(p.parse_args(["--ddo-backend", "vmm",
                                            "--ddo-vmm-total-staging-gb", "3"]))
    assert float(cfg.get("vmm_staging_buffer_gb")) == 3.0
    assert float(cfg.get("vmm_resident_weight_budget_gb")) == 4.0  # the helper's default


def test_bad_flag_value_is_one_line():
    p = argparse.ArgumentParser()
    ddo.add_dynamic_offload_arguments(p)
    with pytest.raises(ddo.DdoError) as e:
        ddo.build_config_from_args(p.parse_args(["--ddo-pin-weight-selection", "most"]))
    assert "\n" not in str(e.value) and "pin_weight_selection" in str(e.value).lower() or \
        "most" in str(e.value)


def test_from_env_defaults_and_presets():
    s = ddo.DynamicOffloadSettings.from_env({}, running_on_wsl=False)
    assert s.requested_preset == "" and s.effective_preset == ""
    assert s.config.small_tensor_threshold_bytes == 16 * 1024  # one small-tensor default everywhere
    assert s.config.pin_cpu_workers == 4
    assert s.config.show_profile is False
    assert list(s.config.always_resident_modules_pattern) == [
        r"(^|\.)(proj_in|time_embed|prompt_adaln|norm_out|proj_out)(\.|$)"]
    assert s.config.available_system_ram_gb > 0
    assert s.enabled is False
    s = ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": " AUTO "}, running_on_wsl=False)
    assert s.requested_preset == "auto" and s.effective_preset == "one_shot_fast"
    assert s.enabled and s.execution_mode == "linear_runtime"
    s = ddo.DynamicOffloadSettings.from_env({}, default_preset="low_ram_safe",
                                            running_on_wsl=False)
    assert s.effective_preset == "low_ram_safe" and s.config.resident_module_budget_gb == 3
    with pytest.raises(ddo.DdoError) as e:
        ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": "compat"})
    assert "compat" in str(e.value)


def test_set_even_empty_wins_and_vocabulary():
    env = {"DDO_PRESET": "one_shot_fast", "DDO_RESIDENT_MODULE_PATTERNS": ""}
    s = ddo.DynamicOffloadSettings.from_env(env, running_on_wsl=False)
    assert list(s.config.resident_module_patterns) == []
    s = ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": "one_shot_fast"},
                                            running_on_wsl=False)
    assert list(s.config.resident_module_patterns) == ["auto"]
    for word, want in [("1", True), ("TRUE", True), (" yes ", True), ("On", True),
                       ("0", False), ("", False), ("no", False), ("2", False)]:
        s = ddo.DynamicOffloadSettings.from_env({"DDO_VERBOSE": word}, running_on_wsl=False)
        assert s.config.verbose is want, word
    s = ddo.DynamicOffloadSettings.from_env({"DDO_SKIP_MODULES_PATTERN": " a , ;b;; c "},
                                            running_on_wsl=False)
    assert list(s.config.skip_modules_pattern) == ["a", "b", "c"]
    s = ddo.DynamicOffloadSettings.from_env({"DDO_SAFETENSORS_BACKEND": "mmap"})
    assert s.config.load_safetensors_backend == "mmap"
    s = ddo.DynamicOffloadSettings.from_env({"DDO_SAFETENSORS_BACKEND": "mmap",
                                             "DDO_LOAD_SAFETENSORS_BACKEND": "pread"})
    assert s.config.load_safetensors_backend == "pread"
    with pytest.raises(ddo.DdoError) as e:
        ddo.DynamicOffloadSettings.from_env({"DDO_PIN_CPU_WORKERS": "abc"})
    assert "DDO_PIN_CPU_WORKERS" in str(e.value)


def test_environment_beats_from_env_arguments_and_use_environment_false():
    s = ddo.DynamicOffloadSettings.from_env({"DDO_EXECUTION_DEVICE": "cpu"},
                                            execution_device="cuda:1")
    assert s.config.execution_device == "cpu"
    s = ddo.DynamicOffloadSettings.from_env({}, execution_device="cuda:1")
    assert s.config.execution_device == "cuda:1"
    s = ddo.DynamicOffloadSettings.from_env({"DDO_VERBOSE": "1"}, use_environment=False)
    assert s.config.verbose is False


def test_wsl_pinning_rule():
    env = {"DDO_PRESET": "one_shot_fast"}
    s = ddo.DynamicOffloadSettings.from_env(env, running_on_wsl=True)
    assert s.requested_pin_cpu_memory and not s.effective_pin_cpu_memory
    assert s.running_on_wsl and s.disable_pin_on_wsl
    s = ddo.DynamicOffloadSettings.from_env(dict(env, DDO_DISABLE_PIN_ON_WSL="0"),
                                            running_on_wsl=True)
    assert s.effective_pin_cpu_memory
    s = ddo.DynamicOffloadSettings.from_env(env, running_on_wsl=False)
    assert s.effective_pin_cpu_memory
    # None asks the library (kernel release); this machine's answer is whatever it reports.
    s = ddo.DynamicOffloadSettings.from_env(env)
    assert s.running_on_wsl == ddo.is_wsl_environment()


def test_settings_are_immutable_and_unknown_variables_warn():
    s = ddo.DynamicOffloadSettings.from_env({"DDO_VERBSE": "1"}, running_on_wsl=False)
    with pytest.raises(AttributeError):
        s.enabled = True
    assert any("DDO_VERBSE" in w for w in s.warnings())



# Upstream's DynamicOffloadSettings.as_metrics() keys , all prefixed.
UPSTREAM_METRICS = {f"dynamic_offload_{k}" for k in (
    "requested_preset", "effective_preset", "execution_mode", "linear_runtime_strategy",
    "pin_cpu_memory", "effective_pin_cpu_memory", "allow_pin_memory_fallback",
    "disable_pin_on_wsl", "pin_cpu_workers", "cache_plan", "cache_pinned_weights",
    "pinned_weight_cache_namespace", "auto_budget_policy", "max_resident_module_budget_gb",
    "auto_vram_headroom_gb", "profile_vram_headroom_gb", "profile_name", "build_profile",
    "auto_full_pin_min_model_to_vram_ratio", "profile_resident_module_budget_gb",
    "max_pin_weight_budget_gb", "available_system_ram_gb", "system_ram_headroom_gb",
    "pin_weight_budget_gb", "pin_weight_budget_ratio", "pin_weight_selection",
    "small_tensor_threshold_kb", "resident_module_budget_gb", "resident_module_patterns",
    "resident_module_selection", "load_safetensors_backend", "show_profile",
    "component_policies")}


def test_as_metrics_has_upstreams_keys():
    # Upstream test 5: the profile headroom is a regular setting, reported as metric.
    s = ddo.DynamicOffloadSettings.from_env({"DDO_PROFILE_VRAM_HEADROOM_GB": "1.25"},
                                            running_on_wsl=False)
    m = s.as_metrics()
    assert UPSTREAM_METRICS <= set(m)
    assert set(m) - UPSTREAM_METRICS == {"dynamic_offload_backend", "dynamic_offload_route"}
    assert m["dynamic_offload_profile_vram_headroom_gb"] == 1.25
    assert m["dynamic_offload_requested_preset"] is None  # "" is reported as None
    assert m["dynamic_offload_effective_preset"] is None
    assert m["dynamic_offload_small_tensor_threshold_kb"] == 16
    assert m["dynamic_offload_load_safetensors_backend"] is None
    fast = ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": "one_shot_fast"},
                                               running_on_wsl=True)
    m = fast.as_metrics()
    assert m["dynamic_offload_effective_preset"] == "one_shot_fast"
    assert m["dynamic_offload_pin_cpu_memory"] is True  # requested
    assert m["dynamic_offload_effective_pin_cpu_memory"] is False  # the WSL rule
    assert m["dynamic_offload_resident_module_patterns"] == ("auto",)


def test_lifecycle_arguments_and_purge():
    p = argparse.ArgumentParser()
    ddo.add_dynamic_offload_lifecycle_arguments(p)
    ns = p.parse_args([])
    assert ns.purge_windows_standby_before_transformer is None
    ns = p.parse_args(["--ddo-purge-windows-standby-before-transformer",
                       "--no-ddo-purge-windows-standby-before-run"])
    assert ns.purge_windows_standby_before_transformer is True
    assert ns.purge_windows_standby_before_run is False
    fast = ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": "one_shot_fast"})
    r = ddo.maybe_purge_windows_standby_cache("before_transformer", settings=fast, environ={})
    assert r == {"purged": False, "reason": "non_windows", "phase": "before_transformer",
                 "variable": "DDO_PURGE_WINDOWS_STANDBY_BEFORE_TRANSFORMER"}
    r = ddo.maybe_purge_windows_standby_cache("before_transformer", settings=fast,
                                              enabled=False, environ={})
    assert r["reason"] == "disabled"
    r = ddo.maybe_purge_windows_standby_cache(
        "before_transformer", settings=fast,
        environ={"DDO_PURGE_WINDOWS_STANDBY_BEFORE_TRANSFORMER": ""})
    assert r["reason"] == "disabled"  # set, even empty, wins over the preset
    r = ddo.maybe_purge_windows_standby_cache("after_vae", enabled=True, environ={})
    assert r["reason"] == "non_windows"
    r = ddo.maybe_purge_windows_standby_cache("after_vae", environ={})
    assert r["reason"] == "disabled"
    with pytest.raises(ddo.DdoError):
        ddo.maybe_purge_windows_standby_cache("  ", environ={})


def test_weight_codec_from_the_catalog():
    # issue 13: the codec option reaches the native config from every Python entry point.
    for value in ("none", "auto", "ddoc1"):
        c = _native.Config()
        ddo.DynamicOffloadConfig(weight_codec=value).apply_to(c)
        c.validate()
        assert resolved(c, "weight_codec") == value
    assert CATALOG["weight_codec"]["flag"] == "--ddo-weight-codec"
    assert CATALOG["weight_codec"]["env"] == "DDO_WEIGHT_CODEC"
    with pytest.raises(Exception):
        c = _native.Config()
        ddo.DynamicOffloadConfig(weight_codec="zstd").apply_to(c)
        c.validate()


def test_argument_dests_do_not_collide_with_the_hosts():
    # The host's own --show-profile / --verbose (examples/flux_pipeline.py has --show-profile)
    # keep their dests; ddo's flags land in ddo_<key> and are mapped back.
    p = argparse.ArgumentParser()
    p.add_argument("--show-profile", action="store_true")
    p.add_argument("--verbose", action="store_true")
    ddo.add_dynamic_offload_arguments(p)
    ns = p.parse_args(["--show-profile", "--verbose"])
    assert ns.show_profile is True and ns.verbose is True
    assert ddo.build_config_from_args(ns).explicit() == []  # the host's flags are not ddo's
    ns = p.parse_args(["--ddo-show-profile", "--ddo-verbose", "0"])
    assert ns.show_profile is False and ns.verbose is False
    assert ns.ddo_show_profile == "true" and ns.ddo_verbose == "0"
    conf = ddo.build_config_from_args(ns)
    assert conf.explicit() == ["verbose", "show_profile"]
    assert conf.show_profile is True and conf.verbose is False


def test_from_env_keyword_defaults_as_upstream():
    # Upstream's from_env(target_module_classes=(nn.Linear, nn.Embedding),
    # always_resident_modules_pattern=None): None means the built-in list, classes their
    # names (the catalog's vocabulary, "Linear,Embedding").
    from torch import nn
    builtin = ddo.DynamicOffloadSettings.from_env({}).config.always_resident_modules_pattern
    assert len(builtin) == 1
    s = ddo.DynamicOffloadSettings.from_env({}, always_resident_modules_pattern=None,
                                            target_module_classes=(nn.Linear, nn.Embedding))
    assert s.config.always_resident_modules_pattern == builtin
    assert s.config.target_module_classes == ("Linear", "Embedding")
    s = ddo.DynamicOffloadSettings.from_env({}, target_module_classes=(nn.Linear,))
    assert s.config.target_module_classes == ("Linear",)
    assert s.source("target_module_classes") == "api"


def test_list_elements_are_not_split():
    # A Python list of regexes is taken element by element (only environment
    # variables cannot carry ',' or ';'): ddo_config_set_list / ddo_config_override_list.
    s = ddo.DynamicOffloadSettings.from_env({}, skip_modules_pattern=[r"a\.b", "c"])
    assert s.config.skip_modules_pattern == (r"a\.b", "c")
    pat = r"blocks\.\d{1,2}\.attn"
    s = ddo.DynamicOffloadSettings.from_env({}, always_resident_modules_pattern=[pat, "x;y"])
    assert s.config.always_resident_modules_pattern == (pat, "x;y")
    cfg = ddo.DynamicOffloadConfig(resident_module_patterns=("auto", "x;y"))
    cfg.validate()
    assert cfg.resident_module_patterns == ("auto", "x;y")
    # The environment form stays a separated list (the environment's vocabulary), and a text value's
    # list (a flag) too; joining a list into one text refuses an element with a separator.
    s = ddo.DynamicOffloadSettings.from_env({"DDO_SKIP_MODULES_PATTERN": "a,b"})
    assert s.config.skip_modules_pattern == ("a", "b")
    with pytest.raises(ValueError) as e:
        ddo._native.to_text([pat], "always_resident_modules_pattern")
    assert pat in str(e.value) and "\n" not in str(e.value)


def test_a_comma_regex_selects_the_modules_it_names():
    # Through enable_offload: blocks 0-1 of the Flux-like stack resident by a {m,n} regex.
    import models
    m = models.FluxLike(seed=3)
    r = ddo.enable_offload(m, backend="vmm", execution_device="cpu",
                           small_tensor_threshold_bytes=0, resident_module_budget_gb=0,
                           always_resident_modules_pattern=[r"^transformer_blocks\.[0-1]{1,1}\."])
    resident = {t.name.split(".")[1] for t in r._tensors
                if t.placement == 0 and t.name.startswith("transformer_blocks.")}
    r.close()
    assert resident == {"0", "1"}


def test_invalid_preset_and_route_are_value_errors():
    # Upstream raises ValueError for an invalid preset and an unknown route (
    # step 8); ddo's error is also a DdoError with the code and the one-line detail.
    with pytest.raises(ValueError) as e:
        ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": "windows_fast"})
    assert isinstance(e.value, ddo.DdoError) and e.value.code == "DDO_E_CONFIG"
    assert "DDO_PRESET" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError):
        ddo.DynamicOffloadSettings.from_env({}, default_preset="windows_fast")
    with pytest.raises(ValueError) as e:
        ddo.DynamicOffloadConfig(pin_weight_selection="most").validate()
    assert e.value.code == "DDO_E_CONFIG"
    assert issubclass(ddo.ConfigError, ddo.DdoError) and issubclass(ddo.ConfigError, ValueError)


def test_purge_signature_as_upstream():
    # The standby purge: off Windows the purge is a no-op whose reason
    # is "non_windows", checked after the enable check.
    events = []
    rec = lambda name, seconds, **kw: events.append(name)  # noqa: E731
    # No settings: built from the environment with preset auto (one_shot_fast purges here).
    r = ddo.maybe_purge_windows_standby_cache("before_run", environ={}, record_event=rec)
    assert r["reason"] == "non_windows" and r["purged"] is False
    assert r["phase"] == "before_run"
    r = ddo.maybe_purge_windows_standby_cache("before_run", preset="off", print_message=False,
                                              environ={})
    assert r["reason"] == "disabled"
    off = ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": "off"})
    assert ddo.maybe_purge_windows_standby_cache(off, "before_run", environ={})["reason"] == \
        "disabled"
    fast = ddo.DynamicOffloadSettings.from_env({"DDO_PRESET": "one_shot_fast"})
    assert ddo.maybe_purge_windows_standby_cache(fast, "before_run", environ={})["reason"] == \
        "non_windows"
    # default: the value when neither the environment nor the preset sets the phase.
    r = ddo.maybe_purge_windows_standby_cache("after_vae", preset="off", default="1",
                                              environ={})
    assert r["reason"] == "non_windows"
    r = ddo.maybe_purge_windows_standby_cache(
        "after_vae", preset="off", default="1",
        environ={"DDO_PURGE_WINDOWS_STANDBY_AFTER_VAE": "0"})
    assert r["reason"] == "disabled"
    assert events == []  # events are recorded only for an attempted purge (Windows)
    with pytest.raises(TypeError):
        ddo.maybe_purge_windows_standby_cache(settings=fast)
    with pytest.raises(TypeError):
        ddo.maybe_purge_windows_standby_cache()


def test_preset_value_and_preset_bool():
    # Upstream's DynamicOffloadSettings.preset_value / preset_bool, answered by the library
    # (ddo_config_preset_value): the environment (set, even empty, wins), the effective preset,
    # the default.
    s = ddo.DynamicOffloadSettings.from_env({}, default_preset="one_shot_fast")
    name = "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN"
    assert s.preset_value(name, environ={}) == "1" and s.preset_bool(name, environ={})
    assert s.preset_value(name, "x", environ={name: ""}) == ""
    assert not s.preset_bool(name, "1", environ={name: ""})
    assert s.preset_value("DDO_NOT_IN_ANY_PRESET", "fallback", environ={}) == "fallback"
    assert s.preset_bool("DDO_NOT_IN_ANY_PRESET", " Yes ", environ={})
    assert not s.preset_bool("DDO_NOT_IN_ANY_PRESET", environ={})
    off = ddo.DynamicOffloadSettings.from_env({}, default_preset="off")
    assert not off.preset_bool(name, environ={})
