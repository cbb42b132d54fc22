"""ShardWriter: write tensors into sharded safetensors as they are produced.

A safetensors file starts with a header naming every tensor it holds, so a shard cannot be
written before it is full. Tensors are appended to a raw data file as they come (each freed
by the caller after ``add``); when a shard reaches ``max_bytes`` its header is written and the
data copied behind it (on disk, in chunks). Memory stays at what the caller holds, not a shard.
Shards are named as transformers names them: ``model.safetensors`` when there is one, else
``model-0000i-of-0000N.safetensors`` with ``model.safetensors.index.json``.
"""

import json
import shutil
import struct
from pathlib import Path

import torch

from compress.model.checkpoint import DTYPES, INDEX

MAX_SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size ("5GB")
NAMES = {v: k for k, v in DTYPES.items()}
ALIGN = 8  # tensor data starts 8-byte aligned, as the safetensors writer pads it


class ShardWriter:
    def __init__(self, out_dir: Path, max_bytes: int | None = None):
        self.dir, self.max_bytes = Path(out_dir), max_bytes or MAX_SHARD_BYTES
        self.shards: list[dict[str, dict]] = []  # per finished shard: its header
        self.header: dict[str, dict] = {}
        self.size = 0
        self.data = None

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        """Append ``tensors`` (name -> tensor, any device) to the current shard."""
        for name, t in tensors.items():
            t = t.detach().to("cpu").contiguous()
            nbytes = t.numel() * t.element_size()
            if self.header and self.size + nbytes > self.max_bytes:
                self._finish_shard()
            if self.data is None:
                self.data = open(self._part(len(self.shards)) + ".data", "wb")
            if t.numel():
                self.data.write(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself: no copy
            self.header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [self.size, self.size + nbytes]}
            self.size += nbytes

    def _part(self, i: int) -> str:
        return str(self.dir / f".shard-{i}")

    def _finish_shard(self) -> None:
        self.data.close()
        self.data = None
        part = self._part(len(self.shards))
        head = json.dumps({"__metadata__": {"format": "pt"}, **self.header}, separators=(",", ":")).encode()
        head += b" " * (-len(head) % ALIGN)
        with open(part, "wb") as out, open(part + ".data", "rb") as data:
            out.write(struct.pack("<Q", len(head)) + head)
            shutil.copyfileobj(data, out, 64 * 2**20)
        Path(part + ".data").unlink()
        self.shards.append(self.header)
        self.header, self.size = {}, 0

    def close(self) -> list[Path]:
        """Finish the last shard, give the shards their final names, write the index (several shards)."""
        if self.header or not self.shards:
            if self.data is None:
                self.data = open(self._part(len(self.shards)) + ".data", "wb")
            self._finish_shard()
        n = len(self.shards)
        names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for i, name in enumerate(names):
            Path(self._part(i)).rename(self.dir / name)
        if n > 1:
            weight_map = {t: name for name, header in zip(names, self.shards) for t in header}
            total = sum(e["data_offsets"][1] - e["data_offsets"][0] for h in self.shards for e in h.values())
            (self.dir / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        return [self.dir / name for name in names]
