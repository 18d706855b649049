"""Capacity profiles through the binding: profile_name / build_profile with
result.profile_run() over the C profile store (calibrate zero-resident, measure, save; the
next run applies the recommendation), on the cpu device."""

import json

import pytest
import torch

import ddo
import models

CPU = {"DDO_EXECUTION_DEVICE": "cpu"}


def run(r, n=2):
    with torch.no_grad():
        for _ in range(n):
            r.module(torch.randn(1, 4, 64).to(torch.bfloat16))


def test_calibrate_save_then_apply(tmp_path):
    m = models.FluxLike(seed=11)
    r = ddo.enable_offload(m, component="transformer", environ=CPU, profile_name="flux-like",
                           build_profile=True, profile_dir=str(tmp_path),
                           resident_module_patterns="auto", small_tensor_threshold_bytes=0)
    assert r._profile.status == "calibrating"
    assert r.budgets()["resident_bytes"] == 0  # calibration: zero resident
    with r.profile_run():
        run(r)
    saved = r._profile.saved_path
    r.close()
    assert saved and saved.startswith(str(tmp_path))
    prof = json.loads(open(saved).read())
    rec = prof["recommendation"]["profile_resident_module_budget_gb"]
    assert rec == r._profile.recommendation["profile_resident_module_budget_gb"]
    assert len(prof["observations"]) == 1
    assert prof["observations"][0]["status"] == "success"

    m2 = models.FluxLike(seed=11)
    r2 = ddo.enable_offload(m2, component="transformer", environ=CPU,
                            profile_name="flux-like", profile_dir=str(tmp_path),
                            resident_module_patterns="auto", small_tensor_threshold_bytes=0)
    try:
        assert r2._profile.status == "applied"
        assert r2.budgets()["resident_bytes"] > 0  # the recommendation made blocks resident
        assert r2._profile.budget_gb == pytest.approx(rec, abs=1e-4)
        src = r2._cfg.source("profile_resident_module_budget_gb") + \
            r2._cfg.source("resident_module_budget_gb")
        assert "profile:flux-like" in src
        with r2.profile_run():  # not calibrating: nothing saved
            run(r2, 1)
        assert r2._profile.saved_path is None
    finally:
        r2.close()
    # Another model under the same name is another workload: no recommendation.
    m3 = models.FluxLike(seed=11, double=1)
    r3 = ddo.enable_offload(m3, component="transformer", environ=CPU,
                            profile_name="flux-like", profile_dir=str(tmp_path))
    assert r3._profile.status == "missing"
    r3.close()


def test_profile_dir_from_userprofile_without_home(tmp_path, monkeypatch):
    """Windows sets USERPROFILE and seldom HOME: the binding's setup and profile_dir() both
    take it, as the tool does (tests/cli_profile.sh)."""
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("DDO_PROFILE_DIR", raising=False)
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "user"))
    want = str(tmp_path / "user" / ".ddo" / "profiles")
    assert ddo.profiles.profile_dir() == want
    r = ddo.enable_offload(models.FluxLike(seed=13), component="transformer", environ=CPU,
                           profile_name="up", build_profile=True)
    with r.profile_run():
        run(r, 1)
    assert r._profile.saved_path.startswith(want + "/")
    r.close()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ddo.profiles.profile_dir() == str(tmp_path / "home" / ".ddo" / "profiles")


def test_profile_dir_from_environment_and_manual_budget(tmp_path):
    env = dict(CPU, DDO_PROFILE_DIR=str(tmp_path / "env-dir"))
    m = models.FluxLike(seed=12)
    import os
    old = os.environ.get("DDO_PROFILE_DIR")
    os.environ["DDO_PROFILE_DIR"] = env["DDO_PROFILE_DIR"]
    try:
        r = ddo.enable_offload(m, component="transformer", environ=env, profile_name="w",
                               build_profile=True)
        with r.profile_run():
            run(r, 1)
        assert r._profile.saved_path.startswith(env["DDO_PROFILE_DIR"])
        r.close()
        r = ddo.enable_offload(m, component="transformer", environ=env, profile_name="w",
                               resident_module_budget_gb=0.001)
        assert r._profile.status == "manual"
        r.close()
    finally:
        if old is None:
            del os.environ["DDO_PROFILE_DIR"]
        else:
            os.environ["DDO_PROFILE_DIR"] = old


def test_profile_errors():
    m = models.FluxLike(seed=13)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, component="transformer", environ=CPU, build_profile=True)
    assert "profile_name" in str(e.value)
    with pytest.raises(ValueError) as e:
        ddo.enable_offload(m, component="vae", route="group", environ=CPU,
                           profile_name="w", build_profile=True)
    assert str(e.value) == "Profile calibration requires the dynamic_offload route."
    with pytest.raises(ddo.DdoError):
        ddo.enable_offload(m, component="transformer", environ=CPU, profile_name="w",
                           build_profile=True, profile_dir="/proc/ddo-not-writable")
    assert getattr(m, "_ddo_offload", None) is None


def test_calibration_measures_unit_compute_and_the_next_plan_uses_it(tmp_path):
    """profile_run() times every unit's forward; the next plan of the workload takes those
    figures as its per-unit compute (and the calibration's copy rate as its bus), so the
    simulated-step ("cost") selection has a cost model without a FLOP rate."""
    m = models.FluxLike(seed=13)
    r = ddo.enable_offload(m, component="transformer", environ=CPU, profile_name="timed",
                           build_profile=True, profile_dir=str(tmp_path),
                           resident_module_patterns="auto", small_tensor_threshold_bytes=0)
    names = list(r._unit_names)
    with r.profile_run():
        run(r, 3)
    saved = json.loads(open(r._profile.saved_path).read())
    r.close()
    uc = saved["recommendation"]["unit_compute_s"]
    assert sorted(uc) == sorted(names)
    assert all(v > 0 for v in uc.values())
    assert saved["recommendation"]["bus_bytes_per_s"] > 0
    assert saved["observations"][-1]["unit_compute_s"] == uc

    m2 = models.FluxLike(seed=13)
    r2 = ddo.enable_offload(m2, component="transformer", environ=CPU, profile_name="timed",
                            profile_dir=str(tmp_path), resident_module_patterns="auto",
                            small_tensor_threshold_bytes=0, resident_module_selection="cost")
    try:
        d = r2.plan["planner_decisions"]
        assert d["unit_compute_source"] == "measured"
        assert d["resident_module_selection"] == "cost"
        assert r2.plan["cost_model"]["enabled"] is True
        # Every unit of this plan was a unit of the calibration (which also streamed the
        # always-resident leaves), and its compute is the measured one.
        got = {u["name"]: u["compute_s"] for u in r2.plan["units"]}
        assert got and set(got) <= set(uc)
        assert got == pytest.approx({k: uc[k] for k in got})
        ref = models.FluxLike(seed=13)
        x = torch.randn(1, 4, 64).to(torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(r2.module(x), ref(x))
    finally:
        r2.close()
