"""What the binding tells people (ddo._talk): sizes in adaptive units, the setup progress bar,
the Perfetto trace, show_profile / verbose, the warnings (cpu fallback, nothing streamed) and
argument types checked at the door."""

import json
import sys
import warnings

import pytest
import torch
from torch import nn

import ddo
from ddo import _talk
import models
from conftest import ZERO_RESIDENT


def test_sizes_in_adaptive_units():
    assert _talk.size(0) == "0 B"
    assert _talk.size(512) == "512 B"
    assert _talk.size(98816) == "96.50 KiB"
    assert _talk.size(6556928) == "6.25 MiB"
    assert _talk.size(3 * 2**30 // 2) == "1.50 GiB"
    for n in (1, 1000, 5000, 2**20 + 7, 2**30 - 1):
        assert not _talk.size(n).startswith("0.00")


class RecordingBar:
    """A tqdm-compatible class (the subset ddo uses): records what it was told."""
    made = []

    def __init__(self, total=0, desc="", unit="B", unit_scale=True, leave=True):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        RecordingBar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


def test_progress_bar_per_setup_phase():
    RecordingBar.made = []
    m = models.FluxLike(dim=128, seed=1)
    with ddo.enable_offload(m, progress=RecordingBar, **ZERO_RESIDENT):
        pass
    phases = [b.desc for b in RecordingBar.made]
    assert "ddo model: allocate" in phases and "ddo model: resident" in phases
    for b in RecordingBar.made:
        assert b.closed and 0 < b.n <= b.total  # each phase reported and was closed


def test_progress_stderr_bar_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm fails
    m = models.FluxLike(dim=128, seed=1)
    with ddo.enable_offload(m, progress=True, **ZERO_RESIDENT):
        pass
    err = capsys.readouterr().err
    assert "ddo model: allocate [" in err and "100%" in err and "0.00 GiB" not in err


def test_progress_off_by_default_without_a_terminal_and_with_false(capsys):
    m = models.FluxLike(dim=128, seed=1)
    assert not sys.stderr.isatty()
    with ddo.enable_offload(m, **ZERO_RESIDENT):
        pass
    with ddo.enable_offload(m, progress=False, **ZERO_RESIDENT):
        pass
    assert "allocate" not in capsys.readouterr().err


def test_trace_file_is_the_cli_format(tmp_path):
    path = tmp_path / "t.json"
    m = models.FluxLike(dim=128, seed=1)
    x = torch.randn(1, 4, 128).to(torch.bfloat16)
    with ddo.enable_offload(m, trace=str(path), **ZERO_RESIDENT) as r, torch.no_grad():
        m(x)
        names = set(r._unit_names)
    d = json.loads(path.read_text())
    ev = d["traceEvents"]
    assert d["displayTimeUnit"] == "ms"
    tracks = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert {"host: acquire (wait)", "session: copy engine (uploads)"} <= tracks
    spans = [e for e in ev if e["ph"] == "X"]
    # every unit acquired; the modules outside the blocks, one unit (""), once per module
    assert {e["name"] for e in spans if e["cat"] == "acquire"} == names
    assert sum(e["cat"] == "compute" for e in spans) >= 1
    assert any(e["cat"] == "upload" and e["tid"] == _talk.TID_COPY for e in spans)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)


def test_pipeline_trace_one_process_per_component(tmp_path, without_diffusers):
    from test_pipeline_staged import StandInPipeline
    path = tmp_path / "p.json"
    pipe = StandInPipeline()
    with ddo.pipeline_offload(pipe, trace=path, **ZERO_RESIDENT):
        pipe(seed=1)
    ev = json.loads(path.read_text())["traceEvents"]
    names = [e["args"]["name"] for e in ev if e.get("name") == "process_name"]
    assert names == ["text_encoder", "transformer", "vae"]


def test_trace_path_checked_before_setup(tmp_path):
    with pytest.raises(ValueError, match="cannot write"):
        ddo.enable_offload(nn.Linear(4, 4), trace=str(tmp_path / "no" / "t.json"),
                           execution_device="cpu")


def test_show_profile_prints_at_close_and_verbose_the_plan(capsys):
    m = models.FluxLike(dim=128, seed=1)
    r = ddo.enable_offload(m, verbose=True, **ZERO_RESIDENT)
    err = capsys.readouterr().err
    assert "ddo: model: route" in err and "streamed" in err and "0.00 GiB" not in err
    r.close()
    assert "ddo-profile" not in capsys.readouterr().err  # show_profile resolves false
    with ddo.enable_offload(m, show_profile=True, **ZERO_RESIDENT):
        pass
    err = capsys.readouterr().err
    assert err.startswith("[model]\n") and "ddo-profile" in err


def test_format_profile_for_people():
    m = models.FluxLike(dim=128, seed=1)
    with ddo.enable_offload(m, **ZERO_RESIDENT) as r:
        rep = r.metrics_snapshot()
        short, full = rep.format_profile(), rep.format_profile(verbose=True)
    for text in (short, full):
        assert not any(w.endswith("=") for w in text.split())  # no empty keys
        assert max(len(x) for x in text.splitlines()) <= 200
    assert "planner decisions (format_profile(verbose=True)" in short
    assert "auto_budget_policy=" in full and "auto_budget_policy=" not in short
    assert max(len(x) for x in full.splitlines() if "=" in x and "decisions" in x) <= 100


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: no fallback")
def test_default_device_falls_back_to_cpu_with_a_warning():
    m = models.FluxLike(dim=128, seed=1)
    kw = {k: v for k, v in ZERO_RESIDENT.items() if k != "execution_device"}
    with pytest.warns(UserWarning, match="using the cpu device") as w:
        ddo.enable_offload(m, **kw).close()
    assert w[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ddo.enable_offload(m, **ZERO_RESIDENT).close()  # explicit cpu: silent


def test_no_unit_found_warns():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    with pytest.warns(UserWarning, match="no unit to stream"):
        ddo.enable_offload(m, execution_device="cpu", small_tensor_threshold_bytes=2**20).close()
    with warnings.catch_warnings():  # everything resident because the caller said so: silent
        warnings.simplefilter("error")
        ddo.enable_offload(m, execution_device="cpu", always_resident_modules_pattern="^").close()


def test_nothing_streamed_over_budget_is_not_silent():
    """Tensors under the small-tensor threshold count against the device budget: a model of
    them over the budget is refused by the planner (never placed silently past it)."""
    m = nn.Sequential(*(nn.Linear(256, 256) for _ in range(4)))  # 4 x 257 KiB
    with pytest.raises(ddo.DdoError, match="DDO_E_BUDGET"):
        ddo.enable_offload(m, execution_device="cpu", small_tensor_threshold_bytes=2**20,
                           vmm_resident_weight_budget_gb=0.0005)
    assert getattr(m, "_ddo_offload", None) is None


def test_argument_types_checked_at_the_door():
    m = nn.Linear(4, 4)
    with pytest.raises(TypeError) as e:
        ddo.enable_offload(m, 4)
    assert "preset" in str(e.value) and "vmm_resident_weight_budget_gb=4" in str(e.value)
    with pytest.raises(TypeError, match="progress"):
        ddo.enable_offload(m, progress="yes")
    with pytest.raises(TypeError, match="trace"):
        ddo.enable_offload(m, trace=5)
    with pytest.raises(TypeError, match="config"):
        ddo.enable_offload(m, config={"backend": "vmm"})
    with pytest.raises(TypeError, match="preset"):
        ddo.enable_pipeline_offload(object(), 4)
    with pytest.raises(TypeError, match="preset"):
        ddo.enable_dynamic_offload(m, 4.0)
    assert getattr(m, "_ddo_offload", None) is None
