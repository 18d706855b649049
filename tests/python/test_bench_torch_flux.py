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


@pytest.mark.parametrize("kind", ["q8_0", "fp8"])
def test_quantized_stand_ins(tf, kind):
    """--quant: the toy's block linears become the bench's quantized stand-ins (a GGUF-style
    Q8_0 Parameter subclass, or scaled FP8), close to the bf16 weights they quantize, streamed
    by ddo bit-identical to the unmanaged quantized model and with fewer bytes than bf16."""
    import torch
    import ddo
    from conftest import ZERO_RESIDENT
    ql = tf.quant_layers()
    model = tf.build_toy(torch).to(torch.bfloat16)
    tf.fill_params(model, "cpu")
    lin = model.transformer_blocks[0].mlp_in
    w = lin.weight.detach().float().clone()
    bf16_bytes = tf.model_bytes(model)
    assert ql.quantize_linears(model, kind, r"transformer_blocks\.") == 16
    q = model.transformer_blocks[0].mlp_in
    assert type(q) is ql.KINDS[kind]
    if kind == "q8_0":
        assert type(q.weight) is ql.GGUFLikeParameter and q.weight.quant_type == ql.Q8_0
        back = ql.q8_0_dequantize(q.weight.as_tensor(), q.out_features, torch.float32)
        assert (back - w).abs().max() <= w.abs().max() / 127  # half a step of the block scale
    else:
        assert q.weight.element_size() == 1 and q.weight_scale.numel() == 1
    assert tf.model_bytes(model) < 0.6 * bf16_bytes
    x = torch.randn(1, 16, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        ref = model(hidden_states=x)[0]
    assert torch.isfinite(ref.float()).all()
    r = ddo.enable_offload(model, backend="linear", **ZERO_RESIDENT)
    try:
        with torch.no_grad():
            assert torch.equal(model(hidden_states=x)[0], ref)
    finally:
        r.close()
