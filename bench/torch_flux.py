#!/usr/bin/env python3
"""ddo's PyTorch binding against Diffusers' own offload on the real Flux transformer.

Issue 11, "On the H200": Diffusers' FluxTransformer2DModel with the Flux.1-dev configuration and
random bf16 weights (22.17 GiB, identical in every process), 4096 image + 512 text tokens, batch 1.
Each case runs in a fresh process; the driver collects them, prints a table and writes JSON.

  Driver:  PYTHONPATH=.devbench/src:python DDO_LIBRARY=<build>/libddo.so \\
           python3 bench/torch_flux.py --all --out $OUT/torch_flux.json
           (--cases resident,group_block to choose; --compile for the compiled/CUDA-graph cases)
  Case:    python3 bench/torch_flux.py --case resident --workdir /tmp/torch_flux
  Smoke:   python3 bench/torch_flux.py --all --tiny   (tiny Flux config; --toy: no Diffusers,
           a built-in Flux-like stand-in, also on --device cpu with torch 1.13)
  Quantized (issue 27): --quant q8_0 | q4_k | fp8 | fp8_wrapper makes the blocks' linear
           layers quantized stand-ins (bench/quant_layers.py: a GGUF-style Q8_0 or Q4_K
           Parameter subclass, ComfyUI-style scaled FP8, or a TorchAO-style float8 weight-only
           wrapper subclass), quantized on the GPU at build; every case then runs that model.

Per case: enable time, first and median step (torch.cuda.synchronize around each), the bus
measured in the same process (a 4 GiB pinned host->device copy, after the RSS peak is read),
step / max(resident step, streamed bytes / bus) (and the same for the steps run back to back
with one synchronize each side, as a pipeline's loop runs them: `chained_step_s`,
`ratio_chained`), device memory peak (a thread sampling
torch.cuda.mem_get_info every few ms, plus max_memory_allocated), host RSS peak (VmHWM and
sampled VmRSS), and bit-identity of the output against the resident case (which saves its
output to the work directory). Compiled cases add recompiles and CUDA graph re-records after
warm-up (torch._dynamo.utils.counters, the cudagraph tree manager) and the ratio to eager.
"""

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback

GIB = 1 << 30

# ---------------------------------------------------------------------------------------------
# ddo option keys per case (docs/options.md; src/config/presets.def). Adjust here, in one place.
# "Zero resident" follows docs/benchmarks.md (issue 6): nothing is kept resident (no always-
# resident patterns, no small-tensor residency, no resident module budget); on VMM the active
# device weight capacity (resident + execution slots) stays at the 4 GiB the preset gives.
# ---------------------------------------------------------------------------------------------
DDO_PRESET = "auto"
DDO_ZERO_RESIDENT = {
    "always_resident_modules_pattern": "^$",
    "small_tensor_threshold_bytes": 0,
    "resident_module_budget_gb": 0,
}
DDO_VMM_COMMON = {
    "execution_device": "cuda:0",
    "pin_cpu_memory": True,
    "pin_cpu_workers": 8,
    "vmm_source_cache_gb": 24,
}
DDO_ROOT_LEAVES = r"^(time_text_embed|context_embedder|x_embedder|norm_out|proj_out)(\.|$)"
# The cost model learns each block's compute from a calibration: the zero-resident VMM case
# runs its timed steps inside result.profile_run() (build_profile: it measures every unit's
# forward and the copy rate, docs/plan.md "Cost model"), and the 16 GiB case, a later process
# of the same call, plans with that profile and the simulated-step selection ("cost").
DDO_PROFILE = {"profile_name": "torch_flux"}
# Values are passed as Python values; the binding converts them (bools, numbers, strings).
DDO_CASE_OPTIONS = {
    "ddo_vmm0": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT, **DDO_PROFILE,
                             build_profile=True, vmm_resident_weight_budget_gb=4)),
    # 16 GiB device budget: the blocks resident and the slot count chosen together on the step
    # simulated with the calibration's per-block compute, within the whole 16 GiB (the resident
    # budget is the device budget: the selection fits the residents and the slots their streamed
    # units need, docs/plan.md); the small root leaves resident.
    "ddo_vmm16": ("vmm", dict(DDO_VMM_COMMON, **DDO_PROFILE, vmm_resident_weight_budget_gb=16,
                              always_resident_modules_pattern=DDO_ROOT_LEAVES,
                              resident_module_patterns="auto", resident_module_budget_gb=16,
                              resident_module_selection="cost")),
    # The same 16 GiB case with the spread selection (no profile) and 14 GiB of blocks resident
    # (room for three slots of a double block): the comparison in one call.
    "ddo_vmm16_spread": ("vmm", dict(DDO_VMM_COMMON, vmm_resident_weight_budget_gb=16,
                                     always_resident_modules_pattern=DDO_ROOT_LEAVES,
                                     resident_module_patterns="auto",
                                     resident_module_budget_gb=14)),
    "ddo_linear0": ("linear", dict(DDO_ZERO_RESIDENT, execution_device="cuda:0",
                                   auto_budget_policy="off")),
    # Issue 13 through the binding: the zero-resident VMM case with the module's tensors coded
    # into ddo's store at enable (the module's copies let go) and decoded on the GPU; its
    # ratio_raw_bound is the step against the raw bytes over the bus (the weights are Gaussian,
    # fill_params, so they code like trained ones).
    "ddo_vmm0_codec": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT,
                                   vmm_resident_weight_budget_gb=4, weight_codec="ddoc1")),
    # The zero-resident case with the slot count fixed at three (the automatic count before
    # ee2500e), beside ddo_vmm0's automatic count in the same call.
    "ddo_vmm0_slots3": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT, **DDO_PROFILE,
                                    vmm_resident_weight_budget_gb=4, execution_slots=3)),
    # The zero-resident case with the ten small root leaves (embedders, norm_out, proj_out:
    # about 0.1 GB of 12.7 in GGUF Q8_0) kept resident: each of them otherwise takes a whole slot of
    # the ring, so at a step's end the ring holds them instead of the next step's first blocks
    # (docs/benchmarks.md, the trace of 2026-12-06's fifth session).
    "ddo_vmm0_rootres": ("vmm", dict(DDO_VMM_COMMON, **dict(DDO_ZERO_RESIDENT,
                                     always_resident_modules_pattern=DDO_ROOT_LEAVES),
                                     vmm_resident_weight_budget_gb=4)),
    # The zero-resident case with consecutive small blocks packed into one unit up to the
    # largest block's bytes (unit_pack_blocks: Flux's single blocks in pairs), so a slot holds
    # as much as it can and the ring reaches the next step's first blocks in time (the sixth
    # session's lever, bench/ring_model.py --pack).
    "ddo_vmm0_pack": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT,
                                  vmm_resident_weight_budget_gb=4, unit_pack_blocks=True)),
    "ddo_linear0_pack": ("linear", dict(DDO_ZERO_RESIDENT, execution_device="cuda:0",
                                        auto_budget_policy="off", unit_pack_blocks=True)),
    # The packed case with five slots (what the simulation chose on GGUF Q8_0 while automatic
    # counts stopped at six), beside the automatic count of ddo_vmm0 in the same call.
    "ddo_vmm0_pack5": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT,
                                   vmm_resident_weight_budget_gb=4, unit_pack_blocks=True,
                                   execution_slots=5)),
    # The packed case with six slots, one more than the simulation chose on GGUF Q8_0 (a deeper
    # window, 0.36 GB more device memory): whether depth is what the packed ring still lacks.
    "ddo_vmm0_pack6": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT,
                                   vmm_resident_weight_budget_gb=4, unit_pack_blocks=True,
                                   execution_slots=6)),
    # ... and eight (2.9 GB of slots, within the 4 GiB budget): the slope of the step in depth.
    "ddo_vmm0_pack8": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT,
                                   vmm_resident_weight_budget_gb=4, unit_pack_blocks=True,
                                   execution_slots=8)),
    # The zero-resident case planned with the profile ddo_vmm0 saved earlier in the same call
    # (its timed steps' per-unit compute) instead of the compute its own warm-up forwards time:
    # the automatic slot count on steady-state figures.
    "ddo_vmm0_profiled": ("vmm", dict(DDO_VMM_COMMON, **DDO_ZERO_RESIDENT, **DDO_PROFILE,
                                      vmm_resident_weight_budget_gb=4)),
}
# The device-weight budget each ddo case must stay under (GiB), for the "never over budget" check.
DDO_CASE_BUDGET_GIB = {"ddo_vmm0": 4, "ddo_vmm16": 16, "ddo_vmm16_spread": 16,
                       "ddo_linear0": None, "ddo_vmm0_codec": 4, "ddo_vmm0_slots3": 4,
                       "ddo_vmm0_rootres": 4, "ddo_vmm0_pack": 4, "ddo_linear0_pack": None,
                       "ddo_vmm0_pack5": 4, "ddo_vmm0_pack6": 4, "ddo_vmm0_pack8": 4,
                       "ddo_vmm0_profiled": 4}

# case name -> what it runs. ref: which resident output it is compared with (and resident cases
# write). compile: None, "default" (compile_repeated_blocks) or "reduce-overhead" (CUDA graphs).
CASES = {
    "resident": dict(kind="resident", ref="eager", compile=None),
    "group_block": dict(kind="group", offload_type="block_level", ref="eager", compile=None),
    "group_leaf": dict(kind="group", offload_type="leaf_level", ref="eager", compile=None),
    "ddo_vmm0": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm16": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm16_spread": dict(kind="ddo", ref="eager", compile=None),
    "ddo_linear0": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_codec": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_slots3": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_rootres": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_pack": dict(kind="ddo", ref="eager", compile=None),
    "ddo_linear0_pack": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_pack5": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_pack6": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_pack8": dict(kind="ddo", ref="eager", compile=None),
    "ddo_vmm0_profiled": dict(kind="ddo", ref="eager", compile=None),
    "resident_compile": dict(kind="resident", ref="compile", compile="default",
                             eager="resident"),
    "ddo_vmm0_compile": dict(kind="ddo", base="ddo_vmm0", ref="compile", compile="default",
                             eager="ddo_vmm0"),
    "resident_graphs": dict(kind="resident", ref="graphs", compile="reduce-overhead",
                            eager="resident"),
    "ddo_vmm0_graphs": dict(kind="ddo", base="ddo_vmm0", ref="graphs", compile="reduce-overhead",
                            eager="ddo_vmm0"),
    "group_block_compile": dict(kind="group", offload_type="block_level", ref="compile",
                                compile="default", eager="group_block"),
}
ALL_CASES = ["resident", "group_block", "group_leaf", "ddo_vmm0", "ddo_vmm16", "ddo_linear0"]
COMPILE_CASES = ["ddo_vmm0", "resident_compile", "ddo_vmm0_compile", "resident_graphs",
                 "ddo_vmm0_graphs"]

FLUX1_DEV_CONFIG = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19,
                        num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
                        joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                        axes_dims_rope=(16, 56, 56))
TINY_CONFIG = dict(patch_size=1, in_channels=8, out_channels=None, num_layers=2,
                   num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                   joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
                   axes_dims_rope=(4, 6, 6))
SEED = 20261201


def log(msg):
    print(f"[torch_flux {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Model and inputs
# ---------------------------------------------------------------------------------------------
def flux_config(args):
    if args.tiny:
        return dict(TINY_CONFIG)
    path = os.path.join(repo_root(), "data", "layouts", "flux1-dev.json")
    if os.path.exists(path):
        with open(path) as f:
            cfg = json.load(f)["config"]
        cfg["axes_dims_rope"] = tuple(cfg["axes_dims_rope"])
        return cfg
    return dict(FLUX1_DEV_CONFIG)


def tokens(args):
    if args.tiny or args.toy:
        return 64, 16
    return args.image_tokens, args.text_tokens


def init_std(name, p):
    """A deterministic, finite-output-friendly scale for each parameter."""
    if p.dim() >= 2:
        fan_in = p[0].numel()
        scale = 0.1 if ("norm" in name and ".linear." in name) else 1.0  # AdaLN modulation
        return scale / (fan_in ** 0.5)
    return 0.02


def fill_params(model, device):
    import torch
    g = torch.Generator(device=device)
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            g.manual_seed(SEED * 1000 + i)
            if p.dim() == 1 and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, init_std(name, p), generator=g)
        for i, (name, b) in enumerate(model.named_buffers()):
            if b.is_floating_point():
                g.manual_seed(SEED * 7 + i)
                b.normal_(0.0, 0.02, generator=g)


def build_toy(torch, d=64):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.mlp_in = nn.Linear(d, 4 * d)
            self.mlp_out = nn.Linear(4 * d, d)

        def forward(self, x):
            h = self.norm(x)
            q, k, v = self.qkv(h).chunk(3, dim=-1)
            a = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1) @ v
            x = x + self.proj(a)
            return x + self.mlp_out(torch.nn.functional.gelu(self.mlp_in(self.norm(x))))

    class Toy(nn.Module):
        def __init__(self, d=64, n=4):
            super().__init__()
            self.x_embedder = nn.Linear(8, d)
            self.transformer_blocks = nn.ModuleList([Block(d) for _ in range(n)])
            self.proj_out = nn.Linear(d, 8)

        def forward(self, hidden_states, **_):
            x = self.x_embedder(hidden_states)
            for b in self.transformer_blocks:
                x = b(x)
            return (self.proj_out(x),)

    return Toy(d)


def build_model(args):
    """The module on the CPU, bf16, identical weights in every process. Returns (model, info)."""
    import torch
    info = {}
    t0 = time.perf_counter()
    init_dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.toy:
        model = build_toy(torch, getattr(args, "toy_dim", 64)).to(torch.bfloat16)
        fill_params(model, "cpu")
        info["model"] = "toy"
    elif getattr(args, "quant", "none") == "gguf_file":
        # the real packages: a GGUF file written by gguf's GGUFWriter (once, in the workdir),
        # loaded by Diffusers' from_single_file with its GGUF quantizer (bench/gguf_real.py)
        gr = sibling("gguf_real")
        cfg = flux_config(args)
        qtype = getattr(args, "gguf_type", "Q8_0")
        path = os.path.join(args.workdir, f"flux1-dev-{qtype.lower()}.gguf")
        os.makedirs(args.workdir, exist_ok=True)
        info["gguf_file"] = dict(gr.write_flux(path, cfg, qtype=qtype), path=path)
        model, loaded = gr.load_flux(path, cfg, args.workdir)
        info["gguf_file"].update(loaded)
        info["model"] = "FluxTransformer2DModel.from_single_file (GGUF, Diffusers' quantizer)"
        info["quant"] = {"kind": "gguf_file"}
        init_dev = "cpu"
    else:
        from diffusers import FluxTransformer2DModel
        info["import_s"] = time.perf_counter() - t0
        cfg = flux_config(args)
        if hasattr(torch, "get_default_device"):  # torch >= 2.x: construct on meta, no CPU init
            with torch.device("meta"):
                model = FluxTransformer2DModel(**cfg)
            model = model.to(torch.bfloat16).to_empty(device=init_dev)
        else:
            model = FluxTransformer2DModel(**cfg).to(torch.bfloat16).to(init_dev)
        fill_params(model, init_dev)
        info["model"] = "FluxTransformer2DModel"
        info["config"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}
    if getattr(args, "quant", "none") == "torchao_fp8":  # the real package, on the init device
        t2 = time.perf_counter()
        info["quant"] = dict(torchao_fp8(model), quantize_s=time.perf_counter() - t2)
    elif getattr(args, "quant", "none") not in ("none", "gguf_file"):  # fast on the GPU
        t2 = time.perf_counter()
        info["quant"] = {"kind": args.quant, "layers": quant_layers().quantize_linears(
            model, args.quant, r"transformer_blocks\.")}
        info["quant"]["quantize_s"] = time.perf_counter() - t2
    if init_dev == "cuda":
        torch.cuda.synchronize()
    info["init_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    model = model.to("cpu").eval()
    if init_dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    info["to_cpu_s"] = time.perf_counter() - t1
    info["build_s"] = time.perf_counter() - t0
    info["buffers"] = sum(1 for _ in model.buffers())
    info["params"] = sum(1 for _ in model.parameters())
    info["model_bytes"] = model_bytes(model)
    return model, info


def stored(t):
    """The plain tensors t stores: t itself, or a wrapper subclass's inner tensors (through
    inner wrappers: the flatten protocol)."""
    if not hasattr(type(t), "__tensor_flatten__"):
        return [t]
    return [x for name in t.__tensor_flatten__()[0] for x in stored(getattr(t, name))]


def torchao_fp8(model):
    """The blocks' linear layers quantized by TorchAO itself (quantize_ with
    Float8WeightOnlyConfig: its Float8Tensor, float8 qdata and a per-row scale, a wrapper
    subclass ddo streams by its inner tensors)."""
    import re
    import torch
    import torchao
    from torchao.quantization import Float8WeightOnlyConfig, quantize_
    pat = re.compile(r"transformer_blocks\.")
    names = [n for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and pat.search(n)]
    quantize_(model, Float8WeightOnlyConfig(),
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and pat.search(fqn))
    kinds = sorted({type(m.weight).__name__ for n, m in model.named_modules() if n in names})
    return {"kind": "torchao_fp8", "torchao": getattr(torchao, "__version__", "unknown"),
            "layers": len(names), "weight_types": kinds}


def sibling(name):
    """bench/<name>.py, loaded by path (the benches are scripts, not a package)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def quant_layers():
    """bench/quant_layers.py (the quantized stand-in layers of --quant)."""
    return sibling("quant_layers")


def model_bytes(model):
    """The bytes the model stores (a wrapper subclass parameter: its inner tensors')."""
    seen, total = set(), 0
    for t in [x for t in list(model.parameters()) + list(model.buffers()) for x in stored(t)]:
        key = (t.data_ptr(), t.numel(), t.dtype)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def make_inputs(args, device):
    import torch
    g = torch.Generator(device="cpu")
    g.manual_seed(SEED + 1)
    n_img, n_txt = tokens(args)
    bf = torch.bfloat16
    if args.toy:
        return {"hidden_states": torch.randn(1, n_img, 8, generator=g).to(bf).to(device)}
    cfg = flux_config(args)
    side = int(round(n_img ** 0.5))
    assert side * side == n_img, "image tokens must be a square"
    img_ids = torch.zeros(side, side, 3)
    img_ids[..., 1] = torch.arange(side)[:, None]
    img_ids[..., 2] = torch.arange(side)[None, :]
    return {
        "hidden_states": torch.randn(1, n_img, cfg["in_channels"], generator=g).to(bf).to(device),
        "encoder_hidden_states": torch.randn(1, n_txt, cfg["joint_attention_dim"],
                                             generator=g).to(bf).to(device),
        "pooled_projections": torch.randn(1, cfg["pooled_projection_dim"],
                                          generator=g).to(bf).to(device),
        "timestep": torch.tensor([0.5], dtype=bf).to(device),
        "guidance": torch.tensor([3.5], dtype=bf).to(device),
        "img_ids": img_ids.reshape(n_img, 3).to(bf).to(device),
        "txt_ids": torch.zeros(n_txt, 3, dtype=bf).to(device),
    }


def forward(model, inputs, toy, graphs=False):
    if graphs:  # a new step for CUDA graph trees: earlier outputs may be overwritten now
        import torch
        torch.compiler.cudagraph_mark_step_begin()
    if toy:
        return model(**inputs)[0]
    return model(**inputs, return_dict=False)[0]


# ---------------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------------
def read_status_kib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler:
    """A thread sampling the driver's free memory (cudaMemGetInfo) and VmRSS every 20 ms. The
    driver-level figure only grows when torch's caching allocator or ddo allocates, and neither
    gives memory back during the steps, so a peak lasts and a slow period misses none; a fast
    one (4 ms before run 15) takes the GIL and the driver 250 times a second beside the host
    thread that issues the kernels."""

    def __init__(self, cuda, period_s=0.02):
        self.cuda, self.period_s = cuda, period_s
        self.stop_ev = threading.Event()
        self.samples = 0
        self.min_free = None
        self.total = None
        self.max_rss_kib = 0
        self.baseline_used = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self):
        if self.cuda:
            import torch
            free, total = torch.cuda.mem_get_info(0)
            self.total = total
            self.min_free = free if self.min_free is None else min(self.min_free, free)
        self.max_rss_kib = max(self.max_rss_kib, read_status_kib("VmRSS"))
        self.samples += 1

    def start(self):
        self.sample()
        if self.cuda:
            self.baseline_used = self.total - self.min_free
        self.thread.start()

    def run(self):
        while not self.stop_ev.is_set():
            self.sample()
            time.sleep(self.period_s)

    def stop(self):
        self.stop_ev.set()
        self.thread.join()
        self.sample()
        out = {"samples": self.samples, "rss_sampled_peak_bytes": self.max_rss_kib * 1024}
        if self.cuda:
            peak = self.total - self.min_free
            out.update(device_used_peak_bytes=peak, device_used_baseline_bytes=self.baseline_used,
                       device_used_peak_above_baseline_bytes=peak - self.baseline_used,
                       device_total_bytes=self.total)
        return out


def measure_bus(gib):
    """Pinned host->device copy of `gib` GiB: best and median of 3 timed passes (GB/s)."""
    import torch
    n = int(gib * GIB)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dev.copy_(host, non_blocking=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del host, dev
    torch.cuda.empty_cache()
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()
    return {"bus_bytes": n, "bus_gbps": n / statistics.median(times) / 1e9,
            "bus_gbps_best": n / min(times) / 1e9, "bus_times_s": times}


def find_key(d, key):
    """The first value named `key` anywhere in a nested dict (metrics JSON), or None."""
    if isinstance(d, dict):
        if key in d and not isinstance(d[key], dict):
            return d[key]
        for v in d.values():
            r = find_key(v, key)
            if r is not None:
                return r
    return None


def scalars(d):
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool))} \
        if isinstance(d, dict) else {}


def dynamo_counters():
    try:
        from torch._dynamo.utils import counters
        return {k: dict(v) for k, v in counters.items()}
    except Exception:  # noqa: BLE001 (torch without dynamo)
        return {}


def counters_delta(before, after):
    out = {}
    for group, vals in after.items():
        for k, v in vals.items():
            if not isinstance(v, (int, float)):
                continue
            dv = v - before.get(group, {}).get(k, 0)
            if dv:
                out[f"{group}.{k}"] = dv
    return out


def cudagraph_state():
    """Recorded graph nodes, re-record count and failed matches of the cudagraph tree manager."""
    try:
        import torch
        from torch._inductor import cudagraph_trees as ct
        mgr = ct.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    if mgr is None:
        return {"graphs": 0, "rerecords": 0, "fail_counter": 0}
    nodes, stack = 0, [n for lst in mgr.roots.values() for n in lst]
    while stack:
        n = stack.pop()
        nodes += 1
        stack.extend(c for lst in n.children.values() for c in lst)
    rer = sum(sum(v.values()) for v in mgr.num_rerecord.values())
    return {"graphs": nodes, "rerecords": rer,
            "fail_counter": getattr(mgr, "debug_fail_counter", None)}


# ---------------------------------------------------------------------------------------------
# One case (runs in its own process)
# ---------------------------------------------------------------------------------------------
def enable(case, spec, model, args, res):
    """Make `model` runnable on the execution device the case's way; returns (module, handle)."""
    import torch
    dev = args.device
    if spec["kind"] == "resident":
        return model.to(dev), None
    if spec["kind"] == "group":
        from diffusers.hooks import apply_group_offloading
        kw = dict(onload_device=torch.device(dev), offload_device=torch.device("cpu"),
                  offload_type=spec["offload_type"], use_stream=True, record_stream=True)
        if spec["offload_type"] == "block_level":
            kw["num_blocks_per_group"] = 1
        res["group_offload_kwargs"] = {k: str(v) for k, v in kw.items()}
        apply_group_offloading(model, **kw)
        return model, None
    import ddo  # noqa: F401 (checked by the caller)
    backend, overrides = DDO_CASE_OPTIONS[spec.get("base", case)]
    overrides = dict(overrides)
    if dev == "cpu":
        overrides["execution_device"] = "cpu"
    if "profile_name" in overrides:
        overrides["profile_dir"] = os.path.join(args.workdir, "profiles")
    res["ddo_call"] = {"preset": DDO_PRESET, "backend": backend, "overrides": overrides}
    r = ddo.enable_offload(model, preset=DDO_PRESET, backend=backend, **overrides)
    return r.module, r


def apply_compile(module, mode, res):
    import torch
    if not hasattr(torch, "compile"):
        raise RuntimeError(f"torch.compile needs torch 2.x (this is {torch.__version__})")
    kw = {} if mode == "default" else {"mode": mode}
    if hasattr(module, "compile_repeated_blocks"):
        module.compile_repeated_blocks(**kw)
        res["compile_via"] = "compile_repeated_blocks"
    else:
        names = getattr(module, "_repeated_blocks", None) or ["Block"]
        n = 0
        for sub in module.modules():
            if type(sub).__name__ in names:
                sub.compile(**kw)
                n += 1
        res["compile_via"] = f"torch.compile per block ({n})"
    res["compile_mode"] = mode
    res["torch_compile_available"] = hasattr(torch, "compile")
    try:  # inductor's run-to-run determinism (no benchmark-chosen kernels), where it exists
        import torch._inductor.config as inductor_config
        res["inductor_deterministic"] = bool(getattr(inductor_config, "deterministic", None))
    except Exception:  # noqa: BLE001
        res["inductor_deterministic"] = None


def ddo_bytes(handle):
    """Bytes the session has copied host->device so far (the catalog's copy_bytes) and the
    metrics JSON."""
    try:
        snap = handle.metrics_snapshot(collect_completed=True)
        return snap.get("copy_bytes"), snap.as_dict()
    except Exception as e:  # noqa: BLE001
        return None, {"error": f"{type(e).__name__}: {e}"}


def compare(out, first, case, spec, args, res):
    import torch
    out_cpu = out.detach().cpu()
    res["output_shape"] = list(out_cpu.shape)
    res["output_finite"] = bool(torch.isfinite(out_cpu.float()).all())
    res["output_mean_abs"] = float(out_cpu.float().abs().mean())
    res["self_identical"] = bool(torch.equal(first.detach().cpu().view(torch.int16),
                                             out_cpu.view(torch.int16)))
    ref_path = os.path.join(args.workdir, f"ref_{spec['ref']}.pt")
    if spec["kind"] == "resident":
        torch.save(out_cpu, ref_path)
        res["identical"] = True
        res["reference"] = "self (saved)"
    elif not os.path.exists(ref_path):
        res["identical"] = None
        res["reference"] = f"missing {os.path.basename(ref_path)}"
    else:
        res["reference"] = os.path.basename(ref_path)
        res.update(same_bits(torch.load(ref_path), out_cpu))
    # Every other reference of the call as well: a compiled or CUDA-graph case that differs
    # from its own reference may still equal another (eager against compiled kernels).
    res["against"] = {}
    for name in sorted(os.listdir(args.workdir)):
        if name.startswith("ref_") and name.endswith(".pt") and \
                name != f"ref_{spec['ref']}.pt":
            res["against"][name[4:-3]] = same_bits(torch.load(os.path.join(args.workdir, name)),
                                                   out_cpu)


def same_bits(ref, out):
    """Whether two outputs are equal bit for bit, and their largest difference."""
    import torch
    if list(ref.shape) != list(out.shape) or ref.dtype != out.dtype:
        return {"identical": False, "shape_or_dtype_differs": True}
    bits = torch.int16 if ref.element_size() == 2 else torch.int32
    return {"identical": bool(torch.equal(ref.view(bits), out.view(bits))),
            "max_abs_diff": float((ref.float() - out.float()).abs().max())}


def run_case(case, args):
    """Everything one case records; never raises (errors go into the result)."""
    res = {"case": case, "pid": os.getpid()}
    spec = CASES[case]
    res.update(kind=spec["kind"], compile=spec["compile"])
    # A ddo result may plan once more before its third forward (the activation reserve the
    # first measured, the units' compute the second timed: docs/python.md): that forward is
    # warm-up too (and one more for a compiled case, whose graphs the re-plan makes again).
    res["warmup_steps"] = (max(args.warmup, 4) if spec["compile"] is not None
                           else max(args.warmup, 3) if spec["kind"] == "ddo" else args.warmup)
    deadline = args.deadline_epoch or (time.time() + 1e9)
    handle = None
    try:
        import torch
        res["torch"] = torch.__version__
        cuda = args.device != "cpu"
        if spec["kind"] == "ddo":
            try:
                import ddo
                res["ddo_module"] = getattr(ddo, "__file__", None)
            except Exception as e:  # noqa: BLE001
                res["skipped"] = f"import ddo failed: {type(e).__name__}: {e}"
                return res
        if spec["kind"] == "group" and (args.toy or not cuda):
            res["skipped"] = "group offload needs Diffusers and a CUDA device"
            return res
        if cuda:
            res["gpu"] = torch.cuda.get_device_name(0)
        model, info = build_model(args)
        res.update(info)
        res["rss_after_build_bytes"] = read_status_kib("VmRSS") * 1024
        inputs = make_inputs(args, args.device)
        sampler = Sampler(cuda)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sampler.start()
        try:
            t = time.perf_counter()
            module, handle = enable(case, spec, model, args, res)
            if cuda:
                torch.cuda.synchronize()
            res["enable_s"] = time.perf_counter() - t
            if spec["compile"]:
                apply_compile(module, spec["compile"], res)
            with torch.no_grad():
                run_steps(module, inputs, case, spec, args, deadline, res, handle, cuda)
        finally:
            res.update(sampler.stop())
        if cuda:
            res["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
        res["rss_hwm_bytes"] = read_status_kib("VmHWM") * 1024
        if cuda:  # after the RSS peak is read: torch keeps freed pinned blocks cached
            res.update(measure_bus(args.bus_gib))
        if handle is not None:
            t = time.perf_counter()
            handle.close()
            res["close_s"] = time.perf_counter() - t
            handle = None
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-4000:]
        if handle is not None:
            try:
                handle.close()
            except Exception as e2:  # noqa: BLE001
                res["close_error"] = f"{type(e2).__name__}: {e2}"
    return res


@contextlib.contextmanager
def gc_enabled_after():
    try:
        yield
    finally:
        gc.enable()


def chained_step(step, n, sync):
    """The mean of n calls of step back to back, one sync each side, as a pipeline's loop runs
    them (the garbage collector off, as for the synchronized steps)."""
    gc.collect()
    gc.disable()
    with gc_enabled_after():
        sync()
        t = time.perf_counter()
        for _ in range(n):
            step()
        sync()
    return (time.perf_counter() - t) / n


def run_steps(module, inputs, case, spec, args, deadline, res, handle, cuda):
    cc_before = cg_before = None
    if handle is not None:
        res["plan_summary"] = scalars(handle.plan)
        with open(os.path.join(args.workdir, f"plan_{case}.json"), "w") as f:
            json.dump(handle.plan, f)

    # warm-up (first step plus warmup-1 more), then the timed steps; counters around the latter
    import torch
    graphs = spec["compile"] == "reduce-overhead"
    t = time.perf_counter()
    first = forward(module, inputs, args.toy, graphs).detach().cpu()  # graph outputs get reused
    res["first_step_s"] = time.perf_counter() - t
    for _ in range(max(0, res["warmup_steps"] - 1)):
        forward(module, inputs, args.toy, graphs)
    if cuda:
        torch.cuda.synchronize()
    if spec["compile"]:
        cc_before, cg_before = dynamo_counters(), cudagraph_state()
    bytes_before, metrics_before = ddo_bytes(handle) if handle is not None else (None, None)
    times, out = [], first
    prof = getattr(handle, "_profile", None)
    region = handle.profile_run() if prof is not None else contextlib.nullcontext()
    # As timeit does, the garbage collector is off during the timed steps (every case alike):
    # a collection pass inside a step stalls the host that issues the kernels and the loads.
    gc.collect()
    gc.disable()
    with region, gc_enabled_after():
        while len(times) < args.steps and (len(times) < 2 or time.time() < deadline):
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = forward(module, inputs, args.toy, graphs)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            out = out.detach().cpu()
    if cuda and len(times) >= 2:
        # The same steps back to back, as a pipeline's loop runs them: one synchronize before
        # and one after, so the next step's first loads may overlap this one's end (after the
        # counters are read: the per-step figures stay the synchronized steps').
        timed_counts = ddo_bytes(handle) if handle is not None else (None, None)
        res["chained_step_s"] = chained_step(
            lambda: forward(module, inputs, args.toy, graphs), len(times), torch.cuda.synchronize)
    else:
        timed_counts = None
    if prof is not None:
        d = handle.plan.get("planner_decisions", {})
        res["profile"] = {"status": prof.status, "saved": prof.saved_path,
                          "unit_compute_source": d.get("unit_compute_source"),
                          "resident_module_selection": d.get("resident_module_selection"),
                          "measured_units": len(prof.unit_compute or {}),
                          "selected_resident": handle.plan.get("selected_resident_modules"),
                          # the units' compute summed: as the calibration's timed steps measured
                          # it (medians) and as the plan took it (a profile, the second forward)
                          "calibrated_compute_s": sum(
                              ((prof.recommendation or {}).get("unit_compute_s") or {}).values()),
                          "planned_compute_s": sum(
                              float(u.get("compute_s") or 0.0)
                              for u in handle.plan.get("units") or [])}
    res["step_times_s"] = times
    res["median_step_s"] = statistics.median(times)
    res["mean_step_s"] = statistics.fmean(times)
    if spec["compile"]:
        res["dynamo_counters_delta_after_warmup"] = counters_delta(cc_before, dynamo_counters())
        res["recompiles_after_warmup"] = sum(
            v for k, v in res["dynamo_counters_delta_after_warmup"].items()
            if k.startswith("recompiles.") or k in ("stats.unique_graphs",))
        cg_after = cudagraph_state()
        res["cudagraph_before"], res["cudagraph_after"] = cg_before, cg_after
        if "graphs" in cg_after and "graphs" in (cg_before or {}):
            res["graph_rerecords_after_warmup"] = (cg_after["rerecords"] - cg_before["rerecords"])
            res["graphs_recorded_after_warmup"] = cg_after["graphs"] - cg_before["graphs"]
        res["dynamo_counters_total"] = {g: v for g, v in dynamo_counters().items()
                                        if g in ("recompiles", "stats", "inductor", "frames")}
    if handle is not None:
        after, metrics = timed_counts if timed_counts is not None else ddo_bytes(handle)
        res["ddo_metrics"] = metrics
        # the plan the timed steps ran (a re-plan after the first forward replaces the first)
        final = getattr(handle, "plan", None) or {}
        dec = final.get("planner_decisions") or {}
        dw = (final.get("budgets") or {}).get("device_weights") or {}
        res["plan_final"] = {"unit_count": len(final.get("units") or []),
                             "slot_count": dw.get("slot_count"),
                             **{k: dec.get(k) for k in ("packed_blocks", "slot_count_decision",
                                                        "slot_search", "unit_compute_source")},
                             "predicted_step_s": (final.get("budgets") or {}).get(
                                 "predicted_step_s"),
                             "replan": {k: v for k, v in handle.activation_replan.items()
                                        if k in ("state", "mode", "note", "unit_compute")}}
        if after is not None and bytes_before is not None:
            res["streamed_bytes_per_step"] = (after - bytes_before) / len(times)
            res["streamed_bytes_source"] = "metrics copy_bytes delta over the timed steps"
            for key in ("vmm_maps", "copies", "uploads", "stall_ns"):  # per timed step
                a, b = find_key(metrics_before, key), find_key(metrics, key)
                if a is not None and b is not None:
                    res[f"{key}_per_step"] = (b - a) / len(times)
            raw = raw_streamed_bytes(metrics_before, metrics, after - bytes_before)
            if raw is not None:  # weight_codec: what the same steps move raw
                res["raw_streamed_bytes_per_step"] = raw / len(times)
        res["device_weights_peak_bytes"] = find_key(metrics, "device_weights_peak_bytes")
        res["planned_device_weights_bytes"] = find_key(metrics, "planned_device_weights_bytes")
        budget = DDO_CASE_BUDGET_GIB.get(spec.get("base", case))
        res["budget_bytes"] = budget * GIB if budget is not None else None
        res["weights_within_budget"] = within_budget(res)
    elif spec["kind"] == "group":
        res["streamed_bytes_per_step"] = res["model_bytes"]
        res["streamed_bytes_source"] = "the model's bytes (group offload moves all of it)"
    else:
        res["streamed_bytes_per_step"] = 0
    if args.torch_trace:
        res["torch_trace"] = trace_one_step(module, inputs, case, args, cuda)
    if args.py_profile:
        res["py_profile"] = py_profile_step(lambda: forward(module, inputs, args.toy, False), cuda)
    compare(out, first, case, spec, args, res)


def busy_union(spans):
    """The seconds a set of (start, end) spans (microseconds) covers, overlaps counted once."""
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e6


def overlap(kernels, copies):
    """How copies and kernels ((start, end) spans, microseconds) overlapped over the device's
    span from the first to the last of them: the time neither ran, copies with no kernel
    beside them, kernels with no copy (seconds); {} without both."""
    if not kernels or not copies:
        return {}
    spans = kernels + copies
    window = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e6
    either = busy_union(spans)
    return {"device_window_s": window, "neither_busy_s": window - either,
            "copy_only_s": either - busy_union(kernels),
            "kernel_only_s": either - busy_union(copies)}


def idle_causes(events):
    """Why the device sat idle between kernels, from a torch.profiler Chrome trace's events:
    before each kernel that starts after every earlier kernel ended (a gap), the part of the gap
    until its launch call returned on the host (cudaLaunchKernel or a driver launch, matched by
    the correlation id) is the host's (the GPU waited for Python to launch it); the rest is the
    device's own wait (an event: an upload not done yet, or the launch latency). Returns
    seconds: idle (the gaps), idle_host, idle_wait, and the median launch lead (the kernel's
    start after its launch returned: near zero when the host paces the step). Also the host's
    side of the CUDA API: each kernel launch call's duration (median, 90th percentile: a launch
    that waits on the driver's lock, held by another thread's calls, takes longer), and per
    thread the API calls' count and seconds, and its six costliest calls by name (api_threads,
    the busiest thread first)."""
    launch_end, kernels, launch_dur = {}, [], []
    api: dict = {}
    for e in events:
        cat, a = e.get("cat", ""), e.get("args") or {}
        if e.get("ph") == "X" and cat in ("cuda_runtime", "cuda_driver"):
            t = api.setdefault(str(e.get("tid")), [0, 0.0, {}])
            t[0] += 1
            t[1] += float(e.get("dur", 0.0))
            n = t[2].setdefault(e.get("name", "?"), [0, 0.0])
            n[0] += 1
            n[1] += float(e.get("dur", 0.0))
        corr = a.get("correlation")
        if e.get("ph") != "X" or corr is None:
            continue
        if cat in ("cuda_runtime", "cuda_driver") and "aunch" in e.get("name", ""):
            launch_end[corr] = float(e["ts"]) + float(e.get("dur", 0.0))
            launch_dur.append(float(e.get("dur", 0.0)))
        elif cat == "kernel":
            kernels.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), corr))
    kernels.sort()
    idle = host = 0.0
    leads, end = [], None
    for a, b, corr in kernels:
        le = launch_end.get(corr)
        if le is not None:
            leads.append(a - le)
        if end is not None and a > end:
            gap = a - end
            idle += gap
            if le is not None:
                host += min(gap, max(0.0, le - end))
        end = b if end is None or b > end else end
    leads.sort()
    launch_dur.sort()
    threads = sorted(api.items(), key=lambda kv: -kv[1][1])[:4]
    return {"idle_s": idle / 1e6, "idle_host_s": host / 1e6, "idle_wait_s": (idle - host) / 1e6,
            "launch_lead_median_s": leads[len(leads) // 2] / 1e6 if leads else None,
            "kernels_matched": len(leads),
            "launch_call_median_us": launch_dur[len(launch_dur) // 2] if launch_dur else None,
            "launch_call_p90_us": launch_dur[len(launch_dur) * 9 // 10] if launch_dur else None,
            "api_threads": [{"tid": tid, "calls": n, "s": us / 1e6,
                             "top": [[name, c, round(t / 1e6, 6)] for name, (c, t) in
                                     sorted(names.items(), key=lambda kv: -kv[1][1])[:6]]}
                            for tid, (n, us, names) in threads]}


def trace_one_step(module, inputs, case, args, cuda):
    """One more step under torch.profiler (after the timed ones), traced by trace_step."""
    return trace_step(lambda: forward(module, inputs, args.toy, False),
                      os.path.join(args.workdir, f"torch_trace_{case}.json"), cuda,
                      cpu=args.torch_trace != "cuda")


def py_profile_step(step, cuda, top=30):
    """step() once under cProfile: the host's time by function (the top by own time, as text;
    and the binding's own functions by cumulative time), to tell which Python work paces a
    host-bound step."""
    import cProfile
    import pstats
    import torch
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    step()
    if cuda:
        torch.cuda.synchronize()
    prof.disable()
    wall = time.perf_counter() - t
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    ddo = io.StringIO()  # the binding's share: its functions by cumulative time
    pstats.Stats(prof, stream=ddo).sort_stats("cumtime").print_stats("ddo/", top)
    return {"step_s": wall, "top_by_tottime": out.getvalue()[-12000:],
            "ddo_by_cumtime": ddo.getvalue()[-8000:]}


def trace_step(step, path, cuda, cpu=True):
    """step() once under torch.profiler: its Chrome trace at path, and where the device's time
    went: the kernels' summed time, the union of the spans any kernel ran (busy), the copies'
    union, and the step's wall time. Between two cases the kernels' sum tells slower kernels
    (the copies contending with them) from a device left waiting (busy below the step), and
    idle_causes splits that waiting into the host launching late and the device waiting on an
    event (an upload). Where copies ran too: the device's span from its first kernel or copy
    to its last, the time in it when neither ran (neither_busy_s: nothing issued, the host or
    the loader late), copies with no kernel (copy_only_s: kernels waiting on uploads) and
    kernels with no copy (kernel_only_s: the copy engine idle, the ring full or nothing left),
    and the copies' tail after the last kernel (copy_tail_s)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    # cpu=False: the device's activity and the CUDA API calls only, without torch's operators,
    # whose recording slows the host enough to make a host-paced step of a streamed one
    acts = ([ProfilerActivity.CPU] if cpu or not cuda else []) + \
        ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # (torch only logs a miss)
    prof.export_chrome_trace(path)
    kernels, copies = [], []
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        span = (e.time_range.start, e.time_range.end)
        (copies if "memcpy" in e.name.lower() else kernels).append(span)
    res = {"path": path, "step_s": wall, "kernels": len(kernels),
           "kernel_sum_s": sum(b - a for a, b in kernels) / 1e6,
           "kernel_busy_s": busy_union(kernels), "copy_busy_s": busy_union(copies),
           # the copies still running after the step's last kernel: what the synchronize at
           # the step's end waits for (the next step's first units, loading)
           "copy_tail_s": max(0, max(b for _, b in copies) - max(b for _, b in kernels)) / 1e6
           if kernels and copies else None}
    res.update(overlap(kernels, copies))
    try:  # where the device's idle time went: the host launching late, or the device waiting
        with open(path) as f:
            data = json.load(f)  # torch 2: {"traceEvents": [...]}; some versions: the list
        res.update(idle_causes(data.get("traceEvents", []) if isinstance(data, dict) else data))
    except (OSError, ValueError) as e:
        res["idle_causes_error"] = f"{type(e).__name__}: {e}"
    return res


def within_budget(res):
    peak, plan, budget = (res.get("device_weights_peak_bytes"),
                          res.get("planned_device_weights_bytes"), res.get("budget_bytes"))
    if peak is None or plan is None:
        return None
    return bool(peak <= plan and (budget is None or plan <= budget))


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def case_command(case, args, result_path, deadline_epoch):
    cmd = [sys.executable, os.path.abspath(__file__), "--case", case, "--workdir", args.workdir,
           "--result", result_path, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--device", args.device, "--bus-gib", str(args.bus_gib),
           "--image-tokens", str(args.image_tokens), "--text-tokens", str(args.text_tokens),
           "--deadline-epoch", f"{deadline_epoch:.3f}"]
    if args.tiny:
        cmd.append("--tiny")
    if args.toy:
        cmd.append("--toy")
    if args.quant != "none":
        cmd += ["--quant", args.quant, "--gguf-type", args.gguf_type]
    if args.torch_trace:
        cmd.append(f"--torch-trace={args.torch_trace}")
    if args.py_profile:
        cmd.append("--py-profile")
    return cmd


def drive(args):
    start = time.time()
    deadline = start + args.deadline_s
    names = args.cases.split(",") if args.cases else (COMPILE_CASES if args.compile else ALL_CASES)
    for n in names:
        if n not in CASES:
            sys.exit(f"torch_flux: unknown case '{n}' (known: {', '.join(CASES)})")
    os.makedirs(args.workdir, exist_ok=True)
    for name in names:  # a reference this call makes again is never compared stale
        if CASES[name]["kind"] == "resident":
            stale = os.path.join(args.workdir, f"ref_{CASES[name]['ref']}.pt")
            if os.path.exists(stale):
                os.remove(stale)
    results = {}
    for name in names:
        left = deadline - time.time()
        if left < args.min_case_s:
            results[name] = {"case": name, "skipped": f"global deadline ({left:.0f} s left)"}
            log(f"{name}: skipped, {left:.0f} s left before the deadline")
            continue
        results[name] = run_subprocess(name, args, min(left, args.case_timeout_s))
    bounds(results)
    doc = {"meta": meta(args, names, time.time() - start), "cases": results}
    print_table(results, doc["meta"])
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        log(f"wrote {args.out}")
    return 0


def spawn_case(name, args, timeout_s, make_command, soft_margin_s, say=None):
    """Runs one case in a fresh process (make_command(name, args, result_path, soft deadline))
    under a kill after timeout_s; returns (its result dict or None, return code or "timeout",
    wall seconds). Shared with bench/flux_pipeline.py."""
    result_path = os.path.join(args.workdir, f"result_{name}.json")
    if os.path.exists(result_path):
        os.remove(result_path)
    cmd = make_command(name, args, result_path, time.time() + timeout_s - soft_margin_s)
    (say or log)(f"{name}: starting (limit {timeout_s:.0f} s)")
    t = time.time()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        rc = subprocess.run(cmd, env=env, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.time() - t
    res = None
    if os.path.exists(result_path):
        with open(result_path) as f:
            res = json.load(f)
    return res, rc, wall


def run_subprocess(name, args, timeout_s):
    # the case stops timing early (keeping >= 2 steps) at its soft deadline, 25 s before the kill
    res, rc, wall = spawn_case(name, args, timeout_s, case_command, 25)
    if res is None:
        res = {"case": name, "error": f"killed after {timeout_s:.0f} s" if rc == "timeout"
               else f"process exited {rc} without a result"}
    res["process_rc"], res["process_wall_s"] = rc, wall
    status = res.get("skipped") or res.get("error") or f"median {res.get('median_step_s', 0):.4f} s"
    log(f"{name}: done in {wall:.1f} s: {status}")
    return res


def raw_streamed_bytes(before, after, copied):
    """The bytes `copied` would have been raw: the coded uploads replaced by what they decoded
    to (None without coded uploads)."""
    def delta(key):
        a, b = find_key(after or {}, key), find_key(before or {}, key)
        return None if a is None or b is None else a - b
    coded, decoded = delta("bytes_coded_uploaded"), delta("bytes_decoded")
    if not coded or decoded is None:
        return None
    return copied - coded + decoded


def bounds(results):
    """bound = max(resident step, streamed bytes / bus); ratio = median step / bound."""
    for name, r in results.items():
        if "median_step_s" not in r:
            continue
        ref = "resident_compile" if r.get("compile") == "default" else \
            "resident_graphs" if r.get("compile") == "reduce-overhead" else "resident"
        rs = results.get(ref, {}).get("median_step_s")
        if rs is None and ref != "resident":
            ref, rs = "resident", results.get("resident", {}).get("median_step_s")
        bus = r.get("bus_gbps")
        sb = r.get("streamed_bytes_per_step")
        bus_s = sb / (bus * 1e9) if (sb is not None and bus) else None
        cands = [x for x in (rs, bus_s) if x is not None]
        if not cands:
            continue
        r["bound_s"], r["bound_resident_case"], r["bus_bound_s"] = max(cands), ref, bus_s
        r["ratio"] = r["median_step_s"] / r["bound_s"]
        rc = results.get(ref, {}).get("chained_step_s")
        if r.get("chained_step_s") and rc is not None:  # back to back, against the same bound
            r["chained_bound_s"] = max(x for x in (rc, bus_s) if x is not None)
            r["ratio_chained"] = r["chained_step_s"] / r["chained_bound_s"]
        raw = r.get("raw_streamed_bytes_per_step")
        if raw is not None and bus:  # weight_codec: the step against the raw bytes' bound
            r["raw_bus_bound_s"] = raw / (bus * 1e9)
            r["raw_bound_s"] = max(x for x in (rs, r["raw_bus_bound_s"]) if x is not None)
            r["ratio_raw_bound"] = r["median_step_s"] / r["raw_bound_s"]
        eager = results.get(CASES[name].get("eager", ""), {})
        if eager.get("median_step_s"):
            r["step_ratio_vs_eager"] = r["median_step_s"] / eager["median_step_s"]


def meta(args, names, wall):
    m = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
         "TORCHINDUCTOR_DETERMINISTIC": os.environ.get("TORCHINDUCTOR_DETERMINISTIC"),
         "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": names,
         "driver_wall_s": wall, "steps": args.steps, "tokens": list(tokens(args)),
         "tiny": args.tiny, "toy": args.toy, "quant": args.quant,
         "gguf_type": args.gguf_type if args.quant == "gguf_file" else None,
         "ddo_preset": DDO_PRESET,
         "ddo_case_options": {k: {"backend": b, "overrides": o}
                              for k, (b, o) in DDO_CASE_OPTIONS.items()}}
    try:
        import torch
        m["torch"] = torch.__version__
        if torch.cuda.is_available():
            m["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    try:
        import diffusers
        m["diffusers"] = diffusers.__version__
    except Exception as e:  # noqa: BLE001
        m["diffusers"] = f"unavailable: {type(e).__name__}"
    return m


def fmt(v, spec, scale=1.0):
    if v is None or isinstance(v, str):
        return "-".rjust(int(spec.split(".")[0] or 0))
    return format(v / scale, spec)


def print_table(results, m):
    print(f"\ntorch_flux: torch {m.get('torch')}, diffusers {m.get('diffusers')}, "
          f"{m.get('gpu', 'no gpu')}, tokens {m['tokens']}, {m['steps']} timed steps")
    hdr = (f"{'case':18} {'enable s':>8} {'first s':>8} {'median s':>8} {'bus GB/s':>8} "
           f"{'strm GiB':>8} {'bound s':>8} {'ratio':>6} {'chain':>6} {'dev GiB':>8} "
           f"{'alloc GiB':>9} "
           f"{'RSS GiB':>8} {'same':>5}  note")
    print(hdr)
    for name, r in results.items():
        same = {True: "yes", False: "NO", None: "-"}[r.get("identical")]
        note = r.get("skipped") or r.get("error") or ""
        if r.get("compile"):
            note = (f"recompiles {r.get('recompiles_after_warmup')}, re-records "
                    f"{r.get('graph_rerecords_after_warmup')}, x eager "
                    f"{fmt(r.get('step_ratio_vs_eager'), '.3f')} " + note)
        if r.get("weights_within_budget") is False:
            note += " WEIGHTS OVER PLAN/BUDGET"
        also = [k for k, v in (r.get("against") or {}).items() if v.get("identical")]
        if also:
            note += " = " + ",".join(also)
        print(f"{name:18} {fmt(r.get('enable_s'), '8.2f')} {fmt(r.get('first_step_s'), '8.3f')} "
              f"{fmt(r.get('median_step_s'), '8.4f')} {fmt(r.get('bus_gbps'), '8.2f')} "
              f"{fmt(r.get('streamed_bytes_per_step'), '8.2f', GIB)} "
              f"{fmt(r.get('bound_s'), '8.4f')} {fmt(r.get('ratio'), '6.3f')} "
              f"{fmt(r.get('ratio_chained'), '6.3f')} "
              f"{fmt(r.get('device_used_peak_above_baseline_bytes'), '8.2f', GIB)} "
              f"{fmt(r.get('max_memory_allocated_bytes'), '9.2f', GIB)} "
              f"{fmt(r.get('rss_hwm_bytes'), '8.2f', GIB)} {same:>5}  {note[:120]}")
    print("ratio: median step (synchronized around each) / bound; chain: the same steps back to "
          "back (one synchronize each side), against the resident case's back-to-back step")
    print("dev GiB: driver used-memory peak (sampled mem_get_info) above the case's baseline; "
          "alloc: torch max_memory_allocated; RSS: VmHWM of the case process\n", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="ddo's PyTorch binding against Diffusers group offload on the Flux "
                    "transformer (issue 11). Each case runs in a fresh process.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--all", action="store_true", help="driver: run the cases, one process each")
    mode.add_argument("--compile", action="store_true",
                      help="driver: the compiled / CUDA-graph cases (second call)")
    mode.add_argument("--case", choices=sorted(CASES), help="run one case in this process")
    p.add_argument("--cases", default=None, help="driver: comma-separated case list")
    p.add_argument("--out", default=None, help="driver: JSON results file")
    p.add_argument("--result", default=None, help="case: write the case's JSON here")
    p.add_argument("--workdir", default=os.environ.get("TORCH_FLUX_WORKDIR", "/tmp/torch_flux"),
                   help="reference outputs, plans and per-case results")
    p.add_argument("--steps", type=int, default=6, help="timed steps per case (>= 5 for figures)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed steps first (ddo: >= 3, compile: >= 4)")
    p.add_argument("--device", default="cuda:0", help="execution device (cpu with --toy/--tiny)")
    p.add_argument("--bus-gib", type=float, default=4.0, help="size of the pinned bus copy")
    p.add_argument("--py-profile", action="store_true",
                   help="one more step per case under cProfile: the host's top functions by own "
                        "time (JSON: py_profile)")
    p.add_argument("--torch-trace", nargs="?", const="all", choices=("all", "cuda"),
                   help="one more step per case under torch.profiler: its trace in the workdir "
                        "and the kernels' time against the step's (JSON: torch_trace); 'cuda' "
                        "records the device and the CUDA calls only, not torch's operators, "
                        "which slow the host")
    p.add_argument("--image-tokens", type=int, default=4096)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--tiny", action="store_true", help="tiny Flux configuration (smoke test)")
    p.add_argument("--toy", action="store_true", help="built-in Flux-like module, no Diffusers")
    p.add_argument("--quant", choices=("none", "q8_0", "q4_k", "fp8", "fp8_wrapper", "gguf_file",
                                       "torchao_fp8"),
                   default="none",
                   help="the blocks' linear layers as quantized stand-ins (bench/quant_layers.py: "
                        "GGUF-style Q8_0 or Q4_K, ComfyUI-style scaled FP8, or a TorchAO-style "
                        "float8 wrapper subclass), streamed as stored; gguf_file: the real "
                        "packages, a GGUF file (--gguf-type) written by gguf's writer, loaded by "
                        "Diffusers' from_single_file (bench/gguf_real.py); torchao_fp8: the "
                        "blocks' linears by TorchAO's own quantize_(Float8WeightOnlyConfig())")
    p.add_argument("--gguf-type", choices=("Q8_0", "Q4_K"), default="Q8_0",
                   help="--quant gguf_file: the block type of the blocks' linear weights")
    p.add_argument("--deadline-s", type=float, default=510.0,
                   help="driver: global deadline for all cases (default 8.5 min)")
    p.add_argument("--case-timeout-s", type=float, default=300.0, help="driver: one case's limit")
    p.add_argument("--min-case-s", type=float, default=45.0,
                   help="driver: skip a case when less than this is left")
    p.add_argument("--deadline-epoch", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps must be >= 1")
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.case:
        res = run_case(args.case, args)
        text = json.dumps(res, indent=1, default=str)
        if args.result:
            with open(args.result + ".tmp", "w") as f:
                f.write(text)
            os.replace(args.result + ".tmp", args.result)
        else:
            print(text)
        status = res.get("skipped") or res.get("error") or "ok"
        if "traceback" in res:
            print(res["traceback"], file=sys.stderr, flush=True)
        log(f"case {args.case}: {status}")
        return 0 if "error" not in res else 1
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
