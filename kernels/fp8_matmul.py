"""fp8 e4m3 scaled matmul with per-token dynamic (or static per-tensor) activation scales.
Imports only torch and triton.

Layout (compressed-tensors "float-quantized", docs/formats.md):

* ``weight`` float8_e4m3fn [O, I]; ``weight_scale`` [O, 1]: W[o] = weight[o] * weight_scale[o].
* x [..., I] fp16/bf16/fp32; ``input_scale`` [1] static per-tensor scale, or None: per token,
  s_x = max|x| / 448 computed at run time.
* y [..., O] in x's dtype = (e4m3(x / s_x) @ weight^T) * s_x * weight_scale^T (+ bias), where
  e4m3() saturates to +-448 and rounds to nearest even (subnormals included).

Each program owns an output tile [BLOCK_M, BLOCK_N]: a first pass over its rows of x finds the
token scales (skipped with ``input_scale``), the second quantizes x to e4m3 in registers and
runs ``tl.dot`` on fp8 operands where the GPU has fp8 tensor cores (compute capability >= 8.9),
else on both operands upcast to fp16 (exact: every e4m3 value is an fp16 value). Accumulation
is fp32 (products of two e4m3 values are exact in fp32).
"""

import torch
import triton
import triton.language as tl

from compress.kernels.tiles import scaled_matmul_configs
from compress.kernels.checks import FLOAT_DTYPES, check_bias, check_device, check_dtype, check_shape, interpreting

FP8_MAX = 448.0  # largest finite float8_e4m3fn
E4M3_MIN_NORMAL = 2.0**-6
SUBNORMAL_MAGIC = 24576.0  # 1.5 * 2^14: (v + it) - it rounds to a multiple of 2^-9 (e4m3's subnormal step)
DECODE_MAX_M = 16


@triton.jit
def _round_to_e4m3(v):
    """fp32 values |v| <= 448 rounded to nearest even e4m3 value, still fp32 (the cast after is exact).

    Done by hand so that every backend agrees: the interpreter's fp32 -> e4m3 cast loses the carry
    when rounding up across a power of two (127.7 -> 64).
    """
    bits = v.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)  # keep 3 mantissa bits
    subnormal = (v + SUBNORMAL_MAGIC) - SUBNORMAL_MAGIC
    return tl.where(tl.abs(v) < E4M3_MIN_NORMAL, subnormal, normal)


@triton.jit
def _token_scale(x_ptr, rm, m_ok, K, stride_xm, BLOCK_K: tl.constexpr):
    """[BM] fp32 per-token scale: max |x| / 448."""
    amax = tl.zeros([rm.shape[0]], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(x.to(tl.float32)), 1))
    return tl.maximum(amax, 1e-12) / FP8_MAX


@triton.jit
def _fp8_matmul_kernel(
    x_ptr, w_ptr, ws_ptr, is_ptr, b_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    STATIC: tl.constexpr, HAS_BIAS: tl.constexpr, FP8_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    m_ok, n_ok = rm < M, rn < N
    if STATIC:
        xs = tl.zeros([BLOCK_M], tl.float32) + tl.load(is_ptr).to(tl.float32)  # [BM]
    else:
        xs = _token_scale(x_ptr, rm, m_ok, K, stride_xm, BLOCK_K)  # [BM]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)  # [BK]
        k_ok = k < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        xq = _round_to_e4m3(tl.clamp(x.to(tl.float32) / xs[:, None], -FP8_MAX, FP8_MAX)).to(tl.float8e4nv)  # [BM, BK]
        w = tl.load(w_ptr + rn[None, :] * stride_wn + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)  # [BK, BN]
        if FP8_DOT:
            acc = tl.dot(xq, w, acc)
        else:
            acc = tl.dot(xq.to(tl.float16), w.to(tl.float16), acc)
    ws = tl.load(ws_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)  # [BN]
    y = acc * xs[:, None] * ws[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


_decode = triton.autotune(configs=scaled_matmul_configs(True), key=["N", "K", "STATIC"])(_fp8_matmul_kernel)
_prefill = triton.autotune(configs=scaled_matmul_configs(False), key=["N", "K", "STATIC"])(_fp8_matmul_kernel)


def _fp8_dot(device: torch.device) -> bool:
    """fp8 tensor cores: CUDA compute capability 8.9 (Ada) or newer; never under the interpreter."""
    return device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device) >= (8, 9)


def _check(x, weight, weight_scale, bias, input_scale) -> None:
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight", weight, (torch.float8_e4m3fn,))
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be float8_e4m3fn [out_features, {x.shape[-1]}], got {list(weight.shape)}")
    check_shape("weight_scale", weight_scale, (weight.shape[0], 1))
    check_dtype("weight_scale", weight_scale, FLOAT_DTYPES)
    if input_scale is not None:
        check_shape("input_scale", input_scale.reshape(-1), (1,))
        check_dtype("input_scale", input_scale, FLOAT_DTYPES)
    check_bias(bias, weight.shape[0], x.dtype)
    check_device(x=x, weight=weight, weight_scale=weight_scale, bias=bias, input_scale=input_scale)


def fp8_matmul(x, weight, weight_scale, bias=None, input_scale=None) -> torch.Tensor:
    """y [..., O] in x's dtype; same contract as ``reference.fp8_matmul``."""
    _check(x, weight, weight_scale, bias, input_scale)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, I]
    weight = weight.contiguous()
    (m, k), n = x2.shape, weight.shape[0]
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)  # [M, O]
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, meta["BLOCK_M"]))  # noqa: E731
    (_decode if m <= DECODE_MAX_M else _prefill)[grid](
        x2, weight, weight_scale.contiguous(), x2 if input_scale is None else input_scale,
        x2 if bias is None else bias, y,
        m, n, k,
        x2.stride(0), weight.stride(0), y.stride(0),
        STATIC=input_scale is not None, HAS_BIAS=bias is not None, FP8_DOT=_fp8_dot(x.device),
    )
    return y.view(*x.shape[:-1], n)
