#!/usr/bin/env python3
"""GGUF with the real packages: files written by the `gguf` package (the format's reference
Python implementation, from llama.cpp's gguf-py), read by ddo and by Diffusers.

Neither package is a dependency of ddo, and neither is installed on the build machine or in CI:
this script runs where they are importable (PYTHONPATH), and says so and exits 2 where not.

  reader    (any machine with `gguf`; the cpu device) the gguf package's GGUFWriter writes a file
            with a tensor of every GGML type both it and ddo know (random bytes of the type's
            block size), metadata of every value type and a custom alignment; `ddo inspect
            --json` must report every tensor with gguf's GGUFReader's name, type, shape, offset
            and size, every metadata key, and the same bytes (SHA-256 of each tensor's bytes at
            ddo's offset against GGUFReader's data); then `ddo run --verify` streams it on the
            cpu device with byte identity checked.

      PYTHONPATH=<gguf-py> python3 bench/gguf_real.py reader --ddo build/ddo --dir /tmp/gg

  The Flux transformer as a Diffusers user loads a GGUF checkpoint (used by bench/torch_flux.py
  --quant gguf_file): write_flux() writes the Flux.1-dev transformer's tensors, named as
  Diffusers names them, with GGUFWriter (the blocks' linear weights Q8_0 or Q4_K, random blocks
  with finite small weights, every other tensor F32), and load_flux() loads it the user's way,
  FluxTransformer2DModel.from_single_file(path, config=<local config>,
  quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16)): Diffusers' own
  GGUFParameter and GGUFLinear, dequantizing in their forwards.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np

SEED = 20261205
# Types gguf 0.10 still lists that GGML removed (the ARM repacks, late 2024); ddo refuses them.
REMOVED = ("Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8")
# gguf 0.10 sizes Q8_1's block as 40 bytes (two f32, GGML's old layout); GGML's C today is 36
# (two f16: ggml-common.h asserts it), and ddo follows the C. Q8_1 is a matmul intermediate no
# writer stores, so the check leaves it out and says so.
DIVERGENT = {"Q8_1": "gguf-py sizes its block 40 bytes (GGML's old f32 d/s), GGML's C and ddo 36"}


def need_gguf():
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        print(f"gguf_real: the gguf package is not importable ({e}); put llama.cpp's gguf-py on "
              f"PYTHONPATH", file=sys.stderr)
        sys.exit(2)
    return gguf


# ---- reader: the gguf package writes, ddo reads ----

def block_rows(gguf, qtype, rows, cols, rng):
    """Random stored bytes of a rows x cols tensor of qtype (a quantized type: its blocks)."""
    per, size = gguf.GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, size=(rows, cols // per * size), dtype=np.uint8)


def write_reader_file(gguf, path, rng):
    """Every GGML type gguf and ddo both know, plus plain numpy dtypes and metadata of every
    value type; returns {name: type name}."""
    w = gguf.GGUFWriter(path, "ddo-check")
    w.add_custom_alignment(64)
    w.add_uint8("check.u8", 7)
    w.add_int8("check.i8", -7)
    w.add_uint16("check.u16", 65535)
    w.add_int16("check.i16", -300)
    w.add_uint32("check.u32", 4000000000)
    w.add_int32("check.i32", -2000000000)
    w.add_uint64("check.u64", 1 << 40)
    w.add_int64("check.i64", -(1 << 40))
    w.add_float32("check.f32", 0.5)
    w.add_float64("check.f64", 0.25)
    w.add_bool("check.bool", True)
    w.add_string("check.str", "ddo gguf check")
    w.add_array("check.arr_i32", [1, 2, 3])
    w.add_array("check.arr_str", ["a", "bc"])
    types = {}
    plain = {"F32": np.float32, "F16": np.float16, "I8": np.int8, "I16": np.int16,
             "I32": np.int32, "F64": np.float64}
    for name, dt in plain.items():
        a = rng.standard_normal((8, 64)).astype(dt) if dt in (np.float32, np.float16, np.float64) \
            else rng.integers(-100, 100, size=(8, 64)).astype(dt)
        w.add_tensor(f"plain.{name.lower()}.weight", a)
        types[f"plain.{name.lower()}.weight"] = name
    for qt in gguf.GGMLQuantizationType:
        if qt.name in plain or qt.name in ("F32", "F16") or qt not in gguf.GGML_QUANT_SIZES \
                or qt.name in REMOVED or qt.name in DIVERGENT:
            continue
        per, size = gguf.GGML_QUANT_SIZES[qt]
        if per == 1:  # BF16 and other plain types gguf treats as raw
            data = rng.integers(0, 256, size=(4, 64 * size), dtype=np.uint8)
        else:
            data = block_rows(gguf, qt, 4, 2 * max(per, 256), rng)
        name = f"quant.{qt.name.lower()}.weight"
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)
        types[name] = qt.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def reader_check(args):
    gguf = need_gguf()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "gguf-real-check.gguf")
    types = write_reader_file(gguf, path, np.random.default_rng(SEED))
    r = gguf.GGUFReader(path)
    ref = {t.name: t for t in r.tensors}
    p = subprocess.run([args.ddo, "inspect", "--json", path], capture_output=True, text=True)
    problems, rows = [], []
    if p.returncode != 0:
        # ddo refuses the file: the line it gives is the finding (a type it does not know)
        print(p.stderr.strip())
        return {"path": path, "ddo_inspect_rc": p.returncode, "ddo_error": p.stderr.strip(),
                "types": types}
    got = json.loads(p.stdout)
    by_name = {t["name"]: t for t in got["tensors"]}
    with open(path, "rb") as f:
        blob = f.read()
    for name, t in ref.items():
        d = by_name.get(name)
        want_shape = [int(x) for x in reversed(list(t.shape))]
        row = {"name": name, "gguf_type": t.tensor_type.name, "gguf_offset": int(t.data_offset),
               "gguf_nbytes": int(t.n_bytes), "gguf_shape": want_shape}
        if d is None:
            problems.append(f"{name}: missing in ddo inspect")
            rows.append(row)
            continue
        row.update(ddo_dtype=d["dtype"], ddo_offset=d["offset"], ddo_nbytes=d["nbytes"],
                   ddo_shape=d["shape"])
        ours = hashlib.sha256(blob[d["offset"]:d["offset"] + d["nbytes"]]).hexdigest()
        theirs = hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest()
        row["same_bytes"] = ours == theirs
        for k, a, b in (("dtype", d["dtype"], t.tensor_type.name),
                        ("offset", d["offset"], int(t.data_offset)),
                        ("nbytes", d["nbytes"], int(t.n_bytes)),
                        ("shape", d["shape"], want_shape), ("bytes", ours, theirs)):
            if a != b:
                problems.append(f"{name}: {k} ddo {a} gguf {b}")
        rows.append(row)
    extra = set(by_name) - set(ref)
    problems += [f"{n}: in ddo, not in gguf" for n in sorted(extra)]
    meta = got.get("metadata", {})
    for field in r.fields:
        if field.startswith("GGUF."):  # the header's own fields (version, counts)
            continue
        if field not in meta:
            problems.append(f"metadata {field}: missing in ddo inspect")
    removed = []
    for name in REMOVED:  # each alone in a file: ddo refuses it in one line naming the type id
        qt = gguf.GGMLQuantizationType[name]
        rp = os.path.join(args.dir, f"removed-{name.lower()}.gguf")
        w = gguf.GGUFWriter(rp, "ddo-check")
        w.add_tensor("w", block_rows(gguf, qt, 4, 256, np.random.default_rng(1)),
                     raw_shape=(4, 256 // gguf.GGML_QUANT_SIZES[qt][0] *
                                gguf.GGML_QUANT_SIZES[qt][1]), raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        q = subprocess.run([args.ddo, "inspect", rp], capture_output=True, text=True)
        line = q.stderr.strip()
        removed.append({"type": name, "rc": q.returncode, "line": line})
        if q.returncode == 0 or f"GGML type {int(qt)}" not in line or "\n" in line:
            problems.append(f"{name}: expected one line refusing GGML type {int(qt)}, got "
                            f"rc {q.returncode}: {line!r}")
    v = subprocess.run([args.ddo, "run", path, "--ddo-execution-device", "cpu", "--steps", "2",
                        "--verify"], capture_output=True, text=True)
    res = {"path": path, "tensors": len(ref), "types": sorted(set(types.values())),
           "rows": rows, "removed_types": removed, "left_out": DIVERGENT,
           "metadata_keys": len(meta), "problems": problems,
           "run_verify_rc": v.returncode, "run_verify_tail": (v.stdout + v.stderr)[-600:],
           "gguf_module": gguf.__file__}
    print(f"{len(ref)} tensors of {len(res['types'])} types, {len(meta)} metadata keys: "
          f"{len(problems)} differences; ddo run --verify rc {v.returncode}")
    for q in problems:
        print("  " + q)
    return res


# ---- the Flux transformer as Diffusers loads a GGUF file ----

def flux_tensors(cfg):
    """(name, shape, is_linear_weight) of FluxTransformer2DModel(**cfg), built on meta."""
    import torch
    from diffusers import FluxTransformer2DModel
    with torch.device("meta"):
        m = FluxTransformer2DModel(**cfg)
    linear = {f"{n}.weight" for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    return [(n, tuple(p.shape), n in linear) for n, p in m.state_dict().items()]


# The block types write_flux writes: (weights per block, bytes per block).
BLOCKS = {"Q8_0": (32, 34), "Q4_K": (256, 144)}


def quant_blocks(rng, rows, nblocks, qtype):
    """Random blocks of qtype with finite, small weights: Q8_0 random int8 quants and one f16
    scale of 1/64 per 32 weights; Q4_K random 4-bit quants and 6-bit scales and mins, its super
    scales d and dmin f16 2^-13 (|w| < 0.12, standard deviation about 0.027)."""
    per, size = BLOCKS[qtype]
    b = rng.integers(0, 256, size=(rows, nblocks, size), dtype=np.uint8)
    if qtype == "Q8_0":
        b[:, :, 0:2] = np.frombuffer(np.float16(1.0 / 64).tobytes(), dtype=np.uint8)
    else:
        d = np.frombuffer(np.float16(2.0 ** -13).tobytes(), dtype=np.uint8)
        b[:, :, 0:2] = d  # d
        b[:, :, 2:4] = d  # dmin
    return b.reshape(rows, nblocks * size)


def write_flux(path, cfg, pattern="transformer_blocks.", qtype="Q8_0"):
    """The Flux transformer's tensors in a GGUF file written by gguf's GGUFWriter: the linear
    weights of the blocks in qtype (Q8_0 or Q4_K, random blocks: quant_blocks), every other
    tensor F32 (normal, std 0.02; norms' weights 1). Written once (kept if present)."""
    gguf = need_gguf()
    if os.path.exists(path):
        return {"written": False, "bytes": os.path.getsize(path), "qtype": qtype}
    t0 = time.perf_counter()
    rng = np.random.default_rng(SEED)
    tmp = path + ".part"
    w = gguf.GGUFWriter(tmp, "flux")
    per = BLOCKS[qtype][0]
    n_q = 0
    for name, shape, lin in flux_tensors(cfg):
        if lin and pattern in name and len(shape) == 2 and shape[1] % per == 0:
            rows, cols = shape
            q = quant_blocks(rng, rows, cols // per, qtype)
            w.add_tensor(name, q, raw_shape=q.shape,
                         raw_dtype=getattr(gguf.GGMLQuantizationType, qtype))
            n_q += 1
        elif name.endswith("norm.weight") or ".norm_" in name and name.endswith(".weight"):
            w.add_tensor(name, np.ones(shape, np.float32))
        else:
            w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * 0.02))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return {"written": True, "bytes": os.path.getsize(path), "qtype": qtype,
            "quantized_tensors": n_q, "write_s": time.perf_counter() - t0}


def load_flux(path, cfg, workdir):
    """FluxTransformer2DModel.from_single_file with Diffusers' GGUF quantizer (on the CPU)."""
    import torch
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig
    cdir = os.path.join(workdir, "flux-config")
    os.makedirs(cdir, exist_ok=True)
    conf = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()}
    conf["_class_name"] = "FluxTransformer2DModel"
    with open(os.path.join(cdir, "config.json"), "w") as f:
        json.dump(conf, f)
    t0 = time.perf_counter()
    m = FluxTransformer2DModel.from_single_file(
        path, config=cdir, local_files_only=True, torch_dtype=torch.bfloat16,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16))
    kinds = {}
    for p in m.parameters():
        k = type(p).__name__ + (f":{p.quant_type.name}" if hasattr(p, "quant_type") else "")
        kinds[k] = kinds.get(k, 0) + 1
    return m.eval(), {"load_s": time.perf_counter() - t0, "parameter_types": kinds,
                      "linear_types": sorted({type(mod).__name__ for mod in m.modules()
                                              if "Linear" in type(mod).__name__})}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reader", help="the gguf package writes, ddo reads (cpu device)")
    r.add_argument("--ddo", required=True)
    r.add_argument("--dir", default="/tmp/gguf-real")
    r.add_argument("--out", default=None)
    a = p.parse_args(argv)
    res = reader_check(a)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if not res.get("problems") and res.get("run_verify_rc", 1) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
