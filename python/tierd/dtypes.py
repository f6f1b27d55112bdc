"""Tensor element types: the safetensors spelling the API uses ("BF16", "F32", ...) and torch's."""

import torch

_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
    "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}

# Only the types this torch has (older releases lack unsigned wide ints and float8).
TORCH_DTYPES = {name: getattr(torch, attr) for name, attr in _NAMES.items() if hasattr(torch, attr)}
SAFETENSORS_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
# Bytes per element, looked up on the fetch path rather than asked of torch each time.
ELEMENT_BYTES = {dtype: torch.empty((), dtype=dtype).element_size() for dtype in SAFETENSORS_NAMES}


def to_torch(name):
    dtype = TORCH_DTYPES.get(name)
    if dtype is None:
        raise ValueError(f"tensor dtype {name} has no torch {torch.__version__} equivalent")
    return dtype


def to_safetensors(dtype):
    name = SAFETENSORS_NAMES.get(dtype)
    if name is None:
        raise ValueError(f"tensors of {dtype} cannot be stored (no safetensors dtype)")
    return name
