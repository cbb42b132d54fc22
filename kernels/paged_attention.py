"""Decode attention over a paged KV cache (one query token per sequence, GQA). Imports only torch and triton.

Layout (docs/kernels.md is the contract the runtime follows):

* ``q`` [S, H, D]: the one new query token of each of S sequences.
* ``k_cache``, ``v_cache`` [num_blocks, block_size, KVH, D]: physical blocks; token t of
  sequence s lives in block ``block_tables[s, t // block_size]``, slot ``t % block_size``.
  The new token's K/V must already be written there (attention includes it).
* ``block_tables`` int32 [S, max_blocks_per_seq]: entries past a sequence's last block are unread.
* ``context_lens`` int32 [S]: tokens per sequence, each >= 1 (the new token included).
* query head h reads KV head h // (H / KVH); ``scale`` defaults to 1/sqrt(D).
* ``softcap``: scores = softcap * tanh(q k^T * scale / softcap) (Gemma 2); ``window``: a sequence of n
  tokens attends to its tokens t >= n - window only (a sliding window; None: all of them).
* output [S, H, D] in q's dtype: softmax(scores) v over the sequence's (windowed) tokens.

One program per (sequence, KV head) loads the H/KVH query heads that share that KV head (padded
to a tile of 16) and streams the sequence's tokens BLOCK_N at a time through an online
softmax, so each K/V row is read once for the whole group; with a window the loop starts at the block
of tokens holding the window's first one. fp32 softmax and accumulation.
"""

import torch
import triton
import triton.language as tl

from compress.kernels.checks import check_attention_options, check_device, check_paged_attention, dot_operands, interpreting


@triton.jit
def _load_tokens(cache_ptr, block, t, t_ok, kvh, d, d_ok, stride_b, stride_t, stride_h, BLOCK_SIZE: tl.constexpr):
    """Rows [BLOCK_N, D_PAD] of one KV head for token positions t stored in physical blocks ``block``."""
    rows = block.to(tl.int64) * stride_b + (t % BLOCK_SIZE) * stride_t + kvh * stride_h  # [BN]
    return tl.load(cache_ptr + rows[:, None] + d[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def _soft_cap(s, cap):
    """cap * tanh(s / cap), tanh as (1 - e^-2|x|) / (1 + e^-2|x|) with x's sign (no overflow for any s)."""
    x = s / cap
    e = tl.exp(-2.0 * tl.abs(x))
    th = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x < 0, -th, th)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, o_ptr, scale, softcap, window,
    stride_qs, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_bts,
    QG: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    QG_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, SOFTCAP: tl.constexpr,
):
    seq, kvh = tl.program_id(0), tl.program_id(1)
    n = tl.load(len_ptr + seq)
    first = tl.maximum(n - window, 0)  # the window's first token (window = n or more: every token)
    g = tl.arange(0, QG_PAD)  # [QP] query heads of this KV head
    d = tl.arange(0, D_PAD)  # [DP]
    g_ok, d_ok = g < QG, d < D
    q_ptrs = seq * stride_qs + (kvh * QG + g)[:, None] * stride_qh + d[None, :]  # [QP, DP]
    q = tl.load(q_ptr + q_ptrs, mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)  # [QP, DP]
    m_i = tl.full([QG_PAD], float("-inf"), tl.float32)  # running max
    l_i = tl.zeros([QG_PAD], tl.float32)  # running softmax denominator
    acc = tl.zeros([QG_PAD, D_PAD], tl.float32)
    for start in range(first // BLOCK_N * BLOCK_N, n, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)  # [BN] token positions
        t_ok = (t < n) & (t >= first)
        block = tl.load(bt_ptr + seq * stride_bts + t // BLOCK_SIZE, mask=t_ok, other=0)  # [BN]
        k = _load_tokens(k_ptr, block, t, t_ok, kvh, d, d_ok, stride_kb, stride_kt, stride_kh, BLOCK_SIZE)
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * scale  # [QP, BN]
        if SOFTCAP:
            s = _soft_cap(s, softcap)
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])  # [QP, BN]
        alpha = tl.exp(m_i - m_new)
        v = _load_tokens(v_ptr, block, t, t_ok, kvh, d, d_ok, stride_vb, stride_vt, stride_vh, BLOCK_SIZE)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_ptrs, out.to(o_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float | None = None, softcap: float | None = None,
                    window: int | None = None) -> torch.Tensor:
    """[S, H, D] decode attention of q over each sequence's cached tokens; see the module docstring."""
    check_paged_attention(q, k_cache, v_cache, block_tables, context_lens)
    check_attention_options(softcap, window)
    check_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens)
    q, block_tables = q.contiguous(), block_tables.contiguous()
    seqs, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    _paged_attention_kernel[(seqs, kv_heads)](
        q, k_cache, v_cache, block_tables, context_lens.contiguous(), out, dim**-0.5 if scale is None else scale,
        softcap or 1.0, window or 2**31 - 1,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0),
        QG=heads // kv_heads, D=dim, BLOCK_SIZE=k_cache.shape[1], **dot_operands(q.dtype),
        QG_PAD=max(16, triton.next_power_of_2(heads // kv_heads)), D_PAD=max(16, triton.next_power_of_2(dim)),
        BLOCK_N=16 if interpreting() else 64, SOFTCAP=softcap is not None,
    )
    return out
