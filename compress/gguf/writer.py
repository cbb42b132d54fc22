"""A GGUF file written as its tensors are produced, staged beside its final path.

A GGUF file starts with its metadata and the name, shape, type and offset of every tensor, so the plan of
all tensors (known from the config before any weight is rounded) is written first; each tensor's bytes then
follow in plan order as its block is finished. The file is built as ".NAME.partial-PID" in the target's
directory and renamed onto the target only when complete: an interrupted run leaves no file at the target.
"""

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from compress.errors import UserError
from compress.quant.gguf_blocks import TYPES


@dataclass(frozen=True)
class Planned:
    name: str
    shape: tuple[int, ...]  # as torch holds it: [rows, row length]
    kind: str  # F32, F16 or a key of gguf_blocks.TYPES

    @property
    def nbytes(self) -> int:
        rows, row = (1, *self.shape)[-2:]
        if self.kind in ("F32", "F16"):
            return rows * row * (4 if self.kind == "F32" else 2)
        t = TYPES[self.kind]
        return rows * row // t.block * t.type_size


def check_output(out: Path, force: bool) -> None:
    """One line, before any work, when ``out`` cannot be the written file."""
    if out.suffix != ".gguf":
        raise UserError(f"-o {out}: a GGUF output is one file; give a path ending in .gguf")
    if not out.parent.is_dir():
        raise UserError(f"-o {out}: the directory {out.parent} does not exist; create it first")
    if out.is_dir():
        raise UserError(f"-o {out} is a directory; give the path of the .gguf file to write")
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to replace it")
    if not os.access(out.parent, os.W_OK):
        raise UserError(f"-o {out}: cannot write in {out.parent}")


@contextmanager
def staged_file(out: Path, force: bool = False):
    """Yield a temporary path in ``out``'s directory that is renamed to ``out`` when the block finishes without error."""
    out = Path(out).expanduser()
    check_output(out, force)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


class GgufFile:
    """``metadata(writer)`` adds the key-value pairs; ``plan`` lists every tensor in the order they will come."""

    def __init__(self, path: Path, arch: str, plan: list[Planned], metadata):
        import gguf

        self.writer = gguf.GGUFWriter(str(path), arch)
        metadata(self.writer)
        for p in plan:
            if p.kind in ("F32", "F16"):
                dtype = np.float32 if p.kind == "F32" else np.float16
                self.writer.add_tensor_info(p.name, list(p.shape), np.dtype(dtype), p.nbytes)
            else:
                rows, row = (1, *p.shape)[-2:]
                byte_shape = [*p.shape[:-1], row // TYPES[p.kind].block * TYPES[p.kind].type_size]
                self.writer.add_tensor_info(p.name, byte_shape, np.dtype(np.uint8), p.nbytes, gguf.GGMLQuantizationType(TYPES[p.kind].ggml))
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_ti_data_to_file()
        self.pending = list(plan)

    def write(self, name: str, data: torch.Tensor) -> None:
        """The next planned tensor's bytes: float data as its F32/F16 values, quantized data as uint8 rows."""
        expected = self.pending.pop(0)
        if expected.name != name:
            raise RuntimeError(f"GGUF tensors out of plan order: got {name}, expected {expected.name}")
        dtype = {"F32": torch.float32, "F16": torch.float16}.get(expected.kind, torch.uint8)
        self.writer.write_tensor_data(data.detach().to("cpu", dtype).contiguous().numpy())

    def close(self) -> None:
        if self.pending:
            raise RuntimeError(f"GGUF file closed with {len(self.pending)} tensors unwritten (first: {self.pending[0].name})")
        self.writer.close()
