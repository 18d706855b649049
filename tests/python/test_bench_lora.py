"""bench/lora.py --toy on the cpu device with the tests' stand-in of PEFT's LoRA layer (no PEFT
in CI): every phase of the sequence bit-identical to the resident copy, and no LoRA call moves a
weight byte."""

import json

from conftest import load_bench


def test_toy_run(tmp_path):
    bench = load_bench("lora")
    out = tmp_path / "lora.json"
    assert bench.main(["--toy", "--device", "cpu", "--lora", "standin", "--rank", "8",
                       "--steps", "2", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["identical"] and r["no_read_during_calls"]
    assert [ph["call"] for ph in r["phases"]][:3] == ["switch to b x0.8", "fuse b", "unfuse"]
    assert all(ph["identical"] and not ph["moved_by_call"] for ph in r["phases"])
    assert r["plain_step_s"] > 0 and r["max_switch_cost_s"] > 0
