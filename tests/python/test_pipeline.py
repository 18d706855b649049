"""enable_offload / enable_pipeline_offload routing on the cpu device, without Diffusers.

RecordingGroupOffload STANDS IN FOR DIFFUSERS' apply_group_offloading (Diffusers is not
installed in CI): it records the arguments each component was handed, and nothing else. The
expected routes are the documented rules (docs/options.md: component routes, presets, the
VAE policy), not outputs of this code.
"""

import importlib.util
import json
import sys

import pytest
import torch
from torch import nn

import ddo
import ddo.routing
import models

CPU = {"DDO_EXECUTION_DEVICE": "cpu"}

# preset (backend) -> component -> expected (route, offload_type, use_stream, record_stream).
G_LEAF_STREAM = ("diffusers_group_offload", "leaf_level", True, False)
G_LEAF_NOSTREAM = ("diffusers_group_offload", "leaf_level", False, False)
DYN = ("dynamic_offload",)
NONE = ("none",)
TABLE = {
    ("linear", "auto"): {"transformer": DYN, "text_encoder": G_LEAF_STREAM,
                         "vae": G_LEAF_NOSTREAM, "model": DYN},
    ("linear", "one_shot_fast"): {"transformer": DYN, "text_encoder": G_LEAF_STREAM,
                                  "vae": G_LEAF_NOSTREAM, "model": DYN},
    ("linear", "low_ram_safe"): {"transformer": DYN, "text_encoder": G_LEAF_NOSTREAM,
                                 "vae": G_LEAF_NOSTREAM, "model": DYN},
    ("linear", "wsl_compat"): {"transformer": DYN, "text_encoder": G_LEAF_NOSTREAM,
                               "vae": NONE, "model": DYN},
    ("linear", "warm_process"): {"transformer": DYN, "text_encoder": G_LEAF_STREAM,
                                 "vae": NONE, "model": DYN},
    ("linear", "diffusers_offload_compat"): {
        "transformer": ("diffusers_group_offload", "block_level", True, True),
        "text_encoder": G_LEAF_STREAM, "vae": NONE, "model": NONE},
    ("linear", "diffusers_leaf_offload_compat"): {
        "transformer": ("diffusers_group_offload", "leaf_level", True, True),
        "text_encoder": G_LEAF_STREAM, "vae": NONE, "model": NONE},
    ("linear", "off"): {"transformer": NONE, "text_encoder": NONE, "vae": NONE,
                        "model": NONE},
    ("vmm", "auto"): {"transformer": DYN, "text_encoder": DYN, "vae": G_LEAF_NOSTREAM,
                      "model": DYN},
    ("vmm", "nvme_baseline"): {"transformer": DYN, "text_encoder": DYN, "vae": NONE,
                               "model": DYN},
}


class RecordingGroupOffload:
    """Stands in for diffusers.hooks.apply_group_offloading: records each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, module, **kwargs):
        self.calls.append((module, kwargs))


@pytest.fixture
def group(monkeypatch):
    rec = RecordingGroupOffload()
    monkeypatch.setattr(ddo.routing, "_import_apply_group_offloading", lambda: rec)
    return rec


class Pipe:
    """A stand-in pipeline: a components mapping, the modules also as attributes."""

    def __init__(self, seed=0):
        self.text_encoder = models.FluxLike(seed=seed + 1, double=2, single=0)
        self.transformer = models.FluxLike(seed=seed + 2)
        self.vae = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)).to(torch.bfloat16)
        self.scheduler = object()
        self.tokenizer = None

    @property
    def components(self):
        return {"text_encoder": self.text_encoder, "transformer": self.transformer,
                "vae": self.vae, "scheduler": self.scheduler, "tokenizer": self.tokenizer}


def close_all(results):
    for r in results.values():
        r.close()


@pytest.mark.parametrize("backend,preset", list(TABLE), ids=[f"{b}-{p}" for b, p in TABLE])
def test_routing_table(group, backend, preset):
    for comp, want in TABLE[(backend, preset)].items():
        m = models.FluxLike(seed=3, double=2, single=0)
        r = ddo.enable_offload(m, preset, component=comp, backend=backend, environ=CPU,
                               running_on_wsl=False)
        try:
            assert r.route == want[0], (comp, r.route_policy)
            if want[0] == "diffusers_group_offload":
                mod, kw = group.calls[-1]
                assert mod is m
                assert (kw["offload_type"], kw["use_stream"], kw["record_stream"]) == want[1:]
                assert kw["onload_device"] == torch.device("cpu")
                assert kw["offload_device"] == torch.device("cpu")
                assert ("num_blocks_per_group" in kw) == (want[1] == "block_level")
                assert kw["low_cpu_mem_usage"] is True
            elif want[0] == "dynamic_offload":
                assert isinstance(r, ddo.OffloadResult)
                with torch.no_grad():
                    r.module(torch.randn(1, 4, 64).to(torch.bfloat16))
            else:
                assert all(p.device.type == "cpu" for p in m.parameters())
        finally:
            r.close()


def test_group_offload_forced_off_on_wsl(group):
    m = models.FluxLike(seed=3)
    r = ddo.enable_offload(m, "diffusers_offload_compat", component="transformer",
                           environ=CPU, running_on_wsl=True)
    kw = group.calls[-1][1]
    assert kw["use_stream"] is False and kw["record_stream"] is False
    assert kw["num_blocks_per_group"] == 1
    r.close()
    env = dict(CPU, DDO_DISABLE_PIN_ON_WSL="0")
    r = ddo.enable_offload(m, "diffusers_offload_compat", component="transformer",
                           environ=env, running_on_wsl=True)
    assert group.calls[-1][1]["use_stream"] is True
    r.close()


def test_precedence_explicit_route_policy_environment(group):
    m = models.FluxLike(seed=4)
    env = dict(CPU, DDO_TRANSFORMER_ROUTE="group", DDO_TRANSFORMER_OFFLOAD_TYPE="block_level",
               DDO_TRANSFORMER_NUM_BLOCKS_PER_GROUP="2")
    r = ddo.enable_offload(m, component="transformer", environ=env)
    assert r.route == "diffusers_group_offload"
    assert group.calls[-1][1]["num_blocks_per_group"] == 2
    assert r.route_policy["route_source"] == "env:DDO_TRANSFORMER_ROUTE"
    r.close()
    # The compatibility alias DDO_RUNNER_<COMPONENT>_* is read after DDO_<COMPONENT>_*.
    r = ddo.enable_offload(m, component="transformer",
                           environ=dict(CPU, DDO_RUNNER_TRANSFORMER_ROUTE="cuda"))
    assert r.route == "none"
    r.close()
    # An explicit component policy wins over the environment.
    r = ddo.enable_offload(m, component="transformer", environ=env,
                           component_policies={"transformer": {"route": "ddo"}})
    assert r.route == "dynamic_offload"
    r.close()
    # An explicit route wins over a component policy.
    r = ddo.enable_offload(m, component="transformer", environ=env, route="none",
                           component_policies={"transformer": {"route": "ddo"}})
    assert r.route == "none"
    r.close()
    # use_environment=False ignores environment routes too.
    r = ddo.enable_offload(m, component="transformer", environ=env, use_environment=False,
                           execution_device="cpu")
    assert r.route == "dynamic_offload"
    r.close()
    # Group/dynamic enable arguments are component policies too.
    r = ddo.enable_offload(m, component="transformer", environ=CPU, group_offload=True,
                           offload_type="block_level", num_blocks_per_group=3,
                           use_stream=False)
    kw = group.calls[-1][1]
    assert r.route == "diffusers_group_offload"
    assert kw["num_blocks_per_group"] == 3 and kw["use_stream"] is False
    r.close()


def test_vae_policy_bypassed_by_explicit_config(group):
    vae = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)).to(torch.bfloat16)
    # execution_device= and offload_device= are named parameters of upstream's enable_offload
    # (the routing rule), not config overrides: the preset's VAE route stays.
    for kw in ({"execution_device": "cpu"}, {"offload_device": "cpu"}):
        r = ddo.enable_offload(vae, component="vae", environ={}, **kw)
        assert r.route == "diffusers_group_offload", kw
        assert group.calls[-1][1]["use_stream"] is False
        r.close()
    n = len(group.calls)
    r = ddo.enable_offload(vae, component="vae", environ={}, execution_device="cpu",
                           resident_module_budget_gb=0)
    assert r.route == "dynamic_offload"  # an override: not silently the preset's leaf route
    assert len(group.calls) == n
    r.close()
    r = ddo.enable_offload(vae, component="vae", environ=CPU,
                           config=ddo.DynamicOffloadConfig(execution_device="cpu"))
    assert r.route == "dynamic_offload"
    r.close()
    # An empty config sets nothing: the preset's VAE policy stays.
    r = ddo.enable_offload(vae, component="vae", environ=CPU, config=ddo.DynamicOffloadConfig())
    assert r.route == "diffusers_group_offload" and group.calls[-1][1]["use_stream"] is False
    r.close()
    # With the preset off, the bypass leaves the VAE unmanaged (settings disabled).
    r = ddo.enable_offload(vae, "off", component="vae", environ=CPU, verbose=True)
    assert r.route == "none"
    r.close()


def test_bad_routes_and_policies_are_one_line(group):
    m = models.FluxLike(seed=5)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, component="transformer", route="sideways", environ=CPU)
    assert "sideways" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, component="transformer", environ=CPU,
                           component_policies={"transformer": {"colour": "blue"}})
    assert "colour" in str(e.value)
    assert str(e.value).count("offload_low_cpu_mem_usage") == 1  # the option list once
    # A policy for another component than the one routed: one line naming both.
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, component="transformer", environ=CPU,
                           component_policies={"transfomer": {"route": "none"}})
    assert "'transfomer'" in str(e.value) and "'transformer'" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, component="transformer",
                           environ=dict(CPU, DDO_TRANSFORMER_ROUTE="nowhere"))
    assert "DDO_TRANSFORMER_ROUTE" in str(e.value)
    with pytest.raises(ValueError) as e:
        ddo.enable_offload(m, component="transformer", route="none", environ=CPU,
                           profile_name="w", build_profile=True)
    assert str(e.value) == "Profile calibration requires the dynamic_offload route."
    assert getattr(m, "_ddo_offload", None) is None
    assert all(p.device.type == "cpu" and p.numel() > 0 for p in m.parameters())


def group_route_unavailable():
    """Where Diffusers cannot be imported: the default route of a component is ddo's own (the
    policy says why), and a requested group route is refused with nothing left managed; the
    refusal's text."""
    m = models.FluxLike(seed=6)
    r = ddo.enable_offload(m, component="text_encoder", environ=CPU)
    assert r.route == "dynamic_offload"
    assert "Diffusers not importable" in r.route_policy["route_source"]
    r.close()
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, component="text_encoder", environ=CPU,
                           route="diffusers_group_offload")
    assert getattr(m, "_ddo_offload", None) is None
    return str(e.value)


def test_without_diffusers_group_route_fails_clearly():
    """Without Diffusers a default group route becomes ddo's own; a requested one fails in one
    line naming the component."""
    if importlib.util.find_spec("diffusers") is not None:
        pytest.skip("Diffusers is installed here")
    why = group_route_unavailable()
    assert "Diffusers" in why and "\n" not in why
    assert "component text_encoder" in why


def test_a_broken_diffusers_install_is_not_importable(tmp_path, monkeypatch):
    """A Diffusers that raises something other than ImportError on import (a broken install:
    seen on the GPU machine, where a TorchAO source tree without metadata made Diffusers' own
    import raise InvalidVersion) counts as not importable: the default route is ddo's own, and a
    requested group route fails in one line naming what the import raised."""
    pkg = tmp_path / "broken" / "diffusers"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ValueError(\"Invalid version: 'unknown'\\nmore\")\n")
    monkeypatch.syspath_prepend(str(tmp_path / "broken"))
    for name in [k for k in sys.modules if k == "diffusers" or k.startswith("diffusers.")]:
        monkeypatch.delitem(sys.modules, name)
    why = group_route_unavailable()
    assert "ValueError: Invalid version: 'unknown'" in why, why
    assert "\n" not in why


def test_pipeline_offload_routes_modules_and_skips_others(group):
    pipe = Pipe()
    x = torch.randn(1, 4, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = pipe.transformer(x)
    results = ddo.enable_pipeline_offload(pipe, environ=CPU, running_on_wsl=False)
    try:
        assert set(results) == {"text_encoder", "transformer", "vae"}
        assert results["transformer"].route == "dynamic_offload"
        assert results["text_encoder"].route == "diffusers_group_offload"
        assert results["vae"].route == "diffusers_group_offload"
        assert [c[0] for c in group.calls] == [pipe.text_encoder, pipe.vae]
        with torch.no_grad():
            assert torch.equal(pipe.transformer(x), ref)
        # enable_offload on a pipeline is enable_pipeline_offload; a second call is refused.
        with pytest.raises(ddo.DdoError) as e:
            ddo.enable_offload(pipe, environ=CPU)
        assert "already" in str(e.value)
    finally:
        ddo.close_pipeline_offload(pipe)
    again = ddo.enable_offload(pipe, environ=CPU)
    assert set(again) == {"text_encoder", "transformer", "vae"}
    ddo.close_pipeline_offload(pipe)


def test_pipeline_start_unloaded(group):
    """start_unloaded: each ddo session is unloaded right after its setup (a small card holds one
    component's weights at a time); with staged=False a forward refuses until reload(), then is
    bit-identical."""
    pipe = Pipe()
    x = torch.randn(1, 4, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = pipe.transformer(x)
    results = ddo.enable_pipeline_offload(pipe, environ=CPU, running_on_wsl=False,
                                          start_unloaded=True, resident_module_patterns="auto",
                                          staged=False)
    try:
        r = results["transformer"]
        assert r.route == "dynamic_offload"
        assert r.metrics_snapshot().get("device_weights_bytes") == 0
        with pytest.raises(ddo.DdoError) as e, torch.no_grad():
            pipe.transformer(x)
        assert "reload" in str(e.value)
        r.reload()
        with torch.no_grad():
            assert torch.equal(pipe.transformer(x), ref)
        assert r.metrics_snapshot().get("device_weights_bytes") > 0
    finally:
        ddo.close_pipeline_offload(pipe)


def test_pipeline_bad_input_leaves_it_as_it_was(group):
    pipe = Pipe()
    before = {n: [p.data_ptr() for p in m.parameters()] for n, m in
              (("transformer", pipe.transformer), ("text_encoder", pipe.text_encoder))}
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_pipeline_offload(pipe, environ=CPU,
                                    component_policies={"transfomer": {"route": "none"}})
    assert "transfomer" in str(e.value) and "transformer" in str(e.value)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_pipeline_offload(pipe, environ=CPU, components=["transformer", "unet"])
    assert "unet" in str(e.value)
    with pytest.raises(ddo.DdoError):
        ddo.enable_pipeline_offload(pipe, environ=CPU, routes={"vae": "sideways"})
    # A failure after some components were set up: those are closed again.
    with pytest.raises(ddo.DdoError):
        ddo.enable_pipeline_offload(pipe, environ=CPU, routes={"vae": "group"},
                                    component_policies={"vae": {"offload_type": "x"}})

    class Boom(RecordingGroupOffload):
        def __call__(self, module, **kw):
            if module is pipe.vae:
                raise RuntimeError("group offload failed")
            super().__call__(module, **kw)

    boom = Boom()
    ddo.routing._import_apply_group_offloading = lambda: boom
    with pytest.raises(RuntimeError):  # vae is the last component: the others were set up
        ddo.enable_pipeline_offload(pipe, environ=CPU,
                                    routes={"text_encoder": "none"})
    assert getattr(pipe.vae, "_ddo_offload", None) is None
    for n, m in (("transformer", pipe.transformer), ("text_encoder", pipe.text_encoder)):
        assert getattr(m, "_ddo_offload", None) is None
        assert [p.data_ptr() for p in m.parameters()] == before[n]
    assert getattr(pipe, "_ddo_pipeline_offload", None) is None


def test_none_route_unload_reload_and_metrics(group, tmp_path):
    m = models.FluxLike(seed=7)
    r = ddo.enable_offload(m, component="transformer", route="none", environ=CPU)
    assert r.route == "none"
    r.unload()
    r.reload()
    with r.cleanup_on_error():
        pass
    with pytest.raises(KeyError):
        with r.cleanup_on_error():
            raise KeyError("boom")
    rep = r.metrics_snapshot()
    assert rep.as_dict()["route"] == "none"
    t = ddo.MetricsTracker(tmp_path / "m.jsonl")
    t.record_ddo_metrics(rep, component="transformer")
    assert t.records()[0]["route"] == "none"
    with r.profile_run():
        pass
    r.close()
    with pytest.raises(ddo.DdoError):
        r.unload()


def test_metrics_tracker_records_dynamic_reports(tmp_path):
    m = models.FluxLike(seed=8)
    r = ddo.enable_offload(m, component="transformer", environ=CPU)
    with torch.no_grad():
        r.module(torch.randn(1, 4, 64).to(torch.bfloat16))
    rep = r.metrics_snapshot(collect_completed=True)
    t = ddo.MetricsTracker(tmp_path / "metrics.jsonl")
    t.record_ddo_metrics(rep, component="transformer")
    t.record_ddo_metrics(rep, component="text_encoder")
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["schema_version"] == rep.as_dict()["schema_version"]
    assert [x.get("component") for x in t.records()] == ["transformer", "text_encoder"]
    r.close()
    with pytest.raises(TypeError):
        t.record_ddo_metrics({"a": 1})


def test_config_from_no_flags_keeps_the_preset_route(group):
    # build_config_from_args(parse([])) sets nothing: "Omission preserves the existing
    # route-specific staging default", so the VAE routes as without a config.
    import argparse
    p = argparse.ArgumentParser()
    ddo.add_dynamic_offload_arguments(p)
    conf = ddo.build_config_from_args(p.parse_args([]))
    vae = nn.Sequential(nn.Linear(64, 64)).to(torch.bfloat16)
    r = ddo.enable_offload(vae, component="vae", config=conf, environ=CPU, running_on_wsl=False)
    assert r.route == "diffusers_group_offload" and group.calls[-1][1]["use_stream"] is False
    r.close()
    # preset= is not overridden by an empty flags config.
    m = models.FluxLike(seed=9)
    r = ddo.enable_offload(m, "low_ram_safe", component="transformer", config=conf,
                           environ=CPU, running_on_wsl=False)
    assert r.settings.effective_preset == "low_ram_safe"
    assert float(r._cfg.get("resident_module_budget_gb")) == 3.0
    assert r._cfg.get("pin_cpu_memory") == "false"
    r.close()
    # --ddo-preset low_ram_safe keeps low_ram_safe's values wherever the config is used.
    conf = ddo.build_config_from_args(p.parse_args(["--ddo-preset", "low_ram_safe",
                                                    "--ddo-pin-cpu-workers", "3"]))
    r = ddo.enable_offload(m, component="transformer", config=conf, environ=CPU,
                           running_on_wsl=False)
    assert r.settings.effective_preset == "low_ram_safe"
    assert float(r._cfg.get("resident_module_budget_gb")) == 3.0
    assert r._cfg.get("pin_cpu_memory") == "false" and r._cfg.get("pin_cpu_workers") == "3"
    r.close()
    # The preset a flag selects keeps its own VAE route (low_ram_safe: leaf, no stream); a
    # flag that sets a value is an explicit config and bypasses it (the VAE rule).
    conf = ddo.build_config_from_args(p.parse_args(["--ddo-preset", "low_ram_safe"]))
    r = ddo.enable_offload(vae, component="vae", config=conf, environ=CPU, running_on_wsl=False)
    assert r.route == "diffusers_group_offload" and group.calls[-1][1]["use_stream"] is False
    assert r.settings.effective_preset == "low_ram_safe"
    r.close()
    conf = ddo.build_config_from_args(p.parse_args(["--ddo-preset", "low_ram_safe",
                                                    "--ddo-verbose"]))
    r = ddo.enable_offload(vae, component="vae", config=conf, environ=CPU, running_on_wsl=False)
    assert r.route == "dynamic_offload"
    r.close()


def test_enable_offload_on_a_pipeline_forwards_route_refuses_component_arguments(group):
    pipe = Pipe()
    results = ddo.enable_offload(pipe, route="none", environ=CPU)
    assert {k: v.route for k, v in results.items()} == {
        "text_encoder": "none", "transformer": "none", "vae": "none"}
    ddo.close_pipeline_offload(pipe)
    for kw in ({"component": "transformer"}, {"group_offload": True},
               {"dynamic_offload": False}, {"offload_type": "block_level"},
               {"use_stream": False}, {"record_stream": True},
               {"group_low_cpu_mem_usage": False}, {"num_blocks_per_group": 2},
               {"quantized_backend": True}):
        with pytest.raises(TypeError) as e:
            ddo.enable_offload(pipe, environ=CPU, **kw)
        msg = str(e.value)
        assert list(kw)[0] in msg and "component_policies" in msg and "\n" not in msg
        assert getattr(pipe, "_ddo_pipeline_offload", None) is None
        assert all(getattr(m, "_ddo_offload", None) is None
                   for m in (pipe.text_encoder, pipe.transformer, pipe.vae))


def test_apply_hook_false_leaves_the_module_untouched(group):
    # The routing rule: without apply_hook no hook, the module untouched,
    # should_move_to_execution_device True.
    m = models.FluxLike(seed=10)
    ptrs = [p.data_ptr() for p in m.parameters()]
    for fn in (lambda: ddo.enable_offload(m, component="transformer", environ=CPU,
                                          apply_hook=False),
               lambda: ddo.enable_dynamic_offload(m, environ=CPU, apply_hook=False)):
        r = fn()
        assert r.route == "dynamic_offload"
        assert r.hook is None and r.should_move_to_execution_device is True
        assert [p.data_ptr() for p in m.parameters()] == ptrs
        assert all(not x._forward_pre_hooks and not x._forward_hooks for x in m.modules())
        assert getattr(m, "_ddo_offload", None) is None
        r.close()
    r = ddo.enable_offload(m, component="transformer", environ=CPU)  # still free to manage
    assert r.hook is r and r.should_move_to_execution_device is False
    r.close()
    with pytest.raises(ValueError):  # a calibration needs the session that measures it
        ddo.enable_offload(m, component="transformer", environ=CPU, apply_hook=False,
                           profile_name="w", build_profile=True)


def test_enable_dynamic_offload_is_the_dynamic_route(group, tmp_path, monkeypatch):
    # ddo.enable_dynamic_offload goes through the route machinery (route dynamic_offload,
    # no component route selection): settings=, profiles and the compatible API's result
    # fields (the routing rule).
    monkeypatch.setenv("DDO_PROFILE_DIR", str(tmp_path))
    m = models.FluxLike(seed=11)
    s = ddo.DynamicOffloadSettings.from_env(CPU, default_preset="diffusers_offload_compat")
    r = ddo.enable_dynamic_offload(m, settings=s)  # that preset routes transformers to group
    assert isinstance(r, ddo.OffloadResult) and r.route == "dynamic_offload"
    assert r.settings.effective_preset == "diffusers_offload_compat"
    assert r.hook is r and r.should_move_to_execution_device is False
    assert r.event_payload["route"] == "dynamic_offload"
    r.close()
    r = ddo.enable_dynamic_offload(m, environ=CPU, profile_name="w", build_profile=True)
    assert r._profile is not None and r._profile.calibrating
    with r.profile_run():
        with torch.no_grad():
            r.module(torch.randn(1, 4, 64).to(torch.bfloat16))
    assert r._profile.saved_path is not None
    r.close()
    assert len(group.calls) == 0


def test_quantized_backend_in_the_event_payload(group):
    # The SDNQ detection is in the payload.
    q = models.FluxLike(seed=12)
    q.sdnq_dequantizer = object()
    r = ddo.enable_offload(q, component="transformer", environ=CPU, running_on_wsl=False)
    assert r.route == "diffusers_group_offload"
    assert r.event_payload["quantized_backend"]["sdnq_status"] == "detected_forward_preserved"
    r.close()
    r = ddo.enable_offload(q, component="transformer", route="dynamic", environ=CPU)
    assert r.event_payload["quantized_backend"]["sdnq_module_count"] == 1
    r.close()
    m = models.FluxLike(seed=13)
    r = ddo.enable_offload(m, component="transformer", environ=CPU)
    assert "quantized_backend" not in r.event_payload
    r.close()


def test_second_pipeline_offload_after_every_result_closed(group):
    pipe = Pipe()
    results = ddo.enable_pipeline_offload(pipe, environ=CPU, running_on_wsl=False)
    for r in results.values():
        r.close()
    again = ddo.enable_pipeline_offload(pipe, environ=CPU, running_on_wsl=False)
    try:
        assert set(again) == {"text_encoder", "transformer", "vae"}
        again["vae"].close()
        with pytest.raises(ddo.DdoError) as e:
            ddo.enable_pipeline_offload(pipe, environ=CPU)
        msg = str(e.value)
        assert "ddo.close_pipeline_offload" in msg
        assert "still open: text_encoder, transformer)" in msg  # only the open ones named
    finally:
        ddo.close_pipeline_offload(pipe)


def test_upstream_event_and_low_cpu_mem_usage_parameters(group):
    # enable_offload's record_event / dynamic_event_name / group_event_name and
    # low_cpu_mem_usage (the group route's default).
    events = []

    def rec(name, seconds, **meta):
        events.append((name, meta))
        assert seconds >= 0

    m = models.FluxLike(seed=14)
    r = ddo.enable_offload(m, component="transformer", environ=CPU, record_event=rec)
    assert events[-1][0] == "setup_transformer_dynamic_offload"
    assert events[-1][1]["route"] == "dynamic_offload"
    r.close()
    r = ddo.enable_offload(m, component="text_encoder", environ=CPU, record_event=rec,
                           group_event_name="te_group", low_cpu_mem_usage=False)
    assert events[-1] == ("te_group", r.event_payload)
    assert group.calls[-1][1]["low_cpu_mem_usage"] is False  # nothing else sets it
    r.close()
    env = dict(CPU, DDO_TEXT_ENCODER_OFFLOAD_LOW_CPU_MEM_USAGE="1")  # the environment wins
    r = ddo.enable_offload(m, component="text_encoder", environ=env, low_cpu_mem_usage=False)
    assert group.calls[-1][1]["low_cpu_mem_usage"] is True
    r.close()
    r = ddo.enable_offload(m, component="vae", route="none", environ=CPU, record_event=rec)
    assert events[-1] == ("move_vae_to_execution_device",
                          {"route": "none", "execution_device": "cpu"})
    r.close()
    r = ddo.enable_dynamic_offload(m, environ=CPU, record_event=rec)
    assert events[-1][0] == "setup_dynamic_offload"
    r.close()
    pipe = Pipe()
    events.clear()
    ddo.enable_pipeline_offload(pipe, environ=CPU, record_event=rec, running_on_wsl=False)
    assert [e[0] for e in events] == ["setup_text_encoder_group_offload",
                                      "setup_transformer_dynamic_offload",
                                      "setup_vae_group_offload"]
    ddo.close_pipeline_offload(pipe)


def test_one_settings_object_through_a_pipeline(group):
    # Upstream test 13: a pipeline reuses the settings it was given (identity), and non-module
    # components are dropped (group: Diffusers' route is available).
    from torch import nn

    class Pipe:
        pass

    p = Pipe()
    p.text_encoder, p.transformer, p.scheduler = nn.Linear(4, 4), nn.Linear(4, 4), object()
    p.components = {"text_encoder": p.text_encoder, "transformer": p.transformer,
                    "scheduler": p.scheduler}
    s = ddo.DynamicOffloadSettings.from_env({}, default_preset="auto", execution_device="cpu")
    rs = ddo.enable_pipeline_offload(p, settings=s, apply_hook=False)
    assert set(rs) == {"text_encoder", "transformer"}
    assert rs["text_encoder"].route == "diffusers_group_offload"
    assert rs["transformer"].route == "dynamic_offload"
    assert all(r.settings is s for r in rs.values())
    r = ddo.enable_offload(p.transformer, settings=s, apply_hook=False, pin_cpu_workers=2)
    assert r.settings is not s and r.settings.config.pin_cpu_workers == 2  # a change: a copy
