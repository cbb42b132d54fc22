"""What one timing pass of a group of the CPU path's Linears runs (``kernel_choice`` times the passes): each
candidate kernel over the group's own weights, as many distinct ones as a step would stream, at a row count.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from compress.kernels import linear_cpu, panel_cpu
from compress.runtime.cpu_linears import Group
from compress.runtime.cpu_modules import CpuLinear
from compress.runtime.kernel_choice import C, PANEL, TORCH

# A timing pass streams at least this many fp32-equivalent weight bytes where they fit (distinct
# weights, past any L2, as a step streams them), and does at most PASS_FLOPS of work, cutting a large
# weight to its first output rows (never fewer than SLICE_MIN): about 1 ms a pass either way.
ROTATION_BYTES = 32 << 20
PASS_FLOPS = 5e7
SLICE_MIN = 256


def rotation(items: list, out_features: int, in_features: int, rows: int, cut: Callable) -> list:
    """The weights one timing pass runs over (see ROTATION_BYTES), each cut to its first rows by cut(item, rows)."""
    row_flops, row_bytes = 2 * rows * in_features, 4 * in_features  # per output row of one weight
    keep = min(out_features, max(SLICE_MIN, int(min(PASS_FLOPS / row_flops, ROTATION_BYTES / row_bytes))))
    count = min(len(items), -(-ROTATION_BYTES // (keep * row_bytes)), max(1, int(PASS_FLOPS // (keep * row_flops))))
    return [cut(item, keep) for item in items[:count]]


def candidates(group: Group, rows: int) -> dict[str, Callable[[], object]]:
    """The C kernel, the panel GEMM and torch's (over the dequantized scratch, for held weights), each a pass
    over the group's weights (see rotation) at `rows` rows."""
    first = group.modules[0]
    out_features, in_features = first.out_features, first.in_features
    x = torch.randn(rows, in_features)
    if isinstance(first, CpuLinear):
        weights = rotation([m.weight.detach() for m in group.modules], out_features, in_features, rows, lambda w, k: w[:k])
        runs = {C: lambda: [linear_cpu.unchecked(x, w) for w in weights], TORCH: lambda: [F.linear(x, w) for w in weights]}
        if panel_cpu.load() is not None:  # no panel GEMM where its library did not build
            runs[PANEL] = lambda: [panel_cpu.unchecked(x, w) for w in weights]
        return runs
    packs = rotation([m.packed for m in group.modules], out_features, in_features, rows, lambda p, k: tuple(t[:k] for t in p))
    scratch = torch.empty(packs[0][0].shape[0] * in_features)
    runs = {C: lambda: [first.kernel(x, p) for p in packs],
            TORCH: lambda: [F.linear(x, first.dequantize(first.untiled(p), scratch)) for p in packs]}
    if first.panel_ready:
        runs[PANEL] = lambda: [first.panel(x, first.untiled(p)) for p in packs]
    return runs
