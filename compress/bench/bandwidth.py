"""The memory bandwidth of this machine, measured by copying a large tensor (the roof of `compress bench`).

A copy reads every byte of the source and writes every byte of the destination, so it moves
2 x size bytes; the best of a few repetitions is the figure (the others lost time to something
else). It runs with the process's torch threads, the same ones decoding uses.
"""

import time

import torch

from compress.errors import UserError


def copy_bandwidth(nbytes: int = 512 << 20, reps: int = 5, device: str = "cpu") -> float:
    """Bytes per second moved by the fastest of `reps` copies of an `nbytes` tensor on `device`."""
    if nbytes < 4 or reps < 1:
        raise UserError(f"the copy test needs at least 4 bytes and 1 repetition, got {nbytes} bytes, {reps} reps")
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)  # [nbytes / 4], every page touched
    dst = torch.zeros_like(src)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / best


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
