"""Processed weights: what an engine computes after loading a checkpoint — quantized, repacked,
fused, permuted or tensor-parallel-sharded parameters — kept in tierd under a fingerprint the
client gives, so that the next start maps them instead of loading and processing again.

    identity = tierd.processed.identity(checkpoint_dir, recipe="fuse-qkv v2", rank=0)
    weights = tierd.processed.load(session, identity)       # None: not stored (a miss)
    if weights is None:
        tierd.processed.save(session, identity, process(...))  # {name: tensor}
        weights = tierd.processed.load(session, identity)
    module.load_state_dict(weights.tensors, assign=True)      # views of the daemon's staging

`identity` is a string naming everything the tensors depend on (the checkpoint's files, the
recipe and its version, the rank); identity() builds one from a checkpoint directory's files
(names, sizes, modification times). The set is stored under a key derived from it, and its
manifest holds the identity itself: a set stored under another identity is never served, even
when their keys collide. The tensors are stored objects of the session's client group (other
groups cannot read them), in the daemon's host tier, on disk with durable=True (surviving a
daemon restart), and on the GPU for as long as it is retained (retain=, Session.retain).

A set is all or nothing: its objects are committed first, then its manifest, which names their
generation; a load finds the manifest and every object it names with the sizes, dtypes and shapes
it records, or it is a miss. A save that dies half-way leaves the previous set served (or none);
the objects of the set a save replaces are deleted after its manifest is committed (those another
process still leases are left: `tierctl evict processed-.../ --tier=all` removes them later)."""

import hashlib
import json
import os
import secrets

import torch

from ._session import Session, retain_as_asked
from .client import Client
from .dtypes import to_safetensors
from .errors import StatusCode, TierdError

# A stored object holds tensors up to about this many bytes, so that no object needs a large share
# of the daemon's GPU pool or of a session's staging quota at once.
OBJECT_BYTES = 256 << 20
# Objects a save has reserved and not seen committed, at most.
_OBJECTS_IN_FLIGHT = 8
_MANIFEST_VERSION = 1


def identity(checkpoint_dir, recipe, rank=0, world_size=1):
    """An identity for the processed weights of the checkpoint in `checkpoint_dir`, made by
    `recipe` (a string naming the processing and its version) for `rank` of `world_size`: the
    checkpoint's files by name, size and modification time, the recipe and the rank."""
    files = []
    for name in sorted(os.listdir(checkpoint_dir)):
        path = os.path.join(checkpoint_dir, name)
        if os.path.isfile(path):
            status = os.stat(path)
            files.append(f"{name}:{status.st_size}:{status.st_mtime_ns}")
    return json.dumps({"checkpoint": os.path.abspath(checkpoint_dir), "files": files,
                       "recipe": recipe, "rank": rank, "world_size": world_size},
                      sort_keys=True)


def namespace(identity_text):
    """The stored-object namespace of a processed set: "processed-" and 32 hex digits of the
    identity's SHA-256."""
    return "processed-" + hashlib.sha256(identity_text.encode()).hexdigest()[:32]


class ProcessedWeights:
    """A processed set mapped from the daemon: `tensors` maps each name to a view of the daemon's
    staging (on the session's device), valid until close()."""

    def __init__(self, session, tensors, leases, owns_session):
        self.session = session
        self.tensors = tensors
        self._leases = leases
        self._owns_session = owns_session

    def close(self):
        """Releases the leases (after the current stream's work) and the session load() opened."""
        leases, self._leases = self._leases, []
        if leases:
            self.session.release_many(leases)
        self.tensors = {}
        if self._owns_session:
            self.session.close()
            self._owns_session = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def save(client, identity_text, tensors, durable=False, retain=None):
    """Stores `tensors` ({name: tensor}, on the session's device or the CPU) as the processed set of
    `identity_text`, replacing the set stored under it before, if any. Returns once the daemon holds
    all of it (on disk too with `durable`). `retain`: keep it on the GPU beyond this process
    (Session.retain: True, or seconds of disuse after which it goes). `client`: a tierd.Client or
    a tierd.Session. Raises TierdError (RESOURCE_EXHAUSTED when the daemon has no room for it:
    nothing of it is then served) or ValueError for bad input."""
    if not isinstance(identity_text, str) or not identity_text:
        raise ValueError("the identity must be a non-empty string")
    if not tensors:
        raise ValueError("no tensors to store")
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name or not isinstance(tensor, torch.Tensor):
            raise ValueError(f"tensors must map names to tensors; {name!r} does not")
    session, owned = _session_of(client)
    try:
        prefix = namespace(identity_text)
        previous = _read_manifest(session, prefix)
        generation = secrets.token_hex(8)
        objects, placed = _pack(tensors)
        keys = []
        for index, names in enumerate(objects):
            key = f"{prefix}/{generation}.{index}"
            session.store_async(key, {name: tensors[name].contiguous() for name in names},
                                spillable=not durable, durable=durable)
            keys.append(key)
            if len(keys) % _OBJECTS_IN_FLIGHT == 0:
                session.flush()  # bounds the staging the save holds at once
        session.flush()
        manifest = {"version": _MANIFEST_VERSION, "identity": identity_text,
                    "generation": generation, "objects": keys, "tensors": placed}
        body = torch.frombuffer(bytearray(json.dumps(manifest).encode()), dtype=torch.uint8)
        session.store_async(f"{prefix}/manifest", {"manifest": body},
                            spillable=not durable, durable=durable)
        session.flush()
        # A retained set holds the objects it was retained with: it is retained again over the
        # new ones (with its time to live, unless `retain` gives another).
        ttl = _release_retained(session, prefix + "/")
        if previous is not None and previous.get("generation") != generation:
            for key in previous.get("objects", []):
                _delete(session, key)
        if not retain_as_asked(session, prefix + "/", retain) and ttl is not _NOT_RETAINED:
            session.retain(prefix + "/", ttl=ttl)
    finally:
        if owned:
            session.close()


def load(client, identity_text, retain=None):
    """The processed set of `identity_text`, mapped (ProcessedWeights), or None when the daemon does
    not have all of it under that identity (a miss: process and save it). `retain` as save()'s,
    applied before mapping. `client`: a tierd.Client (a session is opened and closed with the
    result) or a tierd.Session."""
    session, owned = _session_of(client)
    try:
        prefix = namespace(identity_text)
        manifest = _read_manifest(session, prefix)
        if manifest is None or manifest.get("identity") != identity_text:
            return _miss(session, owned)
        try:
            retain_as_asked(session, prefix + "/", retain)
        except TierdError as error:
            if error.code != StatusCode.NOT_FOUND:
                raise
            return _miss(session, owned)
        try:
            leases = session.fetch_many(manifest["objects"])
        except TierdError as error:
            if error.code == StatusCode.NOT_FOUND:
                return _miss(session, owned)
            raise
        views = {}
        for lease in leases:
            views.update(lease.tensors)
        tensors = {}
        for name, (dtype, shape) in manifest["tensors"].items():
            view = views.get(name)
            if view is None or to_safetensors(view.dtype) != dtype or list(view.shape) != shape:
                session.release_many(leases)
                return _miss(session, owned)
            tensors[name] = view
        return ProcessedWeights(session, tensors, leases, owned)
    except BaseException:
        if owned:
            session.close()
        raise


def _miss(session, owned):
    if owned:
        session.close()
    return None


def _session_of(client):
    if isinstance(client, Session):
        return client, False
    if isinstance(client, Client):
        return client.session(), True
    raise TypeError("client must be a tierd.Client or a tierd.Session")


def _read_manifest(session, prefix):
    """The manifest stored under `prefix`, or None when there is none (or it is unreadable)."""
    try:
        with session.fetch(f"{prefix}/manifest") as lease:
            body = lease.tensors["manifest"].cpu().numpy().tobytes()
    except TierdError as error:
        if error.code == StatusCode.NOT_FOUND:
            return None
        raise
    try:
        manifest = json.loads(body.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("version") != _MANIFEST_VERSION:
        return None
    return manifest


def _pack(tensors):
    """Groups the tensors' names into objects of about OBJECT_BYTES each, and records each
    tensor's dtype and shape."""
    objects, current, size = [], [], 0
    placed = {}
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > OBJECT_BYTES:
            objects.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
        placed[name] = (to_safetensors(tensor.dtype), list(tensor.shape))
    if current:
        objects.append(current)
    return objects, placed


_NOT_RETAINED = object()


def _release_retained(session, target):
    """Unretains `target` if it is retained; returns its ttl then (None: none), else
    _NOT_RETAINED."""
    sets, _, _ = session.retained()
    for retained in sets:
        if retained.target == target:
            session.unretain(target)
            return retained.ttl
    return _NOT_RETAINED


def _delete(session, key):
    try:
        session.evict(key, tier="all")
    except TierdError as error:
        if error.code not in (StatusCode.NOT_FOUND, StatusCode.FAILED_PRECONDITION):
            raise
