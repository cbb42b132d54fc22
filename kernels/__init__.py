"""Compute kernels, installed as ``compress.kernels``.

Each op runs a Triton kernel on CUDA tensors and the plain-torch reference (``reference.py``)
everywhere else, so the CPU runtime runs the same code path end to end; three exceptions: fp32 paged
attention on CPU runs a small C kernel (``paged_attention_cpu.py``) where the machine's C compiler
builds it, LLM.int8 on CPU multiplies x as the reference rounds it by the int8 codes in C
(``int8_outlier_cpu.py``), and int4 (any width dividing 32) is unpacked by word arithmetic
(``packed_words.py``, ~8x the reference's bit planes, the same numbers). Layouts: docs/kernels.md.

Three kernel modules share their op's name (``dequant_matmul``, ``fp8_matmul``,
``paged_attention``). Python binds a submodule as an attribute of its package when the submodule
is first imported, so they are imported here, before the ops below rebind those names; the ops
call into them through the module objects.
"""

import torch

from compress.kernels import dequant_matmul as _dequant_matmul_kernel
from compress.kernels import fp8_matmul as _fp8_matmul_kernel
from compress.kernels import fused_moe as _fused_moe_kernel
from compress.kernels import int8_matmul as _int8_matmul_kernel
from compress.kernels import paged_attention as _paged_attention_kernel
from compress.kernels import int8_outlier_cpu, packed_words, paged_attention_cpu
from compress.kernels import reference

__all__ = ["dequant_matmul", "dequantize_packed", "fp8_matmul", "fused_moe_int4", "int8_outlier_matmul", "paged_attention"]

# From this many rows on, dequantizing W once and running the dense GEMM beats the fused kernel
# (the rule vLLM's AWQ uses): the fused one redoes the dequantization for every tile of rows.
DEQUANT_GEMM_MIN_ROWS = 256


def fused_dequant(x: torch.Tensor) -> bool:
    """Whether dequant_matmul runs the fused Triton kernel on x [..., I]: CUDA and fewer rows than DEQUANT_GEMM_MIN_ROWS."""
    return x.is_cuda and x.numel() < DEQUANT_GEMM_MIN_ROWS * x.shape[-1]


def dequant_matmul(x: torch.Tensor, packed, scale, zero_packed, bits: int, bias: torch.Tensor | None = None):
    """y [..., O] = x [..., I] @ dequant(W)^T (+ bias) for pack-quantized int4/int3 W."""
    if fused_dequant(x):
        op = _dequant_matmul_kernel.dequant_matmul
    else:
        op = packed_words.dequant_matmul if packed_words.supports(bits) else reference.dequant_matmul
    return op(x, packed, scale, zero_packed, bits, bias)


def dequantize_packed(packed: torch.Tensor, scale, zero_packed, bits: int, in_features: int) -> torch.Tensor:
    """The weight [O, I] of pack-quantized int4/int3 W, in scale's dtype."""
    op = packed_words.dequantize_packed if packed_words.supports(bits) else reference.dequantize_packed
    return op(packed, scale, zero_packed, bits, in_features)


def int8_outlier_matmul(x: torch.Tensor, weight, weight_scale, outlier_idx, outlier_weight, bias=None, act_group: int = 0):
    """y [..., O]: LLM.int8 with static outlier dims (int8 weight + fp outlier columns); act_group: x's int8 steps per
    token and block of that many inputs (0: one per token)."""
    if x.is_cuda:
        op = _int8_matmul_kernel.int8_outlier_matmul
    else:
        op = int8_outlier_cpu.int8_outlier_matmul if int8_outlier_cpu.supports(x) else reference.int8_outlier_matmul
    return op(x, weight, weight_scale, outlier_idx, outlier_weight, bias, act_group)


def fp8_matmul(x: torch.Tensor, weight, weight_scale, bias=None, input_scale=None):
    """y [..., O]: e4m3 weight x e4m3 activations (per token, or per tensor with input_scale)."""
    op = _fp8_matmul_kernel.fp8_matmul if x.is_cuda else reference.fp8_matmul
    return op(x, weight, weight_scale, bias, input_scale)


def fused_moe_int4(x: torch.Tensor, gate_up: tuple, down: tuple, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
    """out [T, C]: each token's top-k int4 experts' silu-gated MLPs, weighted and summed (layout: kernels/fused_moe.py)."""
    op = _fused_moe_kernel.fused_moe_int4 if x.is_cuda else reference.fused_moe_int4
    return op(x, gate_up, down, topk_ids, topk_weights)


def paged_attention(q: torch.Tensor, k_cache, v_cache, block_tables, context_lens, scale: float | None = None,
                    softcap: float | None = None, window: int | None = None):
    """[S, H, D] decode attention over a paged KV cache, its scores soft-capped by ``softcap`` and each sequence
    reading its last ``window`` tokens only (None: none, all of them)."""
    if q.is_cuda:
        op = _paged_attention_kernel.paged_attention
    else:
        op = paged_attention_cpu.paged_attention if paged_attention_cpu.supports(q) else reference.paged_attention
    return op(q, k_cache, v_cache, block_tables, context_lens, scale, softcap, window)
