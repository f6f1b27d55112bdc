"""A model's attention keys and values kept in tierd layer by layer: the store under
tierd.transformers.TierdCache, usable by any model that appends each layer's new keys and values
and attends over all of them.

Each layer's tokens are kept as chunks of `chunk_tokens` tokens, each a stored object
"NAMESPACE/NAME.l<layer>.c<chunk>" holding tensors "k" and "v" ([batch, heads, tokens, head_dim]),
plus a tail of fewer tokens on the GPU. update(layer, k, v) fetches the layer's chunks (one round
trip, sent ahead by prefetch(layer) while an earlier layer computes), returns the layer's keys and
values with the new ones appended, and stores every chunk the tail fills. The chunks live in the
daemon's tiers: on the GPU while its pool has room, in host memory beyond, on disk when stored
durable; only the layers being computed are on the GPU in this process.

save() stores the tails too and a manifest "NAMESPACE/NAME.manifest"; open() in another process,
or after the model server restarts (durable=True, and the daemon's own restarts), continues from
them. Several processes may read one saved NAME; one writes it at a time.
"""

import torch

from .errors import StatusCode, TierdError

MANIFEST_VERSION = 1


class LayeredKVStore:
    """Keys and values of `layers` attention layers, kept in tierd through `session`. Not
    thread-safe: one model's forward drives it."""

    def __init__(self, session, name, layers, chunk_tokens=4096, namespace="kv", durable=False):
        if not namespace or "/" in namespace:
            raise ValueError(f"namespace must be one path component, not {namespace!r}")
        if not name or "/" in name:
            raise ValueError(f"name must be one path component, not {name!r}")
        if layers <= 0 or chunk_tokens <= 0:
            raise ValueError("layers and chunk_tokens must be positive")
        self.session = session
        self.name = name
        self.namespace = namespace
        self.chunk_tokens = chunk_tokens
        self.durable = durable
        self._layers = [_Layer() for _ in range(layers)]

    @classmethod
    def open(cls, session, name, namespace="kv", durable=False):
        """The store `name` as save() left it: its layers, chunk size and tokens. NOT_FOUND when
        nothing was saved under that name."""
        key = f"{namespace}/{name}.manifest"
        with session.fetch(key) as lease:
            manifest = lease.tensors["manifest"].cpu().tolist()
        version, layers, chunk_tokens, tokens = manifest
        if version != MANIFEST_VERSION:
            raise TierdError(StatusCode.FAILED_PRECONDITION,
                             f"{key} is of version {version}; this client reads {MANIFEST_VERSION}")
        store = cls(session, name, layers, chunk_tokens, namespace, durable)
        for layer in store._layers:
            layer.sealed = tokens // chunk_tokens
            layer.saved_tail = tokens % chunk_tokens
        return store

    # ---- what the model asks ---------------------------------------------------------------

    @property
    def layers(self):
        return len(self._layers)

    def tokens(self, layer=0):
        """Tokens layer `layer` holds (0 for a layer out of range)."""
        if not 0 <= layer < len(self._layers):
            return 0
        state = self._layers[layer]
        tail = state.tail_k.shape[-2] if state.tail_k is not None else state.saved_tail
        return state.sealed * self.chunk_tokens + tail

    def prefetch(self, layer):
        """Sends the fetches of layer `layer`'s stored chunks (layer modulo the layer count: the last
        layer prefetches the first for the next step), unless sent already."""
        state = self._layers[layer % len(self._layers)]
        if state.pending is None:
            keys = self._stored_keys(layer % len(self._layers))
            state.pending = self.session.fetch_many_async(keys) if keys else []

    def update(self, layer, keys, values):
        """Appends `keys` and `values` ([batch, heads, new tokens, head_dim]) to layer `layer` and
        returns the layer's keys and values, all of its tokens, as new tensors on their device."""
        state = self._layers[layer]
        self.prefetch(layer)
        pending, state.pending = state.pending, None
        leases = []
        try:
            for fetch in pending:
                leases.append(fetch.result())
        except BaseException:
            self.session.release_many(leases)
            for fetch in pending[len(leases):]:
                fetch.cancel()
            raise
        try:
            parts_k = [lease.tensors["k"] for lease in leases]
            parts_v = [lease.tensors["v"] for lease in leases]
            if state.tail_k is not None:
                parts_k.append(state.tail_k)
                parts_v.append(state.tail_v)
            all_k = torch.cat(parts_k + [keys], dim=-2)
            all_v = torch.cat(parts_v + [values], dim=-2)
        finally:
            # After the copies out of the staging buffers, enqueued above (or after whatever was
            # enqueued, when the concatenation failed).
            self.session.release_many(leases)
        self._seal(layer, state, all_k, all_v)
        return all_k, all_v

    def save(self):
        """Stores each layer's tail and the manifest, and waits until everything stored is in the
        daemon's host tier (on disk too, when durable): open() in another process then continues
        from here. Every layer must hold the same tokens (a whole forward has run)."""
        tokens = {self.tokens(layer) for layer in range(len(self._layers))}
        if len(tokens) != 1:
            raise ValueError(f"the layers hold different token counts {sorted(tokens)}: save "
                             f"after a whole forward")
        for layer, state in enumerate(self._layers):
            if state.tail_k is not None and state.tail_k.shape[-2] > 0:
                self._store(self._tail_key(layer), state.tail_k, state.tail_v)
        manifest = torch.tensor([MANIFEST_VERSION, len(self._layers), self.chunk_tokens,
                                 tokens.pop()], dtype=torch.int64, device=self.session.device)
        self.session.store_async(f"{self.namespace}/{self.name}.manifest",
                                 {"manifest": manifest}, durable=self.durable)
        self.session.flush()

    def reset(self):
        """Forgets every token here and gives up the fetches sent ahead (what is stored stays
        stored until replaced or evicted)."""
        self.close()
        self._layers = [_Layer() for _ in self._layers]

    def close(self):
        """Gives up the fetches sent ahead (the last layer's update sends the first layer's for the
        next step, and they hold leases until taken); the tokens stay known, and a later update
        fetches them again."""
        for state in self._layers:
            for fetch in state.pending or ():
                fetch.cancel()
            state.pending = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- keys and chunks -------------------------------------------------------------------

    def _chunk_key(self, layer, chunk):
        return f"{self.namespace}/{self.name}.l{layer}.c{chunk}"

    def _tail_key(self, layer):
        return f"{self.namespace}/{self.name}.l{layer}.tail"

    def _stored_keys(self, layer):
        state = self._layers[layer]
        keys = [self._chunk_key(layer, chunk) for chunk in range(state.sealed)]
        if state.saved_tail:
            keys.append(self._tail_key(layer))
        return keys

    def _seal(self, layer, state, all_k, all_v):
        """Stores the full chunks past the sealed ones and keeps the rest as the tail."""
        size = self.chunk_tokens
        try:
            while all_k.shape[-2] - state.sealed * size >= size:
                begin = state.sealed * size
                self._store(self._chunk_key(layer, state.sealed),
                            all_k[:, :, begin:begin + size], all_v[:, :, begin:begin + size])
                state.sealed += 1
        finally:
            # Whether or not every store went out, the layer holds what it returns: the chunks
            # stored and the rest as its tail (a copy: a view would keep the whole layer's tensors
            # alive). A tail save() stored is in `all_k` now, fetched with the chunks.
            state.tail_k = all_k[:, :, state.sealed * size:].clone()
            state.tail_v = all_v[:, :, state.sealed * size:].clone()
            state.saved_tail = 0

    def _store(self, key, k, v):
        self.session.store_async(key, {"k": k, "v": v}, durable=self.durable)


class _Layer:
    __slots__ = ("sealed", "saved_tail", "tail_k", "tail_v", "pending")

    def __init__(self):
        self.sealed = 0  # chunks stored, each chunk_tokens tokens
        self.saved_tail = 0  # tokens of a tail save() stored that is not loaded yet
        self.tail_k = None  # the tokens past the chunks, on the GPU
        self.tail_v = None
        self.pending = None  # PendingFetches of the stored chunks, sent by prefetch()
