"""Fused dequantize + matmul for int4/int3 group-quantized weights. Imports only torch and triton.

y [M, O] = x [M, I] @ dequant(W)^T (+ bias), reading compressed-tensors' pack-quantized layout
(``compress.quant.packing``, layout version 1) as it is stored, with no repack:

* ``weight_packed`` int32 [O, ceil(I*b/32)]: row o is a little-endian bit stream, code k in
  stream bits [k*b, (k+1)*b), stream bit j = bit j % 32 of word j // 32. b = 4: 8 codes per word.
  b = 3: 32 codes per 3 words, codes 10 and 21 of each triple straddle two words.
* ``weight_scale`` [O, I/g] fp16/bf16/fp32; ``weight_zero_point`` int32 [ceil(O*b/32), I/g]:
  column G is a bit stream along O (None: symmetric, z = 2^(b-1)).
* w[o, k] = (q[o, k] - z[o, k // g]) * s[o, k // g], rounded to the scale dtype, then x's dtype.

Each code is read by one gather from its word (two for a straddling int3 code, the second
load masked off unless the code straddles); neighbouring codes share words, so the repeated
loads hit L1 and DRAM traffic stays b bits per weight. Zero points are read the same way along
O, once per (row, group) per tile. That is why no load-time repack is needed.

Launch shapes (one kernel body): M > 16 runs a tiled GEMM (grid N/BLOCK_N x M/BLOCK_M);
M <= 16 runs a split-K GEMV (one BLOCK_M = 16 row tile, SPLIT_K programs per column tile
that atomically add fp32 partial sums). A K tile never crosses a group (BLOCK_K divides g),
so each tile loads one scale and one zero point per output row. Accumulation is fp32.
"""

import math

import torch
import triton
import triton.language as tl

from compress.kernels.checks import FLOAT_DTYPES, check_bias, check_device, check_dtype, check_shape, dot_operands, interpreting

GEMV_MAX_M = 16


@triton.jit
def _code(stream_ptrs, word_stride, idx, BITS: tl.constexpr, mask):
    """Code ``idx`` of the bit streams that start at ``stream_ptrs``, word i at +i * word_stride."""
    bit = idx * BITS
    word = bit // 32
    off = (bit % 32).to(tl.uint32)
    codes = tl.load(stream_ptrs + word * word_stride, mask=mask, other=0).to(tl.uint32, bitcast=True) >> off
    if 32 % BITS != 0:  # the code may continue in the next word
        spills = mask & (off > 32 - BITS)
        hi = tl.load(stream_ptrs + (word + 1) * word_stride, mask=spills, other=0).to(tl.uint32, bitcast=True)
        codes = codes | (hi << ((32 - off) % 32))
    return (codes & ((1 << BITS) - 1)).to(tl.int32)


@triton.jit
def _dequant_tile(w_ptr, s_ptr, z_ptr, rn, n_ok, k, group, stride_wn, stride_sn, stride_zw,
                  BITS: tl.constexpr, HAS_ZERO: tl.constexpr, BLOCK_N: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """W^T tile [BLOCK_K, BLOCK_N] for input dims k (all in ``group``) and output rows rn."""
    q = _code(w_ptr + rn[None, :] * stride_wn, 1, k[:, None], BITS, n_ok[None, :])  # [BK, BN]
    s = tl.load(s_ptr + rn * stride_sn + group, mask=n_ok, other=0.0)  # [BN]
    if HAS_ZERO:
        z = _code(z_ptr + group, stride_zw, rn, BITS, n_ok)  # [BN]: column `group` is a stream along O
    else:
        z = tl.full([BLOCK_N], 1 << (BITS - 1), tl.int32)
    w = (q - z[None, :]).to(tl.float32) * s[None, :].to(tl.float32)  # exact: small int x scale
    return w.to(s_ptr.dtype.element_ty).to(OUT_DTYPE)


@triton.jit
def _dequant_matmul_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_zw, stride_ym,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for t in range(pid_k, K // BLOCK_K, SPLIT_K):  # K tiles split round-robin over pid_k
        k = t * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
        x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=m_ok[:, None], other=0.0)  # [BM, BK]
        w = _dequant_tile(w_ptr, s_ptr, z_ptr, rn, n_ok, k, (t * BLOCK_K) // GROUP, stride_wn, stride_sn,
                          stride_zw, BITS, HAS_ZERO, BLOCK_N, x_ptr.dtype.element_ty)  # [BK, BN]
        acc = tl.dot(x.to(DOT_DTYPE), w.to(DOT_DTYPE), acc, input_precision=PRECISION)
    if HAS_BIAS:
        if pid_k == 0:  # added once, by the first K split
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tl.atomic_add(y_ptrs, acc, mask=ok)


def _configs(gpu: list[tuple[int, int, int, int, int]], interpreted: tuple[int, int, int]) -> list[triton.Config]:
    """(BLOCK_M, BLOCK_N, SPLIT_K, warps, stages) tuples on GPU; one small config under the interpreter."""
    if interpreting():
        bm, bn, split = interpreted
        return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": split})]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk}, num_warps=w, num_stages=s)
            for bm, bn, sk, w, s in gpu]


_gemm = triton.autotune(
    configs=_configs([(bm, bn, 1, w, 3) for bm in (32, 64, 128) for bn in (64, 128) for w in (4, 8)], (16, 32, 1)),
    key=["N", "K", "BITS", "GROUP"],
)(_dequant_matmul_kernel)

_gemv = triton.autotune(
    configs=_configs([(16, bn, sk, 4, 3) for bn in (32, 64, 128) for sk in (1, 2, 4, 8)], (16, 32, 2)),
    key=["N", "K", "BITS", "GROUP"],
    reset_to_zero=["y_ptr"],
)(_dequant_matmul_kernel)


def _check(x, packed, scale, zero_packed, bits, bias) -> None:
    if bits not in (3, 4):
        raise ValueError(f"bits must be 3 or 4, got {bits}")
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight_scale", scale, FLOAT_DTYPES)
    check_dtype("weight_packed", packed, (torch.int32,))
    if scale.dim() != 2:
        raise ValueError(f"weight_scale must be [out_features, groups], got shape {list(scale.shape)}")
    (out_features, groups), in_features = scale.shape, x.shape[-1]
    if in_features % groups or (in_features // groups) % 16:
        raise ValueError(f"in_features {in_features} / {groups} groups must give a group size that is a multiple of 16")
    check_shape("weight_packed", packed, (out_features, math.ceil(in_features * bits / 32)))
    if zero_packed is not None:
        check_dtype("weight_zero_point", zero_packed, (torch.int32,))
        check_shape("weight_zero_point", zero_packed, (math.ceil(out_features * bits / 32), groups))
    check_bias(bias, out_features, x.dtype)
    check_device(x=x, weight_packed=packed, weight_scale=scale, weight_zero_point=zero_packed, bias=bias)


def dequant_matmul(x, packed, scale, zero_packed, bits: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., O] = x [..., I] @ dequant(W)^T (+ bias), in x's dtype. Same contract as the reference."""
    _check(x, packed, scale, zero_packed, bits, bias)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, I]
    packed, scale = packed.contiguous(), scale.contiguous()
    zero = packed if zero_packed is None else zero_packed.contiguous()  # unread when symmetric
    (m, k), n = x2.shape, scale.shape[0]
    group = k // scale.shape[1]
    gemv = m <= GEMV_MAX_M
    y = torch.zeros(m, n, device=x.device, dtype=torch.float32) if gemv else torch.empty(m, n, device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, meta["BLOCK_M"]), meta["SPLIT_K"])  # noqa: E731
    (_gemv if gemv else _gemm)[grid](
        x2, packed, scale, zero, x2 if bias is None else bias, y,
        m, n, k,
        x2.stride(0), packed.stride(0), scale.stride(0), zero.stride(0), y.stride(0),
        BITS=bits, GROUP=group, HAS_ZERO=zero_packed is not None, HAS_BIAS=bias is not None,
        BLOCK_K=math.gcd(group, 64), **dot_operands(x.dtype),
    )
    return y.to(x.dtype).view(*x.shape[:-1], n)
