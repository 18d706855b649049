"""bench/multi_gpu.py on the cpu device (cpu:0, cpu:1 emulate the set; the toy model): the
script a multi-GPU call runs produces its figures, bit-identity and budgets included."""

import json

from conftest import load_bench


def test_smoke_on_cpu(tmp_path):
    mg = load_bench("multi_gpu")
    out = tmp_path / "multi_gpu.json"
    # (blocks of 0.4 MB: each rank's share of a unit is over share mode's 64 KiB minimum)
    assert mg.main(["--toy", "--toy-dim", "128", "--cpu", "--steps", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    d = res["donor"]
    assert d["bit_identical"] is True and d["within_budget"] is True
    assert d["store_device_peak_bytes"] == d["planned_store_bytes"] > 0
    assert d["streamed_bytes_per_step"] > 0 and d["bound_s"] > 0 and d["ratio"] > 0
    assert d["plan_device_set"]["devices"] == "cpu:0,cpu:1"
    s = res["split"]
    assert s["intake_bytes_per_s"] > 0 and s["one_link_bytes_per_s"] > 0
    # share mode: two processes (gloo), each its share and the all-gather; both bit-identical
    sh = res["share"]
    assert "error" not in sh, sh
    assert sh["bit_identical"] is True and sh["same_gathers"] is True
    assert len(sh["ranks"]) == 2
    for r in sh["ranks"]:
        assert r["route"] == "vmm_fast_runtime" and r["gathers"] > 0
        assert 0.4 < r["host_bytes_per_step"] / r["streamed_bytes_per_step"] < 0.6
        assert r["ratio"] > 0 and r["intake_ratio"] > 0
