"""TorchAO-style wrapper tensor subclasses streamed as their inner tensors (docs/formats.md,
"From Python"): the inner float8 / uint8 data and scale of each quantized weight are a unit's
stored tensors, rebound in place at every swap; the wrapper Parameter (its object, type and
attributes) survives every step, unload/reload and close; outputs bit-identical to the
unmanaged module on every route of the cpu device; the bytes moved per step equal to the
stored bytes; wrappers whose inner tensors cannot be moved faithfully refused with one line.

StandInFloat8WeightOnly is a STAND-IN written for these tests (no TorchAO in CI): a wrapper
made with torch.Tensor._make_wrapper_subclass over ``qdata`` (float8_e4m3fn where torch has it,
uint8 E4M3 bytes on torch 1.13) and a float32 ``scale`` per output row, with the flatten
protocol and a weight-only dequantizing F.linear (__torch_function__) and aten.t / aten.mm
(__torch_dispatch__), as TorchAO's float8 weight-only tensors do."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map

import ddo
from conftest import ZERO_RESIDENT
from test_quantized import E4M3, ROUTES, e4m3_encode, moved_as_stored, StackNet, STEPS

HAS_FP8 = hasattr(torch, "float8_e4m3fn")
QDTYPES = [torch.uint8] + ([torch.float8_e4m3fn] if HAS_FP8 else [])


class WeightOnlyDispatch(torch.Tensor):
    """The two stand-ins' torch function and dispatch: weight_only_function / _dispatch."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return weight_only_function(cls, func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return weight_only_dispatch(cls, func, args, kwargs or {})


class StandInFloat8WeightOnly(WeightOnlyDispatch):
    """STAND-IN for TorchAO's float8 weight-only tensor: inner ``qdata`` and ``scale``; the
    wrapper's own dtype is the compute dtype (float32 here)."""

    @staticmethod
    def __new__(cls, qdata, scale, dtype=torch.float32):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=dtype,
                                                   device=qdata.device, requires_grad=False)

    def __init__(self, qdata, scale, dtype=torch.float32):
        self.qdata = qdata
        self.scale = scale
        self.recipe = "float8_weight_only"  # an attribute that must survive every swap

    def __repr__(self):
        return f"StandInFloat8WeightOnly(shape={tuple(self.shape)}, qdata={self.qdata.dtype})"

    def __tensor_flatten__(self):
        return ["qdata", "scale"], self.dtype

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size=None, outer_stride=None):
        return cls(inner["qdata"], inner["scale"], ctx)

    def dequantize(self):
        q = self.qdata
        w = E4M3[q.long()] if q.dtype == torch.uint8 else q.to(torch.float32)
        return (w * self.scale[:, None]).to(self.dtype)

    def detached(self):
        """aten.detach (nn.Parameter(...) calls it): a wrapper over detached inner aliases."""
        return type(self)(self.qdata.detach(), self.scale.detach(), self.dtype)


def weight_only_function(cls, func, args, kwargs):
    """TorchAO's weight-only F.linear: the weight dequantized, then a plain linear."""
    if func is F.linear and isinstance(args[1], cls):
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        return F.linear(args[0], args[1].dequantize(), bias)
    with torch._C.DisableTorchFunction():
        return func(*args, **kwargs)


def weight_only_dispatch(cls, func, args, kwargs):
    if func is torch.ops.aten.detach.default:
        out = args[0].detached()
        out.recipe = args[0].recipe
        return out
    if func in (torch.ops.aten.t.default, torch.ops.aten.mm.default,
                torch.ops.aten.addmm.default, torch.ops.aten.matmul.default):
        return func(*tree_map(lambda a: a.dequantize() if isinstance(a, cls) else a, args),
                    **kwargs)
    raise NotImplementedError(f"{cls.__name__}: {func}")


class StandInAffineQuantized(WeightOnlyDispatch):
    """STAND-IN for TorchAO's AffineQuantizedTensor (its float8 weight-only form): the data
    and scale live in an inner wrapper, ``tensor_impl`` (the flat stand-in above plays AQT's
    Float8AQTTensorImpl), flattened as ["tensor_impl"] with a context of attributes."""

    @staticmethod
    def __new__(cls, tensor_impl, dtype=torch.float32):
        return torch.Tensor._make_wrapper_subclass(cls, tensor_impl.shape, dtype=dtype,
                                                   device=tensor_impl.device,
                                                   requires_grad=False)

    def __init__(self, tensor_impl, dtype=torch.float32):
        self.tensor_impl = tensor_impl
        self.recipe = "affine_quantized"

    def __repr__(self):
        return f"StandInAffineQuantized(shape={tuple(self.shape)})"

    def __tensor_flatten__(self):
        return ["tensor_impl"], [self.shape, self.dtype]

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size=None, outer_stride=None):
        return cls(inner["tensor_impl"], ctx[1])

    def dequantize(self):
        return self.tensor_impl.dequantize().to(self.dtype)

    def detached(self):
        return type(self)(self.tensor_impl.detach(), self.dtype)


def quantize(w, qdtype, nested=False):
    """float [out, in] -> a wrapper Parameter: a scale per row into E4M3's range (448);
    nested: the AffineQuantizedTensor stand-in over the flat one."""
    scale = (w.abs().amax(dim=1) / 448).clamp_min(1e-12)
    code = e4m3_encode(w / scale[:, None])
    qdata = code if qdtype == torch.uint8 else code.view(qdtype)
    t = StandInFloat8WeightOnly(qdata, scale.float())
    return nn.Parameter(StandInAffineQuantized(t) if nested else t, requires_grad=False)


class TLinear(nn.Linear):
    """nn.Linear whose weight is swapped for the stand-in (TorchAO's quantize_ does that)."""

    def __init__(self, n_in, n_out, g, qdtype, nested=False):
        super().__init__(n_in, n_out)
        self.weight = quantize(torch.randn(n_out, n_in, generator=g) * 0.05, qdtype, nested)
        self.bias = nn.Parameter(torch.randn(n_out, generator=g) * 0.01, requires_grad=False)


class MMLinear(nn.Module):
    """Reads its wrapper weight through aten.t and aten.mm (no F.linear)."""

    def __init__(self, n_in, n_out, g, qdtype, nested=False):
        super().__init__()
        self.weight = quantize(torch.randn(n_out, n_in, generator=g) * 0.05, qdtype, nested)

    def forward(self, x):
        return torch.mm(x.reshape(-1, x.shape[-1]), self.weight.t()).reshape(
            *x.shape[:-1], self.weight.shape[0])


class Block(nn.Module):
    def __init__(self, dim, g, qdtype, nested):
        super().__init__()
        self.a = TLinear(dim, 2 * dim, g, qdtype, nested)
        self.b = MMLinear(2 * dim, dim, g, qdtype, nested)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


class WrapNet(StackNet):
    def __init__(self, dim=64, depth=4, seed=0, qdtype=torch.uint8, nested=False):
        super().__init__(dim, depth, seed, lambda g: Block(dim, g, qdtype, nested))


WRAPPERS = (StandInFloat8WeightOnly, StandInAffineQuantized)


def wrappers(m):
    return {n: p for n, p in m.named_parameters() if isinstance(p, WRAPPERS)}


def leaves(p):
    """[(path, plain inner tensor)] of a stand-in wrapper, as ddo names them."""
    if isinstance(p, StandInAffineQuantized):
        return [("tensor_impl:" + a, t) for a, t in leaves(p.tensor_impl)]
    return [("qdata", p.qdata), ("scale", p.scale)]


def objects(p):
    """The wrapper, its type and attributes, its inner wrapper and inner tensor objects."""
    return (p, type(p), p.recipe, getattr(p, "tensor_impl", None),
            tuple(t for _a, t in leaves(p)))


def snapshot(m):
    return {n: objects(p) for n, p in wrappers(m).items()}


def same_objects(m, before):
    for n, p in wrappers(m).items():
        assert objects(p) == before[n], n
    assert set(wrappers(m)) == set(before)


def steps(m, x, n=3):
    with torch.no_grad():
        return [m(x) for _ in range(n)]


def test_stand_in_dequantizes_on_both_paths():
    """The stand-in itself: F.linear and aten.t/aten.mm both see the dequantized weight."""
    g = torch.Generator().manual_seed(0)
    lin, mm = TLinear(32, 16, g, torch.uint8), MMLinear(32, 16, g, torch.uint8)
    x = torch.randn(3, 32, generator=g)
    assert torch.equal(lin(x), F.linear(x, lin.weight.dequantize(), lin.bias))
    assert torch.equal(mm(x), x @ mm.weight.dequantize().t())
    assert type(lin.weight) is StandInFloat8WeightOnly and lin.weight.recipe


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("qdtype", QDTYPES, ids=str)
@pytest.mark.parametrize("backend,opts", ROUTES)
def test_wrapper_bit_identical_and_stored_bytes_every_route(backend, opts, qdtype, nested):
    m = WrapNet(seed=1, qdtype=qdtype, nested=nested)
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(2))
    ref = steps(m, x)
    before = snapshot(m)
    inner = {}  # ddo's name of every stored tensor -> its bytes as the module holds them
    for n, p in m.named_parameters():
        if isinstance(p, WRAPPERS):
            for path, t in leaves(p):
                inner[f"{n}:{path}"] = t.numel() * t.element_size()
        else:
            inner[n] = p.numel() * p.element_size()
    r = ddo.enable_offload(m, backend=backend, **opts)
    try:
        names = {t.name: t for t in r._tensors}
        assert set(names) == set(inner), sorted(set(names) ^ set(inner))
        pre = ":tensor_impl" if nested else ""
        for n in wrappers(m):  # the data and its scale travel in the layer's unit
            assert names[f"{n}{pre}:qdata"].unit == names[f"{n}{pre}:scale"].unit
            assert names[f"{n}{pre}:qdata"].dtype_name in ("U8", "F8_E4M3")
        resident_units = {i for i, u in enumerate(r.plan["units"]) if u.get("resident")}
        streamed = [t for t in r._tensors if t.placement == 1 and t.unit not in resident_units]
        assert any(t.name.endswith(":qdata") for t in streamed)
        outs = steps(r.module, x, 1)
        snap1 = r.metrics_snapshot(collect_completed=True)
        outs += steps(r.module, x, STEPS)
        snap2 = r.metrics_snapshot(collect_completed=True)
        assert all(torch.equal(o, ref[0]) for o in outs)
        # the stored bytes (1 byte a weight plus the scales), never a dequantized copy
        moved_as_stored(r, streamed, inner, opts, snap2.get("copy_bytes") -
                        snap1.get("copy_bytes"), ("U8", "F8_E4M3"))
        same_objects(m, before)
        # Between forwards a streamed unit's inner tensors show the empty placeholder (the
        # wrapper itself is untouched); a unit still leased shows its whole bytes.
        shown = [leaves(p)[0][1].numel() for p in wrappers(m).values()]
        assert all(k in (0, p.numel()) for k, p in zip(shown, wrappers(m).values()))
        assert 0 in shown or resident_units
        r.unload()
        r.reload()
        assert torch.equal(steps(r.module, x, 1)[0], ref[0])
        same_objects(m, before)
    finally:
        r.close()
    assert r.device_bytes_after_close == 0
    same_objects(m, before)
    for n, p in wrappers(m).items():  # the host bytes are back in the very inner tensors
        (_a, q), (_b, sc) = leaves(p)
        assert q.shape == p.shape and sc.shape == (p.shape[0],)
    assert torch.equal(steps(m, x, 1)[0], ref[0])  # unmanaged again, same values


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_wrapper_state_dict_holds_the_host_values(nested):
    m = WrapNet(seed=4, nested=nested)
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(5))
    ref_sd = {k: [t.clone() for _a, t in leaves(v)] if isinstance(v, WRAPPERS) else v.clone()
              for k, v in m.state_dict().items()}
    before = snapshot(m)
    r = ddo.enable_offload(m, backend="vmm", **ZERO_RESIDENT)
    try:
        steps(r.module, x, 2)
        sd = r.module.state_dict()
        for k, v in ref_sd.items():
            if isinstance(sd[k], WRAPPERS):  # a wrapper of the type, over the host values
                live = r.module.get_parameter(k)
                assert type(sd[k]) is live.__class__ and sd[k] is not live, k
                got = [t for _a, t in leaves(sd[k])]
                assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                           for a, b in zip(got[:1], v[:1])), k
                assert torch.equal(got[1], v[1]), k
                assert sd[k].recipe == ("affine_quantized" if nested else "float8_weight_only")
            else:
                assert type(v) is torch.Tensor and torch.equal(sd[k], v), k
        assert any(isinstance(v, WRAPPERS) for v in sd.values())
        same_objects(m, before)
        # keep_vars: the wrapper Parameters themselves
        kept = r.module.state_dict(keep_vars=True)
        assert all(kept[n] is p for n, p in wrappers(m).items())
    finally:
        r.close()


def test_wrapper_scratch_is_its_dequantized_size():
    m = WrapNet(seed=6)
    r = ddo.enable_offload(m, backend="linear", **ZERO_RESIDENT)
    try:  # the largest wrapper: 128 x 64 (and 64 x 128) weights at float32
        assert r.dequant_scratch["bytes"] == 128 * 64 * 4, r.dequant_scratch
    finally:
        r.close()


# ---- refusals: one line each, the module untouched ----

def wrapped_linear(make):
    lin = nn.Linear(16, 8)
    lin.weight = nn.Parameter(make(), requires_grad=False)
    return lin


def refused(lin, match):
    before = objects(lin.weight)
    with pytest.raises(ddo.DdoError, match=match) as e:
        ddo.enable_offload(lin, **ZERO_RESIDENT)
    assert "\n" not in str(e.value)
    assert not hasattr(lin, "_ddo_offload")
    assert objects(lin.weight) == before


def test_wrappers_ddo_cannot_rebind_are_named(without_diffusers):
    code = e4m3_encode(torch.randn(8, 16) * 0.1)
    row = torch.ones(8)

    class NoInner(StandInFloat8WeightOnly):
        def __tensor_flatten__(self):
            return [], self.dtype

    refused(wrapped_linear(lambda: NoInner(code, row)),
            r"parameter weight: NoInner is a wrapper tensor subclass .*names no inner tensors"
            r".*compatibility route")
    strided = torch.zeros(16, 8, dtype=torch.uint8).t()
    refused(wrapped_linear(lambda: StandInFloat8WeightOnly(strided, row)),
            r"parameter weight: .*inner tensor qdata is not contiguous")

    class Nested(torch.Tensor):
        """An inner tensor that is itself a subclass."""

    lin = wrapped_linear(lambda: StandInFloat8WeightOnly(code, row))
    lin.weight.scale = row.as_subclass(Nested)
    refused(lin, r"inner tensor scale is a Nested, itself a subclass")

    class Broken(StandInFloat8WeightOnly):
        def __tensor_flatten__(self):
            raise RuntimeError("no protocol here")

    refused(wrapped_linear(lambda: Broken(code, row)),
            r"__tensor_flatten__\(\) failed \(RuntimeError: no protocol here\)")

    class Missing(StandInFloat8WeightOnly):
        def __tensor_flatten__(self):
            return ["qdata", "zero_point"], self.dtype

    refused(wrapped_linear(lambda: Missing(code, row)),
            r"inner attribute zero_point is not a tensor")
    # inside an inner wrapper (AffineQuantizedTensor's tensor_impl): named by its path
    refused(wrapped_linear(lambda: StandInAffineQuantized(StandInFloat8WeightOnly(strided, row))),
            r"parameter weight: StandInAffineQuantized is a wrapper tensor subclass .*inner "
            r"tensor tensor_impl:qdata is not contiguous")
    refused(wrapped_linear(lambda: StandInAffineQuantized(NoInner(code, row))),
            r"its inner tensor tensor_impl \(a NoInner\): __tensor_flatten__\(\) names no "
            r"inner tensors")

    class Shared(StandInFloat8WeightOnly):
        def __tensor_flatten__(self):
            return ["qdata", "scale", "alias"], self.dtype

    lin = wrapped_linear(lambda: Shared(code, row))
    lin.weight.alias = lin.weight.scale  # (set on the Parameter: its detach made new inners)
    with pytest.raises(ddo.DdoError, match=r"inner tensor alias is the same tensor as another"):
        ddo.enable_offload(lin, **ZERO_RESIDENT)


def test_unstreamable_wrappers_take_the_compatibility_route(monkeypatch):
    """Where Diffusers is importable (the GPU machine) the auto route sends a module ddo cannot
    stream to Diffusers' group offload, naming the parameter and why, instead of refusing."""
    from ddo import routing
    monkeypatch.setattr(routing, "_diffusers_available", lambda: True)

    class NoInner(StandInFloat8WeightOnly):
        def __tensor_flatten__(self):
            return [], self.dtype

    lin = wrapped_linear(lambda: NoInner(e4m3_encode(torch.randn(8, 16) * 0.1), torch.ones(8)))
    pol, _cfg, _st = routing.resolve_route(lin, execution_device="cpu")
    assert pol["route"] == "diffusers_group_offload", pol
    assert "weight" in pol["route_source"] and "names no inner tensors" in pol["route_source"]
    monkeypatch.setattr(routing, "_diffusers_available", lambda: False)
    pol, _cfg, _st = routing.resolve_route(lin, execution_device="cpu")
    assert pol["route"] == "dynamic_offload", pol


def test_routing_keeps_streamable_wrappers(without_diffusers):
    from ddo import routing
    m = WrapNet(seed=8)
    assert routing.detect_quantized_backend_modules(m) == {}
    pol, _cfg, _st = routing.resolve_route(m, execution_device="cpu")
    assert pol["route"] == "dynamic_offload", pol


def test_component_ownership_refuses_wrappers():
    """vmm_component_tensor_ownership takes each Parameter as one tensor: a wrapper is
    refused there with one line (it streams on the default ownership)."""
    m = WrapNet(seed=9)
    own = dict(ZERO_RESIDENT, backend="vmm", vmm_component_tensor_ownership=True)
    with pytest.raises(ddo.DdoError, match=r"ownership.*blocks\.0\.a\.weight is a "
                       r"StandInFloat8WeightOnly, a wrapper tensor subclass") as e:
        ddo.enable_offload(m, component="transformer", route="dynamic", environ={}, **own)
    assert "\n" not in str(e.value) and not hasattr(m, "_ddo_offload")
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(10))
    r = ddo.enable_offload(m, component="transformer", route="dynamic", environ={},
                           **dict(own, vmm_component_tensor_ownership=False))
    try:  # the default ownership streams it
        assert any(t.name == "blocks.0.a.weight:qdata" for t in r._tensors)
        steps(r.module, x, 1)
    finally:
        r.close()


def test_one_session_per_tree_counts_wrappers():
    """A wrapper's inner tensors are what a session registers: a second enable_offload on a
    parent of a managed module names the wrapper parameter."""
    m = WrapNet(seed=11)
    r = ddo.enable_offload(m.blocks[0], **ZERO_RESIDENT)
    try:
        with pytest.raises(ddo.DdoError, match=r"parameter blocks\.0\.a\.weight is already "
                           r"managed by ddo"):
            ddo.enable_offload(m, **ZERO_RESIDENT)
    finally:
        r.close()


class WLin(nn.Module):
    """A linear layer over the stand-in's weight computing in float32 (the LoRA model's
    activations are bf16), with the in/out features PEFT's layers read."""

    def __init__(self, n_in, n_out, g):
        super().__init__()
        self.in_features, self.out_features = n_in, n_out
        self.weight = quantize(torch.randn(n_out, n_in, generator=g) * 0.05, torch.uint8)

    def forward(self, x):
        return F.linear(x.float(), self.weight).to(x.dtype)


def test_lora_over_a_wrapper_weight():
    """An unmerged LoRA over a wrapper layer works while streaming (applied after the layer's
    own dequantization), bit-identical to the unmanaged model; fusing it is refused by name
    (ddo does not dequantize, merge and requantize), nothing merged."""
    from test_lora import DIM, StandInDiffusersModel

    def build():
        torch.manual_seed(3)
        m = StandInDiffusersModel()
        g = torch.Generator().manual_seed(4)
        for b in m.blocks:
            b.up, b.down = WLin(DIM, 2 * DIM, g), WLin(2 * DIM, DIM, g)
        return m

    ref, m = build(), build()
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    r = ddo.enable_offload(m, backend="vmm", **ZERO_RESIDENT)
    try:
        for mm in (ref, r.module):
            mm.load_lora_adapter("a", 1)
        assert torch.equal(steps(r.module, x, 1)[0], steps(ref, x, 1)[0])
        with pytest.raises(ddo.DdoError, match=r"blocks\.0\.up: a StandInLoraLinear LoRA layer "
                           r"over a StandInFloat8WeightOnly weight \(a wrapper tensor subclass"
                           r", stored quantized") as e:
            r.module.fuse_lora()
        assert "\n" not in str(e.value)
        assert all(not layer.merged_adapters for layer in r.module._layers())
        assert torch.equal(steps(r.module, x, 1)[0], steps(ref, x, 1)[0])
    finally:
        r.close()
    assert torch.equal(steps(m, x, 1)[0], steps(ref, x, 1)[0])
