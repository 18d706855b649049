"""bench/lease_overhead.py on the cpu device, a small Flux-shaped stand-in: every format and
route runs bit-identical to the unmanaged module (the bench exits otherwise) and reports the
binding's host time per unit lease; FP8 units carry more tensors than bf16 ones."""

import json

from conftest import load_bench


def test_small_run(tmp_path):
    bench = load_bench("lease_overhead")
    out = tmp_path / "lease.json"
    assert bench.main(["--double", "2", "--single", "2", "--reps", "1", "--cycles", "20",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["kind"], r["route"]) for r in rows} == {
        (k, rt) for k in ("bf16", "fp8", "fp8_wrapper") for rt in ("vmm", "linear")}
    per_unit = {(r["kind"], r["route"]): r["cycle_tensors"] for r in rows}
    assert per_unit[("fp8", "vmm")] > per_unit[("fp8_wrapper", "vmm")] > per_unit[("bf16", "vmm")]
    assert all(r["leases"] >= 4 and r["cycle_us"] > 0 and r["lease_us"] > 0 for r in rows)
