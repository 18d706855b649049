"""Quantized weights streamed as stored bytes (docs/formats.md, "From Python"): GGUF-like and
FP8-with-scales layers on every route of the cpu device, bit-identical to the unmanaged module,
the bytes moved per step equal to the stored bytes, the Parameter objects (type and attributes)
kept across steps, unload/reload and state_dict; the plan's dequantization scratch.

Every quantized layer here is a STAND-IN written for these tests (no Diffusers, ComfyUI, gguf
or TorchAO in CI): they follow the hosts' layouts and dequantize in their own forwards."""

import collections
import gc
import json
import struct

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddo
from conftest import ZERO_RESIDENT

HAS_FP8 = hasattr(torch, "float8_e4m3fn")


# ---- stand-ins ----

class GGUFLikeParameter(nn.Parameter):
    """STAND-IN for Diffusers' GGUFParameter: uint8 block bytes plus quant_type (a GGML type
    id) and quant_shape, made with torch.Tensor._make_subclass; its __torch_function__ wraps
    every tensor result in its own type, as Diffusers' does."""

    def __new__(cls, data, requires_grad=False, quant_type=None):
        self = torch.Tensor._make_subclass(cls, data, requires_grad)
        self.quant_type = quant_type
        if quant_type == Q8_0:
            self.quant_shape = tuple(data.shape[:-1]) + (data.shape[-1] // 34 * 32,)
        return self

    def as_tensor(self):
        return torch.Tensor._make_subclass(torch.Tensor, self, self.requires_grad)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        if isinstance(result, torch.Tensor):
            qt = next((a.quant_type for a in args if isinstance(a, GGUFLikeParameter)), None)
            return cls(result, quant_type=qt)
        return result


Q8_0 = 8  # GGML's type id: blocks of 32 weights in 34 bytes (f16 scale + 32 int8)


def q8_0_quantize(w):
    """float [out, in] (in a multiple of 32) -> uint8 [out, in / 32 * 34] (GGML's Q8_0)."""
    blocks = w.float().reshape(-1, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    q = torch.where(d > 0, blocks / d.clamp_min(1e-30), torch.zeros_like(blocks))
    q = q.round().clamp(-127, 127).to(torch.int8)
    raw = torch.cat([d.half().view(torch.uint8).reshape(-1, 2), q.view(torch.uint8)], dim=1)
    return raw.reshape(w.shape[0], -1).contiguous()


def dequantize_gguf_like(weight):
    """STAND-IN for Diffusers' dequantize_gguf_tensor, Q8_0 only: reads weight.quant_type
    (a weight that lost it fails here) and returns a plain float32 tensor."""
    assert weight.quant_type == Q8_0, f"quant_type lost: {getattr(weight, 'quant_type', None)}"
    raw = weight.as_tensor().reshape(-1, 34)
    d = raw[:, :2].contiguous().view(torch.float16).float()
    q = raw[:, 2:].contiguous().view(torch.int8).float()
    return (d * q).reshape(weight.shape[0], -1)


class Q8Linear(nn.Module):
    """STAND-IN for Diffusers' GGUFLinear: a GGUF-like Q8_0 weight, a float bias, computing in
    compute_dtype (float32 here) with its own dequantizing forward."""

    def __init__(self, n_in, n_out, g):
        super().__init__()
        self.compute_dtype = torch.float32
        w = torch.randn(n_out, n_in, generator=g) * 0.05
        self.weight = GGUFLikeParameter(q8_0_quantize(w), quant_type=Q8_0)
        self.bias = nn.Parameter(torch.randn(n_out, generator=g) * 0.01, requires_grad=False)

    def forward(self, x):
        return F.linear(x.float(), dequantize_gguf_like(self.weight), self.bias)


def e4m3_table():
    """The 256 values of the float8 E4M3 (fn) bytes (0x7F and 0xFF are NaN)."""
    vals = []
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        if e == 15 and m == 7:
            v = float("nan")
        vals.append(-v if s else v)
    return torch.tensor(vals, dtype=torch.float32)


E4M3 = e4m3_table()


def moved_as_stored(r, streamed, nbytes, opts, moved, byte_dtypes):
    """The bytes STEPS steps moved are the stored bytes of the streamed units (nbytes: name ->
    stored bytes); byte_dtypes: the dtypes a codec leaves as stored. The window's edges may cut
    an upload the session prefetched across a step's end: at most slot_count units."""
    per_unit = {}
    for t in streamed:
        per_unit[t.unit] = per_unit.get(t.unit, 0) + nbytes[t.name]
    total, edge = sum(per_unit.values()), r.budgets()["slot_count"] * max(per_unit.values())
    if "resident_module_patterns" in opts:  # free slots may keep a unit: no copy
        assert 0 < moved <= STEPS * total + edge, (moved, total)
    elif "weight_codec" in opts:  # the float tensors move coded (smaller), bytes as stored
        raw = sum(nbytes[t.name] for t in streamed if t.dtype_name in byte_dtypes)
        assert STEPS * raw < moved <= STEPS * total + edge, (moved, raw, total)
    else:
        assert abs(moved - STEPS * total) <= edge, (moved, total)


def e4m3_encode(w):
    """float -> the nearest E4M3 byte (what a float8_e4m3fn cast stores), as uint8."""
    finite = torch.arange(256)[~torch.isnan(E4M3)]
    vals, order = E4M3[finite].sort()
    codes = finite[order]
    i = torch.searchsorted(vals, w.contiguous()).clamp(1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    pick = torch.where((w - lo).abs() <= (hi - w).abs(), i - 1, i)
    return codes[pick].to(torch.uint8)


class FP8Linear(nn.Module):
    """STAND-IN for a ComfyUI scaled-FP8 linear (`weight` F8_E4M3 + `weight_scale`): weights
    scaled per tensor into E4M3's range (448) as ComfyUI does. storage uint8 (torch 1.13): the
    bytes stand for E4M3 and are dequantized through a 256-entry table; storage
    torch.float8_e4m3fn (torch >= 2.1): the real dtype, upcast by torch."""

    def __init__(self, n_in, n_out, g, storage=torch.uint8):
        super().__init__()
        w = torch.randn(n_out, n_in, generator=g) * 0.05
        scale = w.abs().max() / 448
        code = e4m3_encode(w / scale)
        self.weight = nn.Parameter(code if storage == torch.uint8 else code.view(storage),
                                   requires_grad=False)
        self.weight_scale = nn.Parameter(scale.reshape(1), requires_grad=False)

    def forward(self, x):
        w = self.weight
        w = E4M3[w.long()] if w.dtype == torch.uint8 else w.float()
        return F.linear(x.float(), w * self.weight_scale)


class Block(nn.Module):
    def __init__(self, dim, g, storage):
        super().__init__()
        self.q = Q8Linear(dim, 2 * dim, g)
        self.f = FP8Linear(2 * dim, dim, g, storage)

    def forward(self, x):
        return x + self.f(torch.relu(self.q(x)))


class StackNet(nn.Module):
    """A float embedder, depth blocks made by make(generator), a float output."""

    def __init__(self, dim, depth, seed, make):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList([make(g) for _ in range(depth)])
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class QuantNet(StackNet):
    """Blocks of one GGUF-like and one FP8 layer each."""

    def __init__(self, dim=64, depth=4, seed=0, storage=torch.uint8):
        super().__init__(dim, depth, seed, lambda g: Block(dim, g, storage))


STORAGES = [torch.uint8] + ([torch.float8_e4m3fn] if HAS_FP8 else [])
ROUTES = [  # (backend, options): zero-resident linear and VMM, leaf units, budget residents
    ("linear", dict(ZERO_RESIDENT)),
    ("vmm", dict(ZERO_RESIDENT)),
    ("linear", dict(ZERO_RESIDENT, unit_granularity="leaf")),
    ("vmm", dict(ZERO_RESIDENT, resident_module_patterns=r"^blocks\.(1|2)$",
                 resident_module_budget_gb=1)),
    ("linear", dict(ZERO_RESIDENT, weight_codec="ddoc1")),  # float tensors coded, blocks raw
]


STEPS = 6


def steps(m, x, n=3):
    with torch.no_grad():
        return [m(x) for _ in range(n)]


def quant_params(m):
    return {n: p for n, p in m.named_parameters() if n.endswith(".q.weight")}


def stored_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- every route ----

@pytest.mark.parametrize("storage", STORAGES, ids=str)
@pytest.mark.parametrize("backend,opts", ROUTES)
def test_bit_identical_and_stored_bytes_every_route(backend, opts, storage):
    m = QuantNet(seed=1, storage=storage)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(2))
    ref = steps(m, x)
    before = {n: (p, dict(p.__dict__)) for n, p in quant_params(m).items()}
    nbytes = {n: stored_bytes([p.as_tensor() if isinstance(p, GGUFLikeParameter) else p])
              for n, p in m.named_parameters()}
    r = ddo.enable_offload(m, backend=backend, **opts)
    try:
        resident_units = {i for i, u in enumerate(r.plan["units"]) if u.get("resident")}
        streamed = [t for t in r._tensors if t.placement == 1 and t.unit not in resident_units]
        assert any(t.dtype_name == "U8" for t in streamed) or storage != torch.uint8
        outs = steps(r.module, x, 1)
        snap1 = r.metrics_snapshot(collect_completed=True)
        outs += steps(r.module, x, STEPS)
        snap2 = r.metrics_snapshot(collect_completed=True)
        assert all(torch.equal(o, ref[0]) for o in outs)
        # The bytes the steps move are the stored bytes of the streamed units (the quantized
        # layers' uint8 / float8 bytes as the module held them, never a dequantized copy,
        # which would be 3.8 x (Q8_0) and 4 x (FP8) more). The window's edges may cut an
        # upload the session prefetched across a step's end: at most slot_count units.
        moved_as_stored(r, streamed, nbytes, opts, snap2.get("copy_bytes") -
                        snap1.get("copy_bytes"), ("U8",))
        for n, p in quant_params(m).items():  # the very objects, type and attributes
            assert p is before[n][0] and type(p) is GGUFLikeParameter
            assert p.__dict__ == before[n][1]
        r.unload()
        r.reload()
        assert torch.equal(steps(r.module, x, 1)[0], ref[0])
        for n, p in quant_params(m).items():
            assert p is before[n][0] and p.quant_type == Q8_0
    finally:
        r.close()
    assert r.device_bytes_after_close == 0
    for n, p in quant_params(m).items():
        assert p is before[n][0] and p.__dict__ == before[n][1]
    assert torch.equal(steps(m, x, 1)[0], ref[0])  # unmanaged again, same values


@pytest.mark.parametrize("backend,opts", ROUTES[:3])
def test_leases_never_run_the_subclass_torch_function(backend, opts, monkeypatch):
    """A lease rebinds each Parameter's .data and reads its ._version with torch-function
    dispatch off: a subclass's own __torch_function__ (Diffusers' GGUFParameter wraps every
    result) runs for the layer's own ops only, as many times as without ddo, not once more per
    tensor and lease (host time that a host-bound quantized step pays in full)."""
    calls = []
    orig = GGUFLikeParameter.__dict__["__torch_function__"].__func__

    def counted(cls, func, types, args=(), kwargs=None):
        calls.append(getattr(func, "__qualname__", None) or getattr(func, "__name__", ""))
        return orig(cls, func, types, args, kwargs)
    monkeypatch.setattr(GGUFLikeParameter, "__torch_function__", classmethod(counted))
    m = QuantNet(seed=3)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(4))
    ref = steps(m, x, 2)
    plain = list(calls)
    assert plain  # the stand-in's forward does run it (its dequantization)
    r = ddo.enable_offload(m, backend=backend, **opts)
    try:
        steps(r.module, x, 1)  # (the first forward's one-time work)
        calls.clear()
        outs = steps(r.module, x, 2)
        assert all(torch.equal(a, b) for a, b in zip(outs, ref))
        more = collections.Counter(calls) - collections.Counter(plain)
        assert not more  # the forward's own (a few fewer on VMM), nothing for the leases
    finally:
        r.close()


@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_a_view_kept_past_its_lease_pins_the_unit_with_unit_wide_views(backend):
    """Each streamed tensor is cut from one view of its unit's bytes per lease: a tensor a hook
    keeps past the forward (here a view derived from a small scale, sharing the unit view's
    storage) is still seen at release: the unit stays leased in C (pinned), the kept values
    stay the weights' while other units come and go, and the pin ends once it dies."""
    m = QuantNet(seed=7)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(8))
    ref = steps(m, x, 1)[0]
    want = m.blocks[1].f.weight_scale.detach().clone()
    kept = []
    h = m.blocks[1].f.register_forward_hook(
        lambda mod, a, o: kept.append(mod.weight_scale.view(-1)[:1]))
    r = ddo.enable_offload(m, backend=backend, **ZERO_RESIDENT)
    try:
        steps(r.module, x, 1)
        h.remove()
        u = r._tensors[[t.name for t in r._tensors].index("blocks.1.f.weight_scale")].unit
        assert r._unit_cuts.get(u) is not None  # the unit-wide view served this unit
        assert u in r._pinned  # the kept view was seen at release
        for _ in range(3):  # the other units come and go; the pinned one keeps its bytes
            assert torch.equal(steps(r.module, x, 1)[0], ref)
        assert torch.equal(kept[0], want[:1])
        kept.clear()
        gc.collect()
        assert torch.equal(steps(r.module, x, 1)[0], ref)
        assert not r._pinned  # released once the view died
    finally:
        r.close()
    assert r.device_bytes_after_close == 0


@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_views_per_tensor_where_a_unit_view_is_not_used(backend):
    """A unit whose tensors are not cut from a unit view (a route that maps each weight apart,
    or a misaligned offset) gets one view per tensor: the same values, writes refused."""
    m = QuantNet(seed=9)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(10))
    ref = steps(m, x, 1)[0]
    r = ddo.enable_offload(m, backend=backend, **ZERO_RESIDENT)
    try:
        r._unit_cuts.update({u: None for u in range(len(r._unit_tensors))})
        assert all(torch.equal(o, ref) for o in steps(r.module, x, 2))
        assert all(v is None for v in r._unit_cuts.values())
        def write(mod, args):
            mod.weight_scale.mul_(2)  # in place, on ddo's device copy (grad off)
        h = m.blocks[0].f.register_forward_pre_hook(write)
        with pytest.raises(ddo.DdoError, match="written in place during the forward"):
            steps(r.module, x, 1)
        h.remove()
        assert torch.equal(steps(r.module, x, 1)[0], ref)  # the device copy restored
    finally:
        r.close()


def test_stored_bytes_are_the_quantized_bytes():
    """The figure the route test compares: a Q8_0 layer moves 34 bytes per 32 weights and an
    FP8 layer 1 byte per weight (with its scale), a quarter of float32 or less."""
    m = QuantNet(seed=3)
    b = m.blocks[0]
    assert b.q.weight.as_tensor().numel() == 128 * 64 // 32 * 34
    assert b.f.weight.numel() * b.f.weight.element_size() == 64 * 128
    r = ddo.enable_offload(m, backend="linear", **ZERO_RESIDENT)
    try:
        names = {t.name: t for t in r._tensors}
        assert names["blocks.0.q.weight"].dtype_name == "U8"
        assert names["blocks.0.q.weight"].shape == (128, 64 // 32 * 34)
        assert names["blocks.0.f.weight"].placement == 1
        assert names["blocks.0.f.weight_scale"].unit == names["blocks.0.f.weight"].unit
    finally:
        r.close()


def test_state_dict_keeps_the_subclass_and_its_attributes():
    m = QuantNet(seed=4)
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(5))
    ref_sd = m.state_dict()
    r = ddo.enable_offload(m, backend="vmm", **ZERO_RESIDENT)
    try:
        steps(r.module, x, 2)
        sd = r.module.state_dict()
        for k, v in ref_sd.items():
            assert type(sd[k]) is type(v), k
            assert torch.equal(torch.Tensor._make_subclass(torch.Tensor, sd[k]),
                               torch.Tensor._make_subclass(torch.Tensor, v)), k
            if isinstance(v, GGUFLikeParameter):
                assert sd[k].quant_type == Q8_0 and sd[k].quant_shape == v.quant_shape
    finally:
        r.close()


# ---- the plan's dequantization scratch ----

def test_plan_reserves_the_dequantization_scratch(capsys):
    """The largest quantized layer dequantized at its compute dtype (float32 here: the Q8_0
    layers are 128 x 64 weights, 32 KiB) comes off the device budget; the plan shows it."""
    m = QuantNet(seed=6)
    opts = dict(ZERO_RESIDENT, device_budget_gb=0.25)
    r = ddo.enable_offload(m, backend="linear", verbose=True, **opts)
    assert "dequantization scratch 32.00 KiB kept (blocks.0.q.weight)" in capsys.readouterr().err
    try:
        dec = r.plan["planner_decisions"]
        assert dec["dequant_scratch_bytes"] == 128 * 64 * 4, dec
        assert "dequantization scratch" in dec["device_weights_limit_source"]
        assert r.budgets()["device_weights_limit"] == int(0.25 * 2 ** 30) - 128 * 64 * 4
    finally:
        r.close()
    r = ddo.enable_offload(m, backend="linear", dequant_scratch_bytes=1 << 20, **opts)
    try:  # the caller's value wins
        assert r.plan["planner_decisions"]["dequant_scratch_bytes"] == 1 << 20
        assert r.dequant_scratch == {"bytes": 128 * 64 * 4, "layer": "blocks.0.q.weight"}
        assert r.budgets()["device_weights_limit"] == int(0.25 * 2 ** 30) - (1 << 20)
    finally:
        r.close()
    plain = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    r = ddo.enable_offload(plain, backend="linear", **opts)
    try:
        assert r.plan["planner_decisions"].get("dequant_scratch_bytes", 0) == 0
        assert r.budgets()["device_weights_limit"] == int(0.25 * 2 ** 30)
    finally:
        r.close()


# ---- refusals: one line each, the module untouched ----

def test_what_ddo_cannot_move_is_named(without_diffusers):
    # (with Diffusers importable the auto route sends these to its group offload instead:
    # test_quantized_wrapper.py's test_unstreamable_wrappers_take_the_compatibility_route)
    class Wrapper(torch.Tensor):
        """STAND-IN for a TorchAO-style wrapper subclass (inner data + scale)."""

        @staticmethod
        def __new__(cls, data, scale):
            return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.float32)

        def __init__(self, data, scale):
            self._data, self._scale = data, scale

        def __tensor_flatten__(self):
            return ["_data", "_scale"], None

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.detach.default:
                return args[0]
            raise NotImplementedError(func)

    lin = nn.Linear(8, 8)
    # (a wrapper over plain contiguous inner tensors is streamed: test_quantized_wrapper.py)
    lin.weight = nn.Parameter(Wrapper(torch.zeros(8, 8, dtype=torch.int8).t(), torch.ones(1)),
                              requires_grad=False)
    with pytest.raises(ddo.DdoError, match="parameter weight: Wrapper is a wrapper tensor "
                       "subclass.*_data is not contiguous.*compatibility route"):
        ddo.enable_offload(lin, **ZERO_RESIDENT)
    assert not hasattr(lin, "_ddo_offload")
    q = nn.Linear(8, 8)
    q.weight = nn.Parameter(torch.quantize_per_tensor(torch.randn(8, 8), 0.1, 0, torch.qint8),
                            requires_grad=False)
    with pytest.raises(ddo.DdoError, match="torch quantized dtype torch.qint8"):
        ddo.enable_offload(q, **ZERO_RESIDENT)
    s = nn.Linear(8, 8)
    s.weight = nn.Parameter(torch.randn(8, 8).to_sparse(), requires_grad=False)
    with pytest.raises(ddo.DdoError, match="ddo moves dense stored bytes"):
        ddo.enable_offload(s, **ZERO_RESIDENT)


    class StateParameter(nn.Parameter):
        """STAND-IN for a bitsandbytes-style parameter: packed bytes plus a quantization
        state object holding tensors (absmax) that must travel with them."""

    class QuantState:
        def __init__(self):
            self.absmax = torch.ones(4)

    b = nn.Linear(8, 8)
    b.weight = StateParameter(torch.zeros(8, 4, dtype=torch.uint8), requires_grad=False)
    b.weight.quant_state = QuantState()
    with pytest.raises(ddo.DdoError, match="StateParameter keeps tensors in its attribute "
                       "quant_state"):
        ddo.enable_offload(b, **ZERO_RESIDENT)
    m = QuantNet(seed=7)
    m.blocks[0].q.weight = GGUFLikeParameter(
        q8_0_quantize(torch.randn(64, 128))[:, ::2], quant_type=Q8_0)
    with pytest.raises(ddo.DdoError, match="blocks.0.q.weight is not contiguous"):
        ddo.enable_offload(m, **ZERO_RESIDENT)


# ---- routing: streamable quantized modules stay on ddo's route ----

def test_routing_keeps_streamable_quantized_modules(without_diffusers):
    from ddo import routing
    m = QuantNet(seed=8)
    assert routing.detect_quantized_backend_modules(m) == {}
    pol, _cfg, _st = routing.resolve_route(m, execution_device="cpu")
    assert pol["route"] == "dynamic_offload", pol
    q = nn.Sequential(nn.Linear(8, 8))
    q[0].weight = nn.Parameter(torch.quantize_per_tensor(torch.randn(8, 8), 0.1, 0,
                                                          torch.qint8), requires_grad=False)
    found = routing.detect_quantized_backend_modules(q)
    assert found["unstreamable_parameters"] == ["0.weight"], found
    pol, _cfg, _st = routing.resolve_route(q, execution_device="cpu")
    assert "0.weight" in pol["route_source"] and "torch.qint8" in pol["route_source"], pol


# ---- file-backed: a ComfyUI-layout safetensors written here ----

ST = {torch.float32: "F32", torch.uint8: "U8", torch.float16: "F16"}


def write_comfy_fp8(path, model):
    """The model's FP8 layers as a ComfyUI-layout file: `<layer>.weight` F8_E4M3 (the stand-in's
    bytes), `<layer>.weight_scale` F32, `<layer>.comfy_quant` JSON; the rest as stored. The
    GGUF-like layers are left out (the file-backed test uses an FP8-only model)."""
    tensors = {}
    for name, t in model.state_dict().items():
        tensors[name] = t
    for name, mod in model.named_modules():
        if isinstance(mod, FP8Linear):
            tensors[f"{name}.comfy_quant"] = torch.tensor(
                list(json.dumps({"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)
    import test_pipeline_loading as T
    T.write_safetensors(path, tensors, lambda name, t: "F8_E4M3" if name.endswith(".weight") and
                        t.element_size() == 1 else ST.get(t.dtype, "F8_E4M3"))


class FP8Net(nn.Module):
    """FP8 stand-in layers between float ones; comfy_quant markers as uint8 buffers."""

    def __init__(self, dim=64, depth=3, seed=0, storage=torch.uint8):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList([FP8Linear(dim, dim, g, storage) for _ in range(depth)])
        marker = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()),
                              dtype=torch.uint8)
        for b in self.blocks:
            b.register_buffer("comfy_quant", marker.clone())

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = x + b(x)
        return x


@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_file_backed_comfy_fp8(tmp_path, storage):
    src = FP8Net(seed=9, storage=storage)
    path = tmp_path / "fp8.safetensors"
    write_comfy_fp8(path, src)
    x = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(10))
    ref = steps(src, x, 1)[0]
    res = ddo.from_pretrained_with_dynamic_offload(
        str(path), model_loader=lambda p: FP8Net(seed=0, storage=storage))
    assert all(p.device.type == "meta" for p in res.module.parameters())
    r = ddo.enable_offload(res.module, backend="linear", **ZERO_RESIDENT)
    try:
        assert r._source == str(path)
        assert torch.equal(steps(res.module, x, 1)[0], ref)
        s1 = r.metrics_snapshot(collect_completed=True)
        assert all(torch.equal(o, ref) for o in steps(res.module, x, STEPS))
        s2 = r.metrics_snapshot(collect_completed=True)
        streamed = [t for t in r._tensors if t.placement == 1]
        assert sum(t.dtype_name == "F8_E4M3" for t in streamed) == 3
        per_unit = {}
        for t in streamed:  # stored bytes: 1 per FP8 weight, as the file holds them
            n = int(torch.Size(t.shape).numel()) * torch.empty(0, dtype=t.torch_dtype) \
                .element_size()
            per_unit[t.unit] = per_unit.get(t.unit, 0) + n
        moved = s2.get("copy_bytes") - s1.get("copy_bytes")
        total, edge = sum(per_unit.values()), r.budgets()["slot_count"] * max(per_unit.values())
        assert abs(moved - STEPS * total) <= edge, (moved, total)
    finally:
        r.close()


# ---- per-layer casting (Diffusers' layerwise casting) ----

def layerwise_cast(module, storage, compute):
    """STAND-IN for Diffusers' apply_layerwise_casting: every Linear is stored in `storage`
    and its forward, wrapped as Diffusers' hook registry wraps it, upcasts the layer to
    `compute` (module.to) before and casts it back after. storage float16 stands for float8
    on torch 1.13 (no float8 dtype); on torch >= 2.1 float8_e4m3fn is used too."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            m.to(dtype=storage)
            orig = m.forward

            def forward(*args, _m=m, _orig=orig, **kwargs):
                _m.to(dtype=compute)
                out = _orig(*args, **kwargs)
                _m.to(dtype=storage)
                return out

            m.forward = forward
    return module


class CastNet(nn.Module):
    def __init__(self, dim=64, depth=4, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(),
                                                   nn.Linear(2 * dim, dim))
                                     for _ in range(depth)])

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


CAST_STORAGES = [torch.float16] + ([torch.float8_e4m3fn] if HAS_FP8 else [])


@pytest.mark.parametrize("storage", CAST_STORAGES, ids=str)
@pytest.mark.parametrize("backend,opts", ROUTES)
def test_layerwise_casting_every_route(backend, opts, storage):
    m = layerwise_cast(CastNet(seed=11), storage, torch.float32)
    x = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(12))
    ref = steps(m, x, 2)
    params = dict(m.named_parameters())
    r = ddo.enable_offload(m, backend=backend, **opts)
    try:
        assert all(t.torch_dtype == storage for t in r._tensors)  # streamed as stored
        assert all(torch.equal(o, ref[0]) for o in steps(r.module, x, 3))
        assert all(p is params[n] for n, p in m.named_parameters())
        for t in r._tensors:  # resident weights show ddo's views again, not torch's copies
            if t.placement == 0:
                assert all(p.dtype == storage and p.data_ptr() == r._views[(t.index, 0)]
                           .data_ptr() for p in t.params)
        with pytest.raises(ddo.DdoError, match="a dtype or device move"):
            m.blocks[0][0].to(dtype=torch.float32)  # outside a forward: refused, as before
    finally:
        r.close()
    assert all(p.dtype == storage for p in m.parameters())
    assert torch.equal(steps(m, x, 1)[0], ref[0])


# ---- file-backed: a GGUF file written here ----

def write_gguf(path, tensors):
    """A GGUF v3 file (no metadata, alignment 32) of name -> (GGML type id, element shape,
    uint8 bytes as stored), written by hand (the format: docs/formats.md, "GGUF")."""
    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0)
    infos, blobs, off = b"", [], 0
    for name, (gtype, shape, raw) in tensors.items():
        infos += string(name) + struct.pack("<I", len(shape))
        infos += b"".join(struct.pack("<Q", d) for d in reversed(shape))
        infos += struct.pack("<IQ", gtype, off)
        data = raw.contiguous().numpy().tobytes()
        blobs.append(data + b"\0" * (-len(data) % 32))
        off += len(blobs[-1])
    body = head + infos
    with open(path, "wb") as f:
        f.write(body + b"\0" * (-len(body) % 32) + b"".join(blobs))


class GGUFNet(nn.Module):
    """Q8_0 stand-in layers (GGUF-like Parameters) in blocks; a float32 embedder."""

    def __init__(self, dim=64, depth=3, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList([Q8Linear(dim, dim, g) for _ in range(depth)])

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = x + b(x)
        return x


def test_file_backed_gguf(tmp_path):
    src = GGUFNet(seed=13)
    tensors = {}
    for name, p in src.named_parameters():
        if isinstance(p, GGUFLikeParameter):
            rows, nbytes = p.shape
            tensors[name] = (Q8_0, (rows, nbytes // 34 * 32), p.as_tensor())
        else:
            tensors[name] = (0, tuple(p.shape), p.detach().contiguous().view(-1)
                             .view(torch.uint8))
    path = tmp_path / "q8.gguf"
    write_gguf(path, tensors)
    x = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(14))
    ref = steps(src, x, 1)[0]
    res = ddo.from_pretrained_with_dynamic_offload(str(path), model_loader=lambda p: GGUFNet())
    m = res.module
    w = m.blocks[0].weight
    assert type(w) is GGUFLikeParameter and w.quant_type == Q8_0 and w.device.type == "meta"
    r = ddo.enable_offload(m, backend="linear", **ZERO_RESIDENT)
    try:
        assert r._source == str(path)
        names = {t.name: t for t in r._tensors}
        assert names["blocks.0.weight"].dtype_name == "Q8_0"
        s1 = r.metrics_snapshot(collect_completed=True)
        assert all(torch.equal(o, ref) for o in steps(m, x, STEPS))
        s2 = r.metrics_snapshot(collect_completed=True)
        assert type(m.blocks[0].weight) is GGUFLikeParameter
        assert m.blocks[0].weight.quant_type == Q8_0
        per_unit = {}
        for t in r._tensors:
            if t.placement == 1:
                per_unit[t.unit] = per_unit.get(t.unit, 0) + tensors[t.name][2].numel()
        moved = s2.get("copy_bytes") - s1.get("copy_bytes")
        total, edge = sum(per_unit.values()), r.budgets()["slot_count"] * max(per_unit.values())
        assert abs(moved - STEPS * total) <= edge, (moved, total)
        assert r.plan["planner_decisions"]["dequant_scratch_bytes"] == 64 * 64 * 4
    finally:
        r.close()
    assert m.blocks[0].weight.device.type == "meta" and m.blocks[0].weight.quant_type == Q8_0
    # The routes that do not stream read the file into host tensors (materialize): the same
    # GGUF-like Parameters, bytes as stored.
    res = ddo.from_pretrained_with_dynamic_offload(str(path), model_loader=lambda p: GGUFNet())
    from ddo.loading import materialize
    m2 = materialize(res.module, str(path))
    assert type(m2.blocks[1].weight) is GGUFLikeParameter
    assert m2.blocks[1].weight.quant_type == Q8_0
    assert torch.equal(steps(m2, x, 1)[0], ref)


def test_component_ownership_takes_gguf_like_parameters():
    """vmm_component_tensor_ownership (every tensor of a component owned by ddo) accepts the
    GGUF-like Parameter subclass; a torch qint parameter is still refused with one line."""
    m = QuantNet(seed=15)
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(16))
    ref = steps(m, x, 1)[0]
    own = dict(ZERO_RESIDENT, backend="vmm", vmm_component_tensor_ownership=True)
    r = ddo.enable_offload(m, component="text_encoder", route="dynamic", environ={}, **own)
    try:
        assert r.ownership["tensors"] == len(list(m.parameters()))
        assert any(t.placement == 1 and t.dtype_name == "U8" for t in r._tensors)
        assert torch.equal(steps(r.module, x, 1)[0], ref)
        assert type(m.blocks[0].q.weight) is GGUFLikeParameter
    finally:
        r.close()
    q = nn.Sequential(nn.Linear(8, 8))
    q[0].weight = nn.Parameter(torch.quantize_per_tensor(torch.randn(8, 8), 0.1, 0,
                                                          torch.qint8), requires_grad=False)
    with pytest.raises(ddo.DdoError, match="ownership.*0.weight"):
        ddo.enable_offload(q, component="text_encoder", route="dynamic", environ={}, **own)
