"""Whole-component ownership (vmm_component_tensor_ownership): the preflight's refusals, one
line each, and an owned text-encoder-like component that runs bit-identical."""

import pytest
import torch
from torch import nn

import ddo
import models

OWN = dict(backend="vmm", vmm_component_tensor_ownership=True, execution_device="cpu")


def test_owned_component_runs():
    m = models.FluxLike(seed=21, double=2, single=0)
    x = torch.randn(1, 4, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = m(x)
    r = ddo.enable_offload(m, component="text_encoder", route="dynamic", environ={}, **OWN)
    try:
        assert r.ownership["tensors"] == len(list(m.parameters()))
        assert r.ownership["buffer_bytes"] <= r.ownership["buffer_limit_bytes"]
        with torch.no_grad():
            assert torch.equal(r.module(x), ref)
    finally:
        r.close()


def test_big_buffers_are_refused():
    m = models.FluxLike(seed=22, double=2, single=0)
    m.register_buffer("table", torch.zeros(1 << 19))  # 2 MiB > the 1 MiB default limit
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, component="text_encoder", route="dynamic", environ={}, **OWN)
    s = str(e.value)
    assert "table" in s and "vmm_component_buffer_limit_mb" in s and "\n" not in s
    r = ddo.enable_offload(m, component="text_encoder", route="dynamic", environ={},
                           vmm_component_buffer_limit_mb=4, **OWN)
    r.close()


def test_partial_alias_and_skips_are_refused():
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    m[1].weight = nn.Parameter(m[0].weight.data[:, :8])  # the same tensor: allowed (tied)
    r = ddo.enable_offload(m, route="dynamic", environ={}, **OWN)
    r.close()
    m[1].bias = nn.Parameter(m[0].weight.data[1])  # a row of another tensor: refused
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, route="dynamic", environ={}, **OWN)
    assert "partial alias" in str(e.value) and "1.bias" in str(e.value)
    m2 = models.FluxLike(seed=23)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m2, route="dynamic", environ={}, skip_modules_pattern="proj_out",
                           **OWN)
    assert "skip_modules_pattern" in str(e.value)
    with pytest.raises(ddo.DdoError) as e:  # the library: native fast route only
        ddo.enable_offload(m2, route="dynamic", environ={}, execution_device="cpu",
                           vmm_component_tensor_ownership=True)
    assert "vmm_fast_runtime" in str(e.value)
    assert getattr(m2, "_ddo_offload", None) is None


def test_enable_dynamic_offload_runs_the_preflight():
    # ddo.enable_dynamic_offload is the dynamic route of enable_offload: the same preflight.
    m = models.FluxLike(seed=24, double=2, single=0)
    m.register_buffer("table", torch.zeros(1 << 19))
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_dynamic_offload(m, environ={}, **OWN)
    assert "vmm_component_buffer_limit_mb" in str(e.value)
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    m[1].bias = nn.Parameter(m[0].weight.data[1])
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_dynamic_offload(m, environ={}, **OWN)
    assert "partial alias" in str(e.value)
    assert getattr(m, "_ddo_offload", None) is None
