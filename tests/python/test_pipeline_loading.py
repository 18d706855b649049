"""from_pretrained_with_dynamic_offload: a model built on the meta device, associated with
safetensors files written here (a standard-library writer), streamed from the files by a ddo
session on the cpu device; mismatches refused with one line; host RSS below the model's size."""

import ctypes
import json
import os
import struct
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddo
from conftest import PYTHON_DIR

DT = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
CPU_STREAM = dict(execution_device="cpu", always_resident_modules_pattern="^$",
                  small_tensor_threshold_bytes=0, resident_module_budget_gb=0)


def write_safetensors(path, tensors, dtype_of=None):
    """name -> contiguous CPU tensor, written as one safetensors file (no library); dtype_of(name,
    tensor) names a tensor's safetensors dtype where DT does not (bytes standing for FP8)."""
    header, off = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": dtype_of(name, t) if dtype_of else DT[t.dtype],
                        "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors.values():
            t = t.contiguous()
            f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


class Lin(nn.Linear):
    """Computes in float32 (torch 1.13 has no CPU bf16/f16 matmul everywhere)."""

    def forward(self, x):
        return F.linear(x.float(), self.weight.float(), self.bias.float()).to(x.dtype)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = Lin(dim, 2 * dim)
        self.down = Lin(2 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class TinyDiT(nn.Module):
    """A model class of the test: embedder, numbered blocks, an output projection, a buffer.

    load_config/from_config STAND IN FOR DIFFUSERS' ConfigMixin (Diffusers is not installed
    in CI): the loader shape ddo builds on the meta device."""

    def __init__(self, dim=32, depth=4, dtype=torch.float32):
        super().__init__()
        self.embed = Lin(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.proj_out = Lin(dim, dim)
        self.register_buffer("scale", torch.ones(dim))
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
        return self.proj_out(x) * self.scale


def reference(dim=32, depth=4, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    m = TinyDiT(dim, depth, dtype)
    with torch.no_grad():
        m.scale.mul_(0.5)
    return m


@pytest.fixture
def checkpoint(tmp_path):
    ref = reference()
    path = tmp_path / "model.safetensors"
    write_safetensors(path, dict(ref.state_dict()))
    return ref, path


def test_streams_from_the_files_bit_identical(checkpoint):
    ref, path = checkpoint
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        want = ref(x)
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT)
    m = res.module
    assert all(p.device.type == "meta" for p in m.parameters())
    assert torch.equal(m.scale, ref.scale)  # the persistent buffer came from the file
    r = ddo.enable_offload(m, component="transformer", environ={}, **CPU_STREAM)
    try:
        assert r._source == str(path)
        assert r.plan["tensor_count"] == len(ref.state_dict())
        with torch.no_grad():
            for _ in range(2):
                assert torch.equal(r.module(x), want)
        snap = r.metrics_snapshot(collect_completed=True)
        assert snap.get("bytes_staged_from_file") + snap.get("bytes_from_registered") + \
            snap.get("bytes_staged_from_retained") > 0
    finally:
        r.close()
    assert all(p.device.type == "meta" for p in m.parameters())  # back to placeholders


def test_apply_dynamic_and_profiles_need_it(checkpoint, tmp_path):
    ref, path = checkpoint
    conf = ddo.DynamicOffloadConfig(**CPU_STREAM)
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT,
                                                   dynamic_offload_config=conf,
                                                   apply_dynamic=True)
    x = torch.randn(1, 2, 32)
    with torch.no_grad():
        assert torch.equal(res.module(x), ref(x))
    assert res.hook.route == "dynamic_offload"
    res.hook.close()
    with pytest.raises(ValueError):
        ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT, profile_name="w")


def test_loader_shapes_as_upstream(checkpoint, tmp_path, monkeypatch):
    # Upstream: from_pretrained = getattr(model_loader, "from_pretrained", model_loader);
    # module = from_pretrained(path, **from_pretrained_kwargs) (the loader contract).
    ref, path = checkpoint
    x = torch.randn(1, 2, 32)
    calls = []

    def loader(p, **kw):  # a callable: built on the meta device, streamed from the files
        calls.append((p, kw))
        return TinyDiT()

    # Upstream's named-profile loader test: the profile options are not forwarded.
    monkeypatch.setenv("DDO_PROFILE_DIR", str(tmp_path / "profiles"))
    res = ddo.from_pretrained_with_dynamic_offload(
        path, model_loader=loader, apply_dynamic=True, profile_name="example",
        build_profile=True, dynamic_offload_config=ddo.DynamicOffloadConfig(**CPU_STREAM))
    assert calls == [(path, {})]
    assert res.source == str(path) and res.hook._source == str(path)
    with res.profile_run():
        with torch.no_grad():
            assert torch.equal(res.module(x), ref(x))
    assert res.hook._profile.saved_path is not None
    res.hook.close()
    calls.clear()
    ddo.from_pretrained_with_dynamic_offload(path, model_loader=loader, subfolder=None,
                                             revision="main")
    assert calls == [(path, {"revision": "main"})]

    class FromPretrained:
        """A transformers-like loader: from_pretrained(path, **kwargs) reads the weights."""

        @classmethod
        def from_pretrained(cls, p, **kw):
            calls.append(("from_pretrained", p, kw))
            m = TinyDiT()
            m.load_state_dict(ref.state_dict())
            return m

    calls.clear()
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=FromPretrained,
                                                   variant="fp32")
    assert calls == [("from_pretrained", path, {"variant": "fp32"})]
    assert res.source is None and "from_pretrained" in res.load_note
    assert all(p.device.type == "cpu" for p in res.module.parameters())
    r = ddo.enable_offload(res.module, component="transformer", environ={}, **CPU_STREAM)
    with torch.no_grad():
        assert torch.equal(r.module(x), ref(x))
    r.close()
    # Anything else: one line naming the shapes ddo takes.
    for bad in (42, lambda: TinyDiT()):
        with pytest.raises(TypeError) as e:
            ddo.from_pretrained_with_dynamic_offload(path, model_loader=bad)
        msg = str(e.value)
        assert "from_config" in msg and "from_pretrained" in msg and "\n" not in msg


def test_non_streaming_routes_read_host_tensors(checkpoint):
    ref, path = checkpoint
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT)
    r = ddo.enable_offload(res.module, component="vae", route="none", environ={},
                           execution_device="cpu")
    x = torch.randn(1, 2, 32)
    with torch.no_grad():
        assert torch.equal(res.module(x), ref(x))
    r.close()


def test_mismatches_are_one_line(tmp_path, checkpoint):
    _ref, path = checkpoint
    with pytest.raises(ddo.DdoError) as e:
        ddo.from_pretrained_with_dynamic_offload(path, model_loader=lambda p: TinyDiT(dim=16))
    assert "shape" in str(e.value) or "[" in str(e.value)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ddo.DdoError) as e:
        ddo.from_pretrained_with_dynamic_offload(path, model_loader=lambda p: TinyDiT(depth=5))
    assert "blocks.4" in str(e.value)
    with pytest.raises(ddo.DdoError) as e:
        ddo.from_pretrained_with_dynamic_offload(path, model_loader=lambda p: TinyDiT(depth=3))
    assert "blocks.3" in str(e.value) and "not a parameter" in str(e.value)
    with pytest.raises(ddo.DdoError) as e:
        ddo.from_pretrained_with_dynamic_offload(
            path, model_loader=lambda p: TinyDiT(dtype=torch.bfloat16))
    assert "F32" in str(e.value) and "bfloat16" in str(e.value)
    assert "torch_dtype=torch.float32" in str(e.value)  # a dtype-only mismatch: the way out
    with pytest.raises(ddo.DdoError):
        ddo.from_pretrained_with_dynamic_offload(tmp_path / "absent.safetensors",
                                                 model_loader=TinyDiT)


def test_torch_dtype_differs_falls_back_to_host_tensors(checkpoint):
    ref, path = checkpoint
    with pytest.warns(UserWarning, match="host tensors"):
        res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT,
                                                       torch_dtype=torch.bfloat16)
    assert "differs" in res.load_note
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16
               for p in res.module.parameters())
    assert torch.equal(res.module.embed.weight, ref.embed.weight.to(torch.bfloat16))
    same = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT,
                                                    torch_dtype=torch.float32)
    assert same.load_note == "" and same.module.embed.weight.device.type == "meta"


def proc_status(key):
    """A byte figure of /proc/self/status ("VmRSS:", "VmHWM:")."""
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak():
    """Resets the process's RSS peak (VmHWM); the RSS then, or None where the kernel does not
    reset it (gVisor, on the GPU machine, which also counts allocated pages never touched)."""
    open("/proc/self/clear_refs", "w").write("5")
    base = proc_status("VmRSS:")
    return None if proc_status("VmHWM:") > base + (16 << 20) else base


CHILD = r"""
import sys, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
import ddo, test_pipeline_loading as T
status = T.proc_status
x = torch.randn(1, 4, 1024).to(torch.bfloat16)
base = T.reset_peak()
if base is None:
    print("SKIP")
    sys.exit(0)
res = ddo.from_pretrained_with_dynamic_offload(sys.argv[3], model_loader=lambda p: T.TinyDiT(
    1024, 40, torch.bfloat16))
# The native route with a retained store of a fifth of the model: the rest is re-read from
# the files on every use. On the cpu device the "device" slots are host memory too, and where
# the kernel counts allocated pages before they are touched (gVisor, on the GPU machine) every
# buffer counts at once: retained 64 MiB, staging 64 MiB (its floor), 30 MiB of slots and
# about 40 MiB of the process's own, 230 MiB there; the model (40 blocks, 330 MB) is well
# above that (with 16 blocks, 138 MB, it was not).
r = ddo.enable_offload(res.module, component="transformer", environ={}, backend="vmm",
                       vmm_source_cache_gb=0.0625, vmm_staging_buffer_gb=0.0625,
                       **T.CPU_STREAM)
with torch.no_grad():
    out = [r.module(x) for _ in range(2)]
peak = status("VmHWM:") - base
m = r.metrics_snapshot(collect_completed=True)
assert m.get("retained_peak_bytes") > 0 and m.get("bytes_staged_from_file") > 0
r.close()
ref = ddo.loading.materialize(res.module, sys.argv[3])
with torch.no_grad():
    assert torch.equal(ref(x), out[0]) and torch.equal(out[0], out[1])
print(peak)
"""


def write_big_checkpoint(path, depth, seed, dim=1024):
    """A bf16 checkpoint of depth up/down blocks between an embedding and a projection (the
    host-RAM tests' model); returns its weight bytes."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed.weight": (dim, dim), "embed.bias": (dim,), "proj_out.weight": (dim, dim),
              "proj_out.bias": (dim,), "scale": (dim,)}
    for i in range(depth):
        shapes.update({f"blocks.{i}.up.weight": (2 * dim, dim), f"blocks.{i}.up.bias": (2 * dim,),
                       f"blocks.{i}.down.weight": (dim, 2 * dim),
                       f"blocks.{i}.down.bias": (dim,)})
    tensors = {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16)
               for k, s in shapes.items()}
    write_safetensors(path, tensors)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_host_rss_stays_below_the_model(tmp_path):
    dim, depth = 1024, 40
    path = tmp_path / "big.safetensors"
    model_bytes = write_big_checkpoint(path, depth, seed=3, dim=dim)  # its tensors freed
    out = subprocess.run([sys.executable, "-c", CHILD, str(PYTHON_DIR),
                          os.path.dirname(__file__), str(path)], capture_output=True,
                         text=True, env=dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    if last == "SKIP":
        pytest.skip("this kernel does not reset VmHWM through /proc/self/clear_refs")
    peak = int(last)
    assert model_bytes > 128 << 20
    assert peak < model_bytes, (peak, model_bytes)


def test_codec_calibration_learns_the_decoder(checkpoint, tmp_path):
    """From the files with weight_codec: the store is coded, decodes are bit-identical, a
    calibration saves the decoder's throughput (its timed decodes) and the next plan of the
    workload takes it as the cost model's decode_bytes_per_s (docs/codec.md)."""
    ref, path = checkpoint
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        want = ref(x)
    opts = dict(CPU_STREAM, weight_codec="ddoc1", profile_name="coded",
                profile_dir=str(tmp_path))
    res = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT)
    r = ddo.enable_offload(res.module, component="transformer", environ={}, build_profile=True,
                           **opts)
    try:
        assert r.plan["planner_decisions"]["weight_codec"] == "ddoc1"
        with r.profile_run(), torch.no_grad():
            for _ in range(2):
                assert torch.equal(r.module(x), want)
        snap = r.metrics_snapshot(collect_completed=True)
        assert snap.get("bytes_decoded") > 0 and snap.get("codec_decode_ns") > 0
        rate = json.loads(open(r._profile.saved_path).read())["recommendation"][
            "decode_bytes_per_s"]
        assert rate == pytest.approx(snap.get("codec_decode_timed_bytes") /
                                     (snap.get("codec_decode_ns") / 1e9), rel=0.5)
    finally:
        r.close()
    res2 = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT)
    r2 = ddo.enable_offload(res2.module, component="transformer", environ={}, **opts)
    try:
        assert r2.plan["inputs"]["decode_bytes_per_s"] == pytest.approx(rate)
        with torch.no_grad():
            assert torch.equal(r2.module(x), want)
    finally:
        r2.close()
