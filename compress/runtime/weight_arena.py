"""The CPU path's held weights (every ``HeldLinear``'s codes, scales and offsets) moved into one buffer that Linux backs
with transparent huge pages, where the kernel offers them (``/sys/kernel/mm/transparent_hugepage/enabled`` "always"
or "madvise", the usual defaults): ``madvise(MADV_HUGEPAGE)`` over the buffer before any of it is written.

Why: a decode step streams every weight once; on 4 KiB pages the hardware prefetchers stop at every page boundary and
each page costs a TLB entry, where one 2 MiB page covers 512 of them (llama.cpp's mmap of a GGUF gets the same where
the file system hands out large folios). SmolLM2's int8 lm_head (27 MiB) read cold at one row: 1.57 -> 1.35 ms a
call; a whole Q4_0 decode step 0.3-10 % faster at the best of 16 interleaved runs, 3.5-8 % at their median
(docs/results/gguf.md, "An AVX2-only build").

Each old tensor is released as its copy is made and the heap is trimmed every TRIM_EVERY bytes (freed tensors below
malloc's mmap threshold otherwise stay resident), so the peak is the model plus its largest held tensor plus
TRIM_EVERY; pages of the buffer are only made resident as they are written. A 1.1B-shaped AWQ int4 checkpoint's engine
(520 MiB held): peak RSS 1,939-2,025 MiB against 1,951-1,954 without the move, 2,155 before the trims were added
(docs/results/scale.md, "Huge pages for the held weights").
"""

import ctypes
import sys
from pathlib import Path

import torch
from torch import nn

from compress.runtime.cpu_modules import HeldLinear

PAGE = 2 << 20  # a transparent huge page on x86-64 (and arm64 with 4 KiB base pages)
ALIGN = 64  # every tensor starts on a cache line of its own
MADV_HUGEPAGE = 14
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
TRIM_EVERY = 64 << 20  # bytes copied between trims of the heap: bounds what freed tensors keep resident


def offered() -> bool:
    """Whether madvise can ask for huge pages here: Linux with transparent huge pages not switched off."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return "[never]" not in THP.read_text()
    except OSError:
        return False


def advise(address: int, length: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), MADV_HUGEPAGE) == 0


def trim() -> None:
    """Hand the heap's free memory back to the OS (glibc): the old tensors below malloc's mmap threshold are freed
    into the heap, which keeps them resident beside their copies unless trimmed."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(ctypes.c_size_t(0))


def gather(model: nn.Module) -> int:
    """Move the held Linears' tensors, in module order, into one huge-page buffer; the bytes moved (0 where the host
    offers no huge pages, or they are less than one page)."""
    held = [(m, name) for m in model.modules() if isinstance(m, HeldLinear) for name in m.names if getattr(m, name).nbytes]
    sizes = [-(-getattr(m, name).nbytes // ALIGN) * ALIGN for m, name in held]
    total = sum(sizes)
    if total < PAGE or not offered():
        return 0
    buffer = torch.empty(total + 2 * PAGE, dtype=torch.uint8)  # untouched: none of it is resident yet
    at = -buffer.data_ptr() % PAGE
    if not advise(buffer.data_ptr() + at, -(-total // PAGE) * PAGE):
        return 0
    since_trim = 0
    for (m, name), size in zip(held, sizes):
        old = getattr(m, name)
        new = buffer[at:at + old.nbytes].view(old.dtype).view(old.shape)
        new.copy_(old)
        setattr(m, name, new)  # a registered buffer: the module now holds the view, the old tensor is freed
        del old
        at, since_trim = at + size, since_trim + size
        if since_trim >= TRIM_EVERY:
            trim()
            since_trim = 0
    trim()
    return total
