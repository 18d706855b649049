"""bench/lowram.py --tiny on the cpu device for both its models, Wan 2.1 14B and Qwen-Image (the
page cache kept: other tests run alongside):
every case runs in its own process under the scaled host limit and emulated card, its peak RSS
within the limit, bit-identical to the resident reference; the raw case reads from the
checkpoint, the sidecar cases read fewer bytes from the coded sidecar instead."""

import json
import os

import pytest

from conftest import ROOT, load_bench


def ddo_tool():
    for p in (os.environ.get("DDO_BIN"),
              os.path.join(os.path.dirname(os.environ.get("DDO_LIBRARY", "")), "ddo"),
              str(ROOT / "build" / "ddo")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


@pytest.mark.skipif(ddo_tool() is None, reason="needs the ddo tool (DDO_BIN or the build's)")
@pytest.mark.parametrize("model,layout", [("wan", "wan2.1-t2v-14b"), ("qwen", "qwen-image")])
def test_tiny_run(tmp_path, model, layout):
    bench = load_bench("lowram")
    assert bench.main(["--tiny", "--keep-cache", "--ddo", ddo_tool(), "--dir", str(tmp_path),
                       "--out", str(tmp_path / "out"), "--model", model]) == 0
    r = json.loads((tmp_path / "out" / "lowram.json").read_text())
    assert r["model"] == model and r["layout"] == layout
    assert r["reference_checksum"] and r["direct_read_bytes_per_s"] > 0
    for name, c in r["cases"].items():
        assert c["rc"] == 0 and c["bit_identical"], (name, c)
        assert c["rss_ok"] and c["peak_rss_bytes"] <= r["host_limit_gib"] * 2**30, (name, c)
    raw, side = r["cases"]["raw"], r["cases"]["sidecar"]
    assert raw["file_fed_bytes_per_step"] > 0 and raw["weight_codec"] == "none"
    assert side["weight_codec"] == "ddoc1" and side["file_fed_bytes_per_step"] == 0
    assert 0 < side["sidecar_fed_bytes_per_step"] < raw["file_fed_bytes_per_step"]
    assert r["sidecar_over_raw_file_bytes"] < 1.0


def test_make_room(tmp_path):
    """Only when the disk lacks the room: the other models' checkpoints this bench wrote in --dir
    (and unfinished ones) are removed, nothing else."""
    bench = load_bench("lowram")
    names = ["wan-1.safetensors", "qwen-1.safetensors.part", "mine.safetensors", "notes.txt"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    args = type("A", (), {"dir": str(tmp_path)})()
    path = str(tmp_path / "qwen-1.safetensors")
    d = bench.make_room(args, path, 1)
    assert d["removed"] == [] and d["need_bytes"] == 1 and d["free_bytes"] > 1
    assert sorted(os.listdir(tmp_path)) == sorted(names)
    d = bench.make_room(args, path, 1 << 62)
    assert d["removed"] == ["qwen-1.safetensors.part", "wan-1.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["mine.safetensors", "notes.txt"]
    assert d["free_bytes_after"] >= d["free_bytes"]
