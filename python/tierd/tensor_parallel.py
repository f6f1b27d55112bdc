"""Tensor-parallel shards: each rank fetches only its slice of each weight, read by the daemon
straight from the model's unconverted safetensors files.

A shard key names part `index` of `count` of every tensor of an object along dimension `dim`, as
torch.tensor_split gives it: "MODEL/OBJECT@DIM:INDEX/COUNT". Tensors without that dimension come
whole. A fused tensor (q, k and v stacked along dimension 0; gate and up) is split segment by
segment: "MODEL/OBJECT@DIM:INDEX/COUNT:S1,S2,..." holds the rank's slice of each segment, in order.
Fetch it like any key: only the disk blocks holding it are read, it is cached as an object of its
own, and two ranks (or two daemons of a node) asking for the same shard share it.

    key = tierd.tensor_parallel.shard_key("llama/model.layers.0.mlp.up_proj.weight", 0, rank, 2)

load_shards fills a module built for one rank (its parallel layers already of the rank's size, or
on the meta device) from a model registered per tensor, following a plan of which parameters split
along which dimension:

    plan = {"*.q_proj": "colwise", "*.k_proj": "colwise", "*.v_proj": "colwise",
            "*.o_proj": "rowwise", "*.gate_proj": "colwise", "*.up_proj": "colwise",
            "*.down_proj": "rowwise"}
    tierd.tensor_parallel.load_shards(layer, client, "llama", plan, rank, world_size,
                                      prefix="model.layers.0.")

A fused parameter's plan entry names its segments: {"*.qkv_proj": ("colwise", (q, k, v)),
"*.gate_up_proj": ("colwise", (intermediate, intermediate))}, sizes along the split dimension.
"""

import fnmatch

import torch

from ._session import Session
from .client import Client

# What a plan's values mean: the dimension a parameter splits along. A rowwise layer's 1-D bias
# has no dimension 1 and so comes whole, as row parallelism needs.
_STYLES = {"colwise": 0, "rowwise": 1, "replicate": None}


def shard_key(key, dim, index, count, segments=None):
    """The key of part `index` of `count` of each tensor of object `key` along dimension `dim`;
    with `segments` (the sizes along `dim` of the segments a fused tensor stacks, two or more),
    of each segment, the rank's slices together."""
    for what, value in (("dim", dim), ("index", index), ("count", count)):
        if not _is_count(value):
            raise ValueError(f"{what} must be a non-negative int, not {value!r}")
    if index >= count:
        raise ValueError(f"index {index} must be below count {count}")
    if segments is None:
        return f"{key}@{dim}:{index}/{count}"
    segments = list(segments)
    if len(segments) < 2 or not all(_is_count(size) for size in segments):
        raise ValueError(f"segments must be two or more non-negative ints, not {segments!r}")
    return f"{key}@{dim}:{index}/{count}:{','.join(str(size) for size in segments)}"


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def split_dim(plan, name):
    """The dimension `plan` splits parameter `name` along, or None when it comes whole (split_spec's
    first half)."""
    return split_spec(plan, name)[0]


def split_spec(plan, name):
    """(dimension, segments) of parameter `name` under `plan`: the dimension it splits along (None:
    whole) and, for a fused parameter, its segments' sizes along it (else None).

    `plan` maps fnmatch patterns to a dimension (an int), "colwise" (0), "rowwise" (1),
    "replicate"/None (whole), or a pair of one of those and a fused parameter's segment sizes. A
    pattern matches the parameter's name ("layers.0.q_proj.weight") or its module's
    ("layers.0.q_proj"); the first pattern in the plan's order that matches wins. Parameters that
    no pattern matches come whole."""
    module = name.rsplit(".", 1)[0] if "." in name else ""
    for pattern, entry in plan.items():
        if fnmatch.fnmatchcase(name, pattern) or (module and fnmatch.fnmatchcase(module, pattern)):
            style, segments = entry if isinstance(entry, (tuple, list)) else (entry, None)
            if segments is not None:
                segments = list(segments)
                if len(segments) < 2 or not all(_is_count(size) for size in segments):
                    raise ValueError(f"plan entry {pattern!r}: segments must be two or more "
                                     f"non-negative ints, not {segments!r}")
            if style is None or isinstance(style, int) and not isinstance(style, bool):
                return style, segments if style is not None else None
            if style not in _STYLES:
                raise ValueError(f"plan entry {pattern!r}: {style!r} is not an int, None, "
                                 f"or one of {sorted(_STYLES)}")
            dim = _STYLES[style]
            return dim, segments if dim is not None else None
    return None, None


def load_shards(module, client, model, plan, rank, world_size, prefix="", prefetch_depth=4):
    """Loads rank `rank` of `world_size`'s shard of each of `module`'s parameters from model
    `model`, registered with per-tensor grouping (its objects named by the tensors), and returns
    the keys fetched, by parameter name (a tied parameter's first).

    A parameter `name` is tensor `prefix + name`: fetched as shard_key(..., dim, rank, world_size)
    where `plan` splits it (split_spec; with its segments for a fused parameter: the rank's slice
    of each, together, as its module expects), world_size > 1 and the parameter has dimension `dim`;
    whole otherwise (a rowwise layer's 1-D bias, as row parallelism needs). A parameter on the meta
    device is replaced by one of the shard's shape, on the session's device, in the parameter's
    dtype; any other must already have the shard's shape (ValueError otherwise) and gets its bytes
    copied in (converted to its dtype). A parameter tied under several names (an embedding and
    the output layer) is fetched once, by its first name, and replaced under every name.
    `client`: a tierd.Client (a session is opened and closed) or a tierd.Session. Keys are
    prefetched `prefetch_depth` ahead, so the daemon reads the next shards while this one is
    copied. Errors: TierdError for the daemon's refusals (a tensor the model lacks: NOT_FOUND; a
    shard that does not fit the tensor: INVALID_ARGUMENT), KeyError for a model registered with
    objects of several tensors."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if isinstance(client, Session):
        return _load(module, client, model, plan, rank, world_size, prefix, prefetch_depth)
    if not isinstance(client, Client):
        raise TypeError("client must be a tierd.Client or a tierd.Session")
    with client.session() as session:
        return _load(module, session, model, plan, rank, world_size, prefix, prefetch_depth)


def _load(module, session, model, plan, rank, world_size, prefix, prefetch_depth):
    # Each parameter once, under its first name, with every name it is tied under.
    names = {}
    parameters = {}
    for path, owner in module.named_modules(remove_duplicate=False):
        for attribute, parameter in owner.named_parameters(recurse=False):
            name = f"{path}.{attribute}" if path else attribute
            names.setdefault(id(parameter), []).append(name)
            parameters.setdefault(id(parameter), parameter)
    keys = {}
    for identity, aliases in names.items():
        key = f"{model}/{prefix}{aliases[0]}"
        dim, segments = split_spec(plan, aliases[0])
        # A parameter without that dimension comes whole: a rowwise layer's 1-D bias.
        split = dim is not None and world_size > 1 and dim < parameters[identity].dim()
        keys[aliases[0]] = shard_key(key, dim, rank, world_size, segments) if split else key
    order = list(keys.values())
    if order:
        session.prefetch(order[:prefetch_depth])
    for position, (identity, aliases) in enumerate(names.items()):
        ahead = position + prefetch_depth
        if ahead < len(order):
            session.prefetch([order[ahead]])
        key = keys[aliases[0]]
        with session.fetch(key) as lease:
            tensor = lease.tensors.get(prefix + aliases[0])
            if tensor is None:
                raise KeyError(f"{key} holds {sorted(lease.tensors)}, not {prefix + aliases[0]}: "
                               f"register {model} with per-tensor grouping")
            _assign(module, aliases, parameters[identity], tensor, key, session.device)
    return keys


def _assign(module, aliases, parameter, tensor, key, device):
    if parameter.is_meta:
        loaded = torch.empty(tensor.shape, dtype=parameter.dtype, device=device)
        loaded.copy_(tensor)
        replacement = torch.nn.Parameter(loaded, requires_grad=parameter.requires_grad)
        for name in aliases:
            owner_path, _, attribute = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            setattr(owner, attribute, replacement)
        return
    name = aliases[0]
    if tuple(parameter.shape) != tuple(tensor.shape):
        raise ValueError(f"parameter {name} has shape {tuple(parameter.shape)} but {key} is "
                         f"{tuple(tensor.shape)}: is the module built for this rank and plan?")
    with torch.no_grad():
        parameter.copy_(tensor)
