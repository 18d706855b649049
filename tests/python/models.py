"""Models written for the binding's tests (not copied from anywhere): a Flux-like stack of
attention blocks with norms and linear layers, and module trees that break naive hooking."""

import collections

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    """Computes in float32 (torch 1.13 has no CPU float16 matmul) and returns the input dtype."""

    def forward(self, x):
        b = self.bias.float() if self.bias is not None else None
        return F.linear(x.float(), self.weight.float(), b).to(x.dtype)


class GELU(nn.GELU):
    def forward(self, x):
        return F.gelu(x.float()).to(x.dtype)


class LayerNorm(nn.LayerNorm):
    def forward(self, x):
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.to_q = Linear(dim, dim)
        self.to_k = Linear(dim, dim)
        self.to_v = Linear(dim, dim)
        self.to_out = Linear(dim, dim)
        self.norm_q = LayerNorm(dim // heads, elementwise_affine=True)

    def forward(self, x):
        b, n, d = x.shape
        h = self.heads
        q = self.norm_q(self.to_q(x).view(b, n, h, d // h)).transpose(1, 2)
        k = self.to_k(x).view(b, n, h, d // h).transpose(1, 2)
        v = self.to_v(x).view(b, n, h, d // h).transpose(1, 2)
        w = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / (d // h) ** 0.5, dim=-1)
        o = (w @ v.float()).to(x.dtype).transpose(1, 2).reshape(b, n, d)
        return self.to_out(o)


class Block(nn.Module):
    def __init__(self, dim, heads, mult=2):
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = LayerNorm(dim)
        self.ff = nn.Sequential(Linear(dim, dim * mult), GELU(), Linear(dim * mult, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class FluxLike(nn.Module):
    """Two block groups (double/single as Flux), an embedder and an output projection."""

    def __init__(self, dim=64, heads=4, double=3, single=4, dtype=torch.bfloat16, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.x_embedder = Linear(dim, dim)
        self.transformer_blocks = nn.ModuleList(Block(dim, heads) for _ in range(double))
        self.single_transformer_blocks = nn.ModuleList(Block(dim, heads) for _ in range(single))
        self.norm_out = LayerNorm(dim)
        self.proj_out = Linear(dim, dim)
        self.register_buffer("scale", torch.tensor(0.5))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        self.to(dtype)

    def forward(self, x):
        x = self.x_embedder(x)
        for b in self.transformer_blocks:
            x = b(x)
        for b in self.single_transformer_blocks:
            x = b(x)
        return self.proj_out(self.norm_out(x)) * self.scale


class NamedSequential(nn.Module):
    """Blocks in an nn.Sequential built from an OrderedDict: no `prefix.N` names."""

    def __init__(self, dim=32, dtype=torch.float32):
        super().__init__()
        self.body = nn.Sequential(collections.OrderedDict(
            (name, Block(dim, 2)) for name in ("first", "second", "third")))
        self.to(dtype)

    def forward(self, x):
        return self.body(x)


class WithMHA(nn.Module):
    """nn.MultiheadAttention reads out_proj.weight itself and never calls out_proj."""

    def __init__(self, dim=32, dtype=torch.float32):
        super().__init__()
        self.layers = nn.ModuleList(nn.MultiheadAttention(dim, 4, batch_first=True)
                                    for _ in range(2))
        self.head = nn.Linear(dim, dim)
        self.to(dtype)

    def forward(self, x):
        for m in self.layers:
            x = x + m(x, x, x, need_weights=False)[0]
        return self.head(x)


class Tied(nn.Module):
    """An embedding and an output projection sharing one weight."""

    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, 2) for _ in range(2))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(x)
