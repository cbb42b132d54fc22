"""AWQ's range search (``compress.quant.awq.search_tile``) for the rows of one group, fused into one C loop:
the same numbers bit for bit, without the ~16 passes over [o, g] per candidate that torch needs.
Built by ``cpu_build``; imports only torch, the standard library and cpu_build.

Per row and candidate grid (scale s, zero point z): codes c = clamp(rint(w / s), -z, qmax - z);
hc = c H; refit s' = sum(hc * w) / sum(hc * c) (kept where positive); codes c' on s'; error
e = c' s' - w; e^T H e = sum((e H) * e). The least error (first of equals, plain rounding first) wins.
It matches the torch code because each of its steps is rounded as torch rounds it:
- x H: each output is one chain of fmaf over k from 0, which is what MKL's fp32 GEMM computes for these
  shapes (a GEMM with K = g <= 128); ``search_rows`` callers compare against torch once (``agrees``).
- sums over a row: ATen's order for a contiguous fp32 row (``vectorized_inner_sum``): VW-wide vectors
  V_0.. summed into 4 accumulators (a_k += V_(4i+k)), the leftover vectors into a_0, then
  ((a_0 + a_1) + a_2) + a_3, then its lanes from 0 up.
- no contraction of c' s' - w into an FMA and no reassociation: the pragma below overrides
  cpu_build's -fassociative-math for this file.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build

SOURCE = r"""
#pragma GCC optimize ("no-associative-math", "fp-contract=off", "signed-zeros")
#include <math.h>
#include <string.h>

#define GMAX 256
#define RB 6  /* rows per matrix product: each H vector loaded once for RB rows (6 x 4 accumulators: 15% faster than 4) */

/* One rounding per vector lane, as MKL's FMA: explicit, since this file forbids contraction. */
#if VW == 16 && defined(__AVX512F__)
#include <immintrin.h>
#define CB 4  /* column vectors per block: RB x CB accumulators in registers */
static inline vf vfma(vf a, vf b, vf c) { return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
static inline vf vset(float x) { return (vf)_mm512_set1_ps(x); }
#elif VW == 8 && defined(__FMA__)
#include <immintrin.h>
#define CB 2
static inline vf vfma(vf a, vf b, vf c) { return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static inline vf vset(float x) { return (vf)_mm256_set1_ps(x); }
#else
#define CB 1
static inline vf vfma(vf a, vf b, vf c) { vf r; for (int l = 0; l < VW; l++) r[l] = fmaf(a[l], b[l], c[l]); return r; }
static inline vf vset(float x) { vf r; for (int l = 0; l < VW; l++) r[l] = x; return r; }
#endif

/* y[r, :g] = x[r, :g] H for r < RB (rows GMAX apart), each y[r, j] a chain of FMAs over k = 0 .. g-1 from 0 */
static void times_h(const float *x, const float *h, float *y, int g) {
    for (int j0 = 0; j0 < g; j0 += CB * VW) {
        vf acc[RB][CB];
        for (int r = 0; r < RB; r++) for (int q = 0; q < CB; q++) acc[r][q] = vset(0.f);
        for (int k = 0; k < g; k++) {
            const float *hk = h + (size_t)k * g + j0;
            vf hv[CB];
            for (int q = 0; q < CB; q++) hv[q] = *(const vfu *)(hk + q * VW);
            for (int r = 0; r < RB; r++) {
                vf xr = vset(x[r * GMAX + k]);
                for (int q = 0; q < CB; q++) acc[r][q] = vfma(xr, hv[q], acc[r][q]);
            }
        }
        for (int r = 0; r < RB; r++) for (int q = 0; q < CB; q++) *(vfu *)(y + r * GMAX + j0 + q * VW) = acc[r][q];
    }
}

/* sum(a * b) over n floats in ATen's order for a contiguous fp32 row: vectors of sw floats (n a multiple of
   sw, n / sw < 64), 4 accumulators, then the lanes from 0 */
static float row_dot(const float *a, const float *b, int n, int sw) {
    if (sw == 8) {  /* the common case, in 8-float vectors */
        typedef float v8 __attribute__((vector_size(32)));
        typedef float v8u __attribute__((vector_size(32), aligned(4)));
        v8 acc[4] = {{0}, {0}, {0}, {0}};
        int nv = n / 8, ilp = nv / 4;
        for (int i = 0; i < ilp; i++)
            for (int k = 0; k < 4; k++) {
                int e = (4 * i + k) * 8;
                v8 p = *(const v8u *)(a + e) * *(const v8u *)(b + e);
                acc[k] = acc[k] + p;
            }
        for (int v = ilp * 4; v < nv; v++) { v8 p = *(const v8u *)(a + v * 8) * *(const v8u *)(b + v * 8); acc[0] = acc[0] + p; }
        acc[0] = ((acc[0] + acc[1]) + acc[2]) + acc[3];
        float s = 0.f;
        for (int l = 0; l < 8; l++) s = s + acc[0][l];
        return s;
    }
    float acc[4][16];
    int nv = n / sw, ilp = nv / 4;
    for (int k = 0; k < 4; k++) for (int l = 0; l < sw; l++) acc[k][l] = 0.f;
    for (int i = 0; i < ilp; i++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < sw; l++) { int e = (4 * i + k) * sw + l; float p = a[e] * b[e]; acc[k][l] = acc[k][l] + p; }
    for (int v = ilp * 4; v < nv; v++)
        for (int l = 0; l < sw; l++) { int e = v * sw + l; float p = a[e] * b[e]; acc[0][l] = acc[0][l] + p; }
    for (int k = 1; k < 4; k++) for (int l = 0; l < sw; l++) acc[0][l] = acc[0][l] + acc[k][l];
    float s = 0.f;
    for (int l = 0; l < sw; l++) s = s + acc[0][l];
    return s;
}

static void to_grid(const float *w, float s, float lo, float hi, float *c, int g) {
    for (int k = 0; k < g; k++) {
        float t = rintf(w[k] / s);
        t = t < lo ? lo : t;
        c[k] = t > hi ? hi : t;
    }
}

/* e^T H e [rb] for rows w on grids (s, lo, hi) [rb]; c, e, he: scratch [RB, GMAX] */
static void errors(const float *w, int ws, const float *h, const float *s, const float *lo, const float *hi, int rb, int g,
                   int sw, float *e, float *he, float *err) {
    for (int r = 0; r < rb; r++) {
        to_grid(w + (size_t)r * ws, s[r], lo[r], hi[r], e + r * GMAX, g);
        for (int k = 0; k < g; k++) { float p = e[r * GMAX + k] * s[r]; e[r * GMAX + k] = p - w[(size_t)r * ws + k]; }
    }
    times_h(e, h, he, g);
    for (int r = 0; r < rb; r++) err[r] = row_dot(he + r * GMAX, e + r * GMAX, g, sw);
}

/* Rows w [n, g] (row stride g) of one group, H h [g, g]; plain grid (s0, z0) [n]; candidates' grids
   (s, z) [P, n]. Writes the winner's scale and zero point [n]. qmax: the top code. */
int column_vectors(void) { return CB; }  /* g must be a multiple of CB * VW */

int search_rows(const float *w, const float *h, int n, int g, float qmax, const float *s0, const float *z0,
                const float *s, const float *z, int P, int sw, float *best_s, float *best_z) {
    if (g > GMAX || g % (CB * VW) || sw > 16 || g % sw || g / sw >= 64) return 1;
    float c[RB * GMAX], hc[RB * GMAX];
    memset(c, 0, sizeof c);  /* rows past the last one are multiplied too: keep them finite */
    for (int r0 = 0; r0 < n; r0 += RB) {
        int rb = n - r0 < RB ? n - r0 : RB;
        const float *wr = w + (size_t)r0 * g;
        float lo[RB], hi[RB], sc[RB], err[RB], best[RB];
        for (int r = 0; r < rb; r++) { lo[r] = -z0[r0 + r]; hi[r] = qmax - z0[r0 + r]; sc[r] = s0[r0 + r]; }
        errors(wr, g, h, sc, lo, hi, rb, g, sw, c, hc, best);
        for (int r = 0; r < rb; r++) { best_s[r0 + r] = sc[r]; best_z[r0 + r] = z0[r0 + r]; }
        for (int p = 0; p < P; p++) {
            const float *sp = s + (size_t)p * n + r0, *zp = z + (size_t)p * n + r0;
            for (int r = 0; r < rb; r++) {
                lo[r] = -zp[r]; hi[r] = qmax - zp[r];
                to_grid(wr + (size_t)r * g, sp[r], lo[r], hi[r], c + r * GMAX, g);
            }
            times_h(c, h, hc, g);
            for (int r = 0; r < rb; r++) {
                float den = row_dot(hc + r * GMAX, c + r * GMAX, g, sw);
                float num = row_dot(hc + r * GMAX, wr + (size_t)r * g, g, sw);
                float fit = num / fmaxf(den, 1e-30f);
                sc[r] = (den > 0.f && fit > 0.f) ? fit : sp[r];
            }
            errors(wr, g, h, sc, lo, hi, rb, g, sw, c, hc, err);
            for (int r = 0; r < rb; r++)
                if (err[r] < best[r]) { best[r] = err[r]; best_s[r0 + r] = sc[r]; best_z[r0 + r] = zp[r]; }
        }
    }
    return 0;
}
"""

_P = ctypes.c_void_p


@functools.cache
def load() -> ctypes.CDLL | None:
    """The built kernel, or None where no C compiler works (or COMPRESS_CPU_KERNELS=0)."""
    return cpu_build.load("range_search", SOURCE, {
        "column_vectors": ([], ctypes.c_int),
        "search_rows": ([_P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_float, _P, _P, _P, _P, ctypes.c_int, ctypes.c_int, _P, _P],
                        ctypes.c_int),
    })


@functools.cache
def sum_width() -> int:
    """Floats per vector in torch's fp32 row sum on this build (8 on an AVX-512 host with torch 2.13): the first
    element 0 meets is 4 vectors on (4 accumulators), so a 1e9 there cancels 0's -1e9 before the 1s are added."""
    for width in (4, 8, 16):
        x = torch.ones(4 * width * 2)
        x[0], x[4 * width] = -1e9, 1e9
        if x.sum().item() == x.numel() - 2:
            return width
    return 0


def supports(w: torch.Tensor) -> bool:
    """Whether ``search_rows`` takes rows like w [o, g]: fp32 on CPU, g a multiple of the vector width, g <= 256."""
    lib = load()
    if lib is None or w.device.type != "cpu" or w.dtype != torch.float32:
        return False
    g, sw = w.shape[-1], sum_width()
    return sw > 0 and g <= 256 and g % (lib.vector_width() * lib.column_vectors()) == 0 and g % sw == 0 and g // sw < 64


def search_rows(w: torch.Tensor, h: torch.Tensor, qmax: int, plain: tuple[torch.Tensor, torch.Tensor],
                cands: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Winning (scale, zero) [o] (fp32) for rows w [o, g] of one group with H h [g, g]: plain rounding's grid
    ``plain`` (s0, z0) [o] and the candidates' grids ``cands`` (s, z) [P, o] (zero points as fp32 integers)."""
    w, h = w.contiguous(), h.contiguous()
    s0, z0 = (t.float().contiguous() for t in plain)
    s, z = (t.float().contiguous() for t in cands)
    best_s, best_z = torch.empty_like(s0), torch.empty_like(z0)
    lib = cpu_build.require(load())
    failed = lib.search_rows(w.data_ptr(), h.data_ptr(), w.shape[0], w.shape[1], float(qmax), s0.data_ptr(), z0.data_ptr(),
                             s.data_ptr(), z.data_ptr(), s.shape[0], sum_width(), best_s.data_ptr(), best_z.data_ptr())
    if failed:
        raise ValueError(f"search_rows does not take rows of {w.shape[1]}")
    return best_s, best_z
