"""bench/copy_queue_probe.py: without a CUDA device it measures nothing and says so (exit 77,
the suite's skip code); with one it reports the small copy's latency alone and beside uploads,
and the uploads' rate."""

import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "..", "..", "bench", "copy_queue_probe.py")


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
