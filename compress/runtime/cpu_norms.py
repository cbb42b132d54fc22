"""The CPU path's small per-layer ops, each choosing per call between a C kernel and torch's ops by the
row count, as measured at engine start (``kernel_choice``, through ``cpu_kernels.choose``):
- RMSNorm (``CpuRMSNorm``, swapped in for every ``RMSNorm``): ``kernels/rms_norm_cpu.py`` or
  ``F.rms_norm``; the two agree to a few units in the last place.
- rotary embedding of q and k (``PagedAttention.rotate``): ``kernels/rope_cpu.py`` or the decoder's
  torch expression; the same numbers bit for bit.
A pass of the timing calls the op enough times for ~64K elements, so that a one-row call (~1-30 us) is
not timed alone.
"""

import torch
import torch.nn.functional as F
from torch import nn

from compress.kernels import rms_norm_cpu, rope_cpu
from compress.model.config import ModelConfig
from compress.model.decoder import RMSNorm
from compress.model.rope import apply_rope
from compress.runtime.kernel_choice import C, TORCH

PASS_ELEMENTS = 1 << 16


def use_c(table: list[bool], rows: int) -> bool:
    """The choice of a Plan's ``table()`` at ``rows`` rows (its last entry beyond it)."""
    return table[rows] if rows < len(table) else table[-1]


class CpuRMSNorm(RMSNorm):
    """An RMSNorm over the same weight that runs the C kernel or torch's per its row count (``use_c[rows]``)."""

    def __init__(self, norm: RMSNorm):
        nn.Module.__init__(self)
        self.weight, self.eps, self.offset = norm.weight, norm.eps, norm.offset
        self.use_c = [False]  # set from the Plan of its width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_c(self.use_c, x.numel() // x.shape[-1]) and rms_norm_cpu.supports(x, self.weight):
            return rms_norm_cpu.rms_norm(x, self.weight, self.eps)
        return super().forward(x)


def swap_norms(model: nn.Module) -> list[CpuRMSNorm]:
    """Replace every RMSNorm of an fp32 model over the hidden width by a CpuRMSNorm (none where the kernel is not
    built). The kernel computes x * w: Gemma's (1 + w) norms, and q/k norms, keep torch's path."""
    if rms_norm_cpu.load() is None:
        return []
    found = [(name, m) for name, m in model.named_modules() if type(m) is RMSNorm and m.weight.dtype == torch.float32
             and not m.offset and not name.endswith(("q_norm", "k_norm"))]
    swapped = []
    for name, norm in found:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, cpu_norm := CpuRMSNorm(norm))
        swapped.append(cpu_norm)
    return swapped


def repeated(fn, elements: int):
    """fn called enough times for PASS_ELEMENTS elements: one timing pass."""
    times = max(1, PASS_ELEMENTS // max(elements, 1))

    def run():
        for _ in range(times):
            fn()
    return run


def norm_op(width: int) -> str:
    return f"rms_norm {width}"


def norm_candidates(width: int, rows: int) -> dict:
    x, w = torch.randn(rows, width), torch.rand(width) + 0.5
    return {C: repeated(lambda: rms_norm_cpu.rms_norm(x, w, 1e-5), rows * width),
            TORCH: repeated(lambda: F.rms_norm(x, (width,), w, 1e-5), rows * width)}


def rope_op(cfg: ModelConfig) -> str:
    return f"rope {cfg.num_heads}x{cfg.num_kv_heads}x{cfg.head_dim}"


def rope_candidates(cfg: ModelConfig, rows: int) -> dict:
    """q and k of one layer at ``rows`` tokens, through the C kernel and through torch's expression."""
    q, k = torch.randn(1, rows, cfg.num_heads, cfg.head_dim), torch.randn(1, rows, cfg.num_kv_heads, cfg.head_dim)
    cos, sin = torch.rand(1, rows, cfg.head_dim), torch.rand(1, rows, cfg.head_dim)
    elements = q.numel() + k.numel()
    return {C: repeated(lambda: (rope_cpu.rope(q, cos, sin), rope_cpu.rope(k, cos, sin)), elements),
            TORCH: repeated(lambda: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)), elements)}
