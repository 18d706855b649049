#!/usr/bin/env python3
"""Zero configuration on cards of every size: ddo.enable_offload(model) against hand-set plans.

Flux.1-dev, Wan 2.1 14B (4680 tokens) and Qwen-Image (4096 tokens) transformers with random
bf16 weights, each on emulated 8, 16 and 24 GiB cards (ddo's device_memory_limit_gb together
with torch.cuda.set_per_process_memory_fraction for torch's own allocations):
  (a) the zero-configuration call ddo.enable_offload(model, device_memory_limit_gb=C);
  (b) the best of a small sweep of hand-set configurations (routes, device budgets, resident
      budgets and selections) in the same process.
  (c) for reference, Diffusers' group offload (apply_group_offloading: block level, one block
      per group, use_stream) on the cards of --group-cards (8 GiB by default), skipped with a
      note where Diffusers is not importable or there is no CUDA device.
Per case: the median step, the bytes streamed per step, the device peak (the driver's free
memory sampled, above the baseline) and bit-identity against the resident run. Per model and
card: (a)/(b) and (a)/max(resident step, streamed bytes / measured bus), and (a) back to back
(the same steps with one synchronize each side, as a pipeline's loop runs them) against the
resident run's back-to-back step the same way; (c)/max(resident step,
model bytes / measured bus) and (a)/(c). (a) runs at least three warm-up forwards: the first
measures the activations, the second times the units' compute on a GPU, and where the reserve
differs from the plan's estimate (or the timed compute changes the plan) the third re-plans
before it runs (the JSON's activation_replan: whether it re-planned, the reserve and the device
limit before and after), so the timed steps run the final plan.

The models are stand-ins of the same tensor shapes: every tensor of the architecture's layout
(data/layouts/*.json; Qwen-Image's written from its published configuration) is a
parameter of a module tree of the same names, and the forward runs every 2-D weight as a real
matmul over the tokens (the running hidden state cut or tiled to the weight's input width), so
the bytes, the units and the FLOPs are the real model's, the wiring is not.

  H200:  PYTHONPATH=python DDO_LIBRARY=<build>/libddo.so \
          python3 bench/cards.py --out $OUT/cards.json
  Smoke: python3 bench/cards.py --tiny --out /tmp/cards.json   (cpu device, torch 1.13 too)

Models run one after another and are freed in between (Wan 14B and Qwen-Image need ~29 and
~41 GB of host RAM).
"""

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_flux as tf  # noqa: E402  (its fill, sampler, bus and bit-identity pieces)

GIB = 1 << 30
MODELS = {"flux": ("flux1-dev", 4096 + 512), "wan": ("wan2.1-t2v-14b", 4680),
          "qwen": ("qwen-image", 4096)}
CARDS_GIB = (8, 16, 24)
# --tiny: blocks kept per group, and the cards in MiB (GiB / 512: the tiny models' 20-40 MB
# stream on the 16 and 32 MiB cards and fit on larger ones).
TINY_BLOCKS = 6
TINY_CARD_SCALE = 1.0 / 512


def log(msg):
    print(f"[cards {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_layout(name, tiny, div=16):
    with open(os.path.join(tf.repo_root(), "data", "layouts", f"{name}.json")) as f:
        lay = json.load(f)
    tensors = lay["tensors"]
    if tiny:  # a few blocks, every width over 64 divided by div: the same structure, small
        keep = []
        for t in tensors:
            parts = t["name"].split(".")
            if any(p.isdigit() and int(p) >= TINY_BLOCKS for p in parts[:2]):
                continue
            keep.append(dict(t, shape=[d // div if d >= 64 else d for d in t["shape"]]))
        tensors = keep
    return tensors


def build_model(tensors, device, dtype):
    """The stand-in module tree: one module per dotted prefix, each tensor a parameter."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Node(nn.Module):
        def forward(self, x):
            own = dict(self.named_parameters(recurse=False))
            for n, p in own.items():
                if p.dim() == 2 and n == "weight":
                    x = apply_linear(x, p, own.get("bias"))
                elif p.dim() == 1 and n != "bias":
                    x = x + p[: x.shape[1]].to(x.dtype).sum() * 0  # read, as a norm would
                elif p.dim() > 2:
                    x = x + p.reshape(-1)[:1].to(x.dtype) * 0
            for child in self.children():
                x = child(x)
            if self.is_block:
                x = F.layer_norm(x.float(), x.shape[1:]).to(x.dtype)
            return x

    def apply_linear(x, w, b):
        width, out = w.shape[1], w.shape[0]
        d = x.shape[1]
        h = x[:, :width] if width <= d else x.repeat(1, math.ceil(width / d))[:, :width]
        if h.device.type == "cpu":  # torch 1.13's CPU half matmuls: compute in float32
            y = F.linear(h.float(), w.float(), None if b is None else b.float()).to(x.dtype)
        else:
            y = F.linear(h, w, b)
        if out >= d:
            return x + y[:, :d]
        return torch.cat([x[:, :out] + y, x[:, out:]], dim=1)

    class Blocks(nn.ModuleList):
        """A model's block list (Diffusers' block-level group offload groups a ModuleList's
        children; ddo streams them as units either way), run in order."""

        def forward(self, x):
            for b in self:
                x = b(x)
            return x

    root = Node()
    root.is_block = False
    for t in tensors:
        parts = t["name"].split(".")
        mod = root
        for i, p in enumerate(parts[:-1]):
            if not hasattr(mod, p) or not isinstance(getattr(mod, p), nn.Module):
                blocks = i == 0 and len(parts) > 2 and parts[1].isdigit()
                child = Blocks() if blocks else Node()
                child.is_block = p.isdigit() and i == 1
                mod.add_module(p, child)
            mod = getattr(mod, p)
        mod.register_parameter(parts[-1], nn.Parameter(
            torch.empty(t["shape"], dtype=dtype, device=device), requires_grad=False))
    return root


def hidden_dim(tensors):
    widths = [t["shape"][1] for t in tensors if len(t["shape"]) == 2]
    return statistics.mode(widths)


def run_steps(module, x, args, sync, warmup=None):
    import torch
    times, out = [], None
    warmup = args.warmup if warmup is None else warmup
    with torch.no_grad():
        for i in range(warmup + args.steps):
            sync()
            t0 = time.perf_counter()
            out = module(x)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def chained_step(module, x, args, sync):
    """args.steps steps back to back (torch_flux.chained_step)."""
    import torch
    with torch.no_grad():
        return tf.chained_step(lambda: module(x), args.steps, sync)


def ddo_case(model, x, opts, card_gib, args, ctx):
    """One ddo configuration on one emulated card; never raises."""
    import torch
    import ddo
    res = {"options": {k: v for k, v in opts.items()}}
    cuda = ctx["cuda"]
    sampler = tf.Sampler(cuda)
    r = None
    try:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(card_gib * GIB / ctx["device_total"])
            torch.cuda.reset_peak_memory_stats()
        sampler.start()
        t0 = time.perf_counter()
        where = {} if cuda else {"execution_device": "cpu"}  # cuda:0 is the default
        r = ddo.enable_offload(model, device_memory_limit_gb=ctx["limit_gb"](card_gib),
                               **where, **opts)
        res["enable_s"] = time.perf_counter() - t0
        # A result re-plans (at most once) before its third forward on a GPU (the zero-config
        # call for the activations the first measured, any for the units' compute the second
        # timed; before its second on the cpu device): three warm-up forwards at least, so the
        # timed ones run the final plan. (The bytes streamed are counted over the timed steps:
        # a re-plan starts a new session.)
        warmup = max(args.warmup, 3)
        res["warmup_steps"] = warmup
        with torch.no_grad():
            for _ in range(warmup):
                r.module(x)
        ctx["sync"]()
        before, _ = tf.ddo_bytes(r)
        step, out = run_steps(r.module, x, args, ctx["sync"], warmup=0)
        after, _ = tf.ddo_bytes(r)
        res["chained_step_s"] = chained_step(r.module, x, args, ctx["sync"])
        res["activation_replan"] = getattr(r, "activation_replan", None)  # (a route result: none)
        dw = r.plan["budgets"]["device_weights"]
        if args.torch_trace and not opts:  # the zero-configuration case: where its step goes
            with torch.no_grad():
                res["torch_trace"] = tf.trace_step(
                    lambda: r.module(x), os.path.join(args.trace_dir, f"cards_{ctx['name']}_"
                                                      f"{card_gib:g}.json"), cuda)
        res.update(step_s=step, plan_peak_bytes=dw["peak"], plan_limit_bytes=dw["limit"],
                   predicted_step_s=r.plan["budgets"].get("predicted_step_s"),
                   slot_count=dw.get("slot_count"),
                   resident_set_rule=r.plan["planner_decisions"].get("resident_set_rule"),
                   plan_note=r.plan["planner_decisions"].get("plan_note"),
                   packed_blocks=r.plan["planner_decisions"].get("packed_blocks"),
                   slot_count_decision=r.plan["planner_decisions"].get("slot_count_decision"),
                   slot_search=r.plan["planner_decisions"].get("slot_search"),
                   resident_bytes=dw.get("resident_bytes"),
                   unit_count=len(r.plan.get("units") or []),
                   streamed_bytes_per_step=(after - before) / args.steps
                   if None not in (before, after) else None,
                   bits=tf.same_bits(ctx["ref"], out.to("cpu")))
        if cuda:
            res["torch_peak_bytes"] = torch.cuda.max_memory_allocated()
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        if r is not None:
            r.close()
        res.update(sampler.stop())
        if cuda:
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()
        gc.collect()
    peak = res.get("device_used_peak_above_baseline_bytes")
    res["within_card"] = (peak <= card_gib * GIB) if peak is not None else \
        (res.get("plan_peak_bytes", 0) <= ctx["limit_gb"](card_gib) * GIB)
    # A real card also holds the process's baseline (the CUDA context, torch's start-up memory)
    absolute = res.get("device_used_peak_bytes")
    res["within_card_with_baseline"] = absolute <= card_gib * GIB if absolute is not None else None
    return res


def group_case(model, x, card_gib, args, ctx):
    """(c) Diffusers' group offload on one emulated card (torch's cap only: it has no budget),
    for reference; never raises. The model is left on the host without the hooks."""
    import torch
    if not ctx["cuda"]:
        return {"skipped": "Diffusers' group offload with use_stream needs a CUDA device"}
    try:
        from diffusers.hooks import apply_group_offloading
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"Diffusers is not importable ({type(e).__name__}: {e})"}
    kw = dict(onload_device=torch.device(ctx["device"]), offload_device=torch.device("cpu"),
              offload_type="block_level", num_blocks_per_group=1, use_stream=True,
              record_stream=True)
    res = {"kwargs": {k: str(v) for k, v in kw.items()}}
    sampler = tf.Sampler(True)
    try:
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(card_gib * GIB / ctx["device_total"])
        torch.cuda.reset_peak_memory_stats()
        sampler.start()
        t0 = time.perf_counter()
        apply_group_offloading(model, **kw)
        res["enable_s"] = time.perf_counter() - t0
        step, out = run_steps(model, x, args, ctx["sync"])
        res.update(step_s=step, bits=tf.same_bits(ctx["ref"], out.to("cpu")),
                   torch_peak_bytes=torch.cuda.max_memory_allocated())
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        try:
            from ddo.routing import _remove_group_hooks
            _remove_group_hooks(model)
            model.to("cpu")
        except Exception as e:  # noqa: BLE001
            res["cleanup_error"] = f"{type(e).__name__}: {e}"
        res.update(sampler.stop())
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
        gc.collect()
    peak = res.get("device_used_peak_above_baseline_bytes")
    res["within_card"] = peak <= card_gib * GIB if peak is not None else None
    return res


def sweep(card_gib, scale):
    """The hand-set configurations of (b): budgets a user would try on a card of card_gib."""
    b = card_gib * scale
    return {
        "vmm_budget_90": dict(backend="vmm", device_budget_gb=0.9 * b, pin_cpu_memory=True),
        "linear_budget_90": dict(backend="linear", device_budget_gb=0.9 * b),
        "vmm_auto_spread": dict(backend="vmm", vmm_resident_weight_budget_gb=0.9 * b,
                                resident_module_patterns="auto",
                                resident_module_budget_gb=0.6 * b,
                                resident_module_selection="spread", pin_cpu_memory=True),
    }


def run_model(key, args, ctx):
    import torch
    name, tokens = MODELS[key]
    ctx["name"] = name
    tensors = load_layout(name, args.tiny)
    if args.tiny:
        tokens = 16
    dtype = torch.bfloat16
    log(f"{name}: {len(tensors)} tensors, {tokens} tokens")
    t0 = time.perf_counter()
    model = build_model(tensors, ctx["device"], dtype).eval()
    tf.fill_params(model, ctx["device"])
    g = torch.Generator(device="cpu").manual_seed(tf.SEED)
    x = torch.randn(tokens, hidden_dim(tensors), generator=g).to(dtype).to(ctx["device"])
    out = {"model": name, "tokens": tokens, "build_s": time.perf_counter() - t0,
           "model_bytes": tf.model_bytes(model), "cards": {}}
    resident_step, ref = run_steps(model, x, args, ctx["sync"])
    ctx["ref"] = ref.to("cpu")
    out["resident_step_s"] = resident_step
    out["resident_chained_step_s"] = chained_step(model, x, args, ctx["sync"])
    model.to("cpu")
    if ctx["cuda"]:
        torch.cuda.empty_cache()
    for card in ctx["cards"]:
        if time.time() > ctx["deadline"]:
            out["cards"][str(card)] = {"skipped": "deadline"}
            continue
        c = {"zero_config": ddo_case(model, x, {}, card, args, ctx)}
        c["sweep"] = {n: ddo_case(model, x, o, card, args, ctx)
                      for n, o in sweep(card, ctx["scale"]).items()}
        ok = {n: v["step_s"] for n, v in c["sweep"].items() if "step_s" in v}
        a = c["zero_config"].get("step_s")
        if ok and a:
            best = min(ok, key=ok.get)
            c["best_sweep"] = best
            c["ratio_zero_config_to_best"] = a / ok[best]
            # the same among the hand-set cases whose peak, the baseline counted, fits the card
            fit = {n: t for n, t in ok.items()
                   if c["sweep"][n].get("within_card_with_baseline") is not False}
            c["best_sweep_fitting"] = min(fit, key=fit.get) if fit else None
            c["ratio_zero_config_to_best_fitting"] = a / fit[c["best_sweep_fitting"]] \
                if fit else None
        sb = c["zero_config"].get("streamed_bytes_per_step")
        if a and ctx["bus_bps"] and sb is not None:
            c["ratio_zero_config_to_bound"] = a / max(resident_step, sb / ctx["bus_bps"])
            ac = c["zero_config"].get("chained_step_s")
            if ac:  # back to back, against the resident run's back-to-back step
                c["ratio_zero_config_chained_to_bound"] = ac / max(
                    out["resident_chained_step_s"], sb / ctx["bus_bps"])
        log(f"{name} on {card}: zero-config {a}, best sweep {c.get('best_sweep')} "
            f"ratio {c.get('ratio_zero_config_to_best')}, bound ratio "
            f"{c.get('ratio_zero_config_to_bound')} (back to back "
            f"{c.get('ratio_zero_config_chained_to_bound')})")
        out["cards"][str(card)] = c
    # (c) last: Diffusers' hooks and pinned copies never touch the ddo cases' model.
    for card in ctx["group_cards"]:
        c = out["cards"].get(str(card))
        if c is None or "zero_config" not in c:
            continue
        if time.time() > ctx["deadline"]:
            c["group_offload"] = {"skipped": "deadline"}
            continue
        g = c["group_offload"] = group_case(model, x, card, args, ctx)
        if "step_s" in g and ctx["bus_bps"]:
            g["ratio_to_bound"] = g["step_s"] / max(resident_step,
                                                    out["model_bytes"] / ctx["bus_bps"])
        a = c["zero_config"].get("step_s")
        if "step_s" in g and a:
            c["ratio_zero_config_to_group_offload"] = a / g["step_s"]
        log(f"{name} on {card}: group offload {g.get('step_s', g.get('skipped', g.get('error')))}")
    del model, x
    ctx.pop("ref", None)
    gc.collect()
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="flux,wan,qwen")
    p.add_argument("--cards", default=",".join(str(c) for c in CARDS_GIB), help="GiB")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "cards.json"))
    p.add_argument("--group-cards", default="8",
                   help="GiB: the cards Diffusers' group offload runs on (reference; '' none)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tiny", action="store_true",
                   help="cpu device, small layouts, cards of GiB / 512 (a smoke test)")
    p.add_argument("--deadline-s", type=float, default=510.0)
    p.add_argument("--torch-trace", action="store_true",
                   help="one more step of each zero-configuration case under torch.profiler: "
                        "the kernels' and copies' busy time against the step (JSON: torch_trace)")
    p.add_argument("--trace-dir", default=tempfile.gettempdir(),
                   help="where --torch-trace writes its Chrome traces")
    args = p.parse_args(argv)
    import torch
    cuda = not args.tiny and torch.cuda.is_available()
    ctx = {"cuda": cuda, "device": "cuda:0" if cuda else "cpu",
           "cards": [int(c) for c in args.cards.split(",")],
           "group_cards": [int(c) for c in args.group_cards.split(",") if c],
           "deadline": time.time() + args.deadline_s,
           "scale": TINY_CARD_SCALE if args.tiny else 1.0,
           "sync": torch.cuda.synchronize if cuda else (lambda: None)}
    ctx["limit_gb"] = lambda card: card * ctx["scale"]
    if not cuda and not args.tiny:
        raise SystemExit("cards.py needs a CUDA device (or --tiny for the cpu device)")
    if cuda:
        ctx["device_total"] = torch.cuda.mem_get_info(0)[1]
        bus = tf.measure_bus(2.0)
        ctx["bus_bps"] = bus["bus_gbps"] * 1e9
    else:
        bus, ctx["bus_bps"] = None, None
    t0 = time.time()
    results = {"schema": "ddo.bench.cards", "tiny": args.tiny, "bus": bus,
               "cards_gib": [c * ctx["scale"] for c in ctx["cards"]], "models": {}}
    for key in args.models.split(","):
        results["models"][key] = run_model(key, args, ctx)
        with open(args.out, "w") as f:  # partial results survive a later failure
            json.dump(results, f, indent=1, default=str)
    results["wall_s"] = time.time() - t0
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)
    log(f"wrote {args.out} in {results['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
