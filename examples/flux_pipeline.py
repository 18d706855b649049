#!/usr/bin/env python3
"""A phase-staged Flux runner over ddo: encode -> read back -> unload -> denoise -> unload ->
decode, each component routed by ddo (enable_pipeline_offload), cleanup in `finally` with the
original error preserved.

    python examples/flux_pipeline.py --model /models/FLUX.1-dev --prompt "a fox" \
        --ddo-backend vmm --ddo-vmm-resident-weight-budget-gb 4 --show-profile
    python examples/flux_pipeline.py --stand-in --ddo-execution-device cpu \
        --route text_encoder=dynamic --route vae=none --show-metrics     # no Diffusers needed

--model loads a Diffusers FluxPipeline folder (Diffusers and transformers required): the
transformer through ddo.from_pretrained_with_dynamic_offload (meta device, streamed from its
files), the rest with Diffusers. --stand-in runs a tiny pipeline of the same shape with random
weights (what CI runs). Every --ddo-* flag of the catalog is accepted (`ddo config --list`);
the flags build the config alone (DDO_* variables are not merged into it, as the seed says),
and only the flags given are explicit in it. They land in args.ddo_<key>, so this runner's own
--show-profile (print the profiles) is not --ddo-show-profile.
"""

import argparse
import json
import sys
import time

from ddo_vmm_bootstrap import ensure_vmm_fast_process, vmm_fast_requested

if vmm_fast_requested():
    ensure_vmm_fast_process()  # before torch: the same native library for the whole run

import torch  # noqa: E402
from torch import nn  # noqa: E402

import ddo  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a Diffusers FluxPipeline folder")
    src.add_argument("--stand-in", action="store_true",
                     help="a tiny built-in pipeline with random weights (no Diffusers)")
    p.add_argument("--prompt", default="a photograph of a red fox in the snow")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--height", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--route", action="append", default=[], metavar="COMPONENT=ROUTE",
                   help="route one component (dynamic_offload, diffusers_group_offload, none)")
    p.add_argument("--show-profile", action="store_true", help="print each phase's profile")
    p.add_argument("--show-metrics", action="store_true", help="print each phase's metrics")
    p.add_argument("--metrics", metavar="FILE", help="append each phase's metrics (JSON lines)")
    p.add_argument("--output", help="write the image (PNG, --model) or latents (.pt)")
    ddo.add_dynamic_offload_arguments(p)
    ddo.add_dynamic_offload_lifecycle_arguments(p)
    return p.parse_args(argv)


# ---- the stand-in pipeline (CI) ----

class _TextEncoder(nn.Module):
    def __init__(self, vocab=256, dim=64, depth=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


class _Transformer(nn.Module):
    def __init__(self, dim=64, depth=4):
        super().__init__()
        self.x_embedder = nn.Linear(dim, dim)
        self.transformer_blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.proj_out = nn.Linear(dim, dim)

    def forward(self, latents, context):
        x = self.x_embedder(latents) + context.mean(dim=1, keepdim=True)
        for b in self.transformer_blocks:
            x = x + torch.tanh(b(x))
        return self.proj_out(x)


class StandInPipeline:
    """The three phases of Flux at toy size: text encoder, transformer, VAE decoder."""

    def __init__(self, seed=0):
        torch.manual_seed(seed)
        self.text_encoder = _TextEncoder()
        self.transformer = _Transformer()
        self.vae = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
        self.scheduler = object()  # not a module: ddo skips it

    @property
    def components(self):
        return {"text_encoder": self.text_encoder, "transformer": self.transformer,
                "vae": self.vae, "scheduler": self.scheduler}

    def encode(self, prompt, device):
        ids = torch.tensor([[ord(c) % 256 for c in prompt[:64]]], device=device)
        with torch.no_grad():
            return {"prompt_embeds": self.text_encoder(ids)}

    def denoise(self, embeds, args, device):
        g = torch.Generator().manual_seed(args.seed)
        lat = torch.randn(1, (args.height // 16) * (args.width // 16), 64, generator=g)
        lat = lat.to(device)
        ctx = embeds["prompt_embeds"].to(device)
        with torch.no_grad():
            for _ in range(args.steps):
                lat = lat - 0.1 * self.transformer(lat, ctx)
        return lat

    def decode(self, latents, args, device):
        with torch.no_grad():
            return self.vae(latents.to(device))


# ---- the Diffusers pipeline (--model) ----

class DiffusersFlux:
    """A FluxPipeline whose transformer is associated with its files (streamed by ddo)."""

    def __init__(self, path, dtype=torch.bfloat16):
        from diffusers import FluxPipeline, FluxTransformer2DModel
        loaded = ddo.from_pretrained_with_dynamic_offload(
            path, model_loader=FluxTransformer2DModel, subfolder="transformer",
            torch_dtype=dtype)
        self.pipe = FluxPipeline.from_pretrained(path, transformer=loaded.module,
                                                 torch_dtype=dtype)
        self.components = {k: v for k, v in self.pipe.components.items()}
        for k, v in self.components.items():
            setattr(self, k, v)

    def encode(self, prompt, device):
        with torch.no_grad():
            pe, pooled, ids = self.pipe.encode_prompt(prompt=prompt, prompt_2=prompt,
                                                      device=device,
                                                      num_images_per_prompt=1)
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pooled, "text_ids": ids}

    def denoise(self, embeds, args, device):
        g = torch.Generator("cpu").manual_seed(args.seed)
        with torch.no_grad():
            out = self.pipe(prompt_embeds=embeds["prompt_embeds"].to(device),
                            pooled_prompt_embeds=embeds["pooled_prompt_embeds"].to(device),
                            width=args.width, height=args.height,
                            num_inference_steps=args.steps, generator=g, output_type="latent")
        return out.images

    def decode(self, latents, args, device):
        p = self.pipe
        lat = p._unpack_latents(latents.to(device), args.height, args.width,
                                p.vae_scale_factor)
        lat = lat / p.vae.config.scaling_factor + p.vae.config.shift_factor
        with torch.no_grad():
            image = p.vae.decode(lat.to(p.vae.dtype), return_dict=False)[0]
        return p.image_processor.postprocess(image, output_type="pil")[0]


# ---- phases ----

def report(name, result, args, tracker):
    rep = result.metrics_snapshot(collect_completed=True)
    if args.show_profile:
        print(f"[{name}]\n{rep.format_profile()}")
    if args.show_metrics:
        print(json.dumps(rep.as_dict(), indent=2))
    if tracker is not None:
        tracker.record_ddo_metrics(rep, component=name)


def phase(name, results, components, fn, args, tracker, timings):
    """Runs fn with the phase's components loaded; unloads them after (error boundary)."""
    for c in components:
        if c in results:
            results[c].reload()
    t0 = time.perf_counter()
    with _boundaries([results[c] for c in components if c in results]):
        out = fn()
    timings[name] = time.perf_counter() - t0
    for c in components:
        if c in results:
            report(c, results[c], args, tracker)
            results[c].unload()
    return out


class _boundaries:
    """cleanup_on_error() of several results at once."""

    def __init__(self, results):
        self.cms = [r.cleanup_on_error() for r in results]

    def __enter__(self):
        for cm in self.cms:
            cm.__enter__()

    def __exit__(self, *exc):
        for cm in reversed(self.cms):
            try:
                cm.__exit__(*exc)
            except BaseException:
                pass  # each one re-raises the original; we re-raise it once below
        return False


def purge(name, args, settings):
    """The phase boundary's standby purge (it prints what it did; a no-op off Windows)."""
    enabled = getattr(args, f"purge_windows_standby_{name}", None)
    ddo.maybe_purge_windows_standby_cache(settings, name, enabled=enabled)


def run(args):
    config = ddo.build_config_from_args(args)
    pipe = StandInPipeline(args.seed) if args.stand_in else DiffusersFlux(args.model)
    routes = dict(r.split("=", 1) for r in args.route)
    settings = ddo.DynamicOffloadSettings.from_env(default_preset="auto")
    tracker = ddo.MetricsTracker(args.metrics) if args.metrics else None
    timings, results = {}, {}
    t0 = time.perf_counter()
    try:
        results = ddo.enable_pipeline_offload(pipe, config=config, routes=routes,
                                              settings=settings)
        timings["setup"] = time.perf_counter() - t0
        device = next(iter(results.values())).device if results else torch.device("cpu")
        for r in results.values():
            r.unload()
        purge("before_run", args, settings)
        encoders = [c for c in results if c.startswith("text_encoder")]
        embeds = phase("encode", results, encoders, lambda: pipe.encode(args.prompt, device),
                       args, tracker, timings)
        embeds = {k: v.detach().to("cpu") for k, v in embeds.items()}  # read back
        purge("after_text_encoder", args, settings)
        purge("before_transformer", args, settings)
        latents = phase("denoise", results, ["transformer"],
                        lambda: pipe.denoise(embeds, args, device), args, tracker, timings)
        latents = latents.detach().to("cpu")
        out = phase("decode", results, ["vae"], lambda: pipe.decode(latents, args, device),
                    args, tracker, timings)
    except BaseException as err:
        _close(results, err)
        raise
    _close(results, None)
    timings["total"] = time.perf_counter() - t0
    return out, latents, timings


def _close(results, err):
    """Closes every result; a cleanup error is a note on the original error (or raised)."""
    failures = []
    for r in reversed(list(results.values())):
        try:
            r.close()
        except Exception as ce:  # keep closing the others
            failures.append(ce)
    if failures and err is not None:
        note = f"ddo cleanup also failed: {failures[0]}"
        if hasattr(err, "add_note"):
            err.add_note(note)
        return
    if failures:
        raise failures[0]


def main(argv=None):
    args = parse_args(argv)
    try:
        out, latents, timings = run(args)
    except ddo.DdoError as e:
        print(f"flux_pipeline: {e}", file=sys.stderr)
        return 1
    print("timings: " + ", ".join(f"{k} {v:.3f} s" for k, v in timings.items()))
    if args.output:
        if hasattr(out, "save"):
            out.save(args.output)
        else:
            torch.save({"latents": latents, "output": out}, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
