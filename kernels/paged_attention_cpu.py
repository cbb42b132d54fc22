"""Decode attention over a paged KV cache on CPU: a small C kernel built by ``cpu_build``. Imports
only torch, the standard library and the shared checks (torch and triton).

Same contract as kernels/paged_attention.py (docs/kernels.md), fp32 only. Why C: torch ops can only
gather each row's blocks into a padded copy and then attend over the copy, so every K/V byte is read,
written and read again; this kernel reads each row's K/V once, in place, block by block (one
thread per sequence). Where it cannot be built, ``load()`` returns None and the caller takes the
torch path.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build
from compress.kernels.checks import check_attention_options, check_paged_attention

EXP_NEG = r"""
#include <stdint.h>

/* 2^f for f in [-1/2, 1/2] (times ln 2 below): degree-6 Taylor, relative error ~1e-7; for a float or a vector */
#define EXP_POLY(f) ((((((1.3888889e-3f * (f) + 8.3333333e-3f) * (f) + 4.1666667e-2f) * (f) + 1.6666667e-1f) * (f) \
                       + 0.5f) * (f) + 1.f) * (f) + 1.f)

/* e^x for x <= 0 as 2^n * 2^f, no libm call (expf is a call per element). */
static inline float exp_neg(float x) {
    float z = (x < -87.f ? -87.f : x) * 1.44269504f;
    int32_t n = (int32_t)(z - 0.5f);
    float f = (z - (float)n) * 0.69314718f;
    union { float f; int32_t i; } u = { EXP_POLY(f) };
    u.i += n << 23;
    return u.f;
}

/* exp_neg over a vector: GCC leaves exp_neg's clamp a branch in a loop (without -ffinite-math-only), so a loop over it
   runs one float at a time. */
typedef int32_t vi32 __attribute__((vector_size(VW * 4)));
static inline vf exp_neg_v(vf x) {
    const vf low = (vf){0} - 87.f;
    const vi32 below = x < low;
    const vf z = (vf)(((vi32)x & ~below) | ((vi32)low & below)) * 1.44269504f;
    const vi32 n = __builtin_convertvector(z - 0.5f, vi32);
    const vf f = (z - __builtin_convertvector(n, vf)) * 0.69314718f;
    return (vf)((vi32)EXP_POLY(f) + (n << 23));
}
"""

SOURCE = EXP_NEG + r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The slot of token t + 16 (its cache lines): a sequence's blocks lie anywhere in the pool, so the
   hardware prefetcher stalls at every block boundary; fetching a block ahead hides most of that. */
static inline void prefetch_slot(const float *cache, const int32_t *tab, int t, int n, int BS, int row) {
    if (t + 16 >= n) return;
    const char *p = (const char *)(cache + ((size_t)tab[(t + 16) / BS] * BS + (t + 16) % BS) * row);
    for (int i = 0; i < row * (int)sizeof(float); i += 64) __builtin_prefetch(p + i);
}

/* scores -> cap * tanh(scores / cap) (the soft-cap of Gemma 2), tanh as (1 - e^-2|x|) / (1 + e^-2|x|) with x's
   sign: vectorized (branch-free, no libm), where tanhf is a call per element. */
static void soft_cap(float *row, int m, float cap) {
    for (int i = 0; i < m; i++) {
        float x = row[i] / cap, e = exp_neg(-2.f * __builtin_fabsf(x));
        row[i] = cap * __builtin_copysignf((1.f - e) / (1.f + e), x);
    }
}

/* One sequence's query heads h0 .. h1-1 (whole KV groups) over its tokens t0 .. n-1 (t0 > 0: a sliding window),
   query head h reads KV head h / rep; cap > 0: the scores' soft-cap. sc: [H, n - t0] scratch. */
static inline __attribute__((always_inline)) void attend(
        const float *q, const float *kc, const float *vc, const int32_t *tab, int t0, int n, float *out,
        int H, int KVH, const int D, int BS, float scale, float cap, float *sc, int h0, int h1) {
    const int rep = H / KVH, m = n - t0;
    for (int t = t0; t < n; t++) {
        prefetch_slot(kc, tab, t, n, BS, KVH * D);
        const float *kt = kc + ((size_t)tab[t / BS] * BS + t % BS) * KVH * D;
        for (int h = h0; h < h1; h++) {
            const float *k = kt + (h / rep) * D, *qh = q + h * D;
            float acc = 0.f;
            for (int d = 0; d < D; d++) acc += qh[d] * k[d];
            sc[h * m + t - t0] = acc * scale;
        }
    }
    for (int h = h0; h < h1; h++) {
        float *row = sc + h * m, mx, sum = 0.f;
        if (cap > 0.f) soft_cap(row, m, cap);
        mx = row[0];
        for (int i = 1; i < m; i++) mx = row[i] > mx ? row[i] : mx;
        vf part = (vf){0};
        int i = 0;
        for (; i + VW <= m; i += VW) {
            const vf e = exp_neg_v(*(vfu *)(row + i) - mx);
            *(vfu *)(row + i) = e;
            part += e;
        }
        sum = hsum(part);
        for (; i < m; i++) { row[i] = exp_neg(row[i] - mx); sum += row[i]; }
        for (i = 0; i < m; i++) row[i] /= sum;
    }
    memset(out + h0 * D, 0, sizeof(float) * (h1 - h0) * D);
    for (int t = t0; t < n; t++) {
        prefetch_slot(vc, tab, t, n, BS, KVH * D);
        const float *vt = vc + ((size_t)tab[t / BS] * BS + t % BS) * KVH * D;
        for (int h = h0; h < h1; h++) {
            const float *v = vt + (h / rep) * D;
            float p = sc[h * m + t - t0], *o = out + h * D;
            for (int d = 0; d < D; d++) o[d] += p * v[d];
        }
    }
}

#define ROW_ARGS const float *q, const float *kc, const float *vc, const int32_t *tab, int t0, int n, float *out, \
                 int H, int KVH, int D, int BS, float scale, float cap, float *sc, int h0, int h1
typedef void row_fn(ROW_ARGS);

/* The common head sizes get their own copy with D known at compile time (fully unrolled loops). */
static void attend_64(ROW_ARGS) { attend(q, kc, vc, tab, t0, n, out, H, KVH, 64, BS, scale, cap, sc, h0, h1); }
static void attend_128(ROW_ARGS) { attend(q, kc, vc, tab, t0, n, out, H, KVH, 128, BS, scale, cap, sc, h0, h1); }
static void attend_any(ROW_ARGS) { attend(q, kc, vc, tab, t0, n, out, H, KVH, D, BS, scale, cap, sc, h0, h1); }

/* window > 0: a sequence of n tokens sees its last min(n, window) only; cap > 0: the scores' soft-cap. */
int paged_attention(const float *q, const float *kc, const float *vc, const int32_t *tables,
                    const int32_t *lens, float *out, int S, int H, int KVH, int D, int BS, int MB,
                    float scale, int window, float cap, int threads) {
    row_fn *row = D == 64 ? attend_64 : D == 128 ? attend_128 : attend_any;
    /* fewer sequences than threads (a batch-1 decode): each sequence's KV heads are split over the threads */
    const int split = S >= threads ? 1 : (KVH < threads ? KVH : threads), rep = H / KVH;
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int item = 0; item < S * split; item++) {
        int s = item / split, part = item % split;
        int h0 = KVH * part / split * rep, h1 = KVH * (part + 1) / split * rep;
        int n = lens[s], t0 = window > 0 && n > window ? n - window : 0;
        float *sc = malloc(sizeof(float) * (size_t)H * (n - t0));
        if (!sc) { failed = 1; continue; }
        row(q + (size_t)s * H * D, kc, vc, tables + (size_t)s * MB, t0, n, out + (size_t)s * H * D,
            H, KVH, D, BS, scale, cap, sc, h0, h1);
        free(sc);
    }
    return failed;
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int, ctypes.c_float, ctypes.c_int]
    return cpu_build.load("paged_attention", SOURCE, {"paged_attention": (argtypes, ctypes.c_int)})


def supports(t: torch.Tensor) -> bool:
    """Whether attention over fp32 CPU tensors like ``t`` (q or the KV cache) runs this kernel."""
    return t.device.type == "cpu" and t.dtype == torch.float32 and load() is not None


def _check(q, k_cache, v_cache, block_tables, context_lens) -> None:
    check_paged_attention(q, k_cache, v_cache, block_tables, context_lens)
    if q.dtype != torch.float32:
        raise ValueError(f"q, k_cache and v_cache must be torch.float32, got {q.dtype}")
    check_bounds(k_cache, block_tables, context_lens)


def check_bounds(k_cache, block_tables, context_lens) -> None:
    """The bounds the C code trusts (a bad table would read outside the cache): for a caller whose shapes,
    dtypes and contiguous layouts hold by construction and whose tables serve many calls (the runtime checks once a step, not a layer)."""
    block_size, num_blocks = k_cache.shape[1], k_cache.shape[0]
    if len(context_lens) and (int(context_lens.min()) < 1 or int(context_lens.max()) > block_tables.shape[1] * block_size):
        raise ValueError("context_lens must be in [1, block_tables.shape[1] * block_size]")
    if block_tables.numel() and (int(block_tables.min()) < 0 or int(block_tables.max()) >= num_blocks):
        raise ValueError(f"block_tables entries must be block ids in [0, {num_blocks})")


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float | None = None, softcap: float | None = None,
                    window: int | None = None) -> torch.Tensor:
    """[S, H, D]: softmax(q k^T * scale, soft-capped) v over each sequence's last ``window`` cached tokens, read in place."""
    _check(q, k_cache, v_cache, block_tables, context_lens)
    check_attention_options(softcap, window)
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    return unchecked(q, k_cache, v_cache, block_tables.contiguous(), context_lens.contiguous(), scale, softcap, window)


def unchecked(q, k_cache, v_cache, block_tables, context_lens, scale: float | None = None, softcap: float | None = None,
              window: int | None = None) -> torch.Tensor:
    """``paged_attention`` without its checks, for a caller that made sure once that they pass and that every
    operand is contiguous (the runtime: ``check_bounds`` once per step, not once per layer)."""
    seqs, heads, dim = q.shape
    out = torch.empty_like(q)
    failed = cpu_build.require(load()).paged_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(),
        out.data_ptr(), seqs, heads, k_cache.shape[2], dim, k_cache.shape[1], block_tables.shape[1],
        dim**-0.5 if scale is None else scale, window or 0, softcap or 0.0, torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("paged_attention: out of memory for the attention scores")
    return out
