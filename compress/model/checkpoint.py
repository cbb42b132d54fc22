"""Checkpoint: the tensors of a safetensors checkpoint (one file, or shards named by
``model.safetensors.index.json``), read one at a time.

Each tensor is read with one positioned read into its own buffer. Memory-mapping a shard would
count every page touched in the process's RSS until the map is closed (a 5 GB shard read whole
shows as 5 GB), so reading a block at a time would still look like holding the model.
"""

import json
import os
import struct
from pathlib import Path

import torch

from compress.errors import UserError

INDEX = "model.safetensors.index.json"
FP8 = getattr(torch, "float8_e4m3fn", None)  # absent from old torch builds
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
} | ({"F8_E4M3": FP8} if FP8 is not None else {})
MAX_HEADER = 100 * 2**20  # safetensors' own limit


def read_header(path: Path) -> tuple[dict, int]:
    """(tensor name -> {dtype, shape, data_offsets}, offset of the data) of one .safetensors file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < n <= min(MAX_HEADER, size - 8):
            raise UserError(f"{path} is not a readable safetensors file (truncated or corrupt header); re-download or re-export it")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path} has a corrupt safetensors header ({e.msg if hasattr(e, 'msg') else e}); re-download or re-export it") from e
    header.pop("__metadata__", None)
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if 8 + n + end > size:
        raise UserError(f"{path} is truncated ({size} bytes, its header needs {8 + n + end}); re-download or re-export it")
    return header, 8 + n


def shard_files(model_dir: Path) -> list[Path]:
    """The checkpoint's .safetensors files: the index's shards if there is one, else every file."""
    index = model_dir / INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise UserError(f"{index} is not a valid safetensors index ({e}); re-download the checkpoint") from e
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise UserError(f"{index} names {len(missing)} shard(s) that are missing, e.g. {missing[0]}; re-download the checkpoint")
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    if list(model_dir.glob("*.bin")) or list(model_dir.glob("*.pt")):
        raise UserError(
            f"{model_dir} holds only pickle weights (.bin/.pt), which can run code when loaded; "
            "convert them to safetensors first (e.g. transformers' save_pretrained(safe_serialization=True))"
        )
    raise UserError(f"{model_dir} has no *.safetensors weights")


class Checkpoint:
    """Name -> tensor, read on demand; headers are read (and checked) when it is opened."""

    def __init__(self, model_dir: Path):
        self.dir = Path(model_dir)
        self.entries: dict[str, tuple[Path, int, dict]] = {}  # name -> (file, data start, header entry)
        for path in shard_files(self.dir):
            header, start = read_header(path)
            for name, entry in header.items():
                if entry.get("dtype") not in DTYPES:
                    raise UserError(f"{path}: tensor {name} has dtype {entry.get('dtype')}, which this version does not read")
                self.entries[name] = (path, start, entry)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name][2]["shape"])

    def stored_dtype(self, name: str) -> torch.dtype:
        return DTYPES[self.entries[name][2]["dtype"]]

    def dtype(self) -> torch.dtype:
        """The checkpoint's float dtype: that of the most bytes of 16/32-bit float tensors (fp32 if none)."""
        count: dict[torch.dtype, int] = {}
        for name, (_, _, e) in self.entries.items():
            dt = DTYPES[e["dtype"]]
            if dt in (torch.float32, torch.bfloat16, torch.float16):
                count[dt] = count.get(dt, 0) + e["data_offsets"][1] - e["data_offsets"][0]
        return max(count, key=count.get) if count else torch.float32

    def nbytes(self) -> int:
        return sum(e["data_offsets"][1] - e["data_offsets"][0] for _, _, e in self.entries.values())

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``name`` (a fresh CPU tensor), cast to ``dtype`` if given."""
        if name not in self.entries:
            raise UserError(f"{self.dir} lacks tensor {name}; the checkpoint does not match its config.json")
        path, start, e = self.entries[name]
        lo, hi = e["data_offsets"]
        out = torch.empty(e["shape"], dtype=DTYPES[e["dtype"]])
        buf = out.reshape(-1).view(torch.uint8).numpy() if out.numel() else None
        if buf is not None:
            if buf.nbytes != hi - lo:
                raise UserError(f"{path}: tensor {name} has {hi - lo} bytes for shape {e['shape']}; the file is corrupt")
            got = 0
            with open(path, "rb", buffering=0) as f:
                while got < hi - lo:  # one read returns at most ~2 GiB on Linux: a 152k x 4096 fp32 table needs two
                    n = os.preadv(f.fileno(), [buf[got:]], start + lo + got)
                    if n == 0:
                        raise UserError(f"{path} is truncated at tensor {name}; re-download or re-export it")
                    got += n
        return out if dtype is None or out.dtype == dtype else out.to(dtype)

    def names(self, prefix: str) -> list[str]:
        return [k for k in self.entries if k.startswith(prefix)]
