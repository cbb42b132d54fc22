"""LLM.int8 with static outlier dims on CPU (``reference.int8_outlier_matmul``'s contract): x rounded to int8 per
token (or per token and block of ``act_group`` inputs) as the reference rounds it, then x as rounded times the int8
weight by ``int8_rows_cpu``'s C kernels, which widen the codes in registers. Imports only torch, the standard
library and the shared checks (torch and triton).

Why: the reference either multiplies int8 by int8 with ``torch._int_mm`` (one step per token; on a 2-core Xeon
3.5x slower than this for one 14336 x 4096 row, 1.6-3x for 8-512 rows) or, with steps per block, widens the
whole weight to fp32 on every call (4x its bytes as a temporary: 235 MB for 14336 x 4096; 6-23x slower than this
at 1-8 rows). docs/results/quality.md has the timings.
"""

import torch

from compress.kernels import int8_rows_cpu
from compress.kernels.reference import int8_epilogue, quantize_per_token_int8

PANEL_ROWS = 32  # from this many rows on the panel GEMM beat the row kernel on every measured shape


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
    xq, xs = quantize_per_token_int8(rest.reshape(-1, act_group or shape[-1]))  # [M * I/G, G] int8, [M * I/G, 1]
    xd = (xq.float() * xs).view(x2.shape)  # [M, I]: x as rounded
    packed = (weight.contiguous(), weight_scale.float().view(-1).contiguous())  # [O, I] int8, [O] fp32
    run = int8_rows_cpu.panel if x2.shape[0] >= PANEL_ROWS else int8_rows_cpu.unchecked
    y = run(xd, packed)  # [M, O] fp32
    return int8_epilogue(y, x2, idx, outlier_weight, bias, shape)
