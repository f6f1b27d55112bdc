"""tierd's Python client: fetch, store and release tensors held by a tierd daemon, zero-copy.

    import tierd
    client = tierd.Client("/run/tierd/gpu0.sock")
    with client.session() as session, session.fetch("wan/blocks.0") as lease:
        ...  # lease.tensors: {name: tensor viewing the daemon's staging buffer}

tierd.ActivationCache offloads activation caches (store_async / begin_fetch_step / fetch);
tierd.torch.stream_weights streams a model's blocks through forward hooks;
tierd.tensor_parallel.load_shards loads one rank's shards of a model's weights.
"""

from ._version import __version__
from .activation_cache import ActivationCache
from .client import Client, Lease, PendingFetch, RetainedSet, Session
from .errors import StatusCode, TierdError

__all__ = ["ActivationCache", "Client", "Lease", "PendingFetch", "RetainedSet", "Session",
           "StatusCode", "TierdError"]
