"""Streaming a model's weights from tierd through forward hooks, without changing the model's code
(the seeds' layerwise offload): stream_weights(module, client, model).

The model's repeated blocks (the children of its nn.ModuleLists: "blocks.3", "layers.7") are the
units streamed: a forward pre-hook on block i fetches it (the current stream waits on the copy's
ready event; the CPU does not wait), points the block's parameters at the leased staging buffer
and sends fetches for blocks i+1 … i+prefetch_depth, so their copies run while block i computes,
and asks the daemon to read the `host_read_ahead` blocks after those into its host tier (a model's
first pass then keeps the daemon's readers busy, not just its link); a forward hook records the
done event on the current stream and releases the lease. Fetches wrap around from the last block
to the first, so a model called repeatedly (a denoising loop, decode steps) keeps the copy engine
busy across calls. Objects outside the blocks (embeddings, final norms, heads) and the first
`resident_blocks` blocks are fetched once and stay on the GPU (the seeds' offload_ratio).

For inference: the weights are views of memory the daemon reuses once released, so nothing may
keep them past the block's forward (autograd would).
"""

import collections

import torch

from .client import Client, Session
from .dtypes import to_torch
from .errors import StatusCode, TierdError

_GROUPING_NAMES = {1: "tensor", 2: "block", 3: "phase"}


def stream_weights(module, client, model, granularity="block", prefetch_depth=2,
                   resident_blocks=0, exclude=(), host_read_ahead=8):
    """Streams `module`'s weights from tierd model `model` (registered from the safetensors the
    module's state dict was saved to). `client` is a tierd.Client (a session is opened and owned)
    or a tierd.Session. granularity: "block" streams whole blocks; "phase" streams each phase
    object (the model must be registered with grouping "phase"). The module may be built with its
    parameters on the meta device (they then take no memory of their own). Tensors the model lacks:
    those tied to one it holds get its bytes; those with values (buffers computed when the module
    was built) are moved to the session's device; those on the meta device are refused by name
    (build the module with accelerate.init_empty_weights(), which keeps buffers real).
    `exclude`: names of parameters the caller gives values to (tierd.experts fetches a mixture's
    experts itself): not streamed, and the model's objects holding only those are left out. With
    grouping "tensor", a block's tensor objects are fetched together, in one round trip.
    `host_read_ahead`: the blocks after the prefetch window asked into the daemon's host tier only
    (Session.prefetch with host_only), each once a pass — where the host tier holds them already,
    a request that finds them there; 0: none. Returns a StreamedWeights; close() undoes it."""
    if granularity not in ("block", "phase"):
        raise ValueError(f'granularity must be "block" or "phase", not {granularity!r}')
    if prefetch_depth < 0 or resident_blocks < 0 or host_read_ahead < 0:
        raise ValueError("prefetch_depth, resident_blocks and host_read_ahead must not be "
                         "negative")
    if isinstance(client, Session):
        session, owned = client, False
    elif isinstance(client, Client):
        session, owned = client.session(), True
    else:
        raise TypeError("client must be a tierd.Client or a tierd.Session")
    try:
        return StreamedWeights(module, session, owned, model, granularity, prefetch_depth,
                               resident_blocks, frozenset(exclude), host_read_ahead)
    except BaseException:
        if owned:
            session.close()
        raise


def map_weights(module, client, model, copy=False, exclude=()):
    """Gives every weight of `module` its bytes from tierd model `model` at once, with no hooks:
    each parameter a view of the daemon's staging (mapped: zero-copy, one GPU copy for every
    process of the client group on that GPU, held until close()), or with `copy` a copy in this
    process's own GPU memory (the leases released at once; close() then only ends the session it
    opened). Retain the model first (Session.retain) to keep its GPU copy between processes.
    `client` and `exclude` as stream_weights'. Returns a StreamedWeights."""
    weights = stream_weights(module, client, model, prefetch_depth=0,
                             resident_blocks=_ALL_BLOCKS, exclude=exclude, host_read_ahead=0)
    if copy:
        try:
            weights._copy_out()
        except BaseException:
            weights.close()
            raise
    return weights


_ALL_BLOCKS = 1 << 62
# Fetches of resident units sent ahead of the one being taken (a daemon answers 1024 requests in
# flight a session by default).
_RESIDENT_REQUESTS_AHEAD = 256


class _Unit:
    """What one hook pair streams: objects whose tensors are parameters of one submodule."""

    def __init__(self, path, submodule):
        self.path = path
        self.submodule = submodule
        self.keys = []
        self.parameters = []  # (tensor name, Parameter or buffer owner, attribute)
        self.resident = False
        self.leases = None  # list of Lease while the unit's weights are in place
        self.pending = None  # list of PendingFetch sent ahead


class StreamedWeights:
    """The hooks stream_weights() installed, and the leases they hold."""

    def __init__(self, module, session, owns_session, model, granularity, prefetch_depth,
                 resident_blocks, exclude=frozenset(), host_read_ahead=0):
        self.session = session
        self.model = model
        self.prefetch_depth = prefetch_depth
        self.host_read_ahead = host_read_ahead
        self._read_ahead = set()  # ids of the units asked into the host tier, until taken
        self._owns_session = owns_session
        self._device = session.device
        self._placeholders = {}
        self._hooks = []
        self.fetches = 0  # leases taken by hooks, for tests and reports
        self._on_close = []  # what else ends with the streaming (tierd.experts' hooks)
        grouping = _model_grouping(session._client, model)
        if granularity == "phase" and grouping != "phase":
            raise ValueError(f'model {model} is registered with grouping "{grouping}"; '
                             f'register it with grouping "phase" to stream by phase')
        _tie_weights(module)
        self.units, uncovered = _plan_units(module, session._client.list_objects(model), model,
                                            granularity, exclude)
        _place_uncovered(uncovered, model, self._device)
        blocks = [unit for unit in self.units if not unit.resident]
        for unit in blocks[:resident_blocks]:
            unit.resident = True
        self._streamed = blocks[resident_blocks:]
        self._position = {id(unit): index for index, unit in enumerate(self._streamed)}
        try:
            for unit in self.units:
                for _, owner, attribute in unit.parameters:
                    tensor = getattr(owner, attribute)
                    tensor.requires_grad_(False)
                    _set_tensor(owner, attribute, self._placeholder(tensor.dtype))
            self._take_resident([unit for unit in self.units if unit.resident])
            for unit in self._streamed:
                self._hooks.append(unit.submodule.register_forward_pre_hook(
                    lambda _module, inputs, unit=unit: self._before(unit, inputs)))
                self._hooks.append(unit.submodule.register_forward_hook(
                    lambda _module, _inputs, _output, unit=unit: self._after(unit)))
        except BaseException:
            self.close()
            raise

    @property
    def resident_units(self):
        return [unit.path for unit in self.units if unit.resident]

    @property
    def streamed_units(self):
        return [unit.path for unit in self._streamed]

    def close(self):
        """Removes the hooks and releases every lease (after the current stream's work). The
        streamed parameters are left empty."""
        for close in self._on_close:
            close()
        self._on_close = []
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for unit in self.units:
            self._drop(unit)
        if self._owns_session:
            self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- hooks ------------------------------------------------------------------------------

    def _before(self, unit, inputs):
        if torch.is_grad_enabled() and any(
                isinstance(value, torch.Tensor) and value.requires_grad for value in inputs):
            raise RuntimeError("tierd.torch.stream_weights serves inference only: run the model "
                               "under torch.no_grad() or torch.inference_mode()")
        if unit.leases is None:
            self._take(unit, stream=None)
            self.fetches += 1
        self._send_ahead(unit)

    def _after(self, unit):
        """Empties the unit's parameters and releases its leases after the current stream's work."""
        if unit.leases is None:
            return
        for _, owner, attribute in unit.parameters:
            _set_tensor(owner, attribute, self._placeholder(getattr(owner, attribute).dtype))
        leases, unit.leases = unit.leases, None
        self.session.release_many(leases)

    def _send_ahead(self, unit):
        """Sends fetches for the prefetch_depth blocks after `unit` (wrapping around) and cancels
        fetches sent ahead for blocks no longer in that window (the model took another path)."""
        count = len(self._streamed)
        start = self._position[id(unit)]
        window = {id(self._streamed[(start + step) % count])
                  for step in range(1, min(self.prefetch_depth, count - 1) + 1)}
        for other in self._streamed:
            if other.pending is not None and id(other) not in window:
                for fetch in other.pending:
                    fetch.cancel()
                other.pending = None
        for step in range(1, min(self.prefetch_depth, count - 1) + 1):
            ahead = self._streamed[(start + step) % count]
            if ahead.pending is None and ahead.leases is None:
                ahead.pending = self.session.fetch_many_async(ahead.keys)
        self._read_ahead_into_host(start, count)

    def _read_ahead_into_host(self, start, count):
        """Asks the daemon to read the host_read_ahead units after the prefetch window into its
        host tier, each unit once until it is taken: one request a step, for the unit newly in
        reach (all of them at the first)."""
        first = self.prefetch_depth + 1
        last = min(self.prefetch_depth + self.host_read_ahead, count - 1)
        keys = []
        for step in range(first, last + 1):
            ahead = self._streamed[(start + step) % count]
            if id(ahead) not in self._read_ahead and ahead.leases is None:
                self._read_ahead.add(id(ahead))
                keys.extend(ahead.keys)
        if keys:
            self.session.prefetch(keys, host_only=True)

    # ---- leases -----------------------------------------------------------------------------

    def _take(self, unit, stream):
        self._read_ahead.discard(id(unit))  # asked again on the next pass
        pending, unit.pending = unit.pending, None
        if pending is None:
            pending = self.session.fetch_many_async(unit.keys)
        leases = []
        try:
            for fetch in pending:
                leases.append(fetch.result(stream))
        except BaseException:
            for lease in leases:
                lease.release(stream)
            for fetch in pending[len(leases) + 1:]:
                fetch.cancel()
            raise
        views = {}
        for lease in leases:
            views.update(lease.tensors)
        for name, owner, attribute in unit.parameters:
            _set_tensor(owner, attribute, views[name])
        unit.leases = leases

    def _take_resident(self, units):
        """Takes every resident unit, in order, with the fetches of the units after the one waited
        on already sent, up to _RESIDENT_REQUESTS_AHEAD requests: the daemon's readers and the
        link work on the next units while one unit's answers come back, instead of on one unit's
        objects at a time. (Resident units are held together in the end anyway; the bound keeps
        a model of many objects under the session's requests in flight.)"""
        sent = 0
        in_flight = 0
        for index, unit in enumerate(units):
            while sent < len(units) and (sent <= index or in_flight + len(units[sent].keys)
                                         <= _RESIDENT_REQUESTS_AHEAD):
                units[sent].pending = self.session.fetch_many_async(units[sent].keys)
                in_flight += len(units[sent].keys)
                sent += 1
            in_flight -= len(unit.keys)
            self._take(unit, stream=None)

    def _copy_out(self):
        """Replaces every leased weight with a copy of its own, then releases the leases (after
        the copies, on the current stream). Tensors that were one view stay one copy."""
        copies = {}
        for unit in self.units:
            if unit.leases is None:
                continue
            for _, owner, attribute in unit.parameters:
                view = getattr(owner, attribute)
                identity = (view.data_ptr(), view.dtype, tuple(view.shape), view.stride())
                if identity not in copies:
                    copies[identity] = view.detach().clone()
                _set_tensor(owner, attribute, copies[identity])
            leases, unit.leases = unit.leases, None
            self.session.release_many(leases)

    def _drop(self, unit):
        if unit.pending is not None:
            for fetch in unit.pending:
                fetch.cancel()
            unit.pending = None
        self._after(unit)

    def _placeholder(self, dtype):
        placeholder = self._placeholders.get(dtype)
        if placeholder is None:
            placeholder = torch.empty(0, dtype=dtype, device=self._device)
            self._placeholders[dtype] = placeholder
        return placeholder


def _tie_weights(module):
    """Ties what the module declares tied, as loading a checkpoint would: a Hugging Face model built
    from its config (transformers 5 under accelerate.init_empty_weights()) has its LM head and
    embedding as two tensors until tie_weights() is called, and the checkpoint holds only one."""
    tie = getattr(module, "tie_weights", None)
    if callable(tie):
        tie()


def _set_tensor(owner, attribute, tensor):
    current = owner._parameters.get(attribute)
    if current is None:
        owner._buffers[attribute] = tensor
    elif current.is_meta:
        # A module built on the meta device: its parameters cannot take real data in place.
        owner._parameters[attribute] = torch.nn.Parameter(tensor, requires_grad=False)
    else:
        current.data = tensor


def _model_grouping(client, model):
    for summary in client.list_models():
        if summary.name == model:
            return _GROUPING_NAMES.get(summary.grouping, "block")
    raise TierdError(StatusCode.NOT_FOUND, f"model {model} is not registered")


def _repeated_children(module):
    """Paths of the children of every nn.ModuleList / nn.ModuleDict: the model's blocks."""
    paths = set()
    for path, submodule in module.named_modules():
        if isinstance(submodule, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for name, _ in submodule.named_children():
                paths.add(f"{path}.{name}" if path else name)
    return paths


def _plan_units(module, objects, model, granularity, exclude=frozenset()):
    """Groups the model's objects into units hooked on submodules, in the module's order; objects
    holding only `exclude`d tensors are left out."""
    owners = {}
    for path, submodule in module.named_modules():
        for attribute, _ in list(submodule._parameters.items()) + list(submodule._buffers.items()):
            owners[f"{path}.{attribute}" if path else attribute] = (submodule, attribute)
    blocks = _repeated_children(module)
    modules = dict(module.named_modules())
    units = collections.OrderedDict()
    covered = set()
    for info in objects:
        names = [tensor.name for tensor in info.tensors]
        if names and all(name in exclude for name in names):
            continue
        if any(name in exclude for name in names):
            raise ValueError(f"{info.key} holds both excluded and streamed tensors: register the "
                             f'model with grouping "tensor" to leave some of a block out')
        stored_tensors = {tensor.name: tensor for tensor in info.tensors}
        for name in names:
            if name not in owners:
                raise ValueError(f"tensor {name} of {info.key} is not a parameter or buffer of "
                                 f"the module")
            stored = stored_tensors[name]
            ours = getattr(*owners[name])
            if tuple(stored.shape) != tuple(ours.shape) or to_torch(stored.dtype) != ours.dtype:
                raise ValueError(f"{name} is {stored.dtype} {list(stored.shape)} in {model} but "
                                 f"{ours.dtype} {list(ours.shape)} in the module")
        root = _common_module(names, modules)
        block = next((prefix for prefix in _prefixes(root) if prefix in blocks), None)
        path = block if granularity == "block" and block is not None else root
        unit = units.get(path)
        if unit is None:
            unit = units[path] = _Unit(path, modules[path])
            unit.resident = block is None
        unit.keys.append(info.key)
        for name in names:
            unit.parameters.append((name,) + owners[name])
            covered.add(name)
    # A tensor the checkpoint does not name may be another's alias (tied weights, e.g. an LM head
    # sharing the embedding's matrix, saved once): it gets the same bytes.
    by_identity = {}
    for unit in units.values():
        for name, owner, attribute in unit.parameters:
            by_identity.setdefault(id(getattr(owner, attribute)), (unit, name))
    uncovered = {}
    for name, (owner, attribute) in owners.items():
        tensor = getattr(owner, attribute)
        if name in covered or name in exclude or tensor is None:
            continue
        alias = by_identity.get(id(tensor))
        if alias is not None:
            alias[0].parameters.append((alias[1], owner, attribute))
            covered.add(name)
        else:
            uncovered[name] = (owner, attribute)
    for unit in units.values():
        if unit.resident:
            continue
        missing = [name for name, _ in unit.submodule.named_parameters(prefix=unit.path)
                   if name not in covered and name not in exclude]
        if missing:
            raise ValueError(f"{unit.path} has parameters that {model} lacks: "
                             f"{', '.join(missing[:5])}")
    order = {path: index for index, (path, _) in enumerate(module.named_modules())}
    return sorted(units.values(), key=lambda unit: order[unit.path]), uncovered


def _place_uncovered(uncovered, model, device):
    """Tensors the model's objects do not hold: those with values (buffers computed when the
    module was built, such as rotary frequencies) go to `device`; those still on the meta device
    have no values anywhere, and are refused before the first forward."""
    empty = sorted(name for name, (owner, attribute) in uncovered.items()
                   if getattr(owner, attribute).is_meta)
    if empty:
        shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise ValueError(
            f"{shown} {'is' if len(empty) == 1 else 'are'} on the meta device and not in {model}: "
            f"nothing can give {'it' if len(empty) == 1 else 'them'} values. Build the module "
            f"without its weights but with real buffers (accelerate.init_empty_weights(), or "
            f"build it on the CPU and move only its parameters to the meta device), or give "
            f"these tensors values before streaming")
    for name, (owner, attribute) in uncovered.items():
        tensor = getattr(owner, attribute)
        if tensor.device != device:
            _set_tensor(owner, attribute, tensor.to(device))


def _prefixes(path):
    """'a.b.c' -> 'a', 'a.b', 'a.b.c'."""
    parts = path.split(".") if path else []
    return [".".join(parts[: count]) for count in range(1, len(parts) + 1)]


def _common_module(names, modules):
    """The deepest module holding every tensor in `names`."""
    split = [name.split(".")[:-1] for name in names]
    common = split[0]
    for parts in split[1:]:
        length = 0
        while length < min(len(common), len(parts)) and common[length] == parts[length]:
            length += 1
        common = common[:length]
    path = ".".join(common)
    while path not in modules:
        path = path.rpartition(".")[0]
    return path
