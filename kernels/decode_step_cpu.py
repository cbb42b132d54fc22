"""A decode step of a Llama-family decoder's blocks in one C call on CPU: for R sequences with one new token
each, every block's RMSNorm, q/k/v projection, rotary embedding, K/V cache write, decode attention, output
projection, residual, RMSNorm, gate/up projection, SiLU(gate) * up, down projection and residual, then the
final norm. Built by ``cpu_build``; imports only torch, the standard library and cpu_build.

Why: run from Python, a block is ~40 module calls and torch ops of a few microseconds each around its
kernels; at batch 1 on SmolLM2 that was ~8 ms of a ~25 ms step (``compress.runtime.cpu_step``). This loop
calls the same C kernels (the 4-bit GEMMs, ``rms_norm_cpu``, ``rope_cpu``, ``paged_attention_cpu``)
through function pointers taken from their libraries, so each op computes what it computes when called
from Python; only the residual adds and SiLU(gate) * up are computed here.

Tables (int64, built once by the runtime): per block, ``PTRS`` entries: the two norm weights, then ``LINS`` per
Linear, q/k/v (joined, or q alone), o, gate/up (joined), down, then k and v where the block's q/k/v are three Linears
(a GGUF's Q4_K q/k beside a Q6_K v: types that join no Linear; k's entries 0 where joined): a held one's codes, scales, offsets (a Q5_0's plane of
fifth bits, a Q6_K's top 2 bits, tiled; 0 where its kernel takes none), its GEMM (``nibble_linear_cpu``'s or ``nibble_q8_cpu``'s ``linear``, ``byte_q8_cpu``'s ``step_linear``: one
calling convention) and its scales' second dimension (groups per row; a Q6_K's super-blocks), so a GGUF's mixture of block types runs in one loop; or the fp32 weight
(the rest unused, ``dims[9]`` 1: every Linear fp32, ``fns[0]`` their ``linear_cpu`` GEMM); then the q and k norms'
weights (Qwen3's RMSNorm over each head, applied where ``dims[10]`` is 1; unused otherwise). ``fns``: the fp32 GEMM
(or 0), rms_norm, rope, paged_attention.
"""

import ctypes
import functools

from compress.kernels import cpu_build
from compress.kernels.paged_attention_cpu import EXP_NEG

LINS = 5  # per Linear: codes, scales, offsets, its GEMM, groups per row
PTRS = 2 + 6 * LINS + 2  # norm1, norm2, then qkv (or q), o, gate_up, down, k, v, then q_norm, k_norm

SOURCE = EXP_NEG + f"#define LINS {LINS}\n#define PTRS {PTRS}\n" + r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int (*linear_fn)(const float *, const unsigned char *, const float *, const float *, float *, int, int, int, int, int);
typedef void (*dense_fn)(const float *, const float *, float *, int, int, int, int);
typedef void (*norm_fn)(const float *, const float *, float *, int, int, float, int);
typedef void (*rope_fn)(const float *, const float *, const float *, float *, int, int, int, int);
typedef int (*attn_fn)(const float *, const float *, const float *, const int32_t *, const int32_t *, float *,
                       int, int, int, int, int, int, float, int, float, int);

static inline float silu1(float g) {
    const float e = exp_neg(-fabsf(g));  /* e^-|g| */
    return g * (g >= 0.f ? 1.f / (1.f + e) : e / (1.f + e));
}

/* act[r] = silu(gu[r, :m]) * gu[r, m:], a vector at a time (one float at a time it was ~5 % of a SmolLM2 decode step,
   run while the other threads wait) */
static void silu_mul(const float *gu, float *act, int rows, int m) {
    const vi32 magnitude = (vi32){0} + 0x7fffffff;
    for (int r = 0; r < rows; r++) {
        const float *g = gu + (size_t)r * 2 * m, *u = g + m;
        float *a = act + (size_t)r * m;
        int j = 0;
        for (; j + VW <= m; j += VW) {
            const vf x = *(const vfu *)(g + j), e = exp_neg_v((vf)(((vi32)x & magnitude) ^ ~magnitude));  /* -|x| */
            const vf inv = 1.f / (1.f + e), below = e * inv;
            const vi32 pos = x >= 0.f;
            *(vfu *)(a + j) = x * (vf)(((vi32)inv & pos) | ((vi32)below & ~pos)) * *(const vfu *)(u + j);
        }
        for (; j < m; j++) a[j] = silu1(g[j]) * u[j];
    }
}

static void add(float *x, const float *y, size_t n) { for (size_t i = 0; i < n; i++) x[i] += y[i]; }

/* columns [at, at + n) of the R rows of qkv (W wide) from part [R, n] */
static void scatter(float *qkv, const float *part, int R, int W, int at, int n) {
    for (int r = 0; r < R; r++) memcpy(qkv + (size_t)r * W + at, part + (size_t)r * n, sizeof(float) * n);
}

/* the GEMM of the Linear whose entries start at p: a held one's (x, codes, scales, offsets, y, rows, O, I, groups per
   row, threads), or fp32 (x, w, y, rows, O, I, threads) */
#define LIN(p, in, out, O, I) \
    if (dense) ((dense_fn)fns[0])((in), (const float *)(p)[0], (out), R, (O), (I), threads); \
    else if (((linear_fn)(p)[3])((in), (const unsigned char *)(p)[0], (const float *)(p)[1], (const float *)(p)[2], (out), \
                                 R, (O), (I), (int)(p)[4], threads)) return 1

/* x [R, C]: the blocks' input (overwritten by the residual stream); out [R, C]: after the final norm.
   cos, sin [R, D]; slots [R] (int64) the new tokens' cache slots; tables [R, MB], lens [R] as
   paged_attention_cpu takes them; kv [2, L, NB, BS, KVH, D]. dims: C, M (MLP width), H, KVH, D, BS, NB, MB,
   L, dense (1: fp32 Linears), qk_norm (1: q and k normalized per head before rope); eps: the norms'; scale: attention's; scratch: ``scratch_floats`` floats. */
int decode_step(float *x, float *out, const float *cos, const float *sin, const int64_t *slots, const int32_t *tables,
                const int32_t *lens, float *kv, const int64_t *ptrs, const int64_t *fns, const int *dims, float eps,
                float scale, float *scratch, int R, int threads) {
    const int C = dims[0], M = dims[1], H = dims[2], KVH = dims[3], D = dims[4], BS = dims[5], NB = dims[6], MB = dims[7],
              L = dims[8], dense = dims[9], qk_norm = dims[10], W = (H + 2 * KVH) * D;
    norm_fn norm = (norm_fn)fns[1];
    rope_fn rope = (rope_fn)fns[2];
    attn_fn attn = (attn_fn)fns[3];
    float *h = scratch, *qkv = h + (size_t)R * C, *q = qkv + (size_t)R * W, *att = q + (size_t)R * H * D,
          *gu = att + (size_t)R * H * D, *act = gu + (size_t)R * 2 * M, *tmp = act + (size_t)R * M;
    const size_t layer = (size_t)NB * BS * KVH * D, row = (size_t)KVH * D;
    for (int l = 0; l < L; l++) {
        const int64_t *p = ptrs + (size_t)l * PTRS;
        float *kc = kv + (size_t)l * layer, *vc = kv + ((size_t)L + l) * layer;
        norm(x, (const float *)p[0], h, R, C, eps, threads);
        if (p[2 + 4 * LINS] == 0) {
            LIN(p + 2, h, qkv, W, C);
        } else {  /* q, k, v through att (unused until attention) into qkv's columns */
            LIN(p + 2, h, att, H * D, C);
            scatter(qkv, att, R, W, 0, H * D);
            LIN(p + 2 + 4 * LINS, h, att, KVH * D, C);
            scatter(qkv, att, R, W, H * D, KVH * D);
            LIN(p + 2 + 5 * LINS, h, att, KVH * D, C);
            scatter(qkv, att, R, W, (H + KVH) * D, KVH * D);
        }
        if (qk_norm)  /* in place: each row of D is read whole before it is written */
            for (int r = 0; r < R; r++) {
                norm(qkv + (size_t)r * W, (const float *)p[2 + 6 * LINS], qkv + (size_t)r * W, H, D, eps, 1);
                norm(qkv + (size_t)r * W + H * D, (const float *)p[3 + 6 * LINS], qkv + (size_t)r * W + H * D, KVH, D, eps, 1);
            }
        for (int r = 0; r < R; r++) {
            const float *src = qkv + (size_t)r * W;
            rope(src, cos + (size_t)r * D, sin + (size_t)r * D, q + (size_t)r * H * D, 1, H, D, 1);
            rope(src + H * D, cos + (size_t)r * D, sin + (size_t)r * D, kc + slots[r] * row, 1, KVH, D, 1);
            memcpy(vc + slots[r] * row, src + (H + KVH) * D, sizeof(float) * row);
        }
        if (attn(q, kc, vc, tables, lens, att, R, H, KVH, D, BS, MB, scale, 0, 0.f, threads)) return 1;
        LIN(p + 2 + LINS, att, tmp, C, H * D);
        add(x, tmp, (size_t)R * C);
        norm(x, (const float *)p[1], h, R, C, eps, threads);
        LIN(p + 2 + 2 * LINS, h, gu, 2 * M, C);
        silu_mul(gu, act, R, M);
        LIN(p + 2 + 3 * LINS, act, tmp, C, M);
        add(x, tmp, (size_t)R * C);
    }
    norm(x, (const float *)ptrs[(size_t)L * PTRS], out, R, C, eps, threads);
    return 0;
}
"""

_P = ctypes.c_void_p


@functools.cache
def load() -> ctypes.CDLL | None:
    """The built loop, or None where no C compiler works (or COMPRESS_CPU_KERNELS=0)."""
    return cpu_build.load("decode_step", SOURCE, {
        "decode_step": ([_P] * 11 + [ctypes.c_float, ctypes.c_float, _P, ctypes.c_int, ctypes.c_int], ctypes.c_int),
    })


def address(lib: ctypes.CDLL, name: str) -> int:
    """The address of a function of a built kernel library, for the ``fns`` table."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def scratch_floats(rows: int, hidden: int, mlp: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Floats of ``decode_step``'s scratch for ``rows`` sequences: h, qkv, q, attention out, gate/up, act, tmp."""
    return rows * (2 * hidden + (heads + 2 * kv_heads) * head_dim + 2 * heads * head_dim + 3 * mlp)
