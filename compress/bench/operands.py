"""Random operands in each kernel's stored layout, for the kernel benchmarks (plain torch, no Triton)."""

import math

import torch

GROUP, OUTLIERS = 128, 16


def int_operands(o: int, i: int, bits: int, device):
    """(packed [O, I*b/32], scale [O, I/g], zero [O*b/32, I/g]): random words, fp16 scales."""
    group = min(GROUP, i)
    packed = torch.randint(-(2**31), 2**31 - 1, (o, math.ceil(i * bits / 32)), dtype=torch.int32, device=device)
    scale = torch.rand(o, i // group, device=device, dtype=torch.float16) * 0.01
    zero = torch.randint(-(2**31), 2**31 - 1, (math.ceil(o * bits / 32), i // group), dtype=torch.int32, device=device)
    return packed, scale, zero


def int8_operands(o: int, i: int, device, dtype) -> tuple:
    """(codes int8 [O, I] with the OUTLIERS columns zero, as the format stores them; row scales [O, 1] in dtype;
    outlier dims int32 [k]; outlier columns fp16 [O, k])."""
    idx = torch.arange(OUTLIERS, dtype=torch.int32, device=device) * (i // OUTLIERS)  # [k]
    w8 = torch.randint(-127, 128, (o, i), dtype=torch.int8, device=device).index_fill_(1, idx.long(), 0)
    s8 = (torch.rand(o, 1, device=device) * 0.01).to(dtype)
    return w8, s8, idx, torch.randn(o, OUTLIERS, device=device, dtype=torch.float16)
