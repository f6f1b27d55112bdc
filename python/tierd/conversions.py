"""Checkpoint conversions served as bytes.

transformers 5 builds some modules with parameters a checkpoint does not store as such — a mixture
of experts' fused `experts.gate_up_proj` [E, 2I, H] where the checkpoint has one gate and one up
projection per expert — and converts while loading, following its checkpoint conversion mapping
(`transformers.conversion_mapping`): renames, and `WeightConverter`s whose operations stack,
concatenate and split tensors. Those operations only move bytes, so tierd serves their results
as bytes: derived_tensors() works out, for each converted parameter, which byte ranges of which
checkpoint tensors make it, in order, and the daemon registers the model with them
(RegisterModelRequest.derived), gathering each parameter from its ranges when it reads them — one
disk read of each range, one copy to the GPU, nothing concatenated here.

The mapping is transformers' own: the renames and converters come from
get_model_conversion_mapping(model), and which converter takes which checkpoint key is decided by
their own rename_source_key(). Only what each operation does to the bytes is worked out here, for
the operations that move whole rows of bytes: MergeModulelist (torch.stack), Concatenate
(torch.cat), Chunk (torch.chunk) and SplitModulelist (torch.split). Any other operation (a
transpose, a permutation of rows, dequantisation) is refused with a ValueError naming the
parameter and the operation: it is never served wrong.

This module imports neither transformers nor the daemon's client: it works on the objects it is
given, so it runs (and is tested) without transformers installed."""

import json
import os
import re
import struct

from .v1 import tierd_pb2

# Bytes per element of the safetensors dtypes whose elements are whole bytes.
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}

# The daemon's bound on the ranges of one derived tensor (storage/model/derived_tensors.h).
MAX_RANGES_PER_TENSOR = 262144


def read_checkpoint_index(directory):
    """{tensor name: (safetensors dtype, shape)} of the checkpoint in `directory`: the files
    model.safetensors.index.json names, or else every .safetensors file there (as the daemon
    registers them). Reads only the files' headers."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as file:
            files = sorted(set(json.load(file)["weight_map"].values()))
    else:
        files = sorted(name for name in os.listdir(directory) if name.endswith(".safetensors"))
    tensors = {}
    for name in files:
        with open(os.path.join(directory, name), "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        for tensor, entry in header.items():
            if tensor != "__metadata__":
                tensors[tensor] = (entry["dtype"], tuple(entry["shape"]))
    return tensors


def natural_key(name):
    """Dotted names with their numeric parts compared as numbers ("experts.10" after
    "experts.9"): the order transformers collects a converter's tensors in."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split(".")]


class _Bytes:
    """A tensor as byte ranges of checkpoint tensors: `shape`, and for each index of its first
    `depth` dimensions (row-major) a row — a list of (tensor, offset, length) ranges, which
    concatenated are that row's bytes. A checkpoint tensor is one row at depth 0."""

    def __init__(self, shape, itemsize, depth, rows):
        self.shape = tuple(shape)
        self.itemsize = itemsize
        self.depth = depth
        self.rows = rows

    @classmethod
    def of(cls, name, shape, itemsize):
        size = itemsize
        for dim in shape:
            size *= dim
        return cls(shape, itemsize, 0, [[(name, 0, size)]] if size else [[]])

    def at_depth(self, depth):
        """The same bytes with one row for each index of exactly the first `depth` dimensions:
        rows split when the tensor has fewer, joined when it has more."""
        rows, current = self.rows, self.depth
        while current < depth:
            parts = self.shape[current]
            size = self.row_bytes_at(current + 1)
            rows = [_slice(row, part * size, size) for row in rows for part in range(parts)]
            current += 1
        if current > depth:
            group = 1
            for dim in self.shape[depth:current]:
                group *= dim
            count = 1
            for dim in self.shape[:depth]:
                count *= dim
            rows = [[piece for row in rows[index * group:(index + 1) * group] for piece in row]
                    for index in range(count)]
        return _Bytes(self.shape, self.itemsize, depth, rows)

    def row_bytes_at(self, depth):
        size = self.itemsize
        for dim in self.shape[depth:]:
            size *= dim
        return size

    def ranges(self):
        """The tensor's bytes as ranges, adjacent ones of one tensor merged."""
        merged = []
        for row in self.rows:
            for tensor, offset, length in row:
                if merged and merged[-1][0] == tensor and merged[-1][1] + merged[-1][2] == offset:
                    merged[-1] = (tensor, merged[-1][1], merged[-1][2] + length)
                else:
                    merged.append((tensor, offset, length))
        return merged


def _slice(row, start, length):
    """Bytes [start, start + length) of a row of ranges."""
    out = []
    position = 0
    for tensor, offset, size in row:
        begin = max(start, position)
        end = min(start + length, position + size)
        if begin < end:
            out.append((tensor, offset + begin - position, end - begin))
        position += size
        if position >= start + length:
            break
    return out


def _dim(dim, rank):
    if not -rank <= dim < max(rank, 1):
        raise IndexError(f"dimension {dim} out of range for {rank} dimensions")
    return dim % rank if rank else 0


def _cat(tensors, dim):
    first = tensors[0]
    dim = _dim(dim, len(first.shape))
    for other in tensors[1:]:
        if (len(other.shape) != len(first.shape) or other.shape[:dim] != first.shape[:dim]
                or other.shape[dim + 1:] != first.shape[dim + 1:]):
            raise ValueError(f"cannot concatenate shapes {[list(t.shape) for t in tensors]}")
    parts = [tensor.at_depth(dim) for tensor in tensors]
    shape = list(first.shape)
    shape[dim] = sum(tensor.shape[dim] for tensor in tensors)
    rows = [[piece for part in parts for piece in part.rows[index]]
            for index in range(len(parts[0].rows))]
    return _Bytes(shape, first.itemsize, dim, rows)


def _stack(tensors, dim):
    first = tensors[0]
    if any(tensor.shape != first.shape for tensor in tensors):
        raise ValueError(f"cannot stack shapes {[list(t.shape) for t in tensors]}")
    dim = _dim(dim, len(first.shape) + 1)
    parts = [tensor.at_depth(dim) for tensor in tensors]
    shape = list(first.shape[:dim]) + [len(tensors)] + list(first.shape[dim:])
    rows = [part.rows[index] for index in range(len(parts[0].rows)) for part in parts]
    return _Bytes(shape, first.itemsize, dim + 1, rows)


def _split(tensor, sizes, dim):
    dim = _dim(dim, len(tensor.shape))
    if sum(sizes) != tensor.shape[dim]:
        raise ValueError(f"split sizes {sizes} do not add up to {tensor.shape[dim]}")
    base = tensor.at_depth(dim)
    inner = base.row_bytes_at(dim + 1)
    pieces = []
    start = 0
    for size in sizes:
        shape = list(tensor.shape)
        shape[dim] = size
        rows = [_slice(row, start * inner, size * inner) for row in base.rows]
        pieces.append(_Bytes(shape, tensor.itemsize, dim, rows))
        start += size
    return pieces


def _chunk_sizes(length, chunks):
    """torch.chunk's sizes: chunks of ceil(length / chunks), the last smaller, maybe fewer; of a
    dimension of length 0, `chunks` empty ones."""
    if length == 0:
        return [0] * max(chunks, 1)
    size = -(-length // chunks) if chunks else length
    sizes = []
    while length > 0:
        sizes.append(min(size, length))
        length -= sizes[-1]
    return sizes


def _only(tensors, operation):
    if isinstance(tensors, _Bytes):
        return tensors
    if len(tensors) != 1:
        raise ValueError(f"{operation} expects one tensor per source, got {len(tensors)}")
    return tensors[0]


def _apply(operation, value, targets):
    """One conversion operation on {key: [tensors]} (or {key: tensor}), as transformers applies
    it; a KeyError-free ValueError for an operation that is not a move of bytes."""
    kind = type(operation).__name__
    dim = getattr(operation, "dim", 0)
    if kind == "MergeModulelist":
        return {key: [_stack(list(tensors), dim)] for key, tensors in value.items()}
    if kind == "Concatenate":
        return {targets[0]: [_cat([_only(tensors, kind) for tensors in value.values()], dim)]}
    if kind == "Chunk":
        tensor = _only(next(iter(value.values())), kind)
        sizes = getattr(operation, "sizes", None)
        if not sizes:
            chunks = getattr(operation, "chunks", None) or len(targets)
            sizes = _chunk_sizes(tensor.shape[_dim(dim, len(tensor.shape))], chunks)
        pieces = _split(tensor, list(sizes), dim)
        if len(pieces) != len(targets):
            raise ValueError(f"Chunk made {len(pieces)} tensors for {len(targets)} targets")
        return {target: [piece] for target, piece in zip(targets, pieces)}
    if kind == "SplitModulelist":
        sizes = getattr(operation, "sizes")
        if len(sizes) != len(value):
            raise ValueError("SplitModulelist received an unexpected number of tensors")
        return {key: _split(_only(tensors, kind), list(split), dim)
                for (key, tensors), split in zip(value.items(), sizes)}
    raise _Refused(kind)


class _Refused(Exception):
    def __init__(self, operation):
        super().__init__(operation)
        self.operation = operation


def _patterns(transform, names):
    for name in names:
        value = getattr(transform, name, None)
        if value is not None:
            return [value] if isinstance(value, str) else list(value)
    raise ValueError(f"transformers' {type(transform).__name__} has none of {names}: this "
                     f"version's conversion mapping is not one tierd can read")


def _plain(pattern):
    """A target pattern as the name text it stands for (regex escapes and anchors removed)."""
    return re.sub(r"\\(.)", r"\1", pattern).lstrip("^").rstrip("$")


def derived_tensors(checkpoint, transforms, model_keys=None, base_model_prefix="",
                    rename_source_key=None):
    """The tierd_pb2.DerivedTensor messages that make the checkpoint's tensors the model's
    parameters, as transformers' loading converts them.

    `checkpoint`: {name: (safetensors dtype, shape)} (read_checkpoint_index). `transforms`:
    transformers' conversion mapping for the model (get_model_conversion_mapping(model)): its
    WeightRenaming and WeightConverter objects, used through their rename_source_key(),
    source/target patterns and operations. `model_keys`: the model's state-dict keys, to add or
    strip `base_model_prefix` as transformers does (None: names are kept as renamed).
    `rename_source_key`: transformers' own function of that name
    (`transformers.core_model_loading.rename_source_key(key, renamings, converters, prefix,
    meta_state_dict)`), which renames a key as its loading does; without it, the same steps are
    taken here through each transform's rename_source_key().

    A checkpoint tensor no transform renames is served as stored and has no derived tensor. Each
    converter's sources are collected in natural order of their names (experts 0, 1, ..., 10).
    ValueError names the parameter and the operation when a conversion does not only move bytes,
    or when the checkpoint's tensors do not fit it."""
    # A transform with operations converts (WeightConverter); one without only renames.
    converters = [t for t in transforms if getattr(t, "operations", None)]
    renamings = [t for t in transforms if not getattr(t, "operations", None)]
    unknown = [type(t).__name__ for t in transforms if not callable(
        getattr(t, "rename_source_key", None))]
    if unknown:
        raise ValueError(f"the conversion mapping holds {', '.join(sorted(set(unknown)))}, "
                         f"which has no rename_source_key(): this transformers' mapping is not "
                         f"one tierd can read")
    keys = set(model_keys) if model_keys is not None else None
    prefix = f"{base_model_prefix}." if base_model_prefix else ""

    def with_prefix(name):
        if keys is None or not prefix or name in keys:
            return name
        if name.startswith(prefix) and name[len(prefix):] in keys:
            return name[len(prefix):]
        if prefix + name in keys:
            return prefix + name
        return name

    state = dict.fromkeys(keys) if keys is not None else None

    def rename(name):
        if rename_source_key is not None:
            key, pattern = rename_source_key(name, renamings, converters, base_model_prefix,
                                             state)[:2]
            owner = next((c for c in converters if pattern in _patterns(
                c, ("source_patterns", "source_keys"))), None) if pattern is not None else None
            return key, pattern, owner
        key = name
        for renaming in renamings:
            key, _ = renaming.rename_source_key(key)
        for converter in converters:
            key, pattern = converter.rename_source_key(key)
            if pattern is not None:
                return with_prefix(key), pattern, converter
        return with_prefix(key), None, None

    renamed = {}  # checkpoint name -> parameter name, for those only renamed
    converted = {}  # parameter name -> (converter, {source pattern: [checkpoint names]})
    for name in sorted(checkpoint, key=natural_key):
        key, pattern, converter = rename(name)
        if pattern is not None and converter is None:
            raise ValueError(f"{name}: transformers matched it to {pattern!r}, which no converter "
                             f"of the mapping has")
        if pattern is None:
            if key != name:
                renamed[name] = key
            continue
        _, sources = converted.setdefault(key, (converter, {}))
        sources.setdefault(pattern, []).append(name)

    messages = []
    for name, key in renamed.items():
        dtype, shape = checkpoint[name]
        messages.append(_message(key, dtype, _Bytes.of(name, shape, _itemsize(dtype)),
                                 _empty([name], checkpoint)))
    for key, (converter, sources) in converted.items():
        source_patterns = _patterns(converter, ("source_patterns", "source_keys"))
        target_patterns = [_plain(pattern) for pattern in
                           _patterns(converter, ("target_patterns", "target_keys"))]
        order = {pattern: index for index, pattern in enumerate(source_patterns)}
        dtypes = {checkpoint[n][0] for names in sources.values() for n in names}
        if len(dtypes) != 1:
            raise ValueError(f"{key}: its checkpoint tensors have dtypes {sorted(dtypes)}; "
                             f"converting them would change values")
        dtype = dtypes.pop()
        value = {pattern: [_Bytes.of(n, checkpoint[n][1], _itemsize(dtype)) for n in names]
                 for pattern, names in sorted(sources.items(),
                                              key=lambda item: order.get(item[0], len(order)))}
        first = target_patterns[0]
        targets = [key.replace(first, target, 1) if first else target for target in target_patterns]
        operations = getattr(converter, "operations", None) or []
        try:
            for operation in operations:
                value = _apply(operation, value, targets)
        except _Refused as refused:
            raise ValueError(
                f"{key}: transformers converts it with {refused.operation}, which changes values or "
                f"their layout in a way tierd does not serve as bytes (it serves renames, "
                f"MergeModulelist, Concatenate, Chunk and SplitModulelist)") from None
        except (ValueError, IndexError) as error:
            raise ValueError(f"{key}: {error}") from None
        if set(value) != set(targets) and len(targets) == 1 and len(value) == 1:
            # One source, merged: transformers names the result after the target.
            value = {targets[0]: next(iter(value.values()))}
        if set(value) != set(targets):
            raise ValueError(f"{key}: its conversion made {sorted(value)}, not {targets}")
        # Zero-size sources hold no bytes to range over: the first target names them, so that the
        # daemon replaces them too.
        empty = _empty([n for names in sources.values() for n in names], checkpoint)
        for target, tensors in value.items():
            messages.append(_message(target, dtype, _only(tensors, "the last operation"), empty))
            empty = []
    return messages


def _empty(names, checkpoint):
    """Those of `names` that are zero-size tensors of the checkpoint."""
    return [name for name in names if 0 in checkpoint[name][1]]


def _itemsize(dtype):
    size = _ITEMSIZE.get(dtype)
    if size is None:
        raise ValueError(f"a tensor of dtype {dtype} cannot be converted as bytes here")
    return size


def _message(name, dtype, tensor, empty_sources=()):
    """The DerivedTensor `name` of `tensor`'s ranges, and a range of no bytes for each of
    `empty_sources` (zero-size tensors it replaces)."""
    ranges = tensor.ranges() + [(source, 0, 0) for source in empty_sources]
    if len(ranges) > MAX_RANGES_PER_TENSOR:
        raise ValueError(f"{name} would be gathered from {len(ranges)} ranges of the checkpoint; "
                         f"tierd gathers at most {MAX_RANGES_PER_TENSOR}")
    return tierd_pb2.DerivedTensor(
        name=name, dtype=dtype, shape=list(tensor.shape),
        ranges=[tierd_pb2.TensorRange(tensor=t, offset=o, length=n) for t, o, n in ranges])
