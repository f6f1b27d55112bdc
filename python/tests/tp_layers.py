"""Decoder layers in plain torch, with Hugging Face's parameter names, that run whole or as one rank
of a tensor-parallel group:
- a Llama layer (RMSNorm, causal multi-head attention, SwiGLU MLP): its q/k/v and gate/up
  projections column-parallel, o and down row-parallel, its norms replicated;
- a Phi-3-style layer: q, k and v fused in one `qkv_proj` (grouped-query: fewer k and v heads),
  gate and up fused in one `gate_up_proj`, both column-parallel segment by segment and with
  biases; o and down row-parallel with biases added once, after the all-reduce.
Rotary embeddings are left out: they act on each head alone and do not touch the sharding."""

import json

import torch
from torch import nn

HIDDEN = 64
HEADS = 8
INTERMEDIATE = 96
PREFIX = "model.layers.0."

# The layer's tensor-parallel plan, as tierd.tensor_parallel.load_shards takes it.
PLAN = {"*.q_proj": "colwise", "*.k_proj": "colwise", "*.v_proj": "colwise",
        "*.o_proj": "rowwise", "*.gate_proj": "colwise", "*.up_proj": "colwise",
        "*.down_proj": "rowwise"}


class RMSNorm(nn.Module):
    def __init__(self, size, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, world_size, device):
        super().__init__()
        self.heads = HEADS // world_size
        self.head_dim = HIDDEN // HEADS
        local = self.heads * self.head_dim
        self.q_proj = nn.Linear(HIDDEN, local, bias=False, device=device)
        self.k_proj = nn.Linear(HIDDEN, local, bias=False, device=device)
        self.v_proj = nn.Linear(HIDDEN, local, bias=False, device=device)
        self.o_proj = nn.Linear(local, HIDDEN, bias=False, device=device)

    def forward(self, x):
        batch, tokens, _ = x.shape

        def heads(t):
            return t.view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        scores = q @ k.transpose(-1, -2) / self.head_dim ** 0.5
        mask = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).triu(1)
        attended = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(attended.transpose(1, 2).reshape(batch, tokens, -1))


class MLP(nn.Module):
    def __init__(self, world_size, device):
        super().__init__()
        local = INTERMEDIATE // world_size
        self.gate_proj = nn.Linear(HIDDEN, local, bias=False, device=device)
        self.up_proj = nn.Linear(HIDDEN, local, bias=False, device=device)
        self.down_proj = nn.Linear(local, HIDDEN, bias=False, device=device)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    """One rank of `world_size` (1: the whole layer)."""

    def __init__(self, world_size=1, device=None):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN, device)
        self.self_attn = Attention(world_size, device)
        self.post_attention_layernorm = RMSNorm(HIDDEN, device)
        self.mlp = MLP(world_size, device)

    def forward(self, x, all_reduce=lambda partial: partial):
        """`all_reduce` sums a row-parallel layer's partial output over the ranks."""
        h = x + all_reduce(self.self_attn(self.input_layernorm(x)))
        return h + all_reduce(self.mlp(self.post_attention_layernorm(h)))


KV_HEADS = 4
HEAD_DIM = HIDDEN // HEADS
Q_SIZE, KV_SIZE = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM

# The Phi-3-style layer's plan: its fused parameters split segment by segment.
PHI3_PLAN = {"*.qkv_proj": ("colwise", (Q_SIZE, KV_SIZE, KV_SIZE)), "*.o_proj": "rowwise",
             "*.gate_up_proj": ("colwise", (INTERMEDIATE, INTERMEDIATE)), "*.down_proj": "rowwise"}


class RowParallelLinear(nn.Module):
    """nn.Linear's parameters, its input features split over the ranks: the partial products are
    all-reduced, then the bias (whole on every rank) is added once."""

    def __init__(self, in_features, out_features, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, device=device))

    def forward(self, x, all_reduce):
        return all_reduce(nn.functional.linear(x, self.weight)) + self.bias


class FusedAttention(nn.Module):
    def __init__(self, world_size, device):
        super().__init__()
        self.heads, self.kv_heads = HEADS // world_size, KV_HEADS // world_size
        self.qkv_proj = nn.Linear(HIDDEN, (Q_SIZE + 2 * KV_SIZE) // world_size, device=device)
        self.o_proj = RowParallelLinear(Q_SIZE // world_size, HIDDEN, device=device)

    def forward(self, x, all_reduce):
        batch, tokens, _ = x.shape
        q, k, v = self.qkv_proj(x).split(
            [self.heads * HEAD_DIM, self.kv_heads * HEAD_DIM, self.kv_heads * HEAD_DIM], dim=-1)

        def heads(t, count):
            return t.view(batch, tokens, count, HEAD_DIM).transpose(1, 2)

        group = self.heads // self.kv_heads
        q = heads(q, self.heads)
        k = heads(k, self.kv_heads).repeat_interleave(group, dim=1)
        v = heads(v, self.kv_heads).repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / HEAD_DIM ** 0.5
        mask = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).triu(1)
        attended = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(attended.transpose(1, 2).reshape(batch, tokens, -1), all_reduce)


class FusedMLP(nn.Module):
    def __init__(self, world_size, device):
        super().__init__()
        local = INTERMEDIATE // world_size
        self.gate_up_proj = nn.Linear(HIDDEN, 2 * local, device=device)
        self.down_proj = RowParallelLinear(local, HIDDEN, device=device)

    def forward(self, x, all_reduce):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up, all_reduce)


class Phi3Layer(nn.Module):
    """One rank of `world_size` (1: the whole layer)."""

    def __init__(self, world_size=1, device=None):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN, device)
        self.self_attn = FusedAttention(world_size, device)
        self.post_attention_layernorm = RMSNorm(HIDDEN, device)
        self.mlp = FusedMLP(world_size, device)

    def forward(self, x, all_reduce=lambda partial: partial):
        h = x + self.self_attn(self.input_layernorm(x), all_reduce)
        return h + self.mlp(self.post_attention_layernorm(h), all_reduce)


# The layers by name: (class, plan).
LAYERS = {"llama": (lambda **kw: LlamaLayer(**kw), PLAN),
          "phi3": (lambda **kw: Phi3Layer(**kw), PHI3_PLAN)}


def reference_layer(seed=0, kind="llama"):
    """The whole layer of `kind` with random weights (norms and biases included)."""
    torch.manual_seed(seed)
    layer = LAYERS[kind][0]()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    return layer


def example_input(seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 5, HIDDEN, generator=generator)


def run_rank(socket, rank, ranks, rendezvous, out, kind="llama"):
    """One rank of a `ranks`-way group, in a process of its own: loads its shards of the `kind`
    layer saved as model `kind` from the daemon at `socket`, runs the forward on the daemon's device,
    the partial results all-reduced over gloo (file rendezvous), and has rank 0 save the output to
    `out`. Prints a JSON line: its rank and device, and each parameter's key and shape."""
    import torch.distributed as dist

    import tierd
    from tierd import tensor_parallel

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=ranks)
    build, plan = LAYERS[kind]
    layer = build(world_size=ranks, device="meta")
    with tierd.Client(socket) as client, client.session() as session:
        keys = tensor_parallel.load_shards(layer, session, kind, plan, rank, ranks, prefix=PREFIX)
        device = session.device
    x = example_input().to(device)  # the loaded parameters outlive the session

    def all_reduce(partial):
        summed = partial.cpu()
        dist.all_reduce(summed)
        return summed.to(partial.device)

    with torch.no_grad():
        y = layer(x, all_reduce)
    if rank == 0:
        torch.save(y.cpu(), out)
    parameters = {name: [keys[name], list(parameter.shape)]
                  for name, parameter in layer.named_parameters()}
    print(json.dumps({"rank": rank, "device": str(device), "parameters": parameters}))
    dist.destroy_process_group()


# What a rank's process runs: python -c RANK_SOURCE SOCKET RANK RANKS RENDEZVOUS OUT [KIND], with
# this directory and the client on PYTHONPATH.
RANK_SOURCE = ("import sys; from tp_layers import run_rank; "
               "run_rank(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], "
               "*sys.argv[6:])")
