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
from compress.kernels.checks import check_paged_attention

EXP_NEG = r"""
#include <stdint.h>

/* e^x for x <= 0 in a form compilers vectorize: 2^n * 2^f, f in [-1/2, 1/2], degree-6 Taylor
   (relative error ~1e-7); libm's expf is a call per element. */
static inline float exp_neg(float x) {
    float z = (x < -87.f ? -87.f : x) * 1.44269504f;
    int32_t n = (int32_t)(z - 0.5f);
    float f = (z - (float)n) * 0.69314718f, p = 1.3888889e-3f;
    p = p * f + 8.3333333e-3f;
    p = p * f + 4.1666667e-2f;
    p = p * f + 1.6666667e-1f;
    p = p * f + 0.5f;
    p = p * f + 1.f;
    p = p * f + 1.f;
    union { float f; int32_t i; } u = { p };
    u.i += n << 23;
    return u.f;
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

/* One sequence's query heads h0 .. h1-1 (whole KV groups): n tokens, query head h reads KV head h / rep.
   sc: [H, n] scratch. */
static inline __attribute__((always_inline)) void attend(
        const float *q, const float *kc, const float *vc, const int32_t *tab, int n, float *out,
        int H, int KVH, const int D, int BS, float scale, float *sc, int h0, int h1) {
    const int rep = H / KVH;
    for (int t = 0; t < n; t++) {
        prefetch_slot(kc, tab, t, n, BS, KVH * D);
        const float *kt = kc + ((size_t)tab[t / BS] * BS + t % BS) * KVH * D;
        for (int h = h0; h < h1; h++) {
            const float *k = kt + (h / rep) * D, *qh = q + h * D;
            float acc = 0.f;
            for (int d = 0; d < D; d++) acc += qh[d] * k[d];
            sc[h * n + t] = acc * scale;
        }
    }
    for (int h = h0; h < h1; h++) {
        float *row = sc + h * n, m = row[0], sum = 0.f;
        for (int t = 1; t < n; t++) m = row[t] > m ? row[t] : m;
        for (int t = 0; t < n; t++) { row[t] = exp_neg(row[t] - m); sum += row[t]; }
        for (int t = 0; t < n; t++) row[t] /= sum;
    }
    memset(out + h0 * D, 0, sizeof(float) * (h1 - h0) * D);
    for (int t = 0; t < n; t++) {
        prefetch_slot(vc, tab, t, n, BS, KVH * D);
        const float *vt = vc + ((size_t)tab[t / BS] * BS + t % BS) * KVH * D;
        for (int h = h0; h < h1; h++) {
            const float *v = vt + (h / rep) * D;
            float p = sc[h * n + t], *o = out + h * D;
            for (int d = 0; d < D; d++) o[d] += p * v[d];
        }
    }
}

typedef void row_fn(const float *, const float *, const float *, const int32_t *, int, float *, int, int, int, int,
                    float, float *, int, int);

/* The common head sizes get their own copy with D known at compile time (fully unrolled loops). */
static void attend_64(const float *q, const float *kc, const float *vc, const int32_t *tab, int n, float *out,
                      int H, int KVH, int D, int BS, float scale, float *sc, int h0, int h1) {
    attend(q, kc, vc, tab, n, out, H, KVH, 64, BS, scale, sc, h0, h1);
}
static void attend_128(const float *q, const float *kc, const float *vc, const int32_t *tab, int n, float *out,
                       int H, int KVH, int D, int BS, float scale, float *sc, int h0, int h1) {
    attend(q, kc, vc, tab, n, out, H, KVH, 128, BS, scale, sc, h0, h1);
}
static void attend_any(const float *q, const float *kc, const float *vc, const int32_t *tab, int n, float *out,
                       int H, int KVH, int D, int BS, float scale, float *sc, int h0, int h1) {
    attend(q, kc, vc, tab, n, out, H, KVH, D, BS, scale, sc, h0, h1);
}

int paged_attention(const float *q, const float *kc, const float *vc, const int32_t *tables,
                    const int32_t *lens, float *out, int S, int H, int KVH, int D, int BS, int MB,
                    float scale, int threads) {
    row_fn *row = D == 64 ? attend_64 : D == 128 ? attend_128 : attend_any;
    /* fewer sequences than threads (a batch-1 decode): each sequence's KV heads are split over the threads */
    const int split = S >= threads ? 1 : (KVH < threads ? KVH : threads), rep = H / KVH;
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int item = 0; item < S * split; item++) {
        int s = item / split, part = item % split;
        int h0 = KVH * part / split * rep, h1 = KVH * (part + 1) / split * rep;
        float *sc = malloc(sizeof(float) * (size_t)H * lens[s]);
        if (!sc) { failed = 1; continue; }
        row(q + (size_t)s * H * D, kc, vc, tables + (size_t)s * MB, lens[s], out + (size_t)s * H * D,
            H, KVH, D, BS, scale, sc, h0, h1);
        free(sc);
    }
    return failed;
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int]
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


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float | None = None) -> torch.Tensor:
    """[S, H, D]: softmax(q k^T * scale) v over each sequence's cached tokens, read in place."""
    _check(q, k_cache, v_cache, block_tables, context_lens)
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    return unchecked(q, k_cache, v_cache, block_tables.contiguous(), context_lens.contiguous(), scale)


def unchecked(q, k_cache, v_cache, block_tables, context_lens, scale: float | None = None) -> torch.Tensor:
    """``paged_attention`` without its checks, for a caller that made sure once that they pass and that every
    operand is contiguous (the runtime: ``check_bounds`` once per step, not once per layer)."""
    seqs, heads, dim = q.shape
    out = torch.empty_like(q)
    failed = cpu_build.require(load()).paged_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(),
        out.data_ptr(), seqs, heads, k_cache.shape[2], dim, k_cache.shape[1], block_tables.shape[1],
        dim**-0.5 if scale is None else scale, torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("paged_attention: out of memory for the attention scores")
    return out
