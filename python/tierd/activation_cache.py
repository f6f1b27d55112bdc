"""Activation caches (per-layer KV or hidden states) offloaded to tierd and brought back: the seeds'
OffloadManager calls — store_async, begin_fetch_step, fetch — on top of a tierd session.

Keys are the caller's, e.g. "s_kv_cond_12" (static KV of layer 12 under cond), "m_x_uncond_3"
(medium hidden state of layer 3 under uncond); each is stored as "<namespace>/<key>". Stores
replace: storing a key again publishes the new tensor once its commit lands.

    cache = tierd.ActivationCache(session, "jano-worker0")
    cache.store_async(static_kv, f"s_kv_{state_key}")      # update step
    ...
    cache.begin_fetch_step([f"s_kv_{k}" for k in keys])    # fetch step: all copies start
    static_kv = cache.fetch(f"s_kv_{state_key}")           # the stream waits, the CPU does not

A fetched tensor views a staging buffer: it is valid until the next begin_fetch_step(),
end_fetch_step() or release(key), and must not be written to. Keep what must live longer with
torch.cat or .clone().
"""


class ActivationCache:
    def __init__(self, session, namespace, spillable=True):
        if not namespace or "/" in namespace:
            raise ValueError(f"namespace must be one path component, not {namespace!r}")
        self.session = session
        self.namespace = namespace
        self.spillable = spillable
        self._pending = {}  # key -> PendingFetch sent by begin_fetch_step, not yet taken
        self._leases = {}  # key -> Lease taken in this step

    def object_key(self, key):
        return f"{self.namespace}/{key}"

    def store_async(self, tensor, key, stream=None):
        """Copies `tensor` into a staging buffer on `stream` (default: the current stream) and
        commits it, without waiting. The tensor must not change until the stream ran the copy.
        flush() reports whether the commits landed."""
        self.session.store_async(self.object_key(key), tensor, spillable=self.spillable,
                                 stream=stream)

    def flush(self):
        self.session.flush()

    def begin_fetch_step(self, keys):
        """Releases the previous step's tensors and starts bringing `keys` to the GPU, in order:
        one fetch per key is sent at once and the daemon's copies run while earlier layers
        compute."""
        self.end_fetch_step()
        for key in keys:
            if key not in self._pending:
                self._pending[key] = self.session.fetch_async(self.object_key(key))

    def fetch(self, key, stream=None):
        """The tensor stored under `key`, with `stream` (default: the current stream) made to wait
        for its copy. Without begin_fetch_step() for it, the fetch is sent here."""
        lease = self._leases.get(key)
        if lease is None:
            pending = self._pending.pop(key, None)
            if pending is None:
                pending = self.session.fetch_async(self.object_key(key))
            lease = pending.result(stream)
            self._leases[key] = lease
        return lease.tensor

    def release(self, key, stream=None):
        """Gives back `key`'s staging buffer before the step ends (after its last use on
        `stream`)."""
        lease = self._leases.pop(key, None)
        if lease is not None:
            lease.release(stream)
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending.cancel()

    def end_fetch_step(self, stream=None):
        """Releases every tensor fetched in this step and fetches nobody took."""
        leases, self._leases = self._leases, {}
        pending, self._pending = self._pending, {}
        for fetch in pending.values():
            fetch.cancel()
        for lease in leases.values():
            lease.release(stream)
