"""Fused mixture-of-experts MLP over int4 group-quantized experts (vLLM's fused_moe, small). Imports only torch and triton.

out [T, C] = sum_k w[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, k], with every
expert's weights in dequant_matmul's int4 pack-quantized layout, stacked over the E experts:

* gate_up: packed int32 [E, 2I, C/8], scale [E, 2I, C/g], zero int32 [E, 2I/8, C/g] or None;
  rows 0..I-1 are gate, I..2I-1 up (the order of transformers' fused ``gate_up_proj``).
* down: packed int32 [E, C, I/8], scale [E, C, I/g], zero int32 [E, C/8, I/g] or None.

The T*K (token, k) pairs, "slots" s = t*K + k, are sorted by expert and each expert's run is padded
to a multiple of BLOCK_M with the sentinel S = T*K (:func:`align`, vLLM's moe_align_block_size, here
in torch), so every BLOCK_M rows of the sorted list belong to one expert. Then two launches of one
grouped dequant-GEMM cover all experts, one program per (BLOCK_N columns, BLOCK_M sorted slots):

1. gate/up: rows x[s // K]; two accumulators, gate rows n and up rows I + n of the block's expert;
   stores silu(gate) * up to h [S, I] in x's dtype.
2. down: rows h[s]; the accumulator times w[s], stored fp32 to [S, C]; a token's K slots are
   summed after, in torch (deterministic, no atomics).

Padded slots load zero rows and store nothing; an expert no token chose has no blocks, so its
weights are never read. Accumulation is fp32; weights are dequantized as dequant_matmul does.
"""

import math

import torch
import triton
import triton.language as tl

from compress.kernels.checks import FLOAT_DTYPES, check_device, check_dtype, check_shape, dot_operands, interpreting
from compress.kernels.dequant_matmul import _dequant_tile


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, s_ptr, z_ptr, c_ptr, slots_ptr, block_expert_ptr, weights_ptr,
    num_slots, N, K,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_ze, stride_zw, stride_cm,
    SLOTS_PER_ROW: tl.constexpr, GATED: tl.constexpr, ROUTED: tl.constexpr, GROUP: tl.constexpr,
    HAS_ZERO: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]: num_slots marks padding
    s_ok = slot < num_slots
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    w_ptr, s_ptr, z_ptr = w_ptr + expert * stride_we, s_ptr + expert * stride_se, z_ptr + expert * stride_ze
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    n_ok = rn < N
    a_rows = a_ptr + (slot // SLOTS_PER_ROW)[:, None] * stride_am  # [BM, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)  # used only when GATED
    for t in range(0, K // BLOCK_K):
        k = t * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
        a = tl.load(a_rows + k[None, :], mask=s_ok[:, None], other=0.0).to(DOT_DTYPE)  # [BM, BK]
        group = (t * BLOCK_K) // GROUP
        w = _dequant_tile(w_ptr, s_ptr, z_ptr, rn, n_ok, k, group, stride_wn, stride_sn, stride_zw,
                          4, HAS_ZERO, BLOCK_N, a_ptr.dtype.element_ty)  # [BK, BN]
        acc = tl.dot(a, w.to(DOT_DTYPE), acc, input_precision=PRECISION)
        if GATED:  # the up rows sit N rows below the gate rows
            u = _dequant_tile(w_ptr, s_ptr, z_ptr, rn + N, n_ok, k, group, stride_wn, stride_sn, stride_zw,
                              4, HAS_ZERO, BLOCK_N, a_ptr.dtype.element_ty)  # [BK, BN]
            acc_up = tl.dot(a, u.to(DOT_DTYPE), acc_up, input_precision=PRECISION)
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up  # silu(gate) * up
    if ROUTED:
        acc = acc * tl.load(weights_ptr + slot, mask=s_ok, other=0.0)[:, None]
    c_ptrs = c_ptr + slot[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=s_ok[:, None] & n_ok[None, :])


def _configs() -> list[triton.Config]:
    """BLOCK_N (BLOCK_M is fixed by the alignment, before launch); one small config under the interpreter."""
    if interpreting():
        return [triton.Config({"BLOCK_N": 32})]
    return [triton.Config({"BLOCK_N": bn}, num_warps=4, num_stages=3) for bn in (32, 64, 128)]


_moe_gemm = triton.autotune(configs=_configs(), key=["N", "K", "GATED", "BLOCK_M"])(_moe_gemm_kernel)


def block_m(num_slots: int, experts: int) -> int:
    """Rows of a program's tile: 16 while experts see few slots each (decode), 64 from 32 slots per expert on."""
    return 64 if num_slots >= 32 * experts else 16


def align(topk_ids: torch.Tensor, experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [P] int32, block_expert [P / block] int32): slots s = t*K + k sorted by expert, each expert's
    run padded to a multiple of ``block`` with the sentinel T*K; block_expert[b] is the expert of rows b*block.."""
    flat = topk_ids.flatten()  # [S]
    n = flat.numel()
    if n and (flat.min() < 0 or flat.max() >= experts):
        raise ValueError(f"topk_ids must lie in [0, {experts}), got [{flat.min().item()}, {flat.max().item()}]")
    counts = torch.bincount(flat, minlength=experts)  # [E]
    padded = (counts + block - 1) // block * block  # [E]
    order = flat.argsort(stable=True)  # [S] slots by expert
    expert = flat[order]  # [S]
    rank = torch.arange(n, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert]  # [S] place in its expert's run
    slots = torch.full((int(padded.sum()),), n, dtype=torch.int32, device=flat.device)
    slots[(torch.cumsum(padded, 0) - padded)[expert] + rank] = order.to(torch.int32)
    block_expert = torch.repeat_interleave(torch.arange(experts, dtype=torch.int32, device=flat.device), padded // block)
    return slots, block_expert


def _check_experts(name: str, weight: tuple, experts: int | None, out_features: int, in_features: int) -> int:
    """One (packed, scale, zero) stack of E int4 weights [out_features, in_features]; returns the group size."""
    packed, scale, zero = weight
    check_dtype(f"{name} packed", packed, (torch.int32,))
    check_dtype(f"{name} scale", scale, FLOAT_DTYPES)
    if scale.dim() != 3 or scale.shape[1] != out_features or (experts is not None and scale.shape[0] != experts):
        raise ValueError(f"{name} scale must be [experts, {out_features}, groups], got {list(scale.shape)}")
    experts, groups = scale.shape[0], scale.shape[2]
    if not groups or in_features % groups or (in_features // groups) % 16:
        raise ValueError(f"{name}: in_features {in_features} / {groups} groups must give a group size that is a multiple of 16")
    check_shape(f"{name} packed", packed, (experts, out_features, in_features // 8))
    if zero is not None:
        check_dtype(f"{name} zero", zero, (torch.int32,))
        check_shape(f"{name} zero", zero, (experts, math.ceil(out_features / 8), groups))
    return in_features // groups


def _check(x, gate_up, down, topk_ids, topk_weights) -> tuple[int, int]:
    """The contract of the module docstring; returns (group of gate_up, group of down)."""
    check_dtype("x", x, FLOAT_DTYPES)
    if x.dim() != 2 or gate_up[1].dim() != 3 or gate_up[1].shape[1] % 2:
        raise ValueError(f"x must be [T, C] and gate_up scale [E, 2I, groups], got {list(x.shape)}, {list(gate_up[1].shape)}")
    (tokens, hidden), (experts, width) = x.shape, (gate_up[1].shape[0], gate_up[1].shape[1] // 2)
    groups = (_check_experts("gate_up", gate_up, None, 2 * width, hidden), _check_experts("down", down, experts, hidden, width))
    check_dtype("topk_ids", topk_ids, (torch.int32, torch.int64))
    check_dtype("topk_weights", topk_weights, (torch.float32,))
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens:
        raise ValueError(f"topk_ids must be [{tokens}, top_k], got {list(topk_ids.shape)}")
    check_shape("topk_weights", topk_weights, tuple(topk_ids.shape))
    names = [f"{w}_{part}" for w in ("gate_up", "down") for part in ("packed", "scale", "zero")]
    check_device(x=x, topk_ids=topk_ids, topk_weights=topk_weights, **dict(zip(names, (*gate_up, *down))))
    return groups


def _launch(a, weight, c, slots, block_expert, topk_weights, group, block, slots_per_row, gated):
    """c [S, N] over the sorted slots, N = c's columns, from a's rows and the stacked weights."""
    packed, scale, zero = (t.contiguous() if t is not None else None for t in weight)
    z = packed if zero is None else zero  # unread when symmetric
    n, k = c.shape[1], a.shape[1]
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), block_expert.numel())  # noqa: E731
    _moe_gemm[grid](
        a, packed, scale, z, c, slots, block_expert, topk_weights,
        c.shape[0], n, k,
        a.stride(0), packed.stride(0), packed.stride(1), scale.stride(0), scale.stride(1), z.stride(0), z.stride(1), c.stride(0),
        SLOTS_PER_ROW=slots_per_row, GATED=gated, ROUTED=not gated, GROUP=group, HAS_ZERO=zero is not None,
        BLOCK_K=math.gcd(group, 64), BLOCK_M=block, **dot_operands(a.dtype),
    )


def fused_moe_int4(x, gate_up: tuple, down: tuple, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """out [T, C] in x's dtype; the same contract as ``reference.fused_moe_int4``."""
    group_up, group_down = _check(x, gate_up, down, topk_ids, topk_weights)
    (tokens, hidden), (experts, width), top_k = x.shape, (gate_up[1].shape[0], gate_up[1].shape[1] // 2), topk_ids.shape[1]
    if tokens == 0:
        return torch.zeros_like(x)
    block = block_m(tokens * top_k, experts)
    slots, block_expert = align(topk_ids, experts, block)  # [P], [P / block]
    x, weights = x.contiguous(), topk_weights.contiguous().view(-1)  # [T, C], [S]
    h = torch.empty(tokens * top_k, width, dtype=x.dtype, device=x.device)  # [S, I]: silu(gate) * up per slot
    _launch(x, gate_up, h, slots, block_expert, weights, group_up, block, top_k, gated=True)
    y = torch.empty(tokens * top_k, hidden, dtype=torch.float32, device=x.device)  # [S, C]: weighted down per slot
    _launch(h, down, y, slots, block_expert, weights, group_down, block, 1, gated=False)
    return y.view(tokens, top_k, hidden).sum(1).to(x.dtype)
