"""bench/multi_gpu.py on the cpu device (cpu:0, cpu:1 emulate the set; the toy model): the
script a multi-GPU call runs produces its figures, bit-identity and budgets included."""

import json

from conftest import load_bench


def test_smoke_on_cpu(tmp_path):
    mg = load_bench("multi_gpu")
    out = tmp_path / "multi_gpu.json"
    assert mg.main(["--toy", "--cpu", "--steps", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    d = res["donor"]
    assert d["bit_identical"] is True and d["within_budget"] is True
    assert d["store_device_peak_bytes"] == d["planned_store_bytes"] > 0
    assert d["streamed_bytes_per_step"] > 0 and d["bound_s"] > 0 and d["ratio"] > 0
    assert d["plan_device_set"]["devices"] == "cpu:0,cpu:1"
    s = res["split"]
    assert s["intake_bytes_per_s"] > 0 and s["one_link_bytes_per_s"] > 0
