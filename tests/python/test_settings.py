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
           "vmm_page_mb": "4", "small_tensor_threshold_bytes": "7"}
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
        assert getattr(ns, key) is not None
        from ddo.cli import build_native_config
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
        a = actions[key]
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
    assert float(conf.resident_module_budget_gb) == 3.0  # the preset's, not DDO_*'s 9
    assert conf.pin_cpu_workers in ("3", 3)


def test_total_staging_flag_becomes_two_nvme_slots():
    p = argparse.ArgumentParser()
    ddo.add_dynamic_offload_arguments(p)
    from ddo.cli import build_native_config
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
    assert s.config.small_tensor_threshold_bytes == 1024 * 1024
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
    assert set(s.as_metrics()) >= {"requested_preset", "effective_preset", "enabled",
                                   "effective_pin_cpu_memory", "execution_mode"}


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
