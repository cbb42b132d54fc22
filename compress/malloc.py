"""Let memory freed by tensors go back to the OS (glibc), so peak RSS is what is live, not what was."""

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
THRESHOLD = 4 * 2**20  # 64 KiB gave fresh mappings to decode activations too: fp32 batch 32 was 7 % slower
# Quantization frees many tensors below 4 MiB (a MoE layer's 128 experts: 3 MiB bf16 each as read, their codes
# 1.5 MiB): from the heap they fragmented it and stayed in RSS (Qwen3-30B-A3B's first 8 layers, RTN: 7.05 GiB
# peak; 3.44 GiB at this threshold, and 2x faster). No decode loop runs there, so a low threshold costs nothing.
QUANTIZE_THRESHOLD = 256 * 2**10


def return_freed_memory(threshold: int = THRESHOLD) -> None:
    """Fix glibc's mmap threshold. By default glibc raises it each time a large block is freed (up to
    32 MiB); blocks below it then come from the heap, and freed ones stay in RSS. Reading a model tensor
    by tensor frees thousands of such blocks (an 8B int4 engine peaked at 8.6 GiB; 7.0 with this).
    With a fixed threshold each tensor above it has its own mapping, unmapped when freed. No-op off glibc."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return
    mallopt = getattr(libc, "mallopt", None)  # musl has none
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, threshold)
