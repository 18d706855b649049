#!/usr/bin/env python3
"""A whole Flux pipeline through ddo in one call: ddo.enable_pipeline_offload(pipe), then
pipe(...). Each component is loaded when the pipeline first calls it, and the others are
unloaded when their device memory is needed (nothing is unloaded where everything fits).

    python examples/flux_pipeline.py --model /models/FLUX.1-dev --prompt "a fox" \
        --ddo-backend vmm --ddo-device-budget-gb 8 --show-profile
    python examples/flux_pipeline.py --stand-in --show-metrics     # no Diffusers needed

--model loads a Diffusers FluxPipeline folder (Diffusers and transformers required): the
transformer through ddo.from_pretrained_with_dynamic_offload (streamed from its files), the
rest with Diffusers. --stand-in runs a tiny pipeline of the same shape with random weights on
the cpu device unless --ddo-execution-device says otherwise (what CI runs). Every --ddo-* flag
of the catalog is accepted (`ddo config --list`); only the flags given are explicit. This
runner's own --show-profile (print each component's profile) is not --ddo-show-profile.
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
    p.add_argument("--show-profile", action="store_true", help="print each component's profile")
    p.add_argument("--show-metrics", action="store_true", help="print each component's metrics")
    p.add_argument("--metrics", metavar="FILE", help="append each component's metrics (JSON "
                   "lines)")
    p.add_argument("--output", help="write the image (PNG, --model) or the output (.pt)")
    ddo.add_dynamic_offload_arguments(p)
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
    """Flux's shape at toy size: text encoder -> transformer (steps) -> VAE decoder, called as
    a Diffusers pipeline is: pipe(prompt, ...)."""

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

    @property
    def device(self):
        return next(self.transformer.parameters()).device

    def __call__(self, prompt, width=1024, height=1024, num_inference_steps=8,
                 generator=None, device=None):
        device = device or torch.device("cpu")
        ids = torch.tensor([[ord(c) % 256 for c in prompt[:64]]], device=device)
        lat = torch.randn(1, (height // 16) * (width // 16), 64, generator=generator)
        with torch.no_grad():
            ctx = self.text_encoder(ids)
            lat = lat.to(device)
            for _ in range(num_inference_steps):
                lat = lat - 0.1 * self.transformer(lat, ctx)
            return self.vae(lat)


def load_pipeline(args):
    if args.stand_in:
        return StandInPipeline(args.seed)
    from diffusers import FluxPipeline, FluxTransformer2DModel
    loaded = ddo.from_pretrained_with_dynamic_offload(
        args.model, model_loader=FluxTransformer2DModel, subfolder="transformer",
        torch_dtype=torch.bfloat16)
    return FluxPipeline.from_pretrained(args.model, transformer=loaded.module,
                                        torch_dtype=torch.bfloat16)


def generate(pipe, args, device):
    """The one pipeline call."""
    g = torch.Generator("cpu").manual_seed(args.seed)
    if args.stand_in:
        return pipe(args.prompt, width=args.width, height=args.height,
                    num_inference_steps=args.steps, generator=g, device=device)
    return pipe(args.prompt, width=args.width, height=args.height,
                num_inference_steps=args.steps, generator=g).images[0]


def report(results, args):
    tracker = ddo.MetricsTracker(args.metrics) if args.metrics else None
    for name, r in results.items():
        rep = r.metrics_snapshot(collect_completed=True)
        if args.show_profile:
            print(f"[{name}]\n{rep.format_profile()}")
        if args.show_metrics:
            print(json.dumps(rep.as_dict(), indent=2))
        if tracker is not None:
            tracker.record_ddo_metrics(rep, component=name)


def run(args):
    config = ddo.build_config_from_args(args)
    if args.stand_in and "execution_device" not in config.explicit():
        config.execution_device = "cpu"  # the toy pipeline is a cpu demonstration
    if args.stand_in and "small_tensor_threshold_bytes" not in config.explicit():
        config.small_tensor_threshold_bytes = 0  # its toy tensors stream too
    pipe = load_pipeline(args)
    routes = dict(r.split("=", 1) for r in args.route)
    timings = {}
    t0 = time.perf_counter()
    with ddo.pipeline_offload(pipe, config=config, routes=routes) as results:
        timings["setup"] = time.perf_counter() - t0
        device = next(iter(results.values())).device if results else torch.device("cpu")
        t1 = time.perf_counter()
        out = generate(pipe, args, device)
        timings["call"] = time.perf_counter() - t1
        report(results, args)
    timings["total"] = time.perf_counter() - t0
    return out, timings


def main(argv=None):
    args = parse_args(argv)
    try:
        out, timings = run(args)
    except ddo.DdoError as e:
        print(f"flux_pipeline: {e}", file=sys.stderr)
        return 1
    print("timings: " + ", ".join(f"{k} {v:.3f} s" for k, v in timings.items()))
    if args.output:
        if hasattr(out, "save"):
            out.save(args.output)
        else:
            torch.save({"output": out.detach().to("cpu")}, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
