"""What a safetensors file's header says, checked against the file: one line naming the file
when it is not safetensors, is truncated, or describes tensors its bytes cannot hold.

safetensors' own reader says "header too large" or "incomplete metadata, file not fully
covered" (without the file's name) for these, and only when a tensor is read; reading
the headers first refuses a bad folder before anything is converted or a run starts.
Layout: 8 bytes little-endian header length, the JSON header (name -> dtype, shape,
data_offsets relative to the end of the header), then the data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# Bytes per element of each safetensors dtype (the header's names).
_ITEMSIZE = {
    **dict.fromkeys(("F64", "I64", "U64"), 8),
    **dict.fromkeys(("F32", "I32", "U32"), 4),
    **dict.fromkeys(("F16", "BF16", "I16", "U16"), 2),
    **dict.fromkeys(("I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"), 1),
}


class HFCheckpointError(ValueError):
    """An HF folder whose files cannot hold the model its config.json describes (one line,
    naming the file and what is wrong)."""


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """name -> shape of a safetensors file, once its header parses and the file holds every
    byte the header describes (HFCheckpointError naming the file otherwise)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            raw = f.read(length) if size >= 8 and length <= size - 8 else None
    except OSError as e:
        raise HFCheckpointError(f"{path}: {e.strerror or e}") from None
    if raw is None:
        raise HFCheckpointError(
            f"{path}: not a safetensors file, or truncated ({size:,} bytes; its first "
            f"8 bytes announce a {length:,}-byte header)"
        )
    try:
        header = json.loads(raw)
    except ValueError as e:  # not UTF-8, not JSON
        raise HFCheckpointError(f"{path}: not a safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise HFCheckpointError(f"{path}: not a safetensors file (header is not a JSON object)")
    header.pop("__metadata__", None)
    shapes, end = {}, 0
    for name, info in header.items():
        try:
            shape = tuple(int(n) for n in info["shape"])
            begin, stop = (int(n) for n in info["data_offsets"])
            # A dtype not listed here (a newer safetensors') is not checked for its size.
            itemsize = _ITEMSIZE.get(info["dtype"])
            nbytes = int(np.prod(shape, dtype=np.int64)) * (itemsize or 0)
        except (KeyError, TypeError, ValueError):
            raise HFCheckpointError(f"{path}: tensor {name}: malformed header entry") from None
        if itemsize is not None and stop - begin != nbytes:
            raise HFCheckpointError(
                f"{path}: tensor {name}: {stop - begin:,} bytes for a {info['dtype']} "
                f"tensor of shape {list(shape)} ({nbytes:,} bytes)"
            )
        shapes[name], end = shape, max(end, stop)
    if 8 + length + end > size:
        raise HFCheckpointError(
            f"{path}: truncated ({size:,} bytes; its header describes {8 + length + end:,})"
        )
    return shapes
