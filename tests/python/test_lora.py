"""LoRA on a managed module (cpu device, torch 1.13): load, switch, fuse and unfuse sequences
bit-identical to the same sequence on an unmanaged copy, zero-resident and with residents, from
host memory (enable_offload) and from files (from_pretrained_with_dynamic_offload); the
checkpoint never re-read for a switch or a fuse (metrics); bad input refused with one line,
nothing lost, the module usable after.

There is no PEFT or Diffusers in CI: StandInLoraLinear STANDS IN FOR PEFT's lora.Linear (its
parts a merge uses: base_layer, lora_A / lora_B ModuleDicts, scaling, merged_adapters,
active_adapters, set_adapter, set_scale, get_delta_weight, merge(safe_merge, adapter_names),
unmerge(), with PEFT's arithmetic: unsafe merge ``w += delta``, safe merge
``w + delta.to(dtype)`` checked finite, unmerge ``w -= delta.to(dtype)`` newest first), and
StandInDiffusersModel's methods STAND IN FOR Diffusers' PeftAdapterMixin (load_lora_adapter,
set_adapters, fuse_lora, unfuse_lora, unload_lora, delete_adapters)."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddo
from conftest import ZERO_RESIDENT
from ddo.offload import _nbytes
from test_pipeline_loading import write_safetensors

# Some blocks resident, the others streamed.
WITH_RESIDENTS = dict(ZERO_RESIDENT, always_resident_modules_pattern=r"^blocks\.[02]\.")
DIM, DEPTH = 32, 4


class Lin(nn.Linear):
    """Computes in float32 (torch 1.13 has no CPU bf16 matmul everywhere)."""

    def forward(self, x):
        b = self.bias.float() if self.bias is not None else None
        return F.linear(x.float(), self.weight.float(), b).to(x.dtype)


class StandInLoraLinear(nn.Module):
    """STAND-IN for PEFT's lora.Linear (see the module docstring): no PEFT in CI."""

    def __init__(self, base_layer):
        super().__init__()
        self.base_layer = base_layer
        self.lora_A, self.lora_B = nn.ModuleDict(), nn.ModuleDict()
        self.scaling, self.r, self.lora_alpha = {}, {}, {}
        self.merged_adapters = []
        self._active = []
        self.disable_adapters = False
        self.lora_variant, self.lora_bias = {}, {}

    def get_base_layer(self):
        return self.base_layer

    def update_layer(self, name, r, alpha, gen, out=None, variant=None):
        base = self.base_layer
        out = out or base.out_features
        dt = base.weight.dtype  # as PEFT: the base weight's dtype where it is a float one
        dt = dt if dt.is_floating_point else torch.float32
        self.lora_A[name] = Lin(base.in_features, r, bias=False).to(dt)
        self.lora_B[name] = Lin(r, out, bias=False).to(dt)
        with torch.no_grad():  # PEFT's default init: B zero (the weights are loaded after)
            self.lora_A[name].weight.copy_(torch.randn(self.lora_A[name].weight.shape,
                                                       generator=gen))
            self.lora_B[name].weight.zero_()
        self.r[name], self.lora_alpha[name] = r, alpha
        self.scaling[name] = alpha / r
        self.lora_bias[name] = False
        if variant is not None:
            self.lora_variant[name] = variant
        if not self._active:
            self._active = [name]

    @property
    def merged(self):
        return bool(self.merged_adapters)

    @property
    def active_adapters(self):
        return list(self._active)

    def set_adapter(self, names):
        self._active = [names] if isinstance(names, str) else list(names)

    def set_scale(self, name, scale):
        self.scaling[name] = scale * self.lora_alpha[name] / self.r[name]

    def delete_adapter(self, name):
        for d in (self.lora_A, self.lora_B):
            del d[name]
        for d in (self.scaling, self.r, self.lora_alpha):
            d.pop(name)
        self._active = [a for a in self._active if a != name]

    def get_delta_weight(self, adapter):
        a, b = self.lora_A[adapter].weight, self.lora_B[adapter].weight
        dtype = b.dtype
        cast = b.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
        if cast:
            a, b = a.float(), b.float()
        out = (b @ a) * self.scaling[adapter]
        if cast:  # as PEFT: the adapter's weights cast back, rebound through .data
            out = out.to(dtype)
            self.lora_A[adapter].weight.data = a.to(dtype)
            self.lora_B[adapter].weight.data = b.to(dtype)
        return out

    def merge(self, safe_merge=False, adapter_names=None):
        names = self.active_adapters if adapter_names is None else adapter_names
        names = [n for n in names if n not in self.merged_adapters]
        base = self.get_base_layer()
        for n in names:
            if n not in self.lora_A.keys():
                continue
            if safe_merge:
                w = base.weight.data.clone()
                w += self.get_delta_weight(n).to(w.dtype)
                if not torch.isfinite(w).all():
                    raise ValueError(f"NaNs detected in the merged weights. The adapter {n} "
                                     f"seems to be broken")
                base.weight.data = w
            else:
                base.weight.data += self.get_delta_weight(n)
            self.merged_adapters.append(n)

    def unmerge(self):
        if not self.merged:
            warnings.warn("Already unmerged. Nothing to do.")
            return
        while self.merged_adapters:
            n = self.merged_adapters.pop()
            if n in self.lora_A.keys():
                w = self.get_base_layer().weight
                w.data -= self.get_delta_weight(n).to(w.dtype)

    def forward(self, x):
        out = self.base_layer(x)
        if self.disable_adapters or self.merged:
            return out
        for n in self._active:
            if n in self.lora_A.keys():
                out = out + (self.lora_B[n](self.lora_A[n](x)) * self.scaling[n]).to(out.dtype)
        return out


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = Lin(dim, 2 * dim)
        self.down = Lin(2 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class StandInDiffusersModel(nn.Module):
    """A model whose LoRA methods STAND IN FOR Diffusers' PeftAdapterMixin."""

    def __init__(self, dim=DIM, depth=DEPTH, dtype=torch.bfloat16):
        super().__init__()
        self.embed = Lin(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.proj_out = Lin(dim, dim)
        self.to(dtype)

    @classmethod
    def load_config(cls, path, subfolder=None):
        return {}

    @classmethod
    def from_config(cls, config, **kwargs):
        return cls(**config, **kwargs)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.proj_out(x)

    def _layers(self):
        return [m for m in self.modules() if isinstance(m, StandInLoraLinear)]

    def load_lora_adapter(self, name, seed, rank=4, alpha=8, targets=("up", "down"), out=None,
                          variant=None):
        """As Diffusers does it: the layers injected (PEFT's inject_adapter_in_model), then the
        adapter's weights loaded through the model's own load_state_dict(strict=False) (PEFT's
        set_peft_model_state_dict)."""
        gen = torch.Generator().manual_seed(seed)
        weights = {}
        for i, b in enumerate(self.blocks):
            for tname in targets:
                layer = getattr(b, tname)
                if not isinstance(layer, StandInLoraLinear):
                    layer = StandInLoraLinear(layer)
                    setattr(b, tname, layer)
                layer.update_layer(name, rank, alpha, gen, out=out, variant=variant)
                for ab in ("lora_A", "lora_B"):
                    w = getattr(layer, ab)[name].weight
                    weights[f"blocks.{i}.{tname}.{ab}.{name}.weight"] = \
                        (torch.randn(w.shape, generator=gen) * 0.3).to(w.dtype)
        result = self.load_state_dict(weights, strict=False)
        assert not result.unexpected_keys

    def set_adapters(self, names, weights=None):
        names = [names] if isinstance(names, str) else list(names)
        weights = weights or [1.0] * len(names)
        for layer in self._layers():
            layer.set_adapter(names)
            for n, w in zip(names, weights):
                layer.set_scale(n, w)

    def fuse_lora(self, lora_scale=1.0, safe_fusing=False, adapter_names=None):
        for layer in self._layers():
            if lora_scale != 1.0:
                for n in layer.active_adapters:
                    layer.scaling[n] *= lora_scale
            layer.merge(safe_merge=safe_fusing, adapter_names=adapter_names)

    def unfuse_lora(self):
        for layer in self._layers():
            layer.unmerge()

    def delete_adapters(self, names):
        for layer in self._layers():
            for n in [names] if isinstance(names, str) else names:
                layer.delete_adapter(n)

    def unload_lora(self):
        for b in self.blocks:
            for tname in ("up", "down"):
                layer = getattr(b, tname)
                if isinstance(layer, StandInLoraLinear):
                    setattr(b, tname, layer.get_base_layer())


def model(seed=0):
    torch.manual_seed(seed)
    return StandInDiffusersModel()


def twins(*adapters):
    """A reference model and one to manage, the same adapters loaded in both (the first with
    seed 1, the next 2, ...)."""
    ref, m = model(), model()
    for mm in (ref, m):
        for seed, name in enumerate(adapters, 1):
            mm.load_lora_adapter(name, seed)
    return ref, m


def step(m, x):
    with torch.no_grad():
        return m(x)


# A sequence of what users do: each entry is (method, args, kwargs) on the model, or "step".
SEQUENCE = [
    ("load_lora_adapter", ("a", 1), {}), "step",
    ("fuse_lora", (), {}), "step", "step",
    ("load_lora_adapter", ("b", 2), {}), ("set_adapters", (["a", "b"], [0.5, 1.25]), {}), "step",
    ("fuse_lora", (), {"adapter_names": ["b"], "safe_fusing": True}), "step",
    ("unfuse_lora", (), {}), "step",
    ("set_adapters", (["b"], [0.75]), {}), "step",
    ("fuse_lora", (), {"lora_scale": 0.5}), "step",
    ("set_adapters", (["a"], [2.0]), {}), "step",  # scale changed while b is merged
    ("unfuse_lora", (), {}), "step",
    ("fuse_lora", (), {"adapter_names": ["a", "b"]}), "step",
    ("delete_adapters", ("b",), {}), "step",  # deleted while fused: its merge stays
    ("unfuse_lora", (), {}), "step",  # takes out a only (b is no layer's adapter any more)
    ("fuse_lora", (), {}), "step",
    ("unload_lora", (), {}), "step", "step",  # fused and unloaded: the merge stays
]


def run_sequence(m, x, seq=SEQUENCE, between=None):
    outs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for entry in seq:
            if entry == "step":
                outs.append(step(m, x))
                continue
            name, args, kwargs = entry
            getattr(m, name)(*args, **kwargs)
            if between is not None:
                between(name)
    return outs


COUNTERS = ("bytes_staged_from_file", "file_rereads", "setup_read_bytes", "bytes_from_registered",
            "bytes_staged_from_retained", "bytes_resident_uploaded", "copy_bytes", "uploads")


def counters(r):
    """The byte and upload counters once every upload issued so far finished (the session
    prefetches the next pass's first units after a step, asynchronously)."""
    L = ddo._native.lib()
    assert L.ddo_session_synchronize(r._session) == 0
    snap = r.metrics_snapshot(collect_completed=True)
    return {k: snap.get(k) for k in COUNTERS}


def managed_sequence(r, x, seq=SEQUENCE):
    """seq on a managed module; every LoRA call is checked to read and upload nothing."""
    outs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for entry in seq:
            if entry == "step":
                outs.append(step(r.module, x))
                continue
            name, args, kwargs = entry
            before = counters(r)
            getattr(r.module, name)(*args, **kwargs)
            assert counters(r) == before, f"{name} moved weight bytes"
    return outs


@pytest.mark.parametrize("backend", ["vmm", "linear"])
@pytest.mark.parametrize("conf", ["zero_resident", "with_residents"])
@pytest.mark.parametrize("inject", ["after", "before"])
def test_sequence_from_host_memory_is_bit_identical(backend, conf, inject):
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref = model()
    m = model()
    seq = SEQUENCE
    if inject == "before":  # the first adapter is part of the module ddo manages
        ref.load_lora_adapter("a", 1)
        m.load_lora_adapter("a", 1)
        seq = SEQUENCE[1:]
    want = run_sequence(ref, x, seq)
    cfg = ZERO_RESIDENT if conf == "zero_resident" else WITH_RESIDENTS
    r = ddo.enable_offload(m, backend=backend, **cfg)
    try:
        placements = {t.placement for t in r._tensors}
        assert ddo._enums.DDO_PLACEMENT_STREAMED in placements
        if conf == "with_residents":
            assert ddo._enums.DDO_PLACEMENT_RESIDENT in placements
        got = managed_sequence(r, x, seq)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g, w), f"step {i} differs"
    finally:
        r.close()
    assert r.device_bytes_after_close == 0
    # closed: the module holds host copies with the merged adapters, as the unmanaged one
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n
    assert torch.equal(step(m, x), step(ref, x))


def test_merged_weights_differ_from_a_sum():
    # The reason for a log: (w + dA + dB) - dB is not w + dA in bf16; the sequence above
    # would not be bit-identical if ddo applied net deltas.
    ref = model()
    ref.load_lora_adapter("a", 1)
    ref.load_lora_adapter("b", 2)
    w0 = ref.blocks[1].up.base_layer.weight.detach().clone()
    ref.fuse_lora(adapter_names=["a"])
    wa = ref.blocks[1].up.base_layer.weight.detach().clone()
    ref.unfuse_lora()
    assert not torch.equal(ref.blocks[1].up.base_layer.weight, w0)  # (w + dA) - dA != w
    ref.fuse_lora(adapter_names=["a", "b"])
    ref.unfuse_lora()
    ref.fuse_lora(adapter_names=["a"])
    assert not torch.equal(ref.blocks[1].up.base_layer.weight, wa)


@pytest.mark.parametrize("conf", ["zero_resident", "with_residents", "no_store"])
def test_sequence_from_files_is_bit_identical_and_never_rereads(tmp_path, conf):
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref = model()
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {k: v.contiguous() for k, v in ref.state_dict().items()})
    want = run_sequence(ref, x)
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=StandInDiffusersModel)
    # no_store: no retained store, so every step reads the streamed weights from the file
    cfg = {"zero_resident": ZERO_RESIDENT, "with_residents": WITH_RESIDENTS,
           "no_store": dict(ZERO_RESIDENT, vmm_source_cache_gb=0)}[conf]
    r = ddo.enable_offload(res.module, component="transformer", environ={}, backend="vmm",
                           **cfg)
    try:
        assert r._source == str(path)
        step(r.module, x)
        plain = counters(r)
        step(r.module, x)
        per_step = {k: counters(r)[k] - plain[k] for k in COUNTERS}
        assert per_step["copy_bytes"] > 0 and per_step["uploads"] > 0  # the counters are live
        if conf == "no_store":
            assert per_step["bytes_staged_from_file"] > 0  # each step reads the file
        got = managed_sequence(r, x)
        for i, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g, w), f"step {i} differs"
        # a step with merged adapters moves at most one pass of the streamed weights, and no
        # resident weight is uploaded again (the merges never reload the session)
        streamed = sum(_nbytes(t) for t in r._tensors
                       if t.placement == ddo._enums.DDO_PLACEMENT_STREAMED)
        before = counters(r)
        step(r.module, x)
        after = counters(r)
        assert 0 < after["copy_bytes"] - before["copy_bytes"] <= streamed
        assert after["bytes_resident_uploaded"] == plain["bytes_resident_uploaded"]
        assert after["setup_read_bytes"] == plain["setup_read_bytes"]
    finally:
        r.close()


def test_many_switches_reuse_cached_copies_exactly_once():
    # Leaf units kept in their slots between forwards (hits): a new op is applied once to the
    # copy a slot still holds, the whole log to a fresh one.
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref, m = twins("a", "b")
    r = ddo.enable_offload(m, backend="linear", unit_granularity="leaf",
                           **dict(ZERO_RESIDENT, always_resident_modules_pattern="zzzz"))
    try:
        snap0 = r.metrics_snapshot(True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for k in range(6):
                names = [["a"], ["b"], ["a", "b"]][k % 3]
                for mm in (ref, r.module):
                    mm.fuse_lora(adapter_names=names)
                assert torch.equal(step(r.module, x), step(ref, x)), k
                assert torch.equal(step(r.module, x), step(ref, x)), k
                for mm in (ref, r.module):
                    mm.unfuse_lora()
                assert torch.equal(step(r.module, x), step(ref, x)), k
        snap = r.metrics_snapshot(True)
        assert snap.get("hits") > snap0.get("hits")  # some copies were reused, not re-uploaded
    finally:
        r.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("backend", ["vmm", "linear"])
def test_random_sequences_match_the_unmanaged_module(seed, backend):
    # Random fuses, unfuses, switches, unload/reload and steps on leaf units with few slots
    # (copies kept, evicted and reloaded in every pattern), some of them resident.
    import random
    rnd = random.Random(seed)
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref, m = twins("a", "b")
    r = ddo.enable_offload(m, backend=backend, unit_granularity="leaf", execution_slots=2,
                           **dict(ZERO_RESIDENT, always_resident_modules_pattern=r"blocks\.1\."))
    ops = [
        lambda mm: mm.fuse_lora(adapter_names=[rnd_names]),
        lambda mm: mm.fuse_lora(safe_fusing=True, lora_scale=rnd_scale),
        lambda mm: mm.unfuse_lora(),
        lambda mm: mm.set_adapters([rnd_names], [rnd_scale]),
        lambda mm: mm.set_adapters(["a", "b"], [rnd_scale, 1.0]),
    ]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(40):
                k = rnd.randrange(len(ops) + 2)
                rnd_names = rnd.choice(["a", "b"])  # read by the ops
                rnd_scale = rnd.choice([0.5, 1.0, 1.5])
                if k < len(ops):
                    for mm in (ref, r.module):
                        ops[k](mm)
                elif k == len(ops) and rnd.random() < 0.3:
                    r.unload()
                    r.reload()
                assert torch.equal(step(r.module, x), step(ref, x)), (seed, i, k)
    finally:
        r.close()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n


def test_unload_and_reload_replay_the_log():
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref, m = twins("a")
    r = ddo.enable_offload(m, backend="vmm", **WITH_RESIDENTS)
    try:
        ref.fuse_lora()
        r.module.fuse_lora()
        want = step(ref, x)
        assert torch.equal(step(r.module, x), want)
        r.unload()
        r.reload()  # residents uploaded again from the checkpoint: the log replayed once
        assert torch.equal(step(r.module, x), want)
        assert torch.equal(step(r.module, x), want)
    finally:
        r.close()


def stand_in_inject_adapter_in_model(model, name, seed):
    """STANDS IN FOR PEFT's inject_adapter_in_model: the layers replaced in place and the
    model's peft_config set (no method of the model is called)."""
    gen = torch.Generator().manual_seed(seed)
    for b in model.blocks:
        for tname in ("up", "down"):
            layer = getattr(b, tname)
            if not isinstance(layer, StandInLoraLinear):
                layer = StandInLoraLinear(layer)
                setattr(b, tname, layer)
            layer.update_layer(name, 4, 8, gen)
            with torch.no_grad():
                layer.lora_B[name].weight.copy_(torch.randn(layer.lora_B[name].weight.shape,
                                                            generator=gen))
    model.peft_config = dict(getattr(model, "peft_config", {}), **{name: {"r": 4}})


def stand_in_merge_adapter(model, adapter_names=None):
    """STANDS IN FOR PEFT's BaseTuner.merge_adapter: every tuner layer's merge, in module
    order (no method of the managed model is called)."""
    for m in model.modules():
        if isinstance(m, StandInLoraLinear):
            m.merge(adapter_names=adapter_names)


def test_layers_injected_by_peft_directly_are_taken_over_at_the_next_forward():
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref, m = model(), model()
    r = ddo.enable_offload(m, backend="vmm", **WITH_RESIDENTS)
    try:
        for mm in (ref, m):
            stand_in_inject_adapter_in_model(mm, "a", 5)
        assert torch.equal(step(m, x), step(ref, x))  # unmerged; the layers taken over here
        for mm in (ref, m):
            stand_in_merge_adapter(mm)
        assert torch.equal(step(m, x), step(ref, x))
        for mm in (ref, m):
            for layer in mm._layers():
                layer.unmerge()
        assert torch.equal(step(m, x), step(ref, x))
    finally:
        r.close()


def test_with_the_real_peft_where_installed():
    # CI has no PEFT (skipped there); where PEFT is installed, its own LoRA layers, injected
    # into the managed module by inject_adapter_in_model, merged and unmerged layer by layer
    # (as its merge_adapter and Diffusers' fuse_lora do), match the unmanaged module.
    pytest.importorskip("peft")
    import inspect
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import BaseTunerLayer
    x = torch.randn(2, 3, DIM)
    torch.manual_seed(0)
    ref = StandInDiffusersModel(dtype=torch.float32)
    torch.manual_seed(0)
    m = StandInDiffusersModel(dtype=torch.float32)
    r = ddo.enable_offload(m, backend="vmm", **WITH_RESIDENTS)
    try:
        for name, seed in (("a", 1), ("b", 2)):
            for mm in (ref, m):
                torch.manual_seed(seed)  # init_lora_weights=False: A and B random, B non-zero
                inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                   target_modules=["up", "down"]),
                                        mm, adapter_name=name)
        assert torch.equal(step(m, x), step(ref, x))  # the layers are taken over here

        def layers(mm):
            return [mod for mod in mm.modules() if isinstance(mod, BaseTunerLayer)]
        assert len(layers(m)) == 2 * DEPTH
        assert all("adapter_names" in inspect.signature(mod.merge).parameters
                   for mod in layers(m))  # what Diffusers' fuse_lora looks for

        def each(fn):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for mm in (ref, m):
                    for mod in layers(mm):
                        fn(mod)
            assert torch.equal(step(m, x), step(ref, x))
        each(lambda mod: mod.set_adapter(["a", "b"]))
        each(lambda mod: mod.merge(adapter_names=["a"]))
        each(lambda mod: mod.merge(safe_merge=True, adapter_names=["b"]))
        each(lambda mod: mod.set_scale("a", 0.5))
        each(lambda mod: mod.unmerge())
        each(lambda mod: mod.merge())
        each(lambda mod: mod.unmerge())
        each(lambda mod: mod.merge(adapter_names=["b"]))
    finally:
        r.close()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n


def test_merges_peft_made_on_resident_weights_before_the_takeover_are_kept():
    # Injected and merged by PEFT directly, no forward between: on resident weights the merge
    # reached the device copies; ddo logs it when it takes the layers over, so a reload (fresh
    # copies from the checkpoint) keeps it and an unmerge takes it out as unmanaged.
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref, m = model(), model()
    r = ddo.enable_offload(m, backend="vmm", **dict(ZERO_RESIDENT,
                                                    always_resident_modules_pattern="."))
    try:
        assert {t.placement for t in r._tensors} == {ddo._enums.DDO_PLACEMENT_RESIDENT}
        for mm in (ref, m):
            stand_in_inject_adapter_in_model(mm, "a", 5)
            stand_in_merge_adapter(mm)
        assert torch.equal(step(m, x), step(ref, x))  # taken over (and adopted) here
        r.unload()
        r.reload()
        assert torch.equal(step(m, x), step(ref, x))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for mm in (ref, m):
                for layer in mm._layers():
                    layer.unmerge()
        assert torch.equal(step(m, x), step(ref, x))
    finally:
        r.close()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n


# ---- bad input: one line, nothing lost, the module usable ----

def managed(seed=0, **kw):
    m = model(seed)
    m.load_lora_adapter("a", 1)
    return m, ddo.enable_offload(m, backend="vmm", **dict(WITH_RESIDENTS, **kw))


def one_line(e):
    assert "\n" not in str(e.value), str(e.value)


def test_a_lora_of_the_wrong_shape_is_refused_and_nothing_merged():
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    m, r = managed()
    try:
        want = step(r.module, x)
        r.module.load_lora_adapter("bad", 3, targets=("down",), out=DIM + 3)
        r.module.set_adapters(["a"])
        with pytest.raises(ddo.DdoError, match="does not match its base weight") as e:
            r.module.fuse_lora(adapter_names=["a", "bad"])
        one_line(e)
        # nothing merged anywhere (the up layers had merged "a" before the down layer refused)
        assert all(not layer.merged_adapters for layer in r.module._layers())
        assert torch.equal(step(r.module, x), want)
        r.module.fuse_lora(adapter_names=["a"])  # still usable
        ref = model()
        ref.load_lora_adapter("a", 1)
        ref.fuse_lora(adapter_names=["a"])
        assert torch.equal(step(r.module, x), step(ref, x))
    finally:
        r.close()


def test_fusing_two_then_unfusing_one_follows_peft():
    # PEFT's unmerge takes every merged adapter out (newest first): asking for one is refused
    # with one line; unmerging all, then merging the one to keep again, is what works.
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    ref, m = twins("a", "b")
    for mm in (ref, m):
        mm.set_adapters(["a", "b"])
    r = ddo.enable_offload(m, backend="vmm", **WITH_RESIDENTS)
    try:
        for mm in (ref, r.module):
            mm.fuse_lora(adapter_names=["a", "b"])
        layer = r.module.blocks[1].up
        with pytest.raises(ddo.DdoError, match="takes no adapter names") as e:
            layer.unmerge(["b"])
        one_line(e)
        assert layer.merged_adapters == ["a", "b"]
        assert torch.equal(step(r.module, x), step(ref, x))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for mm in (ref, r.module):
                mm.unfuse_lora()
                mm.fuse_lora(adapter_names=["a"])
        assert torch.equal(step(r.module, x), step(ref, x))
    finally:
        r.close()


def test_a_failed_call_undoes_the_merges_of_the_calls_inside_it():
    # Diffusers' methods call one another: a merge made by an inner call reaches no device copy
    # (residents included) before the outermost call returns, so undoing the outer undoes it.
    class Nested(StandInDiffusersModel):
        def set_adapters(self, names, weights=None):
            self.fuse_lora(adapter_names=["a"])  # an inner call that merges
            raise ValueError("the outer call fails after it")
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    torch.manual_seed(0)
    m = Nested()
    m.load_lora_adapter("a", 1)
    r = ddo.enable_offload(m, backend="vmm", **WITH_RESIDENTS)
    try:
        want = step(r.module, x)
        with pytest.raises(ValueError, match="outer call fails"):
            m.set_adapters(["a"])
        assert all(not layer.merged_adapters for layer in m._layers())
        assert torch.equal(step(r.module, x), want)  # resident copies untouched
    finally:
        r.close()


def test_switching_adapters_inside_a_forward_is_refused():
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    m, r = managed()
    try:
        want = step(r.module, x)

        def switch(mod, args):
            r.module.set_adapters(["a"], [3.0])
        h = r.module.blocks[1].register_forward_pre_hook(switch)
        with pytest.raises(ddo.DdoError, match="set_adapters: a forward") as e:
            step(r.module, x)
        one_line(e)
        h.remove()

        def fuse(mod, args):
            r.module.blocks[3].up.merge()  # its block is not leased: refused too
        h = r.module.blocks[1].register_forward_pre_hook(fuse)
        with pytest.raises(ddo.DdoError, match="merge: a forward") as e:
            step(r.module, x)
        h.remove()
        assert not r.module.blocks[3].up.merged_adapters
        assert torch.equal(step(r.module, x), want)
    finally:
        r.close()


class StandInDoraVariant:
    """STANDS IN FOR PEFT's DoraLinearVariant (only its name matters here)."""


def test_a_variant_is_refused_by_name():
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    m, r = managed()
    try:
        want = step(r.module, x)
        r.module.load_lora_adapter("d", 4, variant=StandInDoraVariant())
        r.module.set_adapters(["a"])
        with pytest.raises(ddo.DdoError, match="StandInDoraVariant") as e:
            r.module.fuse_lora(adapter_names=["a", "d"])
        one_line(e)
        assert all(not layer.merged_adapters for layer in r.module._layers())
        assert torch.equal(step(r.module, x), want)
    finally:
        r.close()


def test_a_safe_merge_of_a_broken_adapter_is_refused():
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    m, r = managed()
    try:
        want = step(r.module, x)
        lora_b = r.module.blocks[2].down.lora_B["a"].weight
        good = lora_b.data[0, 0].item()
        with torch.no_grad():
            lora_b.data[0, 0] = float("nan")
        with pytest.raises(ValueError, match="NaNs detected"):
            r.module.fuse_lora(safe_fusing=True)
        assert all(not layer.merged_adapters for layer in r.module._layers())
        with torch.no_grad():
            lora_b.data[0, 0] = good
        assert torch.equal(step(r.module, x), want)
        r.module.fuse_lora(safe_fusing=True)  # usable: the repaired adapter merges
        assert all(layer.merged_adapters == ["a"] for layer in r.module._layers())
    finally:
        r.close()


def test_load_state_dict_of_base_weights_stays_refused_inside_a_lora_call():
    # The module's LoRA methods may load the adapter's weights (strict=False), never the
    # managed base weights: those would be undone silently at the next upload.
    class Sneaky(StandInDiffusersModel):
        def load_lora_adapter(self, name, seed, **kw):
            super().load_lora_adapter(name, seed, **kw)
            self.load_state_dict({"proj_out.weight": torch.zeros(DIM, DIM)}, strict=False)
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    torch.manual_seed(0)
    m = Sneaky()
    r = ddo.enable_offload(m, backend="vmm", **WITH_RESIDENTS)
    try:
        want = step(r.module, x)
        with pytest.raises(ddo.DdoError, match="load_state_dict of a module ddo manages") as e:
            m.load_lora_adapter("a", 1)
        one_line(e)
        assert all(not layer.merged_adapters for layer in m._layers())
        m.set_adapters([])  # no adapter active: the base model's output
        assert torch.equal(step(r.module, x), want)
        with pytest.raises(ddo.DdoError, match="load_state_dict of a module ddo manages"):
            m.load_state_dict({}, strict=False)  # outside a LoRA call: refused as before
    finally:
        r.close()


class StandInQuantLinear(nn.Module):
    """A quantized linear layer of the test (stored uint8 with a scale, its own dequantizing
    forward): LoRA layers apply their adapters after it, as PEFT's do on quantized layers."""

    def __init__(self, dim):
        super().__init__()
        self.in_features = self.out_features = dim
        self.weight = nn.Parameter(torch.randint(0, 256, (dim, dim), dtype=torch.uint8),
                                   requires_grad=False)
        self.scale = nn.Parameter(torch.tensor(0.01))

    def forward(self, x):
        w = (self.weight.float() - 128.0) * self.scale.float()
        return F.linear(x.float(), w).to(x.dtype)


def test_a_fuse_on_a_quantized_base_weight_is_refused_by_name():
    x = torch.randn(2, 3, DIM).to(torch.bfloat16)
    torch.manual_seed(3)
    ref, m = StandInDiffusersModel(), StandInDiffusersModel()
    ref.load_state_dict(m.state_dict())
    for mm in (ref, m):
        torch.manual_seed(4)
        for b in mm.blocks:
            b.up = StandInQuantLinear(DIM)
            b.down = StandInQuantLinear(DIM)
    ref.load_state_dict(m.state_dict())
    r = ddo.enable_offload(m, backend="vmm", **ZERO_RESIDENT)
    try:
        for mm in (ref, r.module):
            mm.load_lora_adapter("a", 1)
        assert torch.equal(step(r.module, x), step(ref, x))  # unmerged: after the dequant
        with pytest.raises(ddo.DdoError, match=r"stored quantized .*torch.uint8") as e:
            r.module.fuse_lora()
        one_line(e)
        assert all(not layer.merged_adapters for layer in r.module._layers())
        assert torch.equal(step(r.module, x), step(ref, x))
    finally:
        r.close()


def test_fuse_on_a_module_without_lora_layers_is_still_refused():
    class WithFuse(StandInDiffusersModel):
        def fuse_lora(self, scale=1.0):
            self.proj_out.weight.data.add_(scale)
    m = WithFuse()
    r = ddo.enable_offload(m, backend="vmm", **ZERO_RESIDENT)
    try:
        with pytest.raises(ddo.DdoError, match="fuse_lora before enable_offload"):
            m.fuse_lora()
    finally:
        r.close()
    assert "fuse_lora" not in m.__dict__
