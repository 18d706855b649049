#!/usr/bin/env python3
"""LoRA switched and fused while ddo streams the Flux transformer (issue 27, item 3).

One process: the model of bench/torch_flux.py (Flux.1-dev configuration, random bf16 weights;
--tiny or --toy for a smoke run), two LoRA adapters injected by PEFT into the managed module and
into a resident copy on the same device, then a user's sequence on both: steps unmerged, a
switch of the active adapter with a weight, fuse, steps, unfuse, fuse of the other. For each
LoRA call: its time, the first step after it against a plain step (the switch's cost between
two pipeline calls), the session's byte counters around the call (a switch or a fuse must move
no base weight: bytes_staged_from_file, setup_read_bytes, copy_bytes, uploads unchanged), and
every step's output against the resident model's (bit-identical).

  GPU:    PYTHONPATH=.devbench/src:python DDO_LIBRARY=<build>/libddo.so \\
          python3 bench/lora.py --out $OUT/lora.json             (PEFT and Diffusers needed)
  Smoke:  python3 bench/lora.py --toy --device cpu --lora standin   (no PEFT: the tests'
          stand-in of PEFT's LoRA layer, tests/python/test_lora.py)
"""

import argparse
import copy
import importlib.util
import json
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
COUNTERS = ("bytes_staged_from_file", "setup_read_bytes", "bytes_from_registered",
            "bytes_staged_from_retained", "bytes_resident_uploaded", "copy_bytes", "uploads")
# The zero-resident VMM case of bench/torch_flux.py without its profile (docs/benchmarks.md).
DDO_OPTIONS = {"always_resident_modules_pattern": "^$", "small_tensor_threshold_bytes": 0,
               "resident_module_budget_gb": 0, "vmm_resident_weight_budget_gb": 4}


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def log(msg):
    print(f"[lora {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def inject(model, name, seed, args):
    """Adapter name into every target layer of model (A and B random: a trained-like LoRA)."""
    import torch
    torch.manual_seed(seed)
    if args.lora == "peft":
        from peft import LoraConfig, inject_adapter_in_model
        inject_adapter_in_model(LoraConfig(r=args.rank, lora_alpha=args.rank,
                                           init_lora_weights=False,
                                           target_modules=args.targets.split(",")),
                                model, adapter_name=name)
        return
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
    from test_lora import StandInLoraLinear
    gen = torch.Generator().manual_seed(seed)
    targets = args.targets.split(",")
    for mname, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            if cname in targets and isinstance(child, (torch.nn.Linear, StandInLoraLinear)):
                layer = child if isinstance(child, StandInLoraLinear) else StandInLoraLinear(child)
                setattr(mod, cname, layer)
                layer.update_layer(name, args.rank, args.rank, gen)
                with torch.no_grad():
                    b = layer.lora_B[name].weight
                    b.copy_(torch.randn(b.shape, generator=gen).to(b.dtype) * 0.01)
    model.peft_config = dict(getattr(model, "peft_config", {}), **{name: {"r": args.rank}})


def lora_layers(model):
    return [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "merge")]


def each_layer(model, fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in lora_layers(model):
            fn(m)


# The sequence: (label, what it does to one model). Layer by layer, as Diffusers' set_adapters,
# fuse_lora and unfuse_lora do it (set_adapter + set_scale, merge, unmerge).
SEQUENCE = [
    ("switch to b x0.8", lambda m: each_layer(
        m, lambda y: (y.set_adapter(["b"]), y.set_scale("b", 0.8)))),
    ("fuse b", lambda m: each_layer(m, lambda y: y.merge(adapter_names=["b"]))),
    ("unfuse", lambda m: each_layer(m, lambda y: y.unmerge())),
    ("switch to a", lambda m: each_layer(m, lambda y: y.set_adapter(["a"]))),
    ("fuse a", lambda m: each_layer(m, lambda y: y.merge(adapter_names=["a"]))),
    ("unfuse, fuse b", lambda m: each_layer(m, lambda y: (y.unmerge(), y.set_adapter(["b"]),
                                                          y.merge(adapter_names=["b"])))),
]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--tiny", action="store_true", help="tiny Flux configuration")
    p.add_argument("--toy", action="store_true", help="bench/torch_flux.py's toy module")
    p.add_argument("--lora", choices=("peft", "standin"), default="peft")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--targets", default=None,
                   help="layer names (default to_q,to_k,to_v,to_out.0; toy: qkv,proj)")
    p.add_argument("--steps", type=int, default=3, help="plain steps per phase (>= 2)")
    p.add_argument("--image-tokens", type=int, default=4096)
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--out", default=None, help="JSON results")
    args = p.parse_args(argv)
    args.targets = args.targets or ("qkv,proj" if args.toy else "to_q,to_k,to_v,to_out.0")
    import torch
    import ddo
    tf = load("torch_flux_bench", os.path.join(HERE, "torch_flux.py"))
    cuda = args.device.startswith("cuda")
    dev = torch.device(args.device)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    model, info = tf.build_model(args)
    ref = copy.deepcopy(model).to(dev)  # the resident model
    inputs = tf.make_inputs(args, dev)
    r = ddo.enable_offload(model, execution_device=args.device, backend="vmm", **DDO_OPTIONS)
    for mm in (ref, model):  # the layers injected into model are ddo's from its next forward
        inject(mm, "a", 1, args)
        inject(mm, "b", 2, args)
    res = {"info": info, "args": vars(args), "phases": [], "identical": True}

    def timed_step():
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = tf.forward(model, inputs, args.toy)
        sync()
        dt = time.perf_counter() - t0
        with torch.no_grad():
            want = tf.forward(ref, inputs, args.toy)
        same = torch.equal(out, want)
        res["identical"] &= same
        return dt, same

    def counters():
        L = ddo._native.lib()
        L.ddo_session_synchronize(r._session)
        snap = r.metrics_snapshot(collect_completed=True)
        return {k: snap.get(k) for k in COUNTERS}

    try:
        plain = [timed_step()[0] for _ in range(max(2, args.steps))]
        res["plain_step_s"] = statistics.median(plain[1:])
        log(f"plain step {res['plain_step_s'] * 1e3:.1f} ms (unmerged a)")
        for label, fn in SEQUENCE:
            fn(ref)
            before = counters()
            sync()
            t0 = time.perf_counter()
            fn(model)
            sync()
            call_s = time.perf_counter() - t0
            after = counters()
            moved = {k: after[k] - before[k] for k in COUNTERS if after[k] != before[k]}
            steps = [timed_step() for _ in range(max(2, args.steps))]
            first, rest = steps[0][0], statistics.median(s[0] for s in steps[1:])
            ph = {"call": label, "call_s": call_s, "moved_by_call": moved,
                  "first_step_s": first, "step_s": rest,
                  "switch_cost_s": call_s + max(0.0, first - res["plain_step_s"]),
                  "identical": all(s[1] for s in steps)}
            res["phases"].append(ph)
            log(f"{label:16s} call {call_s * 1e3:8.1f} ms, first step {first * 1e3:8.1f} ms, "
                f"step {rest * 1e3:8.1f} ms, moved by the call {moved or 'nothing'}, "
                f"identical {ph['identical']}")
        res["max_switch_cost_s"] = max(ph["switch_cost_s"] for ph in res["phases"])
        res["no_read_during_calls"] = not any(ph["moved_by_call"] for ph in res["phases"])
    finally:
        r.close()
    log(f"max switch cost {res['max_switch_cost_s']:.3f} s (target < 1 s), no weight moved by "
        f"a LoRA call: {res['no_read_during_calls']}, bit-identical: {res['identical']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["identical"] and res["no_read_during_calls"] else 1


if __name__ == "__main__":
    sys.exit(main())
