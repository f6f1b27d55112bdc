"""A mixture of experts' experts fetched on demand: only those the router chose, one round trip per
layer, with the daemon's GPU pool as the expert cache.

transformers 5 builds a mixture-of-experts layer as a router and an experts module whose
parameters hold every expert along their first dimension (`gate_up_proj` [E, 2I, H], `down_proj`
[E, H, I], biases where the model has them); the experts module is called as
`experts(hidden_states, top_k_index, top_k_weights)` once the router has chosen. At batch 1 a token
uses k of E experts, so streaming the whole layer moves E/k times the bytes the token needs.

OnDemandExperts hooks every experts module: before it runs, the experts its routing names are
fetched — each expert of each fused parameter is a shard of the parameter's object along its
first dimension, "MODEL/PARAMETER@0:EXPERT/E" (the model registered with tensor grouping and
transformers' conversions: tierd.transformers.from_pretrained(..., experts="on_demand")) — in one
FetchMany, and copied on the GPU into one layer-sized buffer per parameter shape, which the module's
parameters view. The module's own forward then runs unchanged (its results are transformers'),
reading only the rows of the experts it chose. The leases are released once copied: the daemon
keeps the experts in its GPU pool, least recently used evicted first, so a hot expert is a hit
that moves nothing over PCIe. With `prefetch`, while one layer runs, the next one's experts the
previous token chose there are already being fetched; measured on the H200 it cost more than it
saved (the pool already held most experts, and the wrong guesses are copies too), so it is off by
default.

The buffers hold one layer's experts: the model's layers run one after another on one stream."""

import torch

from .torch import _set_tensor


def expert_parameters(module):
    """Names of `module`'s parameters that hold one slice per expert: those whose first dimension
    is its number of experts (gate_up_proj, down_proj and their biases)."""
    experts = getattr(module, "num_experts", None)
    if experts is None:
        fused = module._parameters.get("gate_up_proj")
        experts = fused.shape[0] if fused is not None else None
    if not experts:
        return []
    return [name for name, parameter in module._parameters.items()
            if parameter is not None and parameter.dim() >= 1 and parameter.shape[0] == experts]


def find_expert_modules(model):
    """{path: module} of the model's experts modules: those holding fused per-expert parameters
    (gate_up_proj and down_proj of three dimensions), in the model's order."""
    found = {}
    for path, module in model.named_modules():
        parameters = module._parameters
        gate_up, down = parameters.get("gate_up_proj"), parameters.get("down_proj")
        if gate_up is not None and down is not None and gate_up.dim() == 3 and down.dim() == 3:
            found[path] = module
    return found


class _Layer:
    def __init__(self, index, path, module, parameters):
        self.index = index
        self.path = path
        self.module = module
        self.parameters = parameters  # [(attribute, experts, scratch tensor)]
        self.experts = parameters[0][1]
        self.last_chosen = []  # what the previous call chose: what the next one prefetches
        self.pending = None  # {expert: [PendingFetch per parameter]} sent ahead


class OnDemandExperts:
    """Hooks on `modules` ({path: experts module}, find_expert_modules) that fetch through `session`
    only the experts each call routes to, from model `model` registered with tensor grouping.
    Counters (for reports and tests): `fetched` experts fetched, `resident` of them found whole in
    the daemon's GPU pool (every parameter's slice), `prefetched` fetches sent ahead that were used
    and `wasted` ones that were not. close() removes the hooks (and is called by the
    StreamedWeights' close(), given as `weights`)."""

    def __init__(self, session, model, modules, prefetch=False, weights=None):
        self.session = session
        self.model = model
        self.prefetch = prefetch
        self.fetched = 0
        self.resident = 0
        self.prefetched = 0
        self.wasted = 0
        self._hooks = []
        self._scratch = {}
        self._layers = []
        device = session.device
        for index, (path, module) in enumerate(modules.items()):
            parameters = []
            for attribute in expert_parameters(module):
                current = getattr(module, attribute)
                shape, dtype = tuple(current.shape), current.dtype
                scratch = self._scratch.get((attribute, shape, dtype))
                if scratch is None:
                    # Zeros, not garbage: a kernel that reads every expert's rows multiplies the
                    # unchosen ones by nothing, and zeros stay finite.
                    scratch = torch.zeros(shape, dtype=dtype, device=device)
                    self._scratch[(attribute, shape, dtype)] = scratch
                current.requires_grad_(False)
                _set_tensor(module, attribute, scratch)
                parameters.append((attribute, shape[0], getattr(module, attribute)))
            if not parameters:
                raise ValueError(f"{path} has no per-expert parameters")
            self._layers.append(_Layer(index, path, module, parameters))
        for layer in self._layers:
            self._hooks.append(_pre_hook(layer.module,
                                         lambda args, kwargs, layer=layer: self._before(
                                             layer, args, kwargs)))
        if weights is not None:
            weights._on_close.append(self.close)

    @property
    def layers(self):
        return [layer.path for layer in self._layers]

    def keys(self, layer, expert):
        """The keys of expert `expert` of `layer` (an index into layers): one per parameter."""
        layer = self._layers[layer]
        return [self._key(layer, attribute, expert) for attribute, _, _ in layer.parameters]

    def close(self):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for layer in self._layers:
            self._cancel(layer)

    # ---- hooks ------------------------------------------------------------------------------

    def _key(self, layer, attribute, expert):
        return f"{self.model}/{layer.path}.{attribute}@0:{expert}/{layer.experts}"

    def _before(self, layer, args, kwargs):
        routing = _routing_indices(args, kwargs)
        if routing is None:
            raise RuntimeError(f"{layer.path} was called without its routing (top_k_index): "
                               f"tierd cannot tell which experts to fetch")
        chosen = [e for e in torch.unique(routing).tolist() if 0 <= e < layer.experts]
        pending = layer.pending or {}
        layer.pending = None
        fetches = {}
        leases = []
        stream = None  # the current stream: the copies and the module's forward run on it
        try:
            missing = []
            for expert in chosen:
                if expert in pending:
                    fetches[expert] = pending.pop(expert)
                    self.prefetched += 1
                else:
                    missing.append(expert)
            for sent in pending.values():  # sent ahead for experts not chosen this time
                self.wasted += 1
                for fetch in sent:
                    fetch.cancel()
            pending = {}
            keys = [self._key(layer, attribute, expert)
                    for expert in missing for attribute, _, _ in layer.parameters]
            sent_now = self.session.fetch_many_async(keys) if keys else []
            per_expert = len(layer.parameters)
            for position, expert in enumerate(missing):
                fetches[expert] = sent_now[position * per_expert:(position + 1) * per_expert]
            if self.prefetch and len(self._layers) > 0:
                self._send_ahead(self._layers[(layer.index + 1) % len(self._layers)])
            layer.last_chosen = chosen
            for expert in chosen:
                resident = True
                for (attribute, _, scratch), fetch in zip(layer.parameters, fetches[expert]):
                    lease = fetch.result(stream)
                    leases.append(lease)
                    resident = resident and lease.resident
                    (view,) = lease.tensors.values()
                    scratch[expert].copy_(view[0], non_blocking=True)
                self.fetched += 1
                self.resident += resident
        finally:
            # Released after the copies (their done events follow them on the stream); the daemon
            # keeps the experts cached. Fetches not taken (an error above) are given up, and so
            # are guesses an error left unexamined.
            self.session.release_many(leases, stream)
            for sent in list(fetches.values()) + list(pending.values()):
                for fetch in sent:
                    fetch.cancel()  # a no-op for one already taken

    def _send_ahead(self, layer):
        if layer.pending is not None or not layer.last_chosen:
            return
        keys = [self._key(layer, attribute, expert)
                for expert in layer.last_chosen for attribute, _, _ in layer.parameters]
        sent = self.session.fetch_many_async(keys)
        per_expert = len(layer.parameters)
        layer.pending = {expert: sent[i * per_expert:(i + 1) * per_expert]
                         for i, expert in enumerate(layer.last_chosen)}

    def _cancel(self, layer):
        if layer.pending is not None:
            for sent in layer.pending.values():
                for fetch in sent:
                    fetch.cancel()
            layer.pending = None


def _pre_hook(module, hook):
    """A forward pre-hook seeing the call's positional and keyword arguments (torch before 2.0
    shows hooks the positional ones only)."""
    try:
        return module.register_forward_pre_hook(
            lambda _module, args, kwargs: hook(args, kwargs), with_kwargs=True)
    except TypeError:
        return module.register_forward_pre_hook(lambda _module, args: hook(args, {}))


def _routing_indices(args, kwargs):
    """The experts module's routing: its top_k_index argument (by name, else the first integer
    tensor it was given)."""
    for name in ("top_k_index", "router_indices", "selected_experts"):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return value
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and \
                value.dtype != torch.bool:
            return value
    return None
