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
PROBE = os.path.join(BENCH, "copy_queue_probe.py")


def test_probe(tmp_path):
    out = tmp_path / "probe.json"
    cmd = [sys.executable, PROBE, "--samples", "30", "--total-gib", "0.25", "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not torch.cuda.is_available():
        assert r.returncode == 77 and "no CUDA device" in r.stderr
        assert not out.exists()
        return
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["alone_median_s"] > 0 and res["beside_median_s"] > 0
    assert res["upload_gbps"] > 0 and res["beside_over_alone"] > 0


def test_rate_probe(tmp_path):
    out = tmp_path / "rates.json"
    cmd = [sys.executable, os.path.join(BENCH, "copy_rate_probe.py"), "--total-gib", "0.125",
           "--repeats", "2", "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not torch.cuda.is_available():
        assert r.returncode == 77 and "no CUDA device" in r.stderr
        assert not out.exists()
        return
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert len(res["rates_gbps"]) == 18 and min(res["rates_gbps"].values()) > 0
    assert res["over_pinned_whole_idle"]["pinned/whole/idle"] == 1.0
