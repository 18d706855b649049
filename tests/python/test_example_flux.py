"""examples/flux_pipeline.py with its stand-in pipeline (default options: the cpu device, no
Diffusers): one pipe(...) call, metrics reported and recorded, the output equals the same
pipeline run without ddo, and an error inside a component is the one the caller sees, with every
component closed."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import PYTHON_DIR, ROOT

EXAMPLE = ROOT / "examples" / "flux_pipeline.py"
ARGS = ["--stand-in", "--steps", "2", "--width", "64", "--height", "64"]


def load_example():
    spec = importlib.util.spec_from_file_location("flux_pipeline_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def unmanaged_output(ex, args):
    pipe = ex.StandInPipeline(args.seed)
    return ex.generate(pipe, args, torch.device("cpu"))


def test_runs_phases_and_records_metrics(tmp_path):
    out_file, metrics = tmp_path / "out.pt", tmp_path / "metrics.jsonl"
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    run = subprocess.run([sys.executable, str(EXAMPLE), *ARGS, "--show-profile",
                          "--show-metrics", "--metrics", str(metrics), "--output",
                          str(out_file)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "timings:" in run.stdout and "call" in run.stdout
    assert "_unpack_latents" not in EXAMPLE.read_text()  # no private Diffusers names
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["component"] for r in recs] == ["text_encoder", "transformer", "vae"]
    assert recs[1]["schema_version"] == 1
    ex = load_example()
    want = unmanaged_output(ex, ex.parse_args(ARGS))
    got = torch.load(out_file)["output"]
    assert torch.equal(got, want)


def test_phase_error_is_preserved_and_everything_closed(monkeypatch):
    ex = load_example()
    made = []
    orig = ex.StandInPipeline.__init__

    def init(self, seed=0):
        orig(self, seed)
        made.append(self)

    def boom(self, latents, context):
        raise RuntimeError("denoise failed")

    monkeypatch.setattr(ex.StandInPipeline, "__init__", init)
    monkeypatch.setattr(ex._Transformer, "forward", boom)
    with pytest.raises(RuntimeError, match="denoise failed"):
        ex.main(ARGS)
    pipe = made[0]
    for m in (pipe.text_encoder, pipe.transformer, pipe.vae):
        assert getattr(m, "_ddo_offload", None) is None
        assert all(p.device.type == "cpu" and p.numel() > 0 for p in m.parameters())


def test_bad_route_is_one_line(capsys):
    ex = load_example()
    assert ex.main(ARGS + ["--route", "vae=sideways"]) == 1
    err = capsys.readouterr().err
    assert "sideways" in err and err.count("\n") == 1


def test_host_show_profile_is_not_a_ddo_flag():
    # The example's own --show-profile and ddo's --ddo-show-profile have separate dests.
    ex = load_example()
    import ddo
    args = ex.parse_args(ARGS + ["--show-profile"])
    assert args.show_profile is True
    conf = ddo.build_config_from_args(args)
    assert "show_profile" not in conf.explicit()
    assert conf.explicit() == []
    args = ex.parse_args(ARGS + ["--ddo-show-profile"])
    assert args.show_profile is False
    assert ddo.build_config_from_args(args).show_profile is True


def test_small_budget_stages_the_components(tmp_path, monkeypatch, without_diffusers):
    """A budget that holds one component at a time: the example's one pipe(...) call still gives
    the unmanaged output (the components were unloaded and reloaded by ddo, not by the
    example)."""
    import ddo.routing
    ex = load_example()
    out_file = tmp_path / "out.pt"
    made, orig = [], ddo.routing.enable_pipeline_offload

    def spy(pipe, *a, **kw):
        made.append(orig(pipe, *a, **kw))
        return made[-1]

    monkeypatch.setattr(ddo.routing, "enable_pipeline_offload", spy)
    # The stand-in's components need about 97, 98 and 17 KiB on the device; 150 KiB holds one
    # of the two large ones at a time (the budget is filled now: 10 MiB would hold them all).
    assert ex.main(ARGS + ["--ddo-device-budget-gb", "0.00015", "--output",
                           str(out_file)]) == 0
    assert ("unload", "text_encoder") in made[0].stager.events
    want = unmanaged_output(ex, ex.parse_args(ARGS))
    assert torch.equal(torch.load(out_file)["output"], want)
