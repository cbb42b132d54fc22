"""LLM.int8 with static outlier dims on CPU (``reference.int8_outlier_matmul``'s contract): x rounded to int8 per
token (or per token and block of ``act_group`` inputs) as the reference rounds it, then x as rounded times the int8
weight by ``int8_rows_cpu``'s C kernels, which widen the codes in registers. Imports only torch and its sibling
kernel modules.

Why: the reference copies the whole weight on every call, to float64 for its exact int32 product (one step per
token, beyond 4 rows) or to fp32 (steps per block). On a 2-core Xeon, Llama-3-8B shapes, this is 29-38x faster at 1
row per 32 inputs (3.3x on 1024 x 4096; 14336 x 4096: 94 -> 2.5 ms), 17-25x at 8 rows per token and 0.8-1.2x at 512
rows, with no weight copy (the reference's reached 2 GiB for a 128256 x 4096 output layer): docs/results/speed.md.
"""

import torch

from compress.kernels import int8_rows_cpu
from compress.kernels.reference import int8_epilogue, rounded_int8

PANEL_ROWS = 32  # between 8 rows (the row kernel faster on every shape measured) and 64 (the panel GEMM faster)


def supports(x: torch.Tensor) -> bool:
    """Whether x can run here: on the CPU with the C kernels built."""
    return x.device.type == "cpu" and int8_rows_cpu.load() is not None


def int8_outlier_matmul(x, weight, weight_scale, outlier_idx, outlier_weight, bias=None, act_group: int = 0) -> torch.Tensor:
    """y [..., O] in x's dtype; same contract as ``reference.int8_outlier_matmul`` (the int32 dots there are fp32
    sums here: the same to fp32 rounding)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])  # [M, I]
    idx = outlier_idx.long()
    rest = x2.index_fill(-1, idx, 0)  # [M, I]
    xd = rounded_int8(rest, act_group)  # [M, I]
    packed = (weight.contiguous(), weight_scale.float().view(-1).contiguous())  # [O, I] int8, [O] fp32
    run = int8_rows_cpu.panel if x2.shape[0] >= PANEL_ROWS else int8_rows_cpu.unchecked
    y = run(xd, packed)  # [M, O] fp32
    return int8_epilogue(y, x2, idx, outlier_weight, bias, shape)
