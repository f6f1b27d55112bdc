"""A DiT-like diffusion transformer in the shape of Wan's (self-attention, cross-attention over text
context, a GELU feed-forward network, adaLN modulation per block), the text encoder and the latent
decoder of such a pipeline, and a plain safetensors writer. Used by the streaming example, the
Python tests and the streaming and restart benchmarks. With dim 5120, FFN 13824 and bf16, one block
is 670 MiB, as in Wan 14B; a text encoder of 24 layers of 4096 (FFN 10240) is UMT5-XXL's depth and
width, and a decoder of 4 stages of 384 channels about the size of Wan's VAE.
"""

import json
import math
import struct

import torch
from torch import nn
from torch.nn import functional as F


def _attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v)
    weights = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def forward(self, x, context=None):
        context = x if context is None else context
        batch, tokens, dim = x.shape

        def heads(t):
            return t.view(batch, -1, self.heads, dim // self.heads).transpose(1, 2)

        out = _attention(heads(self.q(x)), heads(self.k(context)), heads(self.v(context)))
        return self.o(out.transpose(1, 2).reshape(batch, tokens, dim))


class FeedForward(nn.Module):
    def __init__(self, dim, ffn_dim):
        super().__init__()
        self.up = nn.Linear(dim, ffn_dim)
        self.down = nn.Linear(ffn_dim, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class DiTBlock(nn.Module):
    def __init__(self, dim, ffn_dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.self_attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.cross_attn = Attention(dim, heads)
        self.norm3 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ffn = FeedForward(dim, ffn_dim)
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)

    def forward(self, x, context, time):
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + time).chunk(6, dim=1)
        x = x + self.self_attn(self.norm1(x) * (1 + scale1) + shift1) * gate1
        x = x + self.cross_attn(self.norm2(x), context)
        return x + self.ffn(self.norm3(x) * (1 + scale2) + shift2) * gate2


class DiT(nn.Module):
    """Patch tokens in, patch tokens out; `time` is a per-sample timestep in [0, 1]."""

    def __init__(self, blocks=4, dim=64, ffn_dim=128, heads=4, in_dim=16, context_dim=32):
        super().__init__()
        self.dim = dim
        self.patch_embedding = nn.Linear(in_dim, dim)
        self.text_embedding = nn.Linear(context_dim, dim)
        self.time_embedding = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(DiTBlock(dim, ffn_dim, heads) for _ in range(blocks))
        self.head_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.head = nn.Linear(dim, in_dim)

    def forward(self, patches, context, time):
        x, context, time = self.embed(patches, context, time)
        x = self.run_blocks(x, context, time, 0, len(self.blocks))
        return self.unembed(x)

    # The forward pass in pieces, for running its blocks in stages (two_stage_pipeline.py).

    def embed(self, patches, context, time):
        """Token, context and time embeddings: what every block takes."""
        x = self.patch_embedding(patches)
        context = self.text_embedding(context)
        half = self.dim // 2
        frequencies = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device) / half)
        angles = time[:, None].float() * 1000.0 * frequencies[None]
        sinusoid = torch.cat([angles.cos(), angles.sin()], dim=-1).to(x.dtype)
        return x, context, self.time_embedding(sinusoid).view(-1, 6, self.dim)

    def run_blocks(self, x, context, time, start, stop):
        for block in self.blocks[start:stop]:
            x = block(x, context, time)
        return x

    def unembed(self, x):
        return self.head(self.head_norm(x))


class EncoderLayer(nn.Module):
    def __init__(self, dim, ffn_dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.ffn = FeedForward(dim, ffn_dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class TextEncoder(nn.Module):
    """Token ids in, context vectors (`context_dim` wide) out: a stack of encoder layers."""

    def __init__(self, layers=2, dim=64, ffn_dim=128, heads=4, vocab=1000, context_dim=32):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, ffn_dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.project = nn.Linear(dim, context_dim)

    def forward(self, ids):
        x = self.embedding(ids)
        for layer in self.layers:
            x = layer(x)
        return self.project(self.norm(x))


class LatentDecoder(nn.Module):
    """Latent frames (batch, in_dim, frames, height, width) to pixels: 3-D convolutions, each
    stage doubling height and width."""

    def __init__(self, stages=2, channels=32, in_dim=16):
        super().__init__()
        self.stem = nn.Conv3d(in_dim, channels, 3, padding=1)
        self.stages = nn.ModuleList(
            nn.ModuleList([nn.Conv3d(channels, channels, 3, padding=1),
                           nn.Conv3d(channels, channels, 3, padding=1)])
            for _ in range(stages))
        self.out = nn.Conv3d(channels, 3, 3, padding=1)

    def forward(self, latents):
        x = self.stem(latents)
        for first, second in self.stages:
            x = x + second(F.silu(first(F.silu(x))))
            x = F.interpolate(x, scale_factor=(1, 2, 2), mode="nearest")
        return self.out(F.silu(x))


def save_safetensors(tensors, path):
    """Writes {name: tensor} as a .safetensors file (8-byte aligned header, tensors back to back
    in name order)."""
    from tierd.dtypes import to_safetensors

    header = {}
    payloads = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        data = tensor.reshape(-1).view(torch.uint8).numpy()  # no copy: written as it is
        header[name] = {"dtype": to_safetensors(tensor.dtype), "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        payloads.append(data)
        offset += data.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for data in payloads:
            out.write(data)
