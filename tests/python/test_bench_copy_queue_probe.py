"""bench/copy_queue_probe.py and bench/copy_rate_probe.py: without a CUDA device they measure
nothing and say so (exit 77, the suite's skip code); with one the first reports the small copy's
latency alone and beside uploads, and the uploads' rate, the second the copy rate per source,
shape and load."""

import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")


def run_probe(script, args, out):
    """The probe's JSON result, or None where it rightly measured nothing (no CUDA: exit 77,
    said on stderr, no file written)."""
    cmd = [sys.executable, os.path.join(BENCH, script)] + args + ["--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not torch.cuda.is_available():
        assert r.returncode == 77 and "no CUDA device" in r.stderr
        assert not out.exists()
        return None
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_probe(tmp_path):
    res = run_probe("copy_queue_probe.py", ["--samples", "30", "--total-gib", "0.25"],
                    tmp_path / "probe.json")
    if res is None:
        return
    assert res["alone_median_s"] > 0 and res["beside_median_s"] > 0
    assert res["upload_gbps"] > 0 and res["beside_over_alone"] > 0


def test_rate_probe(tmp_path):
    res = run_probe("copy_rate_probe.py", ["--total-gib", "0.125", "--repeats", "2"],
                    tmp_path / "rates.json")
    if res is None:
        return
    assert len(res["rates_gbps"]) == 18 and min(res["rates_gbps"].values()) > 0
    assert res["over_pinned_whole_idle"]["pinned/whole/idle"] == 1.0
