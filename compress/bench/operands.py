"""Random operands in each kernel's stored layout, for the kernel benchmarks (plain torch, no Triton)."""

import math

import torch

GROUP, OUTLIERS, BLOCK_SIZE = 128, 16, 16  # BLOCK_SIZE: tokens per paged-cache block


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


def attention_operands(seqs: int, context: int, heads: int, kv_heads: int, dim: int, device):
    """A paged cache whose blocks are shuffled, and the same keys/values as dense [S, KVH, T, D]."""
    per_seq = -(-context // BLOCK_SIZE)
    k_cache = torch.randn(seqs * per_seq, BLOCK_SIZE, kv_heads, dim, device=device, dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(seqs * per_seq, device=device).view(seqs, per_seq).int()  # [S, blocks]
    dense = lambda c: c[tables.long()].flatten(1, 2)[:, :context].transpose(1, 2)  # noqa: E731
    q = torch.randn(seqs, heads, dim, device=device, dtype=torch.float16)  # [S, H, D]
    lens = torch.full((seqs,), context, dtype=torch.int32, device=device)
    return (q, k_cache, v_cache, tables, lens), dense(k_cache), dense(v_cache)


def moe_operands(experts: int, o: int, i: int, device):
    """(packed [E, O, I/8], scale [E, O, I/g], zero [E, O/8, I/g]): random words, fp16 scales."""
    group = min(GROUP, i)
    words = lambda *shape: torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, device=device)  # noqa: E731
    scale = torch.rand(experts, o, i // group, device=device, dtype=torch.float16) * 0.01
    return words(experts, o, i // 8), scale, words(experts, o // 8, i // group)
