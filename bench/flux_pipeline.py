#!/usr/bin/env python3
"""A whole Diffusers FluxPipeline in 8 GiB of device memory: ddo phase-staged against Diffusers'
own offload modes (the H200 part of ddo's Diffusers issue).

The pipeline has Flux.1-dev's configurations and random bf16 weights, identical in every
process: the CLIP ViT-L/14 text model (77 tokens, pooled output), the T5-XXL encoder (512
tokens), the FluxTransformer2DModel of data/layouts/flux1-dev.json and the AutoencoderKL of
Flux.1-dev, with its FlowMatchEulerDiscreteScheduler; 1024x1024, 8 steps, guidance 3.5, a fixed
generator seed. No tokenizer files are used: fixed token ids go through the text encoders (the
encode phase), then the pipeline runs from prompt_embeds / pooled_prompt_embeds with
output_type="latent" (the denoise phase), then the VAE decodes the latents (the decode phase),
exactly as FluxPipeline does after its loop.

  Driver:  PYTHONPATH=.devbench/src:python DDO_LIBRARY=<build>/libddo.so \\
           python3 bench/flux_pipeline.py --all --out $OUT/flux_pipeline.json
  Smoke:   python3 bench/flux_pipeline.py --all --tiny --in-process --out $OUT/tiny.json
           (toy configurations, all cases in one process: one import of Diffusers, ~1 min)
  Suite:   PIPE_ARGS=--all SKIP_TESTS=1 SKIP_SANITIZER=1 SUITE_BUDGET_S=575 \
           bash bench/gpu_suite.sh   (build, the smoke test, then these cases)
  One:     python3 bench/flux_pipeline.py --case ddo --workdir /tmp/flux_pipeline
  Table:   python3 bench/flux_pipeline.py --list   (the cases and the ddo options; no torch)

Cases, each in a fresh process, in this order (CASES below): resident (uncapped, everything on
the GPU: the reference latents and the compute figure), ddo (phase-staged: every component
streamed or held by its own ddo session, reloaded for its phase and unloaded after it),
ddo_one_line (the same sessions and options through ddo.enable_pipeline_offload(pipe): no
phase entered or left by hand, the pipeline's own calls load each component and unload the
least recently used when its device memory is needed; target: its total, on the first call
and on every warm call, at most 1.05 x the ddo case's, latents bit-identical, device peak
within --device-gib: targets()["one_line"]), group_offload (Diffusers' enable_group_offload
on every component, leaf_level, use_stream, record_stream), sequential_cpu_offload and
model_cpu_offload (Diffusers + accelerate).
Every case but resident runs with torch's caching allocator capped by
torch.cuda.set_per_process_memory_fraction so that the process's device memory (its baseline
at the start, the CUDA context; torch's cap; ddo's device weight budget; a margin for what no
allocator counts, such as cuBLAS handles and kernel code) adds up to --device-gib (8).

Per case: setup, encode, denoise (and each step, from CUDA events), decode and total seconds
(total: from the start of setup to the end of decode; building the random weights, which stands
in for reading them from disk, is reported apart as build_s; a phase includes ddo's reload
before it and unload after it, denoise_s is the pipeline call alone; the three phases run
--runs times (3) after the one setup, the later runs' figures under "repeats": the denoise
target is read on those warm calls, as the device method times (warm up first, so that module
load, run-time compilation and handle creation stay out of the numbers); the first call's
ratio is reported beside it as denoise_first_call: it pays one-time costs in every mode,
resident included: cuDNN's attention plan for the shape, kernels loaded at their first
launch; --probe units shows where);
the bus measured in the same process (a pinned host->device copy, after the peaks are read);
the bytes ddo streamed (its copy_bytes); the driver's used device memory, sampled
(torch.cuda.mem_get_info), absolute and above the case's baseline, with torch's own peaks;
host RSS (VmHWM); and latents, prompt embeddings and image against the resident run's
(bit-identical, torch.equal on the bits, and the largest absolute difference). The driver
writes the JSON after every case and each case writes its own after every phase, so a killed
run still leaves what it measured. Nothing here is estimated except where a field says
"nominal" or "arithmetic".
"""

import argparse
import gc
import json
import math
import os
import re
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_flux as tf  # noqa: E402  (its measurement helpers: Sampler, measure_bus, ...)

GIB = tf.GIB
MIB = 1 << 20
SEED = tf.SEED
TENSOR_ALIGN = 256  # DDO_TENSOR_ALIGN: ddo lays tensors out at 256-byte offsets
VMM_GRANULARITY = 2 * MIB  # the VMM slot page on the H200 (its mapping granularity)

# ---------------------------------------------------------------------------------------------
# Flux.1-dev's configurations (the model repository's config.json files; constructor names
# checked against diffusers 0.40.0.dev0 and transformers' T5Config / CLIPTextConfig).
# ---------------------------------------------------------------------------------------------
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, projection_dim=768,
              num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
              hidden_act="quick_gelu", layer_norm_eps=1e-5, attention_dropout=0.0, dropout=0.0,
              pad_token_id=1, bos_token_id=0, eos_token_id=2)
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              relative_attention_num_buckets=32, relative_attention_max_distance=128,
              dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu",
              is_encoder_decoder=True, tie_word_embeddings=False, pad_token_id=0,
              eos_token_id=1, decoder_start_token_id=0)
VAE_FLUX = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32,
                sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, latents_mean=None,
                latents_std=None, force_upcast=True, use_quant_conv=False,
                use_post_quant_conv=False, mid_block_add_attention=True)
SCHEDULER_FLUX = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                      base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                      max_image_seq_len=4096)
# --tiny: the same classes at toy size (a smoke test of every code path in about a minute).
TINY = {
    "text_encoder": dict(CLIP_L, hidden_size=16, intermediate_size=32, projection_dim=16,
                         num_hidden_layers=2, num_attention_heads=2),
    "text_encoder_2": dict(T5_XXL, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2),
    "transformer": dict(patch_size=1, in_channels=16, out_channels=None, num_layers=2,
                        num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                        joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
                        axes_dims_rope=(4, 6, 6)),
    "vae": dict(VAE_FLUX, block_out_channels=(32, 32, 32, 32), layers_per_block=1,
                latent_channels=4),
}
COMPONENTS = ("text_encoder", "text_encoder_2", "transformer", "vae")  # build and phase order
PHASES = (("encode", ("text_encoder", "text_encoder_2")), ("denoise", ("transformer",)),
          ("decode", ("vae",)))
CLIP_BOS, CLIP_EOS, T5_EOS = 49406, 49407, 1  # the ids CLIP's and T5's tokenizers give
PROMPT_TOKENS = 24  # fixed "prompt" ids before EOS; CLIP pads with EOS, T5 with 0

# ---------------------------------------------------------------------------------------------
# Cases. capped: torch's allocator capped so the case fits in --device-gib. timeout_s: the
# driver's limit for the process (the global deadline may cut it).
# ---------------------------------------------------------------------------------------------
CASES = {
    "resident": dict(kind="resident", capped=False, timeout_s=170,
                     what="pipe.to(cuda): everything resident, uncapped; the reference latents "
                          "and the compute figure"),
    "ddo": dict(kind="ddo", capped=True, timeout_s=170,
                what="ddo.enable_offload per component (route dynamic_offload, vmm), each "
                     "session reloaded for its phase and unloaded after it; torch capped"),
    "ddo_one_line": dict(kind="ddo_pipeline", capped=True, timeout_s=170,
                         what="ddo.enable_pipeline_offload(pipe) with the ddo case's options: "
                              "no hand-written phases, each component loaded when the "
                              "pipeline first calls it and the least recently used unloaded "
                              "when its device memory is needed; torch capped"),
    "group_offload": dict(kind="group", capped=True, timeout_s=220,
                          offload_type="leaf_level", use_stream=True, record_stream=True,
                          what="pipe.enable_group_offload on every component: leaf_level, "
                               "use_stream, record_stream (pre-pinned); torch capped"),
    "sequential_cpu_offload": dict(kind="sequential", capped=True, timeout_s=260,
                                   what="pipe.enable_sequential_cpu_offload (accelerate); "
                                        "torch capped"),
    "model_cpu_offload": dict(kind="model", capped=True, timeout_s=120,
                              what="pipe.enable_model_cpu_offload (accelerate); torch capped: "
                                   "a 9.5 GB T5 or a 23.8 GB transformer cannot fit, so an OOM "
                                   "is its expected result (also checked by arithmetic)"),
}
ALL_CASES = ["resident", "ddo", "ddo_one_line", "group_offload", "sequential_cpu_offload",
             "model_cpu_offload"]
DDO_KINDS = ("ddo", "ddo_pipeline")
DIFFUSERS_KINDS = ("group", "sequential", "model")

# ---------------------------------------------------------------------------------------------
# ddo's options per component (docs/options.md). Values are Python values; the binding converts
# them. The budgets (vmm_resident_weight_budget_gb, resident_module_budget_gb) are computed per
# run by ddo_budgets() from the case's measured baseline.
# ---------------------------------------------------------------------------------------------
DDO_PRESET = "auto"
DDO_BACKEND = "vmm"
DDO_COMMON = dict(execution_device="cuda:0", pin_cpu_memory=True, pin_cpu_workers=8,
                  auto_budget_policy="off", small_tensor_threshold_bytes=MIB, execution_slots=3)
# transformer: the root leaves resident (as bench/torch_flux.py's 16 GiB case), whole blocks
# resident within what is left after three slots; T5: runs once per image, so zero resident
# (every block streams once either way); CLIP and the VAE: small, wholly resident.
DDO_ALWAYS = {"transformer": tf.DDO_ROOT_LEAVES, "text_encoder_2": "^$", "text_encoder": "^",
              "vae": "^"}
DDO_RESIDENT_BLOCKS = {"transformer": True, "text_encoder_2": False, "text_encoder": False,
                       "vae": False}


def log(msg):
    print(f"[flux_pipeline {time.strftime('%H:%M:%S')}] {msg}", flush=True)


repo_root = tf.repo_root


def configs(tiny):
    """{component: constructor kwargs} plus the scheduler's."""
    if tiny:
        out = {k: dict(v) for k, v in TINY.items()}
    else:
        out = {"text_encoder": dict(CLIP_L), "text_encoder_2": dict(T5_XXL),
               "transformer": tf.flux_config(argparse.Namespace(tiny=False)),
               "vae": dict(VAE_FLUX)}
    out["scheduler"] = dict(SCHEDULER_FLUX)
    return out


# ---------------------------------------------------------------------------------------------
# Budget arithmetic (pure: no torch; tests/python/test_bench_flux_pipeline.py checks it)
# ---------------------------------------------------------------------------------------------
def round_up(n, a):
    return (n + a - 1) // a * a


def block_groups(names):
    """{prefix: distinct block numbers} of the numbered groups prefix.N in the names."""
    groups = {}
    for name in names:
        parts = name.split(".")
        for i, p in enumerate(parts[:-1]):
            if p.isdigit():
                groups.setdefault(".".join(parts[:i]), set()).add(p)
    return groups


def unit_of(name, groups):
    """ddo's block-granularity unit of a tensor: its outermost block prefix.N of a group of at
    least two blocks (src/checkpoint/checkpoint_blocks.c), else its module (a leaf unit)."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit() and len(groups.get(".".join(parts[:i]), ())) >= 2:
            return ".".join(parts[:i + 1]), True
    return ".".join(parts[:-1]), False


def component_plan(tensors, limit_bytes, always_pattern, resident_blocks, *,
                   threshold=MIB, slots=3, page=VMM_GRANULARITY, margin=16 * MIB,
                   resident_override=None):
    """What ddo's planner will place for one component under a device-weights limit.

    tensors: [(name, nbytes)], one per storage. Tensors of modules matching always_pattern
    (regex search on the module name) and tensors of at most threshold bytes are resident
    (fixed); the rest stream in units (unit_of). The slot is the largest streamed unit's span
    (tensors at 256-byte offsets) rounded to the page; `slots` slots. resident_blocks: whole
    blocks may be made resident in what the limit leaves (resident_module_budget_gb), or
    resident_override bytes. Returns the fixed, slot and resident-budget bytes and the bound
    peak = fixed + resident budget + slots x slot (the planner's peak is at most this).
    """
    always = re.compile(always_pattern) if always_pattern else None
    groups = block_groups(n for n, _ in tensors)
    fixed, spans, total = 0, {}, 0
    for name, nb in tensors:
        total += nb
        module = name.rsplit(".", 1)[0] if "." in name else ""
        if (always is not None and always.search(module)) or nb <= threshold:
            fixed += round_up(nb, TENSOR_ALIGN)
            continue
        unit, _ = unit_of(name, groups)
        spans[unit] = round_up(spans.get(unit, 0), TENSOR_ALIGN) + nb
    streams = bool(spans)
    slot = round_up(max(spans.values()), page) if streams else 0
    n_slots = slots if streams else 0
    room = limit_bytes - fixed - n_slots * slot - margin
    if resident_override is not None:
        resident = int(resident_override)
    elif resident_blocks and streams:
        resident = max(0, room)
    else:
        resident = 0
    return {"total_bytes": total, "fixed_bytes": fixed, "units": len(spans),
            "largest_unit": max(spans, key=spans.get) if streams else None,
            "slot_bytes": slot, "slots": n_slots, "resident_budget_bytes": resident,
            "peak_bound_bytes": fixed + resident + n_slots * slot,
            "fits": fixed + resident + n_slots * slot + margin <= limit_bytes and resident >= 0}


def device_split(device_gib, baseline_bytes, torch_gib, margin_gib, ddo=True):
    """The device target split: baseline (measured) + margin + torch's cap [+ ddo's weights].

    Without ddo, torch gets everything but the baseline and the margin.
    """
    target = int(device_gib * GIB)
    margin = int(margin_gib * GIB)
    if not ddo:
        return {"target_bytes": target, "baseline_bytes": baseline_bytes, "margin_bytes": margin,
                "torch_cap_bytes": target - baseline_bytes - margin, "ddo_bytes": 0}
    cap = int(torch_gib * GIB)
    return {"target_bytes": target, "baseline_bytes": baseline_bytes, "margin_bytes": margin,
            "torch_cap_bytes": cap, "ddo_bytes": target - baseline_bytes - margin - cap}


def gib_floor(n):
    """Bytes as GiB text for an option, rounded down to 1e-4 GiB (never above n)."""
    return f"{math.floor(n / GIB * 1e4) / 1e4:.4f}"


def gib_ceil(n):
    return f"{math.ceil(n / GIB * 1e4) / 1e4:.4f}"


def ddo_budgets(component_tensors, ddo_bytes, resident_override=None, threshold=MIB,
                transformer_slots=3):
    """Per component: the plan arithmetic and the ddo options, so that every phase's sessions
    together stay within ddo_bytes (the encode phase holds CLIP and T5 at once).

    CLIP and the VAE are wholly resident: their limit is their arena. T5 streams with no
    resident blocks. The transformer takes all of ddo_bytes, whole blocks resident in what
    three slots and its fixed residents leave (or resident_override bytes).
    Returns {"components": {name: {plan, options}}, "phase_bytes": {phase: bytes}, "ok", "why"}.
    """
    out, limits = {}, {}
    for name in ("text_encoder", "vae", "text_encoder_2", "transformer"):
        tensors = component_tensors[name]
        always, blocks = DDO_ALWAYS[name], DDO_RESIDENT_BLOCKS[name]
        if name in ("text_encoder", "vae"):
            probe = component_plan(tensors, 1 << 62, always, False, threshold=threshold)
            limit = round_up(probe["peak_bound_bytes"] + 16 * MIB, VMM_GRANULARITY)
        elif name == "text_encoder_2":
            probe = component_plan(tensors, 1 << 62, always, False, threshold=threshold)
            limit = probe["peak_bound_bytes"] + 32 * MIB
        else:
            limit = ddo_bytes
        slots = transformer_slots if name == "transformer" else 3
        plan = component_plan(tensors, limit, always, blocks, threshold=threshold, slots=slots,
                              resident_override=resident_override if blocks else None)
        limits[name] = limit
        opts = dict(DDO_COMMON, execution_slots=slots, always_resident_modules_pattern=always,
                    small_tensor_threshold_bytes=threshold,
                    vmm_resident_weight_budget_gb=gib_ceil(limit) if name != "transformer"
                    else gib_floor(limit),
                    vmm_source_cache_gb=math.ceil(plan["total_bytes"] / GIB) + 2,
                    resident_module_patterns="auto" if blocks else "",
                    resident_module_budget_gb=gib_floor(plan["resident_budget_bytes"]))
        out[name] = {"plan": plan, "limit_bytes": limit, "options": opts}
    phase = {ph: sum(limits[c] for c in comps) for ph, comps in PHASES}
    bad = [f"{c}: {out[c]['plan']['peak_bound_bytes'] / GIB:.2f} GiB planned over its "
           f"{out[c]['limit_bytes'] / GIB:.2f} GiB limit"
           for c in out if not out[c]["plan"]["fits"]]
    bad += [f"phase {ph}: {b / GIB:.2f} GiB of ddo budgets over {ddo_bytes / GIB:.2f} GiB"
            for ph, b in phase.items() if b > ddo_bytes]
    return {"components": out, "phase_bytes": phase, "ddo_bytes": ddo_bytes, "ok": not bad,
            "why": "; ".join(bad)}


def model_offload_arithmetic(component_bytes, torch_cap_bytes):
    """enable_model_cpu_offload holds one whole component on the device while it runs: it
    cannot fit when a component's weights alone exceed torch's cap (a necessary condition)."""
    name = max(component_bytes, key=component_bytes.get)
    return {"largest_component": name, "largest_bytes": component_bytes[name],
            "torch_cap_bytes": torch_cap_bytes,
            "fits": component_bytes[name] < torch_cap_bytes,
            "rule": "largest component's weights < torch's cap (necessary, not sufficient)"}


def denoise_target(r, d, bus):
    """ddo's denoise (r) against max(the resident denoise (d), ddo's denoise bytes / bus)."""
    comp = d.get("denoise_s")
    sb = r.get("denoise_copy_bytes")
    bus_s = sb / (bus * 1e9) if (sb is not None and bus) else None
    if r.get("denoise_s") is None or comp is None or bus_s is None:
        return None
    bound = max(comp, bus_s)
    return {"ddo_s": r["denoise_s"], "resident_s": comp, "bus_bound_s": bus_s, "bound_s": bound,
            "ratio": r["denoise_s"] / bound, "target": 1.05, "met": r["denoise_s"] <= 1.05 * bound}


def targets(results, device_gib):
    """The issue's targets from the measured results (None where a figure is missing).

    denoise: read on the warm pipeline calls (--runs >= 2: every call after the process's
    first, ddo's and the resident case's of the same index), as the device method says to time
    (warm up first, so that module load, run-time compilation and handle creation stay out of
    the numbers); met when every warm call meets it. With --runs 1 there is no warm call and
    the first call's figure stands in (warm: False). denoise_first_call: the first call's
    ratio, always reported beside it: it pays every mode's one-time costs (cuDNN's attention
    plan for the shape, kernels loaded at their first launch; --probe units shows where).
    """
    r, d = results.get("ddo", {}), results.get("resident", {})
    out = {}
    first = denoise_target(r, d, r.get("bus_gbps"))
    if first is not None:
        out["denoise_first_call"] = dict(first, run=1)
    warm = []
    for k, (rr, dd) in enumerate(zip(r.get("repeats") or [], d.get("repeats") or [])):
        den = denoise_target(rr, dd, r.get("bus_gbps"))
        if den is not None:
            warm.append(dict(den, run=k + 2))
    if warm:
        worst = max(warm, key=lambda w: w["ratio"])
        out["denoise"] = dict(worst, warm=True, runs=warm, met=all(w["met"] for w in warm),
                              reading="every warm call (the process's later pipeline calls); "
                                      "the worst one's figures")
    elif first is not None:
        out["denoise"] = dict(first, warm=False, reading="no warm call (--runs 1): the first "
                                                         "call's figure")
    fits = {n: x for n, x in results.items()
            if x.get("kind") in DIFFUSERS_KINDS and x.get("total_s") is not None
            and not x.get("error") and x.get("device_used_peak_bytes") is not None
            and x["device_used_peak_bytes"] <= device_gib * GIB}
    if r.get("total_s") is not None and fits:
        best = min(fits, key=lambda n: fits[n]["total_s"])
        out["total"] = {"ddo_s": r["total_s"], "fastest_diffusers": best,
                        "fastest_diffusers_s": fits[best]["total_s"],
                        "ratio": r["total_s"] / fits[best]["total_s"], "target": 0.5,
                        "met": r["total_s"] <= 0.5 * fits[best]["total_s"]}
    if r.get("device_used_peak_bytes") is not None:
        out["device_peak"] = {"bytes": r["device_used_peak_bytes"],
                              "limit_bytes": int(device_gib * GIB),
                              "met": r["device_used_peak_bytes"] <= device_gib * GIB}
    if r.get("rss_hwm_bytes") and r.get("weights_bytes"):
        out["host_rss"] = {"bytes": r["rss_hwm_bytes"], "weights_bytes": r["weights_bytes"],
                           "ratio": r["rss_hwm_bytes"] / r["weights_bytes"], "target": 1.1,
                           "met": r["rss_hwm_bytes"] <= 1.1 * r["weights_bytes"]}
    if "latents_identical" in r:
        out["latents_identical"] = {"met": r["latents_identical"],
                                    "max_abs_diff": r.get("latents_max_abs_diff")}
    one = one_line_target(r, results.get("ddo_one_line", {}), device_gib)
    if one is not None:
        out["one_line"] = one
    return out


def one_line_target(explicit, one, device_gib, target=1.05):
    """The one-line form (ddo_one_line) against the explicit phases (ddo): its total time on
    the first call (setup and the three phases, total_s) and on every warm call (the phases,
    phases_s of each repeat) at most target x the explicit case's; its latents bit-identical to
    the resident reference; its device peak within device_gib. None: no one-line figures."""
    if one.get("total_s") is None or explicit.get("total_s") is None:
        return None
    calls = [{"run": 1, "one_line_s": one["total_s"], "explicit_s": explicit["total_s"]}]
    for k, (o, e) in enumerate(zip(one.get("repeats") or [], explicit.get("repeats") or [])):
        if o.get("phases_s") is not None and e.get("phases_s") is not None:
            calls.append({"run": k + 2, "one_line_s": o["phases_s"], "explicit_s": e["phases_s"]})
    for c in calls:
        c["ratio"] = c["one_line_s"] / c["explicit_s"]
        c["met"] = c["ratio"] <= target
    peak = one.get("device_used_peak_bytes")
    return {"target": target, "calls": calls, "met": all(c["met"] for c in calls),
            "worst_ratio": max(c["ratio"] for c in calls),
            "latents_identical": one.get("latents_identical"),
            "device_peak_bytes": peak, "device_limit_bytes": int(device_gib * GIB),
            "device_peak_met": peak is not None and peak <= device_gib * GIB}


# ---------------------------------------------------------------------------------------------
# The pipeline (torch, diffusers, transformers: imported only here)
# ---------------------------------------------------------------------------------------------
def tensors_of(module):
    """[(name, nbytes)] of a module's parameters, one per storage (as ddo's binding sees it)."""
    seen, out = set(), []
    for name, p in module.named_parameters():
        key = (p.data_ptr(), p.dtype, tuple(p.shape))
        if key in seen:
            continue
        seen.add(key)
        out.append((name, p.numel() * p.element_size()))
    return out


def build_components(args, res):
    """The four components on the CPU, bf16, identical in every process: each constructed on
    the GPU (its buffers as its constructor computes them), every parameter filled from a fixed
    seed (bench/torch_flux.py's fill_params), then moved to the CPU."""
    import torch
    t0 = time.perf_counter()
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
    res["import_s"] = time.perf_counter() - t0
    cfgs = configs(args.tiny)
    make = {"text_encoder": lambda c: CLIPTextModel(CLIPTextConfig(**c)),
            "text_encoder_2": lambda c: T5EncoderModel(T5Config(**c)),
            "transformer": lambda c: FluxTransformer2DModel(**c),
            "vae": lambda c: AutoencoderKL(**c)}
    comps, info = {}, {}
    torch.manual_seed(SEED)
    for name in COMPONENTS:
        t = time.perf_counter()
        with torch.device("cuda"):
            m = make[name](cfgs[name])
        m = m.to(torch.bfloat16)
        tf.fill_params(m, "cuda")
        torch.cuda.synchronize()
        t_init = time.perf_counter() - t
        m = to_host(m).eval().requires_grad_(False)
        torch.cuda.empty_cache()
        comps[name] = m
        info[name] = {"class": type(m).__name__, "params": sum(1 for _ in m.parameters()),
                      "bytes": tf.model_bytes(m), "init_s": t_init,
                      "to_cpu_s": time.perf_counter() - t - t_init,
                      "build_s": time.perf_counter() - t,
                      "config": {k: (list(v) if isinstance(v, tuple) else v)
                                 for k, v in cfgs[name].items()}}
    comps["scheduler"] = FlowMatchEulerDiscreteScheduler(**cfgs["scheduler"])
    res["components"] = info
    res["weights_bytes"] = sum(i["bytes"] for i in info.values())
    res["build_s"] = time.perf_counter() - t0
    return comps


def to_host(module):
    """module.to("cpu") into pageable memory whose pages are touched first by torch's CPU
    threads (zero_), then copied into: the same tensors as .to("cpu") gives, without one thread
    taking every first-touch page fault during the copy (1.1 GB/s on the GPU machine)."""
    import torch

    def host_copy(t):
        if t.device.type == "cpu":
            return t
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu")
        out.zero_()
        out.copy_(t)
        return out

    with torch.no_grad():
        return module._apply(host_copy)


def make_pipeline(comps):
    from diffusers import FluxPipeline
    pipe = FluxPipeline(scheduler=comps["scheduler"], vae=comps["vae"],
                        text_encoder=comps["text_encoder"], tokenizer=None,
                        text_encoder_2=comps["text_encoder_2"], tokenizer_2=None,
                        transformer=comps["transformer"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def token_ids(clip_len=77, t5_len=512):
    """Fixed token ids as the tokenizers would give them: CLIP [BOS, prompt, EOS, EOS...],
    T5 [prompt, EOS, 0...]."""
    import torch
    g = torch.Generator().manual_seed(SEED + 3)
    clip = torch.full((1, clip_len), CLIP_EOS, dtype=torch.long)
    clip[0, 0] = CLIP_BOS
    clip[0, 1:1 + PROMPT_TOKENS] = torch.randint(1000, 40000, (PROMPT_TOKENS,), generator=g)
    t5 = torch.zeros((1, t5_len), dtype=torch.long)
    t5[0, :PROMPT_TOKENS] = torch.randint(100, 32000, (PROMPT_TOKENS,), generator=g)
    t5[0, PROMPT_TOKENS] = T5_EOS
    return clip, t5


def encode(pipe, ids, device):
    """FluxPipeline._get_clip_prompt_embeds and _get_t5_prompt_embeds from the token ids."""
    import torch
    clip, t5 = ids
    with torch.no_grad():
        out = pipe.text_encoder(clip.to(device), output_hidden_states=False)
        pooled = out.pooler_output.to(dtype=pipe.text_encoder.dtype, device=device)
        pe = pipe.text_encoder_2(t5.to(device), output_hidden_states=False)[0]
        pe = pe.to(dtype=pipe.text_encoder_2.dtype, device=device)
    return pe, pooled


def denoise(pipe, pe, pooled, args, events, probes=None, probe=None):
    """The pipeline from the embeddings; a CUDA event after every step (callback), and with
    probe the host clock and probe()'s figures there too (probes)."""
    import torch

    def on_step(_pipe, _i, _t, kwargs):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        events.append(ev)
        if probes is not None:
            probes.append((time.perf_counter(), probe() if probe is not None else None))
        return kwargs

    g = torch.Generator("cpu").manual_seed(args.seed)
    out = pipe(prompt_embeds=pe, pooled_prompt_embeds=pooled, height=args.height,
               width=args.width, num_inference_steps=args.steps, guidance_scale=args.guidance,
               generator=g, output_type="latent", return_dict=False, callback_on_step_end=on_step,
               max_sequence_length=pe.shape[1])
    return out[0]


def decode(pipe, latents, args, res):
    """FluxPipeline's decode after its loop; under an OOM, once more with the VAE tiled
    (recorded: the image then differs from the resident one by construction)."""
    import torch

    def run():
        lat = pipe._unpack_latents(latents, args.height, args.width, pipe.vae_scale_factor)
        lat = (lat / pipe.vae.config.scaling_factor) + pipe.vae.config.shift_factor
        with torch.no_grad():
            return pipe.vae.decode(lat, return_dict=False)[0]

    try:
        return run()
    except torch.OutOfMemoryError as e:
        res["decode_oom"] = str(e).splitlines()[0][:300]
    torch.cuda.empty_cache()
    pipe.vae.enable_tiling()
    res["decode_tiled"] = True
    return run()


# ---------------------------------------------------------------------------------------------
# Modes: setup, and what each does around a phase
# ---------------------------------------------------------------------------------------------
class Mode:
    """Resident and the Diffusers modes: their hooks move weights themselves."""

    def __init__(self, pipe, spec, args, res):
        self.pipe, self.spec, self.args, self.res = pipe, spec, args, res
        self.device = args.device
        self.handles = {}

    def setup(self):
        import torch
        kind, p, dev = self.spec["kind"], self.pipe, torch.device(self.device)
        if kind == "resident":
            p.to(dev)
        elif kind == "group":
            kw = dict(onload_device=dev, offload_device=torch.device("cpu"),
                      offload_type=self.spec["offload_type"], use_stream=self.spec["use_stream"],
                      record_stream=self.spec["record_stream"])
            self.res["group_offload_kwargs"] = {k: str(v) for k, v in kw.items()}
            p.enable_group_offload(**kw)
        elif kind == "sequential":
            p.enable_sequential_cpu_offload(device=self.device)
        elif kind == "model":
            p.enable_model_cpu_offload(device=self.device)
        else:
            raise ValueError(kind)

    def enter(self, comps):
        pass

    def leave(self, comps):
        pass

    def copy_bytes(self, comps):
        return None

    def step_probe(self):
        """Cumulative figures read at every denoise step's end (None: nothing to read)."""
        return None

    def close(self):
        pass


class DdoMode(Mode):
    """Every component its own ddo session, enabled and unloaded at once (so setup holds one
    session's device weights at a time), reloaded for its phase and unloaded after it."""

    def setup(self):
        import ddo
        b = self.res["ddo_budgets"]
        calls = {}
        for name in COMPONENTS:
            module = getattr(self.pipe, name)
            comp = b["components"][name]
            opts = dict(comp["options"], execution_device=self.device)
            for attempt in range(3):
                calls[name] = dict(opts)
                try:
                    r = ddo.enable_offload(module, DDO_PRESET, component=name,
                                           route="dynamic_offload", backend=DDO_BACKEND,
                                           use_environment=False, **opts)
                    break
                except ddo.DdoError as e:
                    # The planner refused the arithmetic's resident budget: one slot less
                    # (recorded; the setup time includes the refused plans).
                    left = float(opts["resident_module_budget_gb"]) * GIB
                    if e.code != "DDO_E_BUDGET" or left <= 0 or attempt == 2:
                        raise
                    self.res.setdefault("ddo_budget_retries", []).append(
                        {"component": name, "error": str(e)[:500]})
                    slot = comp["plan"]["slot_bytes"] or 64 * MIB
                    opts["resident_module_budget_gb"] = gib_floor(max(0, left - slot))
            self.handles[name] = r
            self.res.setdefault("ddo_plan_budgets", {})[name] = r.budgets()
            self.res.setdefault("ddo_plan_summary", {})[name] = tf.scalars(r.plan)
            r.unload()
        self.res["ddo_call"] = {"preset": DDO_PRESET, "backend": DDO_BACKEND,
                                "route": "dynamic_offload", "use_environment": False,
                                "overrides": calls}

    def enter(self, comps):
        for c in comps:
            self.handles[c].reload()

    def leave(self, comps):
        for c in comps:
            self.handles[c].unload()

    def step_probe(self):
        """The transformer session's host stall (acquire waiting for uploads or slots), copy
        engine busy time and bytes so far: per step, they tell a host-bound step (little
        stall, idle copy engine) from a copy-bound one."""
        r = self.handles.get("transformer")
        if r is None:
            return None
        snap = r.metrics_snapshot()
        return {k: snap.get(k) for k in ("stall_ns", "copy_busy_ns", "copy_bytes")}

    def copy_bytes(self, comps):
        total = 0
        for c in comps:
            n, _ = tf.ddo_bytes(self.handles[c])
            if n is None:
                return None
            total += int(n)
        return total

    def close(self):
        import torch
        t = time.perf_counter()
        metrics = {}
        for name, r in self.handles.items():
            metrics[name] = tf.ddo_bytes(r)[1]
        for r in reversed(list(self.handles.values())):
            r.close()
        if str(self.device).startswith("cuda"):
            torch.cuda.synchronize()
        self.res["ddo_metrics"] = metrics
        self.res["close_s"] = time.perf_counter() - t
        self.handles = {}


class PipelineMode(DdoMode):
    """The one-line form: ddo.enable_pipeline_offload(pipe) with the ddo case's per-component
    options; no phase is entered or left by hand (enter/leave do nothing): the stager's hooks
    load each component when the pipeline first calls it and unload the least recently used
    when its device memory is needed."""

    def setup(self):
        import ddo
        b = self.res["ddo_budgets"]
        opts = {n: dict(b["components"][n]["options"], execution_device=self.device)
                for n in COMPONENTS}
        for attempt in range(3):
            try:
                self.results = ddo.enable_pipeline_offload(
                    self.pipe, DDO_PRESET, components=list(COMPONENTS), backend=DDO_BACKEND,
                    routes={n: "dynamic_offload" for n in COMPONENTS}, use_environment=False,
                    component_options=opts)
                break
            except ddo.DdoError as e:
                # As the ddo case: the planner refused the transformer's resident budget:
                # one slot less (recorded; the setup time includes the refused plans).
                tr = opts["transformer"]
                left = float(tr["resident_module_budget_gb"]) * GIB
                if e.code != "DDO_E_BUDGET" or left <= 0 or attempt == 2:
                    raise
                self.res.setdefault("ddo_budget_retries", []).append(
                    {"component": "transformer", "error": str(e)[:500]})
                slot = b["components"]["transformer"]["plan"]["slot_bytes"] or 64 * MIB
                tr["resident_module_budget_gb"] = gib_floor(max(0, left - slot))
        self.handles = dict(self.results)
        for name, r in self.handles.items():
            self.res.setdefault("ddo_plan_budgets", {})[name] = r.budgets()
            self.res.setdefault("ddo_plan_summary", {})[name] = tf.scalars(r.plan)
        self.res["ddo_call"] = {"call": "enable_pipeline_offload", "preset": DDO_PRESET,
                                "backend": DDO_BACKEND, "route": "dynamic_offload",
                                "use_environment": False, "component_options": opts,
                                "stager_limit_bytes": self.results.stager.limit}

    def enter(self, comps):
        pass

    def leave(self, comps):
        pass

    def close(self):
        import ddo
        if getattr(self, "results", None) is not None and self.results.stager is not None:
            self.res["ddo_stager_events"] = [list(e) for e in self.results.stager.events]
        super().close()  # closes every result (the stager's hooks stay until the next line)
        ddo.close_pipeline_offload(self.pipe)


# ---------------------------------------------------------------------------------------------
# One case (its own process)
# ---------------------------------------------------------------------------------------------
def fingerprint(args):
    return {"tiny": args.tiny, "height": args.height, "width": args.width, "steps": args.steps,
            "seed": args.seed, "guidance": args.guidance, "seed_weights": SEED}


def compare(name, out, ref, res):
    """Bit-identity of a tensor against the reference's (bits compared, as torch_flux does)."""
    import torch
    a = out.detach().to("cpu").contiguous()
    res[f"{name}_shape"] = list(a.shape)
    res[f"{name}_finite"] = bool(torch.isfinite(a.float()).all())
    if ref is None:
        return
    b = ref.contiguous()
    same = list(a.shape) == list(b.shape) and a.dtype == b.dtype
    bits = torch.int16 if a.element_size() == 2 else torch.int32
    res[f"{name}_identical"] = bool(same and torch.equal(a.view(bits), b.view(bits)))
    if same:
        res[f"{name}_max_abs_diff"] = float((a.float() - b.float()).abs().max())


def timed_phase(mode, name, comps, fn, res, write):
    """reload -> compute -> unload, each timed (synchronised); ddo's copy bytes around each."""
    import torch
    ph = res.setdefault("phases", {}).setdefault(name, {})
    b0 = mode.copy_bytes(comps)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    mode.enter(comps)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    b1 = mode.copy_bytes(comps)
    out = fn()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    b2 = mode.copy_bytes(comps)
    mode.leave(comps)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    ph.update(reload_s=t1 - t0, compute_s=t2 - t1, unload_s=t3 - t2, phase_s=t3 - t0,
              torch_max_allocated_bytes=torch.cuda.max_memory_allocated(),
              torch_max_reserved_bytes=torch.cuda.max_memory_reserved())
    if b0 is not None and b2 is not None:
        ph.update(reload_copy_bytes=b1 - b0, compute_copy_bytes=b2 - b1)
    write()
    return out


def load_ref(args, res):
    import torch
    path = os.path.join(args.workdir, "ref_resident.pt")
    if not os.path.exists(path):
        res["reference"] = "missing (run the resident case first)"
        return None
    ref = torch.load(path)
    if ref.get("fingerprint") != fingerprint(args):
        res["reference"] = f"not comparable: {ref.get('fingerprint')} != {fingerprint(args)}"
        return None
    res["reference"] = os.path.basename(path)
    return ref


def cap_torch(spec, args, res, comps_bytes):
    """Measures the baseline, sets torch's cap and (ddo) computes the ddo budgets."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(0)
    res["device_total_bytes"] = total
    base = total - free
    if not spec["capped"]:
        res["split"] = {"baseline_bytes": base, "torch_cap_bytes": None, "uncapped": True}
        return
    split = device_split(args.device_gib, base, args.torch_gib, args.margin_gib,
                         ddo=spec["kind"] in DDO_KINDS)
    res["split"] = split
    if split["torch_cap_bytes"] <= 0 or (spec["kind"] in DDO_KINDS and split["ddo_bytes"] <= 0):
        raise RuntimeError(f"no room in {args.device_gib} GiB: {split}")
    torch.cuda.set_per_process_memory_fraction(split["torch_cap_bytes"] / total, 0)
    res["torch_memory_fraction"] = split["torch_cap_bytes"] / total
    if spec["kind"] == "model":
        res["model_offload_arithmetic"] = model_offload_arithmetic(comps_bytes,
                                                                   split["torch_cap_bytes"])


def step_probes(probes):
    """Per denoise step: the host's time to the step's callback (the host issuing ahead of
    the device makes it shorter than the step's device time) and the deltas of the probe's
    figures, in seconds and bytes."""
    out = {"step_host_s": [b[0] - a[0] for a, b in zip(probes, probes[1:])]}
    if probes and probes[0][1] is not None:
        def delta(key, scale):
            return [None if a[1].get(key) is None or b[1].get(key) is None
                    else (b[1][key] - a[1][key]) * scale for a, b in zip(probes, probes[1:])]
        out["step_ddo_stall_s"] = delta("stall_ns", 1e-9)
        out["step_ddo_copy_busy_s"] = delta("copy_busy_ns", 1e-9)
        out["step_ddo_copy_bytes"] = delta("copy_bytes", 1)
    return out


# ---------------------------------------------------------------------------------------------
# --probe: where a denoise step's host time goes (diagnosis of the first call's extra time)
# ---------------------------------------------------------------------------------------------
def transformer_children(transformer):
    """The transformer's top-level children in call order, ModuleLists expanded."""
    import torch
    out = []
    for name, m in transformer.named_children():
        if isinstance(m, torch.nn.ModuleList):
            out += [(f"{name}.{i}", c) for i, c in enumerate(m)]
        else:
            out.append((name, m))
    return out


class UnitProbe:
    """--probe units: per transformer call (one per denoise step) and per top-level child
    (embedders, every block, the output layers), the host clock before the other hooks (ddo's
    acquire) run (a), when the child's own forward starts (b) and ends (c), after ddo's release
    (d); CUDA events at b and c. Hooks added after ddo's, the outer ones prepended (torch >= 2;
    on torch 1.13 a = b and c = d, stamped after ddo's hooks). Only the clock and events: the
    step's work is unchanged."""

    def __init__(self, transformer):
        import torch
        self.torch = torch
        self.calls, self.cur, self.handles = [], None, []
        self.names = []
        kw = {"prepend": True}
        try:
            transformer.register_forward_pre_hook(lambda *a: None, **kw).remove()
        except TypeError:
            kw = None
        self.handles.append(transformer.register_forward_pre_hook(self._begin, **(kw or {})))
        self.handles.append(transformer.register_forward_hook(self._end))
        for i, (name, m) in enumerate(transformer_children(transformer)):
            self.names.append(name)
            if kw is not None:
                self.handles.append(m.register_forward_pre_hook(
                    lambda mod, args, i=i: self._stamp(i, "a"), **kw))
                self.handles.append(m.register_forward_hook(
                    lambda mod, args, out, i=i: self._stamp(i, "c", True), **kw))
            self.handles.append(m.register_forward_pre_hook(
                lambda mod, args, i=i: self._stamp(i, "b", True)))
            self.handles.append(m.register_forward_hook(
                lambda mod, args, out, i=i: self._post(i, kw is None)))

    def _event(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _begin(self, mod, args):
        self.cur = {"t0": time.perf_counter(), "e0": self._event(), "u": {}}

    def _stamp(self, i, key, event=False):
        if self.cur is None:
            return
        rec = self.cur["u"].setdefault(i, {})
        rec[key] = time.perf_counter()
        if event:
            rec["e" + key] = self._event()

    def _post(self, i, also_c):
        """The last post-hook (d); on torch 1.13 also c (no prepended hook stamps it). Returns
        None: a forward hook's value would replace the module's output."""
        if also_c:
            self._stamp(i, "c", True)
        self._stamp(i, "d")

    def _end(self, mod, args, out):
        if self.cur is not None:
            self.cur["t1"] = time.perf_counter()
            self.cur["e1"] = self._event()
            self.calls.append(self.cur)
        self.cur = None

    def run(self, fn):
        return fn()  # the hooks do the probing

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def summary(self, steps):
        """Per call: host totals (ms) and, for the first two calls of every run and the last
        call, per child: a's offset from the call's start, ddo's pre-hook (b - a), the forward
        (c - b), ddo's post-hook (d - c) in host ms, and the GPU's start offset and duration."""
        self.torch.cuda.synchronize()
        out = []
        for k, c in enumerate(self.calls):
            t0, e0 = c["t0"], c["e0"]
            us = [c["u"].get(i, {}) for i in range(len(self.names))]
            ms = lambda x: round(x * 1e3, 3)  # noqa: E731
            a = [u.get("a", u.get("b")) for u in us]
            d = [u.get("d", u.get("c")) for u in us]
            row = {"call": k, "run": k // steps, "step": k % steps,
                   "host_ms": ms(c["t1"] - t0),
                   "gpu_ms": round(e0.elapsed_time(c["e1"]), 3),
                   "host_pre_hooks_ms": ms(sum(u["b"] - x for u, x in zip(us, a) if "b" in u)),
                   "host_forward_ms": ms(sum(u["c"] - u["b"] for u in us if "c" in u)),
                   "host_post_hooks_ms": ms(sum(x - u["c"] for u, x in zip(us, d) if "c" in u)),
                   "host_between_ms": ms((c["t1"] - t0) - sum(
                       y - x for x, y in zip(a, d) if x is not None and y is not None))}
            if k % steps < 2 or k == len(self.calls) - 1:
                row["units"] = {
                    "name": self.names,
                    "host_a_ms": [ms(x - t0) if x else None for x in a],
                    "host_pre_ms": [ms(u["b"] - x) if "b" in u else None for u, x in zip(us, a)],
                    "host_fwd_ms": [ms(u["c"] - u["b"]) if "c" in u else None for u in us],
                    "host_post_ms": [ms(x - u["c"]) if "c" in u else None
                                     for u, x in zip(us, d)],
                    "gpu_start_ms": [round(e0.elapsed_time(u["eb"]), 3) if "eb" in u else None
                                     for u in us],
                    "gpu_ms": [round(u["eb"].elapsed_time(u["ec"]), 3) if "ec" in u else None
                               for u in us]}
            out.append(row)
        return out


class TorchProbe:
    """--probe torch: torch.profiler (CPU and CUDA activities) over each run's denoise call;
    per run the host calls of 1 ms or more in time order (CUDA runtime calls and aten ops, with
    their start in ms from the call's start) and the runtime calls' totals by name. The
    profiler is started once in setup so that its own start-up is not in the first call."""

    def __init__(self):
        import torch
        self.torch, self.runs = torch, []
        with torch.profiler.profile(activities=self._acts()):
            torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()

    def _acts(self):
        a = self.torch.profiler.ProfilerActivity
        return [a.CPU, a.CUDA]

    def run(self, fn):
        with self.torch.profiler.profile(activities=self._acts()) as prof:
            out = fn()
        self.runs.append(self._digest(prof))
        return out

    def _digest(self, prof):
        evs = list(prof.events())
        t0 = min((e.time_range.start for e in evs), default=0)
        long, totals = [], {}
        for e in evs:
            if e.device_type.name != "CPU":
                continue
            dur = (e.time_range.end - e.time_range.start) / 1e3
            rt = e.name.startswith(("cuda", "cu"))
            if rt:
                t = totals.setdefault(e.name, [0, 0.0, 0.0])
                t[0] += 1
                t[1] += dur
                t[2] = max(t[2], dur)
            if dur >= 1.0 and (rt or e.name.startswith("aten::")):
                long.append([round((e.time_range.start - t0) / 1e3, 3), round(dur, 3), e.name])
        long.sort()
        return {"long_calls": long[:400],
                "runtime_totals": sorted([[k, n, round(t, 3), round(m, 3)]
                                          for k, (n, t, m) in totals.items()],
                                         key=lambda r: -r[2])[:40]}

    def summary(self, steps):
        return {"runs": self.runs}

    def close(self):
        pass


class PythonProbe:
    """--probe python: cProfile over each run's denoise call (the pipeline call alone); per run
    the functions with the most own time, and the first run's excess over the last run's."""

    def __init__(self):
        self.stats = []

    def run(self, fn):
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
        try:
            return fn()
        finally:
            prof.disable()
            self.stats.append(prof)

    def close(self):
        pass

    def summary(self, steps, top=40):
        import pstats

        def table(prof):
            st = pstats.Stats(prof)
            rows = {}
            for (f, line, fn), (cc, nc, tt, ct, _) in st.stats.items():
                rows[f"{os.path.basename(f)}:{line}({fn})"] = (nc, tt, ct)
            return rows

        tabs = [table(p) for p in self.stats]
        out = {"runs": []}
        for t in tabs:
            best = sorted(t.items(), key=lambda kv: -kv[1][1])[:top]
            out["runs"].append([[k, n, round(tt * 1e3, 3), round(ct * 1e3, 3)]
                                for k, (n, tt, ct) in best])
        if len(tabs) > 1:
            first, last = tabs[0], tabs[-1]
            diff = {k: (v[1] - last.get(k, (0, 0, 0))[1], v[2] - last.get(k, (0, 0, 0))[2],
                        v[0], last.get(k, (0, 0, 0))[0]) for k, v in first.items()}
            out["first_minus_last_tottime"] = [
                [k, round(dt * 1e3, 3), round(dc * 1e3, 3), n1, n2]
                for k, (dt, dc, n1, n2) in sorted(diff.items(), key=lambda kv: -kv[1][0])[:top]]
            out["first_minus_last_cumtime"] = [
                [k, round(dt * 1e3, 3), round(dc * 1e3, 3), n1, n2]
                for k, (dt, dc, n1, n2) in sorted(diff.items(), key=lambda kv: -kv[1][1])[:top]]
        return out


def run_pipeline(pipe, mode, args, res, write):
    """setup, then the three phases; every figure into res; returns (embeds, latents, image).
    The phases run --runs times: the first run's figures are res's own (with setup: total_s),
    every later (warm) run's go into res["repeats"] (the denoise target's)."""
    import torch
    ids = token_ids(t5_len=args.text_tokens)
    t0 = time.perf_counter()
    mode.setup()
    torch.cuda.synchronize()
    res["setup_s"] = time.perf_counter() - t0
    res["setup_torch_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    write()
    args.probe_obj = (UnitProbe(pipe.transformer) if args.probe == "units" else
                      PythonProbe() if args.probe == "python" else
                      TorchProbe() if args.probe == "torch" else None)
    out = run_phases(pipe, mode, args, res, write, ids)
    res["total_s"] = time.perf_counter() - t0
    for _ in range(1, args.runs):
        again = {}
        res.setdefault("repeats", []).append(again)
        t = time.perf_counter()
        repeat = run_phases(pipe, mode, args, again, write, ids)
        again["phases_s"] = time.perf_counter() - t
        again["latents_equal_first_run"] = bool(torch.equal(repeat[1], out[1]))
        write()
    if args.probe_obj is not None:
        res["probe"] = {"kind": args.probe, "summary": args.probe_obj.summary(args.steps)}
        args.probe_obj.close()
        args.probe_obj = None
    return out


def prewarm_torch_pool(gib, device, res):
    """--prewarm-torch-gib: one allocation of gib, freed at once, so that torch's caching
    allocator holds a segment the step's large activations are cut from (a cudaMalloc in the
    middle of a step waits for the device). Inside denoise_s; an error is recorded, not
    raised."""
    import torch
    before = torch.cuda.memory_reserved(device)
    try:
        x = torch.empty(int(gib * GIB), dtype=torch.uint8, device=device)
        del x
    except Exception as e:  # noqa: BLE001
        res["prewarm_error"] = f"{type(e).__name__}: {e}"[:300]
    res["prewarm_reserved_bytes"] = [before, torch.cuda.memory_reserved(device)]


def run_phases(pipe, mode, args, res, write, ids):
    """encode -> denoise -> decode (each reloads its components and unloads them after)."""
    import torch
    dev = args.device
    pe, pooled = timed_phase(mode, "encode", PHASES[0][1], lambda: encode(pipe, ids, dev), res,
                             write)
    events, probes = [], []
    start = torch.cuda.Event(enable_timing=True)

    def run_denoise():
        start.record()
        t = time.perf_counter()
        if args.prewarm_torch_gib:
            prewarm_torch_pool(args.prewarm_torch_gib, dev, res)
        probes.append((t, mode.step_probe()))
        call = lambda: denoise(pipe, pe, pooled, args, events, probes, mode.step_probe)  # noqa
        lat = call() if args.probe_obj is None else args.probe_obj.run(call)
        torch.cuda.synchronize()
        res["denoise_s"] = time.perf_counter() - t
        return lat

    latents = timed_phase(mode, "denoise", PHASES[1][1], run_denoise, res, write)
    marks = [start] + events
    res["step_times_s"] = [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
    res.update(step_probes(probes))
    if len(res["step_times_s"]) > 1:
        res["median_step_s"] = statistics.median(res["step_times_s"][1:])
    den = res["phases"]["denoise"]
    if "compute_copy_bytes" in den:
        res["denoise_copy_bytes"] = den["compute_copy_bytes"]
    image = timed_phase(mode, "decode", PHASES[2][1], lambda: decode(pipe, latents, args, res),
                        res, write)
    res["encode_s"] = res["phases"]["encode"]["phase_s"]
    res["decode_s"] = res["phases"]["decode"]["phase_s"]
    return (pe, pooled), latents, image


def nominal_streamed(spec, res, args):
    """Diffusers' offload modes move every weight of a component for each of its forwards."""
    comps = res.get("components", {})
    if spec["kind"] in ("group", "sequential") and "transformer" in comps:
        res["denoise_copy_bytes_nominal"] = comps["transformer"]["bytes"] * args.steps
        res["denoise_copy_bytes_source"] = "nominal: the transformer's bytes x steps"


def finish(spec, args, res, sampler, outputs, ref):
    import torch
    res.update(sampler.stop())
    # torch's own peaks: the largest of setup's and the phases' (each phase resets them)
    phases = res.get("phases", {}).values()
    res["max_memory_allocated_bytes"] = max([torch.cuda.max_memory_allocated()] + [
        p.get("torch_max_allocated_bytes", 0) for p in phases])
    res["max_memory_reserved_bytes"] = max([torch.cuda.max_memory_reserved(),
                                            res.get("setup_torch_max_reserved_bytes", 0)] + [
        p.get("torch_max_reserved_bytes", 0) for p in phases])
    res["rss_hwm_bytes"] = tf.read_status_kib("VmHWM") * 1024
    if outputs is None:
        return
    (pe, pooled), latents, image = outputs
    for name, t in (("latents", latents), ("prompt_embeds", pe), ("pooled", pooled),
                    ("image", image)):
        compare(name, t, None if ref is None else ref.get(name), res)
    if spec["kind"] == "resident":
        torch.save({"fingerprint": fingerprint(args), "latents": latents.cpu(),
                    "prompt_embeds": pe.cpu(), "pooled": pooled.cpu(), "image": image.cpu()},
                   os.path.join(args.workdir, "ref_resident.pt"))
        res["reference"] = "self (saved)"


def run_case(case, args, write_result):
    """Everything one case records; never raises (errors go into the result)."""
    spec = CASES[case]
    res = {"case": case, "kind": spec["kind"], "what": spec["what"], "pid": os.getpid(),
           "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset)")}
    write = lambda: write_result(res)  # noqa: E731
    mode, sampler, outputs = None, None, None
    try:
        import torch
        res["torch"] = torch.__version__
        res["gpu"] = torch.cuda.get_device_name(0)
        if spec["kind"] in ("sequential", "model"):
            import importlib.util
            if importlib.util.find_spec("accelerate") is None:
                res["skipped"] = "accelerate is not installed (Diffusers needs it for this mode)"
                return res
        if spec["kind"] in DDO_KINDS:
            import ddo
            res["ddo_module"], res["ddo_library"] = ddo.__file__, ddo.library_version()[1]
        comps = build_components(args, res)
        res["rss_after_build_bytes"] = tf.read_status_kib("VmRSS") * 1024
        pipe = make_pipeline(comps)
        cap_torch(spec, args, res, {n: i["bytes"] for n, i in res["components"].items()})
        if spec["kind"] in DDO_KINDS:
            res["ddo_budgets"] = ddo_budgets({n: tensors_of(comps[n]) for n in COMPONENTS},
                                             res["split"]["ddo_bytes"], args.ddo_resident_bytes,
                                             threshold=0 if args.tiny else MIB,
                                             transformer_slots=args.ddo_slots)
            if not res["ddo_budgets"]["ok"]:
                raise RuntimeError(f"ddo budgets do not fit: {res['ddo_budgets']['why']}")
        ref = load_ref(args, res) if spec["kind"] != "resident" else None
        write()
        mode = {"ddo": DdoMode, "ddo_pipeline": PipelineMode}.get(spec["kind"], Mode)(
            pipe, spec, args, res)
        torch.cuda.reset_peak_memory_stats()
        sampler = tf.Sampler(True)
        sampler.start()
        # The garbage collector is off while the pipeline runs, every case alike (as in
        # torch_flux.py's timed steps: a collection pass stalls the host that issues the work).
        gc.collect()
        gc.disable()
        try:
            with tf.gc_enabled_after():
                outputs = run_pipeline(pipe, mode, args, res, write)
        finally:
            finish(spec, args, res, sampler, outputs, ref)
            sampler = None
        nominal_streamed(spec, res, args)
        write()
        mode.close()
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        if args.deadline_epoch and time.time() > args.deadline_epoch - 20:
            res["bus_skipped"] = "too close to the case's time limit"
        else:
            res.update(tf.measure_bus(args.bus_gib))  # after the peaks: it pins host memory
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
        res["traceback"] = traceback.format_exc()[-4000:]
        res["oom"] = "OutOfMemory" in type(e).__name__ or "out of memory" in str(e).lower()
        if sampler is not None:
            try:
                res.update(sampler.stop())
                res["rss_hwm_bytes"] = tf.read_status_kib("VmHWM") * 1024
            except Exception:  # noqa: BLE001
                pass
        if mode is not None:
            try:
                mode.close()
            except Exception as e2:  # noqa: BLE001
                res["close_error"] = f"{type(e2).__name__}: {e2}"
    return res


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


def case_command(case, args, result_path, deadline_epoch):
    cmd = [sys.executable, os.path.abspath(__file__), "--case", case, "--workdir", args.workdir,
           "--result", result_path, "--steps", str(args.steps), "--height", str(args.height),
           "--width", str(args.width), "--seed", str(args.seed), "--guidance", str(args.guidance),
           "--text-tokens", str(args.text_tokens), "--device", args.device,
           "--device-gib", str(args.device_gib), "--torch-gib", str(args.torch_gib),
           "--margin-gib", str(args.margin_gib), "--bus-gib", str(args.bus_gib),
           "--runs", str(args.runs), "--probe", args.probe,
           "--deadline-epoch", f"{deadline_epoch:.3f}"]
    if args.ddo_resident_gib is not None:
        cmd += ["--ddo-resident-gib", str(args.ddo_resident_gib)]
    cmd += ["--ddo-slots", str(args.ddo_slots),
            "--prewarm-torch-gib", str(args.prewarm_torch_gib)]
    if args.tiny:
        cmd.append("--tiny")
    return cmd


def run_subprocess(name, args, timeout_s):
    found, rc, wall = tf.spawn_case(name, args, timeout_s, case_command, 0, say=log)
    res = found if found is not None else {"case": name, "kind": CASES[name]["kind"]}
    if rc == "timeout":
        res["error"] = (res.get("error") or "") + f" killed after {timeout_s:.0f} s " \
            f"(the figures above are those written before)"
    elif rc != 0 and "error" not in res and "skipped" not in res:
        res["error"] = f"process exited {rc}"
    res["process_rc"], res["process_wall_s"] = rc, wall
    note = res.get("skipped") or res.get("error") or f"total {res.get('total_s', 0):.2f} s"
    log(f"{name}: done in {wall:.1f} s: {note[:200]}")
    return res


def run_in_process(name, args):
    """--in-process (the smoke test): the case in the driver's own process, one import of
    Diffusers for all cases; device and RSS figures then include the earlier cases."""
    import torch
    log(f"{name}: in process")
    t = time.time()
    res = run_case(name, args, lambda r: None)
    res["in_process"] = True
    res["process_wall_s"] = time.time() - t
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    log(f"{name}: done in {res['process_wall_s']:.1f} s: "
        f"{(res.get('skipped') or res.get('error') or 'ok')[:200]}")
    return res


def driver_model_arithmetic(results, args):
    """model_cpu_offload's verdict by arithmetic from the other cases' measurements: the
    components' bytes and a capped Diffusers case's torch cap (the same rule)."""
    comps = next((r["components"] for r in results.values() if r.get("components")), None)
    cap = next((r["split"]["torch_cap_bytes"] for r in results.values()
                if r.get("kind") in DIFFUSERS_KINDS and (r.get("split") or {}).get(
                    "torch_cap_bytes")), None)
    if comps is None or cap is None:
        return None
    out = model_offload_arithmetic({n: c["bytes"] for n, c in comps.items()}, cap)
    out["from"] = "the driver: component bytes and torch cap measured by the other cases"
    return out


def drive(args):
    start = time.time()
    deadline = start + args.deadline_s
    names = args.cases.split(",") if args.cases else list(ALL_CASES)
    for n in names:
        if n not in CASES:
            sys.exit(f"flux_pipeline: unknown case '{n}' (known: {', '.join(CASES)})")
    os.makedirs(args.workdir, exist_ok=True)
    results = {}
    doc = {"meta": meta(args, names, 0.0), "cases": results}
    for name in names:
        left = deadline - time.time()
        if left < args.min_case_s:
            results[name] = {"case": name, "kind": CASES[name]["kind"],
                             "skipped": f"global deadline ({left:.0f} s left)"}
            log(f"{name}: skipped, {left:.0f} s left before the deadline")
        elif args.in_process:
            results[name] = run_in_process(name, args)
        else:
            limit = min(left, args.case_timeout_s or CASES[name]["timeout_s"])
            results[name] = run_subprocess(name, args, limit)
        if "model_cpu_offload" in results:
            arith = driver_model_arithmetic(results, args)
            if arith is not None:
                results["model_cpu_offload"]["arithmetic"] = arith
        doc["targets"] = targets(results, args.device_gib)
        doc["meta"]["driver_wall_s"] = time.time() - start
        if args.out:
            write_json(args.out, doc)
    print_table(results, doc)
    if args.out:
        log(f"wrote {args.out}")
    return 0


def meta(args, names, wall):
    m = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
         "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": names,
         "driver_wall_s": wall, "tiny": args.tiny, "height": args.height, "width": args.width,
         "steps": args.steps, "runs": args.runs, "probe": args.probe,
         "guidance": args.guidance, "seed": args.seed,
         "text_tokens": args.text_tokens, "device_gib": args.device_gib,
         "torch_gib": args.torch_gib, "margin_gib": args.margin_gib,
         "ddo_resident_gib": args.ddo_resident_gib, "ddo_slots": args.ddo_slots,
         "prewarm_torch_gib": args.prewarm_torch_gib,
         "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
         "ddo_preset": DDO_PRESET,
         "ddo_backend": DDO_BACKEND, "ddo_common": DDO_COMMON, "ddo_always": DDO_ALWAYS,
         "case_table": {k: v["what"] for k, v in CASES.items()}}
    for mod in ("torch", "diffusers", "transformers", "accelerate"):
        m[mod] = package_version(mod)
    # No CUDA call here: a context in the driver would sit in every case's device figures.
    return m


def package_version(name):
    """A package's version without importing it (Diffusers from a source tree: its
    __init__.py's __version__ line)."""
    import importlib.metadata
    import importlib.util
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return "unavailable"
    with open(spec.origin) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'") + f" ({spec.origin})"
    return f"unknown ({spec.origin})"


def fmt(v, spec, scale=1.0):
    return tf.fmt(v, spec, scale)


def print_table(results, doc):
    m = doc["meta"]
    gpu = next((r["gpu"] for r in results.values() if r.get("gpu")), "no gpu seen")
    print(f"\nflux_pipeline: torch {m.get('torch')}, diffusers {m.get('diffusers')}, transformers "
          f"{m.get('transformers')}, accelerate {m.get('accelerate')}, {gpu}; "
          f"{m['width']}x{m['height']}, {m['steps']} steps{', TINY' if m['tiny'] else ''}; "
          f"device target {m['device_gib']} GiB")
    print(f"{'case':23} {'setup s':>8} {'encode s':>8} {'denoise s':>9} {'step s':>7} "
          f"{'decode s':>8} {'total s':>8} {'bus GB/s':>8} {'strm GiB':>8} {'dev GiB':>7} "
          f"{'+base':>6} {'RSS GiB':>7} {'same':>5}  note")
    for name, r in results.items():
        same = {True: "yes", False: "NO", None: "-"}[r.get("latents_identical")]
        note = r.get("skipped") or r.get("error") or ""
        if r.get("decode_tiled"):
            note = "decode OOM: retried tiled " + note
        strm = r.get("denoise_copy_bytes", r.get("denoise_copy_bytes_nominal"))
        print(f"{name:23} {fmt(r.get('setup_s'), '8.2f')} {fmt(r.get('encode_s'), '8.3f')} "
              f"{fmt(r.get('denoise_s'), '9.3f')} {fmt(r.get('median_step_s'), '7.3f')} "
              f"{fmt(r.get('decode_s'), '8.3f')} {fmt(r.get('total_s'), '8.2f')} "
              f"{fmt(r.get('bus_gbps'), '8.2f')} {fmt(strm, '8.2f', GIB)} "
              f"{fmt(r.get('device_used_peak_bytes'), '7.2f', GIB)} "
              f"{fmt(r.get('device_used_peak_above_baseline_bytes'), '6.2f', GIB)} "
              f"{fmt(r.get('rss_hwm_bytes'), '7.2f', GIB)} {same:>5}  {note[:110]}")
    for name, r in results.items():  # --runs: the later pipeline calls of each case
        for k, a in enumerate(r.get("repeats") or [], start=2):
            strm = a.get("denoise_copy_bytes")
            same = {True: "yes", False: "NO", None: "-"}[a.get("latents_equal_first_run")]
            print(f"{name + ' run ' + str(k):23} {'':>8} {fmt(a.get('encode_s'), '8.3f')} "
                  f"{fmt(a.get('denoise_s'), '9.3f')} {fmt(a.get('median_step_s'), '7.3f')} "
                  f"{fmt(a.get('decode_s'), '8.3f')} {fmt(a.get('phases_s'), '8.2f')} "
                  f"{'':>8} {fmt(strm, '8.2f', GIB)} {'':>7} {'':>6} {'':>7} {same:>5}  "
                  f"(same: latents equal to the case's first run; total: the three phases)")
    print("dev GiB: the driver's used memory (sampled mem_get_info), absolute; +base: above the "
          "case's baseline; strm: bytes moved during the denoise (ddo: copy_bytes; Diffusers: "
          "nominal); step: median of steps 2..N (CUDA events)")
    for k, v in doc.get("targets", {}).items():
        print(f"target {k}: {'met' if v.get('met') else 'NOT met'}: "
              + ", ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}"
                          for a, b in v.items() if a not in ("met", "runs", "reading"))
              + ("".join(f"; run {w['run']}: {w['ratio']:.4f}" for w in v.get("runs", []))))
    print(flush=True)


def list_cases():
    print("cases (each a fresh process, in this order):")
    for n in ALL_CASES:
        print(f"  {n:23} {CASES[n]['what']}")
    print(f"ddo: preset {DDO_PRESET}, backend {DDO_BACKEND}, route dynamic_offload, "
          f"use_environment=False; common options {DDO_COMMON}")
    for c in COMPONENTS:
        print(f"  {c:15} always_resident_modules_pattern {DDO_ALWAYS[c]!r}, resident blocks "
              f"{'yes (what the limit leaves)' if DDO_RESIDENT_BLOCKS[c] else 'no'}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="A Diffusers FluxPipeline (Flux.1-dev configurations, random bf16 weights) "
                    "in 8 GiB: ddo phase-staged against Diffusers' offload modes. Each case "
                    "runs in a fresh process.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--all", action="store_true", help="driver: run the cases, one process each")
    mode.add_argument("--case", choices=sorted(CASES), help="run one case in this process")
    mode.add_argument("--list", action="store_true", help="print the case table and exit")
    p.add_argument("--cases", default=None, help="driver: comma-separated case list")
    p.add_argument("--out", default=None, help="driver: JSON results (rewritten after each case)")
    p.add_argument("--result", default=None, help="case: write the case's JSON here")
    p.add_argument("--workdir", default=os.environ.get("FLUX_PIPELINE_WORKDIR",
                                                       "/tmp/flux_pipeline"),
                   help="the resident reference and the per-case results")
    p.add_argument("--tiny", action="store_true",
                   help="toy configurations at 256x256, transformer fully streamed (smoke test)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--runs", type=int, default=3,
                   help="pipeline calls per case after one setup (setup and total are the "
                        "first call's; the later, warm calls go into repeats and the denoise "
                        "target; the first call's ratio is denoise_first_call)")
    p.add_argument("--height", type=int, default=None, help="default 1024 (--tiny: 256)")
    p.add_argument("--width", type=int, default=None, help="default 1024 (--tiny: 256)")
    p.add_argument("--seed", type=int, default=0, help="the pipeline's generator seed")
    p.add_argument("--guidance", type=float, default=3.5)
    p.add_argument("--text-tokens", type=int, default=512, help="T5 tokens (at most 512)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--device-gib", type=float, default=8.0,
                   help="the device memory the whole capped run must fit in")
    p.add_argument("--torch-gib", type=float, default=3.5,
                   help="ddo case: torch's cap (activations, VAE decode); ddo gets the rest")
    p.add_argument("--margin-gib", type=float, default=0.35,
                   help="device memory no allocator counts (cuBLAS/cuDNN handles, kernels)")
    p.add_argument("--ddo-resident-gib", type=float, default=None,
                   help="ddo case: the transformer's resident blocks (default: what the budget "
                        "leaves after three slots; --tiny: 0, every block streams)")
    p.add_argument("--prewarm-torch-gib", type=float, default=0.0,
                   help="every case: before each pipeline call (inside denoise_s), torch "
                        "allocates and frees this many GiB, so its caching allocator cuts the "
                        "first step's activations from one segment instead of calling "
                        "cudaMalloc during the step")
    p.add_argument("--ddo-slots", type=int, default=3,
                   help="ddo case: the transformer's execution_slots (how far its uploads may "
                        "run ahead of the compute)")
    p.add_argument("--bus-gib", type=float, default=None,
                   help="size of the pinned bus copy (default 4; --tiny: 1)")
    p.add_argument("--deadline-s", type=float, default=420.0,
                   help="driver: global deadline for all cases")
    p.add_argument("--case-timeout-s", type=float, default=None,
                   help="driver: one case's limit (default: the case table's)")
    p.add_argument("--min-case-s", type=float, default=40.0,
                   help="driver: skip a case when less than this is left")
    p.add_argument("--in-process", action="store_true",
                   help="driver: run the cases in this process (smoke test: one import; the "
                        "device and RSS figures then include the earlier cases)")
    p.add_argument("--module-loading", choices=["default", "lazy", "eager"], default="default",
                   help="driver: CUDA_MODULE_LOADING for every case alike (lazy, CUDA 12's "
                        "default, loads each kernel at its first launch: host time in the first "
                        "denoise step; eager moves it to context creation)")
    p.add_argument("--probe", choices=["none", "units", "python", "torch"], default="none",
                   help="diagnosis of where a denoise step's host time goes (results under "
                        "'probe'): units: the host clock and CUDA events around every "
                        "top-level child of the transformer and ddo's hooks, per step; python: "
                        "cProfile over each run's denoise call; torch: torch.profiler over it, "
                        "the host calls of 1 ms or more (python and torch slow the host: their "
                        "timings are not the benchmark's)")
    p.add_argument("--deadline-epoch", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    side = 256 if a.tiny else 1024
    a.height = a.height or side
    a.width = a.width or side
    if a.bus_gib is None:
        a.bus_gib = 1.0 if a.tiny else 4.0
    if a.ddo_resident_gib is None and a.tiny:
        a.ddo_resident_gib = 0.0
    a.ddo_resident_bytes = None if a.ddo_resident_gib is None else int(a.ddo_resident_gib * GIB)
    if a.steps < 1:
        p.error("--steps must be >= 1")
    if a.runs < 1:
        p.error("--runs must be >= 1")
    if not 1 <= a.text_tokens <= 512:
        p.error("--text-tokens must be 1..512 (FluxPipeline's max_sequence_length)")
    if a.height % 16 or a.width % 16:
        p.error("--height and --width must be multiples of 16")
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        list_cases()
        return 0
    if args.module_loading != "default":  # before torch initialises CUDA; the cases inherit it
        os.environ["CUDA_MODULE_LOADING"] = args.module_loading.upper()
    if args.case:
        os.makedirs(args.workdir, exist_ok=True)

        def write_result(res):
            if args.result:
                write_json(args.result, res)

        res = run_case(args.case, args, write_result)
        write_result(res)
        if not args.result:
            print(json.dumps(res, indent=1, default=str))
        if "traceback" in res:
            print(res["traceback"], file=sys.stderr, flush=True)
        log(f"case {args.case}: {res.get('skipped') or res.get('error') or 'ok'}"[:400])
        return 0 if "error" not in res else 1
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
