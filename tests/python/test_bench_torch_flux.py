"""bench/torch_flux.py without a GPU or Diffusers: the case table and the bound arithmetic,
the codec case's raw bound included."""

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def tf():
    return load_bench("torch_flux")


def test_cases(tf):
    assert set(tf.ALL_CASES) <= set(tf.CASES) and set(tf.COMPILE_CASES) <= set(tf.CASES)
    for name, (backend, opts) in tf.DDO_CASE_OPTIONS.items():
        assert tf.CASES[name]["kind"] == "ddo" and backend in ("vmm", "linear")
        assert name in tf.DDO_CASE_BUDGET_GIB
    assert tf.DDO_CASE_OPTIONS["ddo_vmm0_codec"][1]["weight_codec"] == "ddoc1"


def test_raw_bound_of_a_coded_case(tf):
    before = {"codec": {"bytes_coded_uploaded": 100, "bytes_decoded": 150}}
    after = {"codec": {"bytes_coded_uploaded": 100 + 600, "bytes_decoded": 150 + 900}}
    # 700 bytes copied: 600 coded (900 decoded) and 100 raw -> 1000 raw bytes
    assert tf.raw_streamed_bytes(before, after, 700) == 1000
    assert tf.raw_streamed_bytes({}, {}, 700) is None  # no codec: no raw figure
    results = {"resident": {"median_step_s": 0.1},
               "ddo_vmm0_codec": {"median_step_s": 0.3, "bus_gbps": 1e-6,
                                  "streamed_bytes_per_step": 200.0,
                                  "raw_streamed_bytes_per_step": 400.0}}
    tf.bounds(results)
    r = results["ddo_vmm0_codec"]
    assert r["bus_bound_s"] == pytest.approx(0.2) and r["ratio"] == pytest.approx(1.5)
    assert r["raw_bus_bound_s"] == pytest.approx(0.4)
    assert r["ratio_raw_bound"] == pytest.approx(0.75)


def test_every_reference_is_compared(tf, tmp_path):
    import argparse
    import torch
    args = argparse.Namespace(workdir=str(tmp_path))
    eager = torch.arange(8, dtype=torch.float32).to(torch.bfloat16)
    graphs = eager.clone()
    graphs[3] += 1
    for name, ref in (("resident", eager), ("resident_graphs", graphs)):
        res = {}
        tf.compare(ref, ref, name, tf.CASES[name], args, res)
        assert res["identical"] is True
    res = {}  # a graph case equal to the eager reference but not to its own
    tf.compare(eager, eager, "ddo_vmm0_graphs", tf.CASES["ddo_vmm0_graphs"], args, res)
    assert res["identical"] is False and res["max_abs_diff"] == 1.0
    assert res["against"] == {"eager": {"identical": True, "max_abs_diff": 0.0}}
    assert tf.same_bits(eager, eager.float()) == {"identical": False,
                                                   "shape_or_dtype_differs": True}
