"""Reading a safetensors checkpoint tensor by tensor into memory the caller already holds.

Why not ``safetensors.safe_open``: it maps the file and hands out a fresh tensor
per name, so loading 65 GB into pinned buffers would touch the file's pages
(resident too while mapped) and allocate each tensor a second time.  The format
is small enough to read directly: an 8-byte little-endian header length, a JSON
header (name -> dtype, shape, [begin, end) byte offsets into the data that
follows), then the data.  A tensor whose stored dtype is the wanted one is read
straight into its destination (``readinto``, no intermediate); another dtype
goes through one temporary tensor, converted on copy.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

#: safetensors' dtype names.
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass(frozen=True)
class Entry:
    """Where one stored tensor lies."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int              # byte offset of its data in the file
    nbytes: int


def read_header(path: Path) -> dict[str, Entry]:
    """Every tensor of one ``.safetensors`` file (metadata left out)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    base = 8 + size
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        if meta["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {meta['dtype']}, which this reader does not know")
        out[name] = Entry(path, DTYPES[meta["dtype"]], tuple(meta["shape"]), base + begin, end - begin)
    return out


class Checkpoint:
    """A checkpoint folder's tensors by name (one ``model.safetensors`` or shards listed in its index)."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        if (folder / INDEX).is_file():
            files = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
        elif (folder / SINGLE).is_file():
            files = [SINGLE]
        else:
            raise FileNotFoundError(f"{folder}: no {SINGLE} and no {INDEX}")
        self.folder = folder
        self.entries: dict[str, Entry] = {}
        for name in files:
            self.entries.update(read_header(folder / name))

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    @property
    def nbytes(self) -> int:
        """Bytes of every stored tensor."""
        return sum(e.nbytes for e in self.entries.values())

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Fill ``out`` (a contiguous CPU tensor of the stored shape) with tensor ``name``, converting its dtype."""
        entry = self.entries.get(name)
        if entry is None:
            raise KeyError(f"{self.folder}: the checkpoint has no tensor {name!r}")
        if tuple(out.shape) != entry.shape:
            raise ValueError(f"{name}: stored shape {entry.shape}, destination {tuple(out.shape)}")
        if out.device.type != "cpu" or not out.is_contiguous():
            raise ValueError(f"{name}: the destination must be a contiguous CPU tensor")
        target = out if out.dtype == entry.dtype else torch.empty(entry.shape, dtype=entry.dtype)
        raw = target.view(-1).view(torch.uint8) if target.numel() else target
        if raw.numel() != entry.nbytes:
            raise ValueError(f"{name}: {entry.nbytes} bytes stored, {raw.numel()} expected")
        with open(entry.file, "rb", buffering=0) as f:
            f.seek(entry.start)
            view = memoryview(raw.numpy())
            while view.nbytes:
                got = f.readinto(view)
                if not got:
                    raise EOFError(f"{entry.file}: tensor {name!r} is cut short")
                view = view[got:]
        if target is not out:
            out.copy_(target)
