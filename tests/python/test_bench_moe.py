"""bench/moe.py --tiny on the cpu device (the script the H200 runs for issue 28's two experts,
on 6-block, 1/16-width stand-ins of the Wan layout): each expert's output bit-identical to its
resident run, the inactive expert holding no retained memory, the switch timed, every step
reading from the file what its expert does not retain, the staged process's peak RSS under the
limit."""

import json

import pytest

from conftest import ddo_tool, load_bench


@pytest.mark.skipif(ddo_tool() is None, reason="needs the ddo tool (DDO_BIN or the build's)")
def test_tiny_two_experts(tmp_path):
    moe = load_bench("moe")
    out = tmp_path / "moe.json"
    assert moe.main(["--tiny", "--ddo", ddo_tool(), "--dir", str(tmp_path / "d"),
                     "--out", str(out), "--steps", "1"]) == 0
    res = json.loads(out.read_text())
    assert res["within_limit_rss"] is True, res
    st = res["staged"]
    for name in ("transformer", "transformer_2"):
        e = st["experts"][name]
        assert e["bit_identical"] is True, e
        assert e["inactive_held_bytes"] == 0, e
        assert e["file_bytes_per_step"] > 0 and e["ratio"] > 0, e
    assert st["experts"]["transformer_2"]["switch_s"] > 0
    assert ["release_host", "transformer"] in st["events"], st["events"]
