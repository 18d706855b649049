"""One host path: the binding plans through the library's host layer (ddo_setup_*) as the tool
does. The same module planned through the tool (`ddo plan --json` on a checkpoint written here)
and through Python (enable_offload on the same tensors), for the same inputs, gives the same
plan: the same units, the same resident set, the same predicted step. Without figures given,
the binding's plan has the host layer's measured bus and compute (a cost model on the cpu
device), and weight_codec="auto" decides from it."""

import json
import os
import pathlib
import subprocess

import pytest
import torch

import ddo
import models
from conftest import ddo_tool
from test_pipeline_loading import write_safetensors

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIB = float(1 << 30)


def tool():
    return ddo_tool() or str(ROOT / "build" / "ddo")


def tool_plan(ck, opts, inputs):
    """`ddo plan --json` on ck for the configuration opts and the figures of inputs."""
    cmd = [tool(), "plan", str(ck), "--json"]
    for k, v in opts.items():
        cmd += ["--ddo-" + k.replace("_", "-"), str(v)]
    cmd += ["--device-memory-gb", repr(inputs["device_total_bytes"] / GIB),
            "--bandwidth-gbps", repr(inputs["bus_bytes_per_s"] / 1e9),
            "--tflops", repr(inputs["flops_per_s"] / 1e12)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDO_")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def resident_units(plan):
    return [u["name"] for u in plan["units"] if u["resident"]]


@pytest.mark.parametrize("backend", ["linear", "vmm"])
@pytest.mark.parametrize("fraction", [0.5, 0.75])
def test_tool_and_python_plan_the_same(tmp_path, backend, fraction):
    m = models.FluxLike(dim=512, double=4, single=8, seed=11)
    ck = tmp_path / "model.safetensors"
    write_safetensors(ck, dict(m.named_parameters()))  # the tensors ddo manages
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    opts = dict(execution_device="cpu", backend=backend, device_budget_gb=total * fraction / GIB)
    r = ddo.enable_offload(m, **opts)
    try:
        py = r.plan
    finally:
        r.close()
    inputs = py["inputs"]
    # The host layer's figures reached the binding's plan: a cost model on the cpu device.
    assert inputs["bus_bytes_per_s"] > 0 and inputs["flops_per_s"] > 0
    assert py["budgets"]["predicted_step_s"] > 0
    cli = tool_plan(ck, opts, inputs)
    assert cli["inputs"]["device_total_bytes"] == inputs["device_total_bytes"]
    assert [u["name"] for u in cli["units"]] == [u["name"] for u in py["units"]]
    assert resident_units(cli) == resident_units(py)
    assert resident_units(py) and len(resident_units(py)) < len(py["units"])
    assert cli["budgets"]["predicted_step_s"] == pytest.approx(py["budgets"]["predicted_step_s"],
                                                               rel=1e-9)
    for k in ("resident_set_rule", "route"):
        assert cli["planner_decisions"].get(k) == py["planner_decisions"].get(k), k
    dw_py, dw_cli = py["budgets"]["device_weights"], cli["budgets"]["device_weights"]
    for k in ("peak", "limit", "slot_count", "slot_bytes", "resident"):
        assert dw_cli.get(k) == dw_py.get(k), k


def test_weight_codec_auto_decides_from_the_cost_model():
    """On the cpu device, decoding costs host time: auto stays none unless coding pays."""
    m = models.FluxLike(dim=512, double=4, single=8, seed=12)
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    r = ddo.enable_offload(m, execution_device="cpu", weight_codec="auto",
                           device_budget_gb=total * 0.5 / GIB)
    try:
        dec = r.plan["planner_decisions"]
        assert r.plan["budgets"]["predicted_step_s"] > 0
        assert dec["weight_codec"] == "none", dec
        assert dec.get("weight_codec_note"), dec
    finally:
        r.close()


def test_calibration_records_alike(tmp_path):
    """A calibration in Python and one through the tool (`ddo run`) of the same tensors land in
    the same profile (the same workload identity) with observations of the same form, both
    recorded by the host layer (ddo_setup_profile_record)."""
    m = models.FluxLike(dim=512, double=2, single=2, seed=13)
    ck = tmp_path / "model.safetensors"
    write_safetensors(ck, dict(m.named_parameters()))
    prof_dir = tmp_path / "profiles"
    opts = dict(execution_device="cpu", profile_name="alike", profile_dir=str(prof_dir))
    r = ddo.enable_offload(m, build_profile=True, **opts)
    try:
        x = torch.randn(1, 4, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        with r.profile_run(), torch.no_grad():
            r.module(x)
        saved = r._profile.saved_path
    finally:
        r.close()
    cmd = [tool(), "run", str(ck), "--steps", "1", "--ddo-execution-device", "cpu",
           "--ddo-profile-name", "alike", "--ddo-profile-dir", str(prof_dir),
           "--ddo-build-profile", "true"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDO_")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    prof = json.loads(open(saved).read())
    obs = prof["observations"]
    assert len(obs) == 2, obs  # one profile: both hosts named the same workload
    py, cli = obs
    assert py["measurement"] == cli["measurement"] == "driver_free_sampled_plus_session_weights"
    shared = set(cli) - {"unit_compute_s", "decode_bytes_per_s"}
    assert shared <= set(py), (sorted(py), sorted(cli))
    assert py["unit_compute_s"] and all(v > 0 for v in py["unit_compute_s"].values())
    rec = prof["recommendation"]
    assert rec["profile_resident_module_budget_gb"] >= 0
