"""weight_codec on an FP8 checkpoint (docs/codec.md, "FP8"): a ComfyUI-layout file of F8_E4M3
weights streamed file-backed with weight_codec="ddoc1" on the cpu device. The library codes each
F8_E4M3 weight's whole bytes into its store, the bus carries fewer bytes than a raw run moves,
and every step's output is bit-identical to the unmanaged module. Uses the FP8 stand-in layers
of test_quantized.py (uint8 storage on torch 1.13; float8_e4m3fn too on torch >= 2.1).
"""

import json

import pytest
import torch
from torch import nn

import ddo
from conftest import ZERO_RESIDENT
from test_quantized import STORAGES, FP8Linear, write_comfy_fp8

STEPS = 3
DIM = 256  # 64 KiB per FP8 weight: coding pays


class FP8Stack(nn.Module):
    """FP8 stand-in layers only (their F32 scales and comfy_quant markers aside), so the coded
    bytes are the FP8 weights'."""

    def __init__(self, seed, storage):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.blocks = nn.ModuleList([FP8Linear(DIM, DIM, g, storage) for _ in range(3)])
        marker = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()),
                              dtype=torch.uint8)
        for b in self.blocks:
            b.register_buffer("comfy_quant", marker.clone())

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


def steps(module, x, n):
    with torch.no_grad():
        return [module(x) for _ in range(n)]


def run(path, storage, x, codec):
    """A file-backed FP8Stack streamed zero-resident: its outputs, the bytes its copies moved
    (copy_bytes: uploads, coded ones at their coded size), its metrics and plan decisions."""
    res = ddo.from_pretrained_with_dynamic_offload(
        str(path), model_loader=lambda p: FP8Stack(0, storage))
    r = ddo.enable_offload(res.module, backend="linear", weight_codec=codec, **ZERO_RESIDENT)
    try:
        outs = steps(res.module, x, STEPS)
        s = r.metrics_snapshot(collect_completed=True)
        streamed = [t for t in r._tensors if t.placement == 1]
        return outs, s.get("copy_bytes"), s.as_dict(), r.plan["planner_decisions"], streamed
    finally:
        r.close()


@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_fp8_checkpoint_coded_bit_identical(tmp_path, storage):
    src = FP8Stack(9, storage)
    path = tmp_path / "fp8.safetensors"
    write_comfy_fp8(path, src)
    x = torch.randn(2, 4, DIM, generator=torch.Generator().manual_seed(10))
    ref = steps(src, x, 1)[0]
    outs, moved, snap, d, streamed = run(path, storage, x, "ddoc1")
    assert d["weight_codec"] == "ddoc1"
    assert sum(t.dtype_name == "F8_E4M3" for t in streamed) == 3
    assert all(torch.equal(o, ref) for o in outs)
    codec = snap["codec"]
    # exactly the three F8_E4M3 weights (64 KiB each) are coded (the 4-byte scales and the
    # markers do not shrink), to about 0.83 of their bytes
    assert codec["setup_encode_bytes"] == 3 * DIM * DIM
    assert 0 < codec["setup_coded_bytes"] < 0.9 * codec["setup_encode_bytes"]
    assert codec["bytes_decoded"] > codec["bytes_coded_uploaded"] > 0
    raw_outs, raw_moved, _, raw_d, _ = run(path, storage, x, "none")
    assert raw_d["weight_codec"] == "none"
    assert all(torch.equal(o, ref) for o in raw_outs)
    # the bytes moved over the same steps: fewer than the raw run's, by about what coding saved
    saved = codec["setup_encode_bytes"] - codec["setup_coded_bytes"]
    assert 0 < moved <= raw_moved - saved, (moved, raw_moved, saved)
