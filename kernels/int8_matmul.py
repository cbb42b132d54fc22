"""LLM.int8 matmul with static outlier dims, in one launch. Imports only torch and triton.

Layout (the int8 format of docs/formats.md):

* ``weight`` int8 [O, I], the outlier columns zero; ``weight_scale`` [O, 1]: W[o] = weight[o] * weight_scale[o].
* ``outlier_idx`` int32 [k] input dims kept in floating point (k may be 0);
  ``outlier_weight`` [O, k] the weight's columns at those dims (fp16 or the model dtype).
* x [..., I] fp16/bf16/fp32; y [..., O] in x's dtype.

y = (q_x @ weight^T) * s_x * weight_scale^T + x[:, outlier_idx] @ outlier_weight^T (+ bias), with
s_x = max|x| / 127 per token over the non-outlier dims and q_x = round_half_even(x / s_x) in int8.
With ``act_group`` G, s_x is taken per token and block of G inputs (``_int8_grouped_kernel``): each K tile is one
block, its int32 dot scaled by its own s_x into an fp32 accumulator.

Each program owns an output tile [BLOCK_M, BLOCK_N]. It makes two passes over its BLOCK_M
rows of x: the first finds the per-token absmax (outlier dims masked out by comparing the
column ids with outlier_idx), the second quantizes x in registers and runs the int8 x int8 ->
int32 ``tl.dot``; then the outlier slice runs as a small floating-point dot and the rescale,
bias and store follow. x is re-read per column tile, which is cheap where this kernel matters
(decode, M small, weight traffic dominates).
"""

import torch
import triton
import triton.language as tl

from compress.kernels.tiles import scaled_matmul_configs
from compress.kernels.checks import FLOAT_DTYPES, check_bias, check_device, check_dtype, check_shape, dot_operands

INT8_MAX = 127.0
ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: (v + it) - it rounds |v| < 2^22 to nearest even in fp32
DECODE_MAX_M = 16


@triton.jit
def _is_outlier(cols, idx_ptr, n_out, OUT_PAD: tl.constexpr):
    """[BK] bool: which of the column ids ``cols`` are in outlier_idx."""
    j = tl.arange(0, OUT_PAD)
    idx = tl.load(idx_ptr + j, mask=j < n_out, other=-1)  # [KP]
    return tl.sum((cols[:, None] == idx[None, :]).to(tl.int32), 1) > 0


@triton.jit
def _token_scale(x_ptr, idx_ptr, rm, m_ok, K, n_out, stride_xm, OUT_PAD: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BM] fp32 per-token scale: max |x| over the non-outlier dims / 127."""
    amax = tl.zeros([rm.shape[0]], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        keep = (k < K) & ~_is_outlier(k, idx_ptr, n_out, OUT_PAD)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & keep[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), 1))
    return tl.maximum(amax, 1e-12) / INT8_MAX


@triton.jit
def _outlier_product(x_ptr, idx_ptr, ow_ptr, rm, m_ok, rn, n_ok, n_out, stride_xm, stride_own,
                     DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_O: tl.constexpr):
    """[BM, BN] fp32: x[rm, outlier_idx] @ outlier_weight[rn]^T in x's dtype."""
    acc = tl.zeros([rm.shape[0], BLOCK_N], tl.float32)
    for j0 in range(0, n_out, BLOCK_O):
        j = j0 + tl.arange(0, BLOCK_O)  # [BO]
        j_ok = j < n_out
        cols = tl.load(idx_ptr + j, mask=j_ok, other=0)  # [BO]
        xo = tl.load(x_ptr + rm[:, None] * stride_xm + cols[None, :], mask=m_ok[:, None] & j_ok[None, :], other=0.0)
        wo = tl.load(ow_ptr + rn[None, :] * stride_own + j[:, None], mask=j_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(xo.to(DOT_DTYPE), wo.to(xo.dtype).to(DOT_DTYPE), acc, input_precision=PRECISION)  # [BM, BO] @ [BO, BN]
    return acc


@triton.jit
def _finish(y, x_ptr, idx_ptr, ow_ptr, b_ptr, y_ptr, rm, m_ok, rn, n_ok, n_out, stride_xm, stride_own, stride_ym,
            HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_O: tl.constexpr):
    """Store y [BM, BN] (the rescaled int8 product) plus the outlier slice's product and the bias."""
    y += _outlier_product(x_ptr, idx_ptr, ow_ptr, rm, m_ok, rn, n_ok, n_out, stride_xm, stride_own,
                          DOT_DTYPE, PRECISION, BLOCK_N, BLOCK_O)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _int8_outlier_matmul_kernel(
    x_ptr, w_ptr, ws_ptr, idx_ptr, ow_ptr, b_ptr, y_ptr,
    M, N, K, n_out,
    stride_xm, stride_wn, stride_own, stride_ym,
    HAS_BIAS: tl.constexpr, OUT_PAD: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_O: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    m_ok, n_ok = rm < M, rn < N
    xs = _token_scale(x_ptr, idx_ptr, rm, m_ok, K, n_out, stride_xm, OUT_PAD, BLOCK_K)  # [BM]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        k_ok = k < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        v = tl.clamp(x.to(tl.float32) / xs[:, None], -INT8_MAX, INT8_MAX)  # outlier dims meet zero weights
        xq = ((v + ROUND_MAGIC) - ROUND_MAGIC).to(tl.int8)  # [BM, BK]
        w = tl.load(w_ptr + rn[None, :] * stride_wn + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0)  # [BK, BN]
        acc = tl.dot(xq, w, acc)
    ws = tl.load(ws_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)  # [BN]
    y = acc.to(tl.float32) * xs[:, None] * ws[None, :]
    _finish(y, x_ptr, idx_ptr, ow_ptr, b_ptr, y_ptr, rm, m_ok, rn, n_ok, n_out, stride_xm, stride_own, stride_ym,
            HAS_BIAS, DOT_DTYPE, PRECISION, BLOCK_N, BLOCK_O)


@triton.jit
def _int8_grouped_kernel(
    x_ptr, w_ptr, ws_ptr, idx_ptr, ow_ptr, b_ptr, y_ptr,
    M, N, K, n_out,
    stride_xm, stride_wn, stride_own, stride_ym,
    HAS_BIAS: tl.constexpr, OUT_PAD: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_O: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, GROUP):  # K % GROUP == 0 (checked)
        k = k0 + tl.arange(0, GROUP)  # [G]
        keep = ~_is_outlier(k, idx_ptr, n_out, OUT_PAD)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & keep[None, :], other=0.0).to(tl.float32)
        xs = tl.maximum(tl.max(tl.abs(x), 1), 1e-12) / INT8_MAX  # [BM]: this block's step per token
        v = tl.clamp(x / xs[:, None], -INT8_MAX, INT8_MAX)
        xq = ((v + ROUND_MAGIC) - ROUND_MAGIC).to(tl.int8)  # [BM, G]
        w = tl.load(w_ptr + rn[None, :] * stride_wn + k[:, None], mask=n_ok[None, :], other=0)  # [G, BN]
        acc += tl.dot(xq, w).to(tl.float32) * xs[:, None]
    ws = tl.load(ws_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)  # [BN]
    y = acc * ws[None, :]
    _finish(y, x_ptr, idx_ptr, ow_ptr, b_ptr, y_ptr, rm, m_ok, rn, n_ok, n_out, stride_xm, stride_own, stride_ym,
            HAS_BIAS, DOT_DTYPE, PRECISION, BLOCK_N, BLOCK_O)


def grouped_configs(decode: bool) -> list[triton.Config]:
    """scaled_matmul_configs' output tiles; the K tile is the activation block (GROUP)."""
    tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]): c for c in scaled_matmul_configs(decode)}
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=c.num_warps, num_stages=c.num_stages)
            for (bm, bn), c in tiles.items()]


_decode = triton.autotune(configs=scaled_matmul_configs(True), key=["N", "K", "OUT_PAD"])(_int8_outlier_matmul_kernel)
_prefill = triton.autotune(configs=scaled_matmul_configs(False), key=["N", "K", "OUT_PAD"])(_int8_outlier_matmul_kernel)
_grouped_decode = triton.autotune(configs=grouped_configs(True), key=["N", "K", "OUT_PAD", "GROUP"])(_int8_grouped_kernel)
_grouped_prefill = triton.autotune(configs=grouped_configs(False), key=["N", "K", "OUT_PAD", "GROUP"])(_int8_grouped_kernel)


def _check(x, weight, weight_scale, outlier_idx, outlier_weight, bias, act_group) -> None:
    if act_group and (act_group < 16 or act_group & (act_group - 1) or x.shape[-1] % act_group):
        raise ValueError(f"act_group must be 0 or a power of two >= 16 dividing in_features {x.shape[-1]}, got {act_group}")
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight", weight, (torch.int8,))
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be int8 [out_features, {x.shape[-1]}], got {list(weight.shape)}")
    out_features = weight.shape[0]
    check_shape("weight_scale", weight_scale, (out_features, 1))
    check_dtype("weight_scale", weight_scale, FLOAT_DTYPES)
    check_dtype("outlier_idx", outlier_idx, (torch.int32,))
    if outlier_idx.dim() != 1:
        raise ValueError(f"outlier_idx must be 1-D [k], got {list(outlier_idx.shape)}")
    check_shape("outlier_weight", outlier_weight, (out_features, outlier_idx.numel()))
    check_dtype("outlier_weight", outlier_weight, FLOAT_DTYPES)
    check_bias(bias, out_features, x.dtype)
    check_device(x=x, weight=weight, weight_scale=weight_scale, outlier_idx=outlier_idx,
                 outlier_weight=outlier_weight, bias=bias)


def int8_outlier_matmul(x, weight, weight_scale, outlier_idx, outlier_weight, bias=None, act_group: int = 0) -> torch.Tensor:
    """y [..., O] in x's dtype; same contract as ``reference.int8_outlier_matmul``."""
    _check(x, weight, weight_scale, outlier_idx, outlier_weight, bias, act_group)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, I]
    weight, outlier_weight, outlier_idx = weight.contiguous(), outlier_weight.contiguous(), outlier_idx.contiguous()
    (m, k), n, n_out = x2.shape, weight.shape[0], outlier_idx.numel()
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)  # [M, O]
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, meta["BLOCK_M"]))  # noqa: E731
    decode = m <= DECODE_MAX_M
    kernel, blocks = ((_grouped_decode if decode else _grouped_prefill), {"GROUP": act_group}) if act_group else \
        ((_decode if decode else _prefill), {})
    kernel[grid](
        x2, weight, weight_scale.contiguous(), outlier_idx, outlier_weight, x2 if bias is None else bias, y,
        m, n, k, n_out,
        x2.stride(0), weight.stride(0), outlier_weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, OUT_PAD=triton.next_power_of_2(max(n_out, 1)),
        BLOCK_O=16, **blocks, **dot_operands(x.dtype),
    )
    return y.view(*x.shape[:-1], n)
