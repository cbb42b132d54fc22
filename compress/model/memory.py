"""Will it fit? What a lazy model needs in memory for a job, checked before the job starts.

The estimates count the tensors a job holds at once (from the checkpoint's shapes and dtypes,
nothing is read) and are meant to refuse what cannot work in one line, instead of the OOM killer
ending the process halfway; they are not a promise that what passes fits.
"""

import psutil
import torch

from compress.errors import UserError
from compress.model import lazy
from compress.model.decoder import Decoder

GIB = 2**30


def available(device: torch.device) -> tuple[int, str]:
    """(bytes free for tensors, where) on ``device``."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], "the GPU has"
    return psutil.virtual_memory().available, "this machine has"


def tensor_bytes(model: Decoder, prefix: str, dtype: torch.dtype | None) -> int:
    """Bytes of the part ``prefix`` once materialized as ``dtype`` (None: as stored)."""
    total = 0
    for name in model.checkpoint.names(prefix):
        stored = model.checkpoint.stored_dtype(name)
        size = stored.itemsize
        if dtype is not None and not lazy.keeps_dtype(name, stored):
            size = dtype.itemsize
        total += size * torch.Size(model.checkpoint.shape(name)).numel()
    return total


def model_bytes(model: Decoder, dtype: torch.dtype) -> int:
    """The whole model as lazy.materialize_all reads it for ``dtype``."""
    return sum(tensor_bytes(model, part + ".", lazy.part_dtype(model, part, dtype)) for part in lazy.top_parts(model))


def block_bytes(model: Decoder, dtype: torch.dtype) -> int:
    return max(tensor_bytes(model, f"model.layers.{i}.", dtype) for i in range(model.cfg.num_layers))


def require(need: int, device: torch.device, what: str, hint: str) -> None:
    """One line, before any work, when ``need`` bytes are more than ``device`` has free."""
    free, where = available(device)
    if need > free:
        raise UserError(f"{what} needs about {need / GIB:.1f} GiB; {where} {free / GIB:.1f} GiB available: {hint}")
