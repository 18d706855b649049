"""bench/cards.py --tiny on the cpu device: the zero-configuration call and the sweep run,
bit-identical to the resident run, within the emulated card; the small card streams, the large
one streams nothing; the zero-configuration case re-plans in its warm-up (the measurement
replaced: the cpu device has none) and records it; Diffusers' group offload is skipped with a
note on the cpu device; --torch-trace traces one more step of the zero-configuration case and
the plan's predicted step and slot count are recorded, and the steps back to back beside the
synchronized ones; the Qwen-Image layout (data/layouts/qwen-image.json) has its 20.4 B
parameters and the tiny Qwen-Image stand-in runs."""

import json
import math

from conftest import ROOT, load_bench


def test_qwen_image_layout():
    lay = json.loads((ROOT / "data" / "layouts" / "qwen-image.json").read_text())
    params = sum(math.prod(t["shape"]) for t in lay["tensors"])
    assert 20.3e9 < params < 20.5e9
    assert lay["total_bytes"] == 2 * params and lay["architecture"] == "qwen-image"
    assert {t["dtype"] for t in lay["tensors"]} == {"BF16"}
    assert len({t["name"] for t in lay["tensors"]}) == len(lay["tensors"])
    blocks = {t["name"].split(".")[1] for t in lay["tensors"]
              if t["name"].startswith("transformer_blocks.")}
    assert blocks == {str(i) for i in range(60)}
    cards = load_bench("cards")
    tiny = cards.load_layout("qwen-image", True)
    assert 0 < len(tiny) < len(lay["tensors"])


def test_tiny_run(tmp_path, monkeypatch):
    import ddo._result_replan as replan
    calls = []

    def measured(device, baseline, call):  # a need of 0 bytes: the margin, under the estimate
        calls.append(1)
        return call(), 0
    monkeypatch.setattr(replan, "measure_activation", measured)
    cards = load_bench("cards")
    out = tmp_path / "cards.json"
    assert cards.main(["--tiny", "--models", "flux", "--cards", "8,24", "--steps", "1",
                       "--torch-trace", "--trace-dir", str(tmp_path), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    m = r["models"]["flux"]
    assert m["resident_step_s"] > 0 and m["resident_chained_step_s"] > 0
    small, large = m["cards"]["8"], m["cards"]["24"]
    for gib, c in ((8, small), (24, large)):
        z = c["zero_config"]
        assert "error" not in z, z
        assert z["bits"]["identical"], z["bits"]
        assert z["within_card"] and z["plan_peak_bytes"] <= z["plan_limit_bytes"]
        assert z["plan_limit_bytes"] == int(gib / 512 * 2**30)  # the emulated card, whole
        assert c["ratio_zero_config_to_best"] > 0 and c["best_sweep"] in c["sweep"]
        # the plan's own figures beside the step, and one traced step (no kernels on the cpu)
        assert z["predicted_step_s"] is not None and z["slot_count"] is not None
        assert z["chained_step_s"] > 0  # the same steps back to back
        tr = z["torch_trace"]
        assert tr["step_s"] > 0 and (tmp_path / f"cards_flux1-dev_{gib}.json").is_file(), tr
        assert tr["idle_s"] == 0 and tr["kernels_matched"] == 0, tr  # no device kernels here
        assert tr["copy_tail_s"] is None, tr  # (nor copies: the tail needs both)
        rp = z["activation_replan"]
        assert z["warmup_steps"] == 3 and rp["replanned"], rp
        assert rp["reserve_bytes"] == replan.MARGIN and rp["plan_before"]["limit"] > 0
        for s in c["sweep"].values():
            assert "error" in s or s["bits"]["identical"]
    assert len(calls) == 2  # one per zero-config case: the sweep's budgets are never measured
    assert "needs a CUDA device" in small["group_offload"]["skipped"]
    assert "group_offload" not in large  # --group-cards: 8 only
    assert small["zero_config"]["resident_set_rule"].startswith("fill")
    assert small["zero_config"]["streamed_bytes_per_step"] > 0
    assert large["zero_config"]["resident_set_rule"] == "fill_all_fits"
    assert large["zero_config"]["streamed_bytes_per_step"] == 0
