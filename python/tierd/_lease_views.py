"""The tensors of leased staging ranges, made once per range and layout.

A model server fetches the same objects step after step (a model's blocks, a KV cache's chunks),
and an object that stays on the GPU is leased at the same place each time. Making its views
(slicing the slab, viewing each tensor's bytes as its dtype and shape) costs several torch calls
per tensor, each of which lets go of the GIL; on a decode step with dozens of leases that was the
larger part of what a lease cost this process. LeaseViews keeps the views of the ranges leased
lately, keyed by the slab, the range and the tensors' layout (every field of their TensorInfos),
and gives each lease views of its own of them (new tensors over the same memory), so that what a
caller does to a lease's tensors (an in-place reshape, requires_grad_) never reaches another
lease's. A range with a tensor that had to be copied (one not aligned for its dtype) is not
kept: the copy holds the bytes of the lease it was made for, and another object of the same layout
may be leased there later.
"""

import collections
import threading


class LeaseViews:
    """Thread-safe. `make(slab, offset, length, infos, *make_args)` gives (buffer,
    {name: tensor}, reusable) for a range not seen lately, `reusable` false when a tensor is a copy
    rather than a view of the buffer; at most `capacity` ranges are kept, the least recently
    leased dropped first."""

    def __init__(self, make, capacity=1024):
        self._make = make
        self._capacity = capacity
        self._lock = threading.Lock()
        self._views = collections.OrderedDict()  # key -> (buffer, {name: tensor})

    def views(self, slab_id, slab, offset, length, infos, *make_args):
        """(buffer, {name: tensor}) for `length` bytes at `offset` of slab `slab_id` laid out as
        `infos` (TensorInfo), each tensor a fresh view the caller may keep. `make_args` go to
        `make` after the range's."""
        key = (slab_id, offset, length, tuple(info.SerializeToString() for info in infos))
        with self._lock:
            kept = self._views.get(key)
            if kept is not None:
                self._views.move_to_end(key)
        if kept is None:
            buffer, tensors, reusable = self._make(slab, offset, length, infos, *make_args)
            if not reusable:
                return buffer, tensors
            kept = (buffer, tensors)
            with self._lock:
                self._views[key] = kept
                while len(self._views) > self._capacity:
                    self._views.popitem(last=False)
        buffer, tensors = kept
        return _own(buffer), {name: _own(tensor) for name, tensor in tensors.items()}

    def clear(self):
        """Drops every view (they keep their slabs' memory mapped)."""
        with self._lock:
            self._views.clear()

    def __len__(self):
        return len(self._views)


def _own(tensor):
    """A new view of all of `tensor` (view_as: one torch call, and unlike detach() its metadata may
    be changed in place)."""
    return tensor.view_as(tensor)
