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


def test_chained_ratio_against_the_resident_chained_step(tf):
    results = {"resident": {"median_step_s": 0.25, "chained_step_s": 0.24},
               "ddo_vmm0": {"median_step_s": 0.28, "chained_step_s": 0.26, "bus_gbps": 1e-6,
                            "streamed_bytes_per_step": 230.0},
               "ddo_linear0": {"median_step_s": 0.3, "bus_gbps": 1e-6,
                               "streamed_bytes_per_step": 230.0}}
    tf.bounds(results)
    r = results["ddo_vmm0"]
    assert r["ratio"] == pytest.approx(0.28 / 0.25)
    assert r["chained_bound_s"] == pytest.approx(0.24)
    assert r["ratio_chained"] == pytest.approx(0.26 / 0.24)
    assert "ratio_chained" not in results["ddo_linear0"]  # not measured back to back
    results["resident"]["chained_step_s"] = 0.2  # the bus bound is the larger: 0.23 s
    tf.bounds(results)
    assert results["ddo_vmm0"]["ratio_chained"] == pytest.approx(0.26 / 0.23)


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


# --quant kind -> (layers the toy's blocks have of it, the layer's stored bytes per bf16 byte)
QUANT_TOY = {"q8_0": (16, 34 / 32 / 2), "q4_k": (4, 144 / 256 / 2), "fp8": (16, 1 / 2),
             "fp8_wrapper": (16, None)}


@pytest.mark.parametrize("kind", ["q8_0", "q4_k", "fp8", "fp8_wrapper"])
def test_quantized_stand_ins(tf, kind):
    """--quant: the toy's block linears become the bench's quantized stand-ins (a GGUF-style
    Q8_0 or Q4_K Parameter subclass, or scaled FP8), close to the bf16 weights they quantize,
    streamed by ddo bit-identical to the unmanaged quantized model and with fewer bytes than
    bf16 (Q4_K takes the layers whose rows are whole 256-weight blocks: the toy's mlp_out)."""
    import torch
    import ddo
    from conftest import ZERO_RESIDENT
    ql = tf.quant_layers()
    model = tf.build_toy(torch).to(torch.bfloat16)
    tf.fill_params(model, "cpu")
    layer = "mlp_out" if kind == "q4_k" else "mlp_in"
    lin = getattr(model.transformer_blocks[0], layer)
    w = lin.weight.detach().float().clone()
    bf16_bytes, layer_bytes = tf.model_bytes(model), w.numel() * 2
    count, ratio = QUANT_TOY[kind]
    assert ql.quantize_linears(model, kind, r"transformer_blocks\.") == count
    q = getattr(model.transformer_blocks[0], layer)
    assert type(q) is ql.KINDS[kind]
    if kind in ("q8_0", "q4_k"):
        qt = ql.Q8_0 if kind == "q8_0" else ql.Q4_K
        assert type(q.weight) is ql.GGUFLikeParameter and q.weight.quant_type == qt
        assert q.weight.quant_shape == tuple(w.shape)
        stored = q.weight.as_tensor()
        back = ql.GGUF_CODECS[qt][1](stored, q.out_features, torch.float32)
        if kind == "q8_0":  # half a step of the block scale
            assert (back - w).abs().max() <= w.abs().max() / 127
        else:  # 15 steps over each 32-weight range, scales and mins in 6 bits: a loose bound
            assert (back - w).abs().max() <= (w.max() - w.min()) / 15
        assert stored.numel() == ratio * layer_bytes
    elif kind == "fp8_wrapper":  # the wrapper Parameter over float8 (or uint8) data + scales
        assert type(q.weight) is ql.Float8WeightOnlyTensor and q.weight.dtype == torch.bfloat16
        assert q.weight.qdata.element_size() == 1 and q.weight.scale.shape == (q.out_features,)
        assert [id(t) for t in tf.stored(q.weight)] == [id(q.weight.qdata), id(q.weight.scale)]
        back = q.weight.dequantize().float()  # E4M3 keeps 3 mantissa bits: 1/16 relative
        assert (back - w).abs().max() <= w.abs().max() / 16
    else:
        assert q.weight.element_size() == 1 and q.weight_scale.numel() == 1
    if kind != "q4_k":
        assert tf.model_bytes(model) < 0.6 * bf16_bytes
    else:
        assert tf.model_bytes(model) == bf16_bytes - count * (layer_bytes - ratio * layer_bytes)
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


def dequantize_row_q4_k_scalar(block):
    """ggml's dequantize_row_q4_K for one 144-byte block, line by line in Python (its
    get_scale_min_k4 included): the reference the bench's torch code is checked against."""
    import struct
    d, dmin = struct.unpack("<ee", bytes(block[:4]))
    scales, q = block[4:16], block[16:144]

    def get_scale_min_k4(j):
        if j < 4:
            return scales[j] & 63, scales[j + 4] & 63
        return ((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
                (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))

    y, qi, is_ = [], 0, 0
    for _j in range(0, 256, 64):
        sc, m = get_scale_min_k4(is_)
        d1, m1 = d * sc, dmin * m
        sc, m = get_scale_min_k4(is_ + 1)
        d2, m2 = d * sc, dmin * m
        y += [d1 * (q[qi + k] & 0xF) - m1 for k in range(32)]
        y += [d2 * (q[qi + k] >> 4) - m2 for k in range(32)]
        qi, is_ = qi + 32, is_ + 2
    return y


def test_q4_k_is_ggml_layout(tf):
    """The bench's torch dequantize of Q4_K against ggml's scalar dequantize_row_q4_K on
    random blocks (every bit of the scales and quants exercised; d and dmin finite f16), and
    its quantize round-trips through that same scalar reference."""
    import torch
    ql = tf.quant_layers()
    g = torch.Generator().manual_seed(3)
    raw = torch.randint(0, 256, (6, 144), generator=g, dtype=torch.uint8)
    raw[:, 0:4] = (torch.rand(6, 2, generator=g) * 0.01).half().view(torch.uint8)
    got = ql.q4_k_dequantize(raw.reshape(2, 3 * 144), 2, torch.float32).reshape(6, 256)
    for i in range(6):
        want = torch.tensor(dequantize_row_q4_k_scalar(raw[i].tolist()), dtype=torch.float64)
        assert torch.allclose(got[i].double(), want, rtol=1e-6, atol=1e-9), i
    w = torch.randn(4, 512, generator=g) * 0.05
    packed = ql.q4_k_quantize(w)
    assert packed.shape == (4, 2 * 144) and packed.dtype == torch.uint8
    back = torch.tensor([dequantize_row_q4_k_scalar(b) for b in packed.reshape(-1, 144).tolist()])
    assert torch.allclose(ql.q4_k_dequantize(packed, 4, torch.float32).reshape(-1, 256).double(),
                          back.double(), rtol=1e-6, atol=1e-9)
    assert (back.reshape(4, 512) - w).abs().max() <= (w.max() - w.min()) / 15


@pytest.mark.parametrize("kind", ["q8_0", "q4_k", "fp8_wrapper"])
def test_toy_cases_with_quant(tf, tmp_path, kind):
    """bench/torch_flux.py --toy --device cpu --quant KIND, the resident case then ddo's zero-
    resident VMM case (each as the driver runs it, --case): identical outputs, the bytes
    streamed per step the quantized model's stored bytes (the window's edges may cut an upload
    prefetched across a step's end: a few units over the window, of the toy's six; streaming
    the quantized layers dequantized would add 92 KiB a step (q4_k's four layers) or more)."""
    import json
    res = {}
    for case in ("resident", "ddo_vmm0"):
        out = tmp_path / f"{case}.json"
        assert tf.main(["--case", case, "--toy", "--device", "cpu", "--quant", kind,
                        "--steps", "4", "--workdir", str(tmp_path), "--result", str(out)]) == 0
        res[case] = json.loads(out.read_text())
    for case, r in res.items():
        assert r["quant"]["kind"] == kind and r["quant"]["layers"] == QUANT_TOY[kind][0], r
        assert r["identical"] is True, (case, r.get("reference"))
    streamed, stored = res["ddo_vmm0"]["streamed_bytes_per_step"], res["ddo_vmm0"]["model_bytes"]
    assert abs(streamed - stored) * 4 <= stored, (streamed, stored)


def test_gguf_file_blocks_and_their_type_reach_the_cases(tf, tmp_path):
    """--quant gguf_file --gguf-type Q4_K: the cases are told the type, and the blocks
    bench/gguf_real.py writes carry finite f16 super scales (gguf itself is not here)."""
    import numpy as np
    args = tf.parse_args(["--all", "--tiny", "--quant", "gguf_file", "--gguf-type", "Q4_K"])
    cmd = tf.case_command("resident", args, str(tmp_path / "r.json"), 0.0)
    assert cmd[cmd.index("--gguf-type") + 1] == "Q4_K"
    gr = load_bench("gguf_real")
    for qtype, (per, size) in gr.BLOCKS.items():
        b = gr.quant_blocks(np.random.default_rng(0), 4, 2, qtype)
        assert b.shape == (4, 2 * size) and b.dtype == np.uint8
        heads = b.reshape(4, 2, size)[:, :, 0:4 if qtype == "Q4_K" else 2]
        scales = heads.copy().view(np.float16)
        assert np.isfinite(scales).all() and (scales > 0).all()


def test_idle_causes_split_host_and_device_waits(tf):
    """The trace's idle time between kernels, split: the part of a gap until the kernel's launch
    returned on the host is the host's, the rest the device's own wait (an upload's event)."""
    def k(ts, end, corr):
        return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": end - ts,
                "args": {"correlation": corr}}

    def launch(end, corr, cat="cuda_runtime", name="cudaLaunchKernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": end - 1, "dur": 1,
                "args": {"correlation": corr}}
    ev = [k(0, 10, 1), launch(-5, 1),
          k(15, 20, 2), launch(14, 2),        # a 5 us gap, 4 of it until the launch returned
          k(30, 40, 3), launch(12, 3),        # a 10 us gap, launched long before: the device's
          k(35, 45, 4), launch(30, 4),        # overlaps: no gap
          k(50, 55, 5), launch(49, 5, "cuda_driver", "cuLaunchKernel"),  # 5 us, 4 the host's
          {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 20, "dur": 30,
           "args": {"correlation": 9}}]
    r = tf.idle_causes(ev)
    assert abs(r["idle_s"] - 20e-6) < 1e-12 and abs(r["idle_host_s"] - 8e-6) < 1e-12
    assert abs(r["idle_wait_s"] - 12e-6) < 1e-12
    assert r["kernels_matched"] == 5 and abs(r["launch_lead_median_s"] - 5e-6) < 1e-12
    assert r["launch_call_median_us"] == 1 and r["launch_call_p90_us"] == 1
    top = [["cudaLaunchKernel", 4, 4e-6], ["cuLaunchKernel", 1, 1e-6]]
    assert r["api_threads"] == [{"tid": "None", "calls": 5, "s": 5e-6, "top": top}]
    ev.append({"ph": "X", "cat": "cuda_driver", "name": "cuMemcpyHtoDAsync_v2", "ts": 3, "dur": 40,
               "tid": 7})
    r = tf.idle_causes(ev)
    assert [t["tid"] for t in r["api_threads"]] == ["7", "None"]
    assert r["api_threads"][0] == {"tid": "7", "calls": 1, "s": 40e-6,
                                   "top": [["cuMemcpyHtoDAsync_v2", 1, 40e-6]]}
    e = tf.idle_causes([])
    assert e["launch_lead_median_s"] is None and e["launch_call_median_us"] is None


def test_overlap_of_copies_and_kernels(tf):
    """Over the span from the first kernel or copy to the last: neither running, copies alone
    (kernels waiting on them), kernels alone (the copy engine idle)."""
    r = tf.overlap([(0, 10), (30, 40)], [(5, 20), (35, 50)])
    assert r["device_window_s"] == pytest.approx(50e-6)
    assert r["neither_busy_s"] == pytest.approx(10e-6)   # 20..30
    assert r["copy_only_s"] == pytest.approx(20e-6)      # 10..20 and 40..50
    assert r["kernel_only_s"] == pytest.approx(10e-6)    # 0..5 and 30..35
    assert tf.overlap([(0, 1)], []) == {}
