"""quant_layers.py - quantized STAND-IN layers for the benches (bench/torch_flux.py --quant).

Issue 27's GPU figures need a Flux transformer whose linear layers hold quantized bytes that
their own forwards dequantize on the device, as the hosts' layers do. These are stand-ins
written for the benches (no gguf package, no ComfyUI), laid out as the hosts lay them out:

  q8_0   a GGUF-style Parameter subclass (uint8 blocks plus quant_type and quant_shape, made
         with torch.Tensor._make_subclass, its __torch_function__ keeping its type, as
         Diffusers' GGUFParameter) in GGML's Q8_0 layout (34 bytes per 32 weights: an f16 scale
         and 32 int8), dequantized by torch ops to the compute dtype in the layer's forward;
  q4_k   the same Parameter subclass in GGML's Q4_K layout (144 bytes per 256 weights: f16 d
         and dmin, 12 bytes of 6-bit sub-block scales and mins, 128 bytes of 4-bit quants),
         dequantized by torch ops as ggml's dequantize_row_q4_K; layers whose input width is
         not a multiple of 256 are left as they are (as GGUF writers fall back for them);
  fp8_wrapper  TorchAO's float8 weight-only tensor: a wrapper subclass (made with
         torch.Tensor._make_wrapper_subclass, the flatten protocol) over `qdata` (float8_e4m3fn;
         uint8 E4M3 bytes on older torch) and a float32 `scale` per row, whose F.linear (its
         __torch_function__) and aten.t / mm (its __torch_dispatch__) dequantize, and whose
         device moves (aten._to_copy) move its inner tensors; ddo streams the inner tensors;
  fp8    ComfyUI's scaled FP8: `weight` float8_e4m3fn (torch >= 2.1; uint8 E4M3 bytes through a
         256-entry table on older torch) and a float32 `weight_scale`, the weights scaled per
         tensor into E4M3's range (max |w| -> 448).

quantize_linears(model, kind, pattern) replaces every nn.Linear whose qualified name matches
pattern (and whose input width is a multiple of 32) in place, quantizing on the weights' own
device (build on the GPU, then move the model to the CPU).
"""

import re

import torch
import torch.nn.functional as F
from torch import nn

Q8_0 = 8  # GGML's type ids
Q4_K = 12
BLOCK_BYTES = {Q8_0: (32, 34), Q4_K: (256, 144)}  # type id -> (weights, bytes) per block


class GGUFLikeParameter(nn.Parameter):
    """STAND-IN for Diffusers' GGUFParameter (see the module docstring)."""

    def __new__(cls, data, requires_grad=False, quant_type=None):
        self = torch.Tensor._make_subclass(cls, data, requires_grad)
        self.quant_type = quant_type
        if quant_type in BLOCK_BYTES and data.dim() >= 1:
            elems, nbytes = BLOCK_BYTES[quant_type]
            self.quant_shape = tuple(data.shape[:-1]) + (data.shape[-1] // nbytes * elems,)
        return self

    def as_tensor(self):
        return torch.Tensor._make_subclass(torch.Tensor, self, self.requires_grad)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        if isinstance(result, torch.Tensor) and not isinstance(result, cls):
            qt = next((a.quant_type for a in args if isinstance(a, GGUFLikeParameter)), None)
            return cls(result, quant_type=qt)
        return result


def q8_0_quantize(w):
    """float [out, in] (in a multiple of 32) -> uint8 [out, in / 32 * 34] (GGML's Q8_0)."""
    blocks = w.float().reshape(-1, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    q = torch.where(d > 0, blocks / d.clamp_min(1e-30), torch.zeros_like(blocks))
    q = q.round().clamp(-127, 127).to(torch.int8)
    raw = torch.cat([d.half().view(torch.uint8).reshape(-1, 2), q.view(torch.uint8)], dim=1)
    return raw.reshape(w.shape[0], -1).contiguous()


def q8_0_dequantize(raw, rows, dtype):
    """uint8 [rows, blocks x 34] -> dtype [rows, blocks x 32]."""
    raw = raw.reshape(-1, 34)
    d = raw[:, :2].contiguous().view(torch.float16).to(dtype)
    q = raw[:, 2:].contiguous().view(torch.int8).to(dtype)
    return (d * q).reshape(rows, -1)


def _q4_k_scales_mins(sc):
    """uint8 [n, 12] -> (scales, mins), each uint8 [n, 8]: ggml's get_scale_min_k4 for j = 0..7
    (j < 4: the low 6 bits of bytes j and j + 4; j >= 4: the nibbles of byte j + 4 with the top
    2 bits of bytes j - 4 and j)."""
    s0, s1, s2 = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scales = torch.cat([s0 & 63, (s2 & 0xF) | ((s0 >> 6) << 4)], dim=1)
    mins = torch.cat([s1 & 63, (s2 >> 4) | ((s1 >> 6) << 4)], dim=1)
    return scales, mins


def q4_k_dequantize(raw, rows, dtype):
    """uint8 [rows, blocks x 144] -> dtype [rows, blocks x 256], as ggml's dequantize_row_q4_K
    (in float32: y = d * scale * q - dmin * min, for each 32-weight sub-block; the 64 weights
    of each 32-byte group are its bytes' low nibbles, then their high nibbles)."""
    raw = raw.reshape(-1, 144)
    d = raw[:, 0:2].contiguous().view(torch.float16).float()
    dmin = raw[:, 2:4].contiguous().view(torch.float16).float()
    scales, mins = _q4_k_scales_mins(raw[:, 4:16])
    qs = raw[:, 16:144].reshape(-1, 4, 1, 32)
    q = torch.cat([qs & 0xF, qs >> 4], dim=2).reshape(-1, 8, 32).float()
    d1 = (d * scales.float()).unsqueeze(-1)
    m1 = (dmin * mins.float()).unsqueeze(-1)
    return (d1 * q - m1).reshape(rows, -1).to(dtype)


def q4_k_quantize(w):
    """float [out, in] (in a multiple of 256) -> uint8 [out, in / 256 * 144] (GGML's Q4_K). A
    plain min/max quantizer (each 32-weight sub-block's range in 15 steps, its scale and min in
    6 bits of the block's d and dmin), not llama.cpp's search; the layout is ggml's."""
    x = w.float().reshape(-1, 8, 32)
    lo = x.amin(dim=2).clamp(max=0)  # Q4_K stores -min >= 0 and subtracts it
    scale = (x.amax(dim=2) - lo) / 15
    d = (scale.amax(dim=1, keepdim=True) / 63).half().float()
    dmin = ((-lo).amax(dim=1, keepdim=True) / 63).half().float()
    sc = torch.where(d > 0, scale / d.clamp_min(1e-30), torch.zeros_like(scale))
    sc = sc.round().clamp(0, 63)
    mn = torch.where(dmin > 0, -lo / dmin.clamp_min(1e-30), torch.zeros_like(lo))
    mn = mn.round().clamp(0, 63)
    step = (d * sc).unsqueeze(-1)
    q = torch.where(step > 0, (x + (dmin * mn).unsqueeze(-1)) / step.clamp_min(1e-30),
                    torch.zeros_like(x))
    q = q.round().clamp(0, 15).to(torch.uint8).reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    sc8, mn8 = sc.to(torch.uint8), mn.to(torch.uint8)
    packed = torch.cat([
        (sc8[:, :4] & 63) | ((sc8[:, 4:] >> 4) << 6),
        (mn8[:, :4] & 63) | ((mn8[:, 4:] >> 4) << 6),
        (sc8[:, 4:] & 0xF) | ((mn8[:, 4:] & 0xF) << 4)], dim=1)
    raw = torch.cat([d.half().view(torch.uint8).reshape(-1, 2),
                     dmin.half().view(torch.uint8).reshape(-1, 2), packed, qs], dim=1)
    return raw.reshape(w.shape[0], -1).contiguous()


GGUF_CODECS = {Q8_0: (q8_0_quantize, q8_0_dequantize), Q4_K: (q4_k_quantize, q4_k_dequantize)}


class Q8Linear(nn.Module):
    """STAND-IN for Diffusers' GGUFLinear with a Q8_0 weight (see the module docstring)."""

    QUANT_TYPE = Q8_0

    def __init__(self, lin, compute_dtype):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.compute_dtype = compute_dtype
        quantize = GGUF_CODECS[self.QUANT_TYPE][0]
        with torch.no_grad():
            self.weight = GGUFLikeParameter(quantize(lin.weight), quant_type=self.QUANT_TYPE)
            self.bias = None if lin.bias is None else nn.Parameter(
                lin.bias.detach().to(compute_dtype), requires_grad=False)

    def forward(self, x):
        w = self.weight
        assert w.quant_type == self.QUANT_TYPE, "quant_type lost"
        dequantize = GGUF_CODECS[self.QUANT_TYPE][1]
        w = dequantize(w.as_tensor(), self.out_features, self.compute_dtype)
        return F.linear(x.to(self.compute_dtype), w, self.bias)


class Q4KLinear(Q8Linear):
    """STAND-IN for Diffusers' GGUFLinear with a Q4_K weight (see the module docstring)."""

    QUANT_TYPE = Q4_K


def _e4m3_table(device):
    vals = []
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        if e == 15 and m == 7:
            v = float("nan")
        vals.append(-v if s else v)
    return torch.tensor(vals, dtype=torch.float32, device=device)


def e4m3_encode(w):
    """float -> the nearest E4M3 byte (uint8): torch's own cast where torch has float8."""
    if hasattr(torch, "float8_e4m3fn"):
        return w.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    table = _e4m3_table(w.device)
    finite = torch.arange(256, device=w.device)[~torch.isnan(table)]
    vals, order = table[finite].sort()
    codes = finite[order]
    flat = w.float().reshape(-1)
    out = torch.empty_like(flat, dtype=torch.uint8)
    for a in range(0, flat.numel(), 1 << 22):
        x = flat[a:a + (1 << 22)]
        i = torch.searchsorted(vals, x.contiguous()).clamp(1, len(vals) - 1)
        pick = torch.where((x - vals[i - 1]).abs() <= (vals[i] - x).abs(), i - 1, i)
        out[a:a + (1 << 22)] = codes[pick].to(torch.uint8)
    return out.reshape(w.shape)


def fp8_codes(x):
    """x's E4M3 codes as float8_e4m3fn (as uint8 bytes on a torch without float8)."""
    code = e4m3_encode(x)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    return code.view(fp8) if fp8 is not None else code


class FP8Linear(nn.Module):
    """STAND-IN for a ComfyUI scaled-FP8 linear (see the module docstring)."""

    def __init__(self, lin, compute_dtype):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.compute_dtype = compute_dtype
        with torch.no_grad():
            w = lin.weight.float()
            scale = (w.abs().max() / 448).clamp_min(1e-12)
            self.weight = nn.Parameter(fp8_codes(w / scale), requires_grad=False)
            self.weight_scale = nn.Parameter(scale.reshape(1), requires_grad=False)
            self.bias = None if lin.bias is None else nn.Parameter(
                lin.bias.detach().to(compute_dtype), requires_grad=False)

    def forward(self, x):
        w = self.weight
        if w.dtype == torch.uint8:
            w = _e4m3_table(w.device)[w.long()]
        w = (w.to(torch.float32) * self.weight_scale).to(self.compute_dtype)
        return F.linear(x.to(self.compute_dtype), w, self.bias)


def _tree_map(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_map(fn, a) for a in x)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(x)


class Float8WeightOnlyTensor(torch.Tensor):
    """STAND-IN for TorchAO's float8 weight-only tensor (see the module docstring): its own
    dtype is the compute dtype; qdata and scale are its inner tensors."""

    @staticmethod
    def __new__(cls, qdata, scale, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=dtype,
                                                   device=qdata.device, requires_grad=False)

    def __init__(self, qdata, scale, dtype):
        self.qdata, self.scale = qdata, scale

    def __repr__(self):
        return f"Float8WeightOnlyTensor(shape={tuple(self.shape)}, dtype={self.dtype})"

    def __tensor_flatten__(self):
        return ["qdata", "scale"], self.dtype

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size=None, outer_stride=None):
        return cls(inner["qdata"], inner["scale"], ctx)

    def dequantize(self):
        q = self.qdata
        w = _e4m3_table(q.device)[q.long()] if q.dtype == torch.uint8 else q.to(torch.float32)
        return (w * self.scale[:, None]).to(self.dtype)

    def _inner_map(self, fn):
        return type(self)(fn(self.qdata), fn(self.scale), self.dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and isinstance(args[1], cls):  # weight-only: dequantize, linear
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return F.linear(args[0], args[1].dequantize(), bias)
        with torch._C.DisableTorchFunction():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.detach.default:
            return args[0]._inner_map(lambda t: t.detach())
        if func is aten._to_copy.default:  # a device move: the inner tensors move
            dev = kwargs.get("device")
            if kwargs.get("dtype") not in (None, args[0].dtype) or dev is None:
                raise NotImplementedError(f"Float8WeightOnlyTensor: {func} {kwargs}")
            return args[0]._inner_map(lambda t: t.to(dev))
        if func in (aten.t.default, aten.mm.default, aten.addmm.default, aten.matmul.default):
            return func(*_tree_map(lambda a: a.dequantize() if isinstance(a, cls) else a, args),
                        **kwargs)
        raise NotImplementedError(f"Float8WeightOnlyTensor: {func}")


class Float8WrapperLinear(nn.Module):
    """A linear layer whose weight is the wrapper stand-in (TorchAO's quantize_ swaps the
    weight of an nn.Linear in place; the layer's forward is plain F.linear)."""

    def __init__(self, lin, compute_dtype):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.compute_dtype = compute_dtype
        with torch.no_grad():
            w = lin.weight.float()
            scale = (w.abs().amax(dim=1) / 448).clamp_min(1e-12)
            qdata = fp8_codes(w / scale[:, None])
            self.weight = nn.Parameter(Float8WeightOnlyTensor(qdata, scale, compute_dtype),
                                       requires_grad=False)
            self.bias = None if lin.bias is None else nn.Parameter(
                lin.bias.detach().to(compute_dtype), requires_grad=False)

    def forward(self, x):
        return F.linear(x.to(self.compute_dtype), self.weight, self.bias)


def stored(t):
    """The plain tensors t stores: t itself, or a wrapper subclass's inner tensors (through
    inner wrappers: the flatten protocol)."""
    if not hasattr(type(t), "__tensor_flatten__"):
        return [t]
    return [x for name in t.__tensor_flatten__()[0] for x in stored(getattr(t, name))]


KINDS = {"q8_0": Q8Linear, "q4_k": Q4KLinear, "fp8": FP8Linear,
         "fp8_wrapper": Float8WrapperLinear}
# the input width a layer must divide by
ROW_MULTIPLE = {"q8_0": 32, "q4_k": 256, "fp8": 32, "fp8_wrapper": 32}


def quantize_linears(model, kind, pattern=r".", compute_dtype=torch.bfloat16):
    """Replaces the nn.Linear layers of model whose name matches pattern (re.search) and whose
    input width is a multiple of ROW_MULTIPLE[kind] (a whole number of blocks a row) by kind's
    stand-in, in place; returns how many."""
    make, rx, n, mult = KINDS[kind], re.compile(pattern), 0, ROW_MULTIPLE[kind]
    for name, parent in list(model.named_modules()):
        for cname, child in list(parent.named_children()):
            full = f"{name}.{cname}" if name else cname
            if type(child) is nn.Linear and rx.search(full) and child.in_features % mult == 0:
                setattr(parent, cname, make(child, compute_dtype))
                n += 1
    return n
