"""tierd for Hugging Face transformers models.

from_pretrained: one call from a directory saved with save_pretrained to a model whose generate()
works, built without its weights, which are streamed from tierd block by block.

    model = tierd.transformers.from_pretrained("/models/llama-3-8b", tierd.Client())
    model.generate(ids, max_new_tokens=32)

TierdCache: a transformers Cache that keeps each layer's keys and values in tierd
(tierd.kv_cache.LayeredKVStore), fetching the next layer's while this one computes; save() lets
another process, or this one after a restart, continue the same prefix.

    cache = tierd.transformers.TierdCache(session, "doc-42", config=model.config)
    model.generate(ids, past_key_values=cache, max_new_tokens=32)

This is the only module of the package that imports transformers."""

import collections
import contextlib
import math
import os
import re

import torch

from . import conversions
from ._session import Session, retain_as_asked
from .client import Client
from .dtypes import ELEMENT_BYTES, to_torch
from .kv_cache import LayeredKVStore
from .torch import map_weights, stream_weights
from .v1 import tierd_pb2

try:
    import transformers
    from transformers.cache_utils import Cache as _Cache
except ImportError:
    transformers = None
    _Cache = object

_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]")


_PLACEMENTS = ("stream", "mapped", "copy")


def from_pretrained(directory, client, name=None, prefetch_depth=2, resident_blocks=0, dtype=None,
                    experts="stream", expert_prefetch=False, placement="stream", retain=None,
                    host_read_ahead=8):
    """A causal language model from the Hugging Face checkpoint in `directory` (config.json and
    safetensors, sharded or not), its weights streamed from tierd block by block.

    `client`: a tierd.Client or tierd.Session. The model is built from config.json with its
    parameters taking no memory (its buffers, which the checkpoint lacks, are computed and put on
    the session's device) and its generation_config.json loaded when there is one. Its checkpoint
    is read as transformers reads it: the renames and fused parameters of transformers' checkpoint
    conversion mapping for the model (a mixture of experts' per-expert tensors stacked into
    `experts.gate_up_proj` and `experts.down_proj`) are served by the daemon as derived tensors
    (tierd.conversions; docs/CLIENTS.md), and a conversion that is not a move of bytes is refused
    with ValueError. The daemon registers `directory` as model `name` with those conversions
    (default: the directory's name made a valid model name, with "-tensors" added when experts
    are fetched on demand), unless it has that name already from the same directory and
    conversions (otherwise ValueError).

    experts="stream": every block is streamed whole (tierd.torch.stream_weights: `prefetch_depth`
    blocks ahead, `host_read_ahead` more read into the daemon's host tier, `resident_blocks` kept
    on the GPU), experts included. experts="on_demand": a
    mixture of experts' layers fetch only the experts their router chose, one round trip per
    layer, the daemon's GPU pool caching them across tokens (tierd.experts; the model is
    registered with tensor grouping); with `expert_prefetch`, each layer's experts chosen by the
    previous token are fetched while the layer before computes (off by default: measured, the
    guesses cost more than they saved — docs/BENCHMARKS.md). `dtype`: the checkpoint's (the
    bytes are served as stored); another is refused. Returns the model, in eval mode;
    `model.tierd_weights` is the StreamedWeights (and `model.tierd_experts` the OnDemandExperts),
    whose close() ends the streaming (and the session, when one was opened).

    placement="stream": as above. placement="mapped": a model that fits the GPU holds every
    parameter as a view of the daemon's staging, with no hooks (zero-copy; one GPU copy for every
    process of the client group on that GPU) until close(). placement="copy": every parameter is
    copied into this process's own GPU memory and the leases released. `retain`: keep the model
    on the daemon's GPU beyond this process (Session.retain) — True until released, or a number
    of seconds it may stay unused; a process started later maps it without a copy
    (docs/CLIENTS.md, "Retained weights")."""
    _require_transformers()
    if placement not in _PLACEMENTS:
        raise ValueError(f"placement must be one of {_PLACEMENTS}, not {placement!r}")
    if placement != "stream" and experts != "stream":
        raise ValueError('experts="on_demand" streams the experts: use placement="stream"')
    if experts not in ("stream", "on_demand"):
        raise ValueError(f'experts must be "stream" or "on_demand", not {experts!r}')
    directory = os.path.abspath(directory)
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise FileNotFoundError(f"{directory} has no config.json: not a Hugging Face checkpoint")
    daemon = client._client if isinstance(client, Session) else client
    if not isinstance(daemon, Client):
        raise TypeError("client must be a tierd.Client or a tierd.Session")
    on_demand = experts == "on_demand"
    grouping = "tensor" if on_demand else "block"
    name = name or model_name_for(directory) + ("-tensors" if on_demand else "")
    checkpoint = conversions.read_checkpoint_index(directory)
    stored = _stored_dtype(checkpoint)
    if dtype is None:
        dtype = stored
    elif dtype != stored:
        raise ValueError(f"{directory} holds {stored} weights, which tierd serves as stored; "
                         f"dtype={dtype} would need a converted checkpoint")
    config = transformers.AutoConfig.from_pretrained(directory)
    with parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(config, **_dtype_argument(dtype))
    model.eval()
    if os.path.isfile(os.path.join(directory, "generation_config.json")):
        model.generation_config = transformers.GenerationConfig.from_pretrained(directory)
    derived = checkpoint_conversions(model, checkpoint)
    register_checkpoint(daemon, name, directory, derived=derived, grouping=grouping)
    expert_modules = {}
    if on_demand:
        from . import experts as _experts

        expert_modules = _experts.find_expert_modules(model)
        if not expert_modules:
            raise ValueError(f"{type(model).__name__} has no mixture-of-experts layers of a "
                             f"structure tierd knows (fused experts.gate_up_proj and down_proj): "
                             f'load it with experts="stream"')
    excluded = {f"{path}.{parameter}" for path, module in expert_modules.items()
                for parameter in _experts.expert_parameters(module)} if on_demand else set()
    session, owned = (client, False) if isinstance(client, Session) else (daemon.session(), True)
    try:
        retain_as_asked(session, name, retain)
        if placement == "stream":
            model.tierd_weights = stream_weights(model, session, name, granularity="block",
                                                 prefetch_depth=prefetch_depth,
                                                 resident_blocks=resident_blocks,
                                                 exclude=excluded,
                                                 host_read_ahead=host_read_ahead)
        else:
            model.tierd_weights = map_weights(model, session, name, copy=placement == "copy",
                                              exclude=excluded)
        model.tierd_weights._owns_session = owned
    except BaseException:
        if owned:
            session.close()
        raise
    if on_demand:
        try:
            model.tierd_experts = _experts.OnDemandExperts(
                model.tierd_weights.session, name, expert_modules, prefetch=expert_prefetch,
                weights=model.tierd_weights)
        except BaseException:
            model.tierd_weights.close()
            raise
    return model


def checkpoint_conversions(model, checkpoint):
    """The derived tensors (tierd_pb2.DerivedTensor) that make `checkpoint`'s tensors ({name:
    (dtype, shape)}, tierd.conversions.read_checkpoint_index) `model`'s parameters, following the
    installed transformers' conversion mapping for the model; none with a transformers that has
    no conversion mapping (before 5)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:
        return []
    try:  # transformers' own renaming of a checkpoint key, where this version has it
        from transformers.core_model_loading import rename_source_key
    except ImportError:
        rename_source_key = None
    transforms = get_model_conversion_mapping(model)
    return conversions.derived_tensors(checkpoint, transforms or [],
                                       model_keys=model.state_dict().keys(),
                                       base_model_prefix=getattr(model, "base_model_prefix", ""),
                                       rename_source_key=rename_source_key)


def _stored_dtype(checkpoint):
    """The torch dtype most of the checkpoint's floating-point bytes are stored in ({name: (dtype,
    shape)})."""
    return _most_floating_point_bytes(
        (dtype, math.prod(shape) * ELEMENT_BYTES[to_torch(dtype)])
        for dtype, shape in checkpoint.values())


def model_name_for(directory):
    """The model name a checkpoint directory registers under by default: its last component, each
    character tierd does not allow in a name made '-' ("Llama-3.1 8B" -> "Llama-3.1-8B")."""
    base = os.path.basename(os.path.normpath(directory))
    name = _NAME_CHARACTERS.sub("-", base).lstrip(".")[:128]
    if not name:
        raise ValueError(f"no model name can be made from {directory!r}: pass name=")
    return name


def checkpoint_dtype(objects):
    """The dtype most of the model's floating-point bytes are stored in (ObjectInfo list)."""
    return _most_floating_point_bytes(
        (tensor.dtype, tensor.size) for info in objects for tensor in info.tensors)


def _most_floating_point_bytes(tensors):
    """The torch dtype of most bytes among (safetensors dtype, bytes) of floating-point tensors."""
    stored = collections.Counter()
    for name, size in tensors:
        dtype = to_torch(name)
        if dtype.is_floating_point:
            stored[dtype] += size
    if not stored:
        raise ValueError("the checkpoint holds no floating-point tensors")
    return stored.most_common(1)[0][0]


@contextlib.contextmanager
def parameters_on_meta():
    """Within it, modules built register their parameters on the meta device (they take no memory)
    while their buffers stay real, as accelerate.init_empty_weights() does: buffers computed in
    __init__ (rotary frequencies, position ids) are not in checkpoints. Ties made by assigning one
    parameter to another are kept. The parameters are marked initialized (transformers'
    `_is_hf_initialized`): the model's weight initialization, which the checkpoint's bytes replace,
    skips them instead of running on the meta device. It patches
    torch.nn.Module.register_parameter for the whole process while it lasts: build nothing else
    meanwhile on other threads."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, parameter):
        register(module, name, parameter)
        # One already on the meta device is kept as it is: a module that ties a weight by
        # assigning another's parameter (lm_head.weight = embed.weight) keeps the tie.
        if parameter is not None and not parameter.is_meta:
            kind = type(module._parameters[name])
            fields = dict(module._parameters[name].__dict__)
            fields["requires_grad"] = parameter.requires_grad
            module._parameters[name] = kind(module._parameters[name].to("meta"), **fields)
            module._parameters[name]._is_hf_initialized = True

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def register_checkpoint(client, name, directory, derived=(), grouping="block"):
    """Registers `directory` as model `name` with `grouping` and the `derived` tensors, unless the
    daemon has that already; ValueError when it has `name` from another directory, with another
    grouping or with other derived tensors."""
    known = {model.name: model for model in client.list_models()}
    if name not in known:
        client.register_model(name, directory, grouping=grouping, derived=derived)
        return
    if os.path.normpath(known[name].directory) != os.path.normpath(directory):
        raise ValueError(f"the daemon has model {name!r} from {known[name].directory}, not "
                         f"{directory}: pass another name=")
    wanted = _GROUPINGS[grouping]
    if known[name].grouping not in wanted:
        raise ValueError(f"the daemon has model {name!r} registered with "
                         f"{tierd_pb2.Grouping.Name(known[name].grouping)}; this use needs "
                         f"{grouping} grouping: drop it or pass another name=")
    if known[name].derived_tensors != len(derived):
        raise ValueError(f"the daemon has model {name!r} registered with "
                         f"{known[name].derived_tensors} derived tensors, but transformers' "
                         f"conversion mapping makes {len(derived)} of its checkpoint: drop it or "
                         f"pass another name=")


_GROUPINGS = {"block": (tierd_pb2.GROUPING_BLOCK, tierd_pb2.GROUPING_UNSPECIFIED),
              "tensor": (tierd_pb2.GROUPING_TENSOR,)}


def _dtype_argument(dtype):
    # transformers 5 names it dtype; 4.x torch_dtype.
    major = int(transformers.__version__.split(".")[0])
    return {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}


def _require_transformers():
    if transformers is None:
        raise ImportError("tierd.transformers needs the transformers package "
                          "(pip install transformers)")


class TierdCache(_Cache):
    """A transformers Cache (pass it as past_key_values to generate() or the model) keeping each
    attention layer's keys and values in tierd through `session`, as stored objects
    "NAMESPACE/NAME.l<layer>.c<chunk>" of `chunk_tokens` tokens (tierd.kv_cache). While layer i
    computes, layer i+1's chunks are fetched (one round trip); only the layers being computed are
    in this process's GPU memory, the rest where the daemon keeps them (its GPU pool, host memory,
    disk when `durable`).

    The last layer fetches the first layer's chunks for the next step: close() (or leaving a
    `with` block) gives them up once generation is over. Needs transformers 5 (its Cache takes the
    layers; tested with 5.17).

    save() stores what is not stored yet; TierdCache.open(session, NAME) in another process (or
    after a restart, when durable) continues from there: pass generate() the saved prefix's ids
    followed by the new ones, and only the new ones are computed. Greedy and sampled decoding;
    beam search and assisted decoding (which reorder or crop the cache) are refused."""

    def __init__(self, session, name, config=None, chunk_tokens=4096, namespace="kv",
                 durable=False, store=None):
        _require_transformers()
        if store is None:
            if config is None:
                raise ValueError("TierdCache needs the model's config (or a store)")
            layers = config.get_text_config(decoder=True).num_hidden_layers
            store = LayeredKVStore(session, name, layers, chunk_tokens, namespace, durable)
        super().__init__(layers=[])
        self.store = store

    @classmethod
    def open(cls, session, name, namespace="kv", durable=False):
        """The cache save() left under `name` (NOT_FOUND when none was saved)."""
        return cls(session, name, store=LayeredKVStore.open(session, name, namespace, durable))

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.store.prefetch(layer_idx + 1)
        return self.store.update(layer_idx, key_states, value_states)

    def get_seq_length(self, layer_idx=0):
        return self.store.tokens(layer_idx)

    def get_query_offset(self, layer_idx=0):
        return self.store.tokens(layer_idx)

    def get_mask_sizes(self, query_length, layer_idx=0):
        if isinstance(query_length, torch.Tensor):  # transformers before 5.4 passes cache_position
            query_length = query_length.shape[0]
        return self.store.tokens(layer_idx) + query_length, 0

    def get_max_length(self, layer_idx=None):
        return -1

    def get_max_cache_shape(self, layer_idx=0):
        return -1

    @property
    def is_compileable(self):
        return False

    @property
    def is_initialized(self):
        return self.store.tokens(0) > 0

    @property
    def is_sliding(self):
        return [False] * self.store.layers

    def __len__(self):
        return self.store.layers

    def save(self):
        """Stores what is not stored yet and waits for it (LayeredKVStore.save)."""
        self.store.save()

    def reset(self):
        self.store.reset()

    def close(self):
        """Gives up the fetches sent ahead for the next step (LayeredKVStore.close): call it, or
        use the cache as a context manager, once generation is over."""
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _refuse(self, *args, **kwargs):
        raise NotImplementedError("TierdCache serves greedy and sampled decoding: beam search and "
                                  "assisted decoding, which reorder or crop the cache, are not "
                                  "supported")

    crop = reorder_cache = batch_repeat_interleave = batch_select_indices = _refuse


if transformers is None:
    TierdCache.__doc__ += "\n\n(transformers is not installed: constructing one raises ImportError.)"
