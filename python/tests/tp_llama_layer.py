"""A Llama decoder layer in plain torch (RMSNorm, causal multi-head attention, SwiGLU MLP), with
Hugging Face's parameter names, that runs whole or as one rank of a tensor-parallel group: its
q/k/v and gate/up projections column-parallel, o and down row-parallel, its norms replicated.
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


def reference_layer(seed=0):
    """The whole layer with random weights (norms included)."""
    torch.manual_seed(seed)
    layer = LlamaLayer()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    return layer


def example_input(seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 5, HIDDEN, generator=generator)


def run_rank(socket, rank, ranks, rendezvous, out):
    """One rank of a `ranks`-way group, in a process of its own: loads its shards of the layer
    saved as model "llama" from the daemon at `socket`, runs the forward on the daemon's device,
    the partial results all-reduced over gloo (file rendezvous), and has rank 0 save the output to
    `out`. Prints a JSON line: its rank and device, and each parameter's key and shape."""
    import torch.distributed as dist

    import tierd
    from tierd import tensor_parallel

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=ranks)
    layer = LlamaLayer(world_size=ranks, device="meta")
    with tierd.Client(socket) as client, client.session() as session:
        keys = tensor_parallel.load_shards(layer, session, "llama", PLAN, rank, ranks,
                                           prefix=PREFIX)
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


# What a rank's process runs: python -c RANK_SOURCE SOCKET RANK RANKS RENDEZVOUS OUT, with this
# directory and the client on PYTHONPATH.
RANK_SOURCE = ("import sys; from tp_llama_layer import run_rank; "
               "run_rank(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])")
