"""y = x dequant(W)^T (+ b) on CPU for group-quantized int4/int3 W held as ``nibble_linear_cpu.pack``
gives it, with x quantized to int8 on the fly: integer dot products on x86 (AVX512-VNNI or AVX-VNNI
``vpdpbusd``, AVX2 ``vpmaddubsw``), x rounded per block of 32 (as llama.cpp's Q4_1 x Q8_1 path), or as ggml
rounds it for the GGUF type a form holds (``nibble_q8_dots``: fp16 steps for Q4_0 / Q4_1 / Q5_0, one step per 256
inputs for Q4_K / Q6_K). Imports only torch, the standard library and the shared checks (torch and triton).

Why: the fp32 kernel turns every 4-bit code into a float before its multiply (about five vector
instructions per 16 weights); here 64 codes take two shifts/masks and two integer dot-product
instructions, and two float operations per 64 weights and row of x.

The arithmetic, per row r of x and row n of W (w = q * s + offset per group g):
  x [r, 32c:32c+32] ~ d[r, c] * xi, xi int8 = round(x * 127 / max |x|), d = max |x| / 127 of that block of 32
  (our F32 form; the GGUF forms take max |x| and d as ggml does, ``quantize_row``)
  y[r, n] = sum_c s[n, g(c)] * d[r, c] * (q . xi)_c  +  sum_g offset[n, g] * sum_{c in g} d[r, c] * sum(xi_c)
that is x rounded times dequant(W), exactly up to fp32 summation order (``reference.int8_activation_matmul``).
The offsets' term takes x as rounded too: x's rounding error then multiplies (q - z) s, centered on
0, not q s; with x's exact sums there (tried first) the error on SmolLM2's Linears was 2.5x larger.
The fp32 kernel stays the exact path (``nibble_linear_cpu``); the runtime runs this one only where
the user allows activation quantization.

x's int8 copy is laid out to match a code row's 32-byte loads (``nibble_linear_cpu`` Layout): of 64
inputs, byte j < 16 of chunk c holds q[32c + j] in its low nibble and q[32c + 16 + j] in its high one,
so the low nibbles of 32 bytes are inputs 0-15 and 32-47, the high ones 16-31 and 48-63.
I must be a multiple of 64, the group size 32 (two groups per load: a lane-wise scale) or a multiple of 64
(``supports``), or 16 in the 6-bit super-block form (``nibble_six``: the two nibbles' dot products apart).
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build, row_tiles
from compress.kernels.nibble_forms import check_form, form
from compress.kernels.nibble_linear_cpu import Packed, call
from compress.kernels.nibble_q8_dots import DOTS
from compress.kernels.nibble_q8_forms import FORMS

BLOCK = 64  # inputs per 32-byte load of codes (x's int8 scales are per 32 of them)
# How a packed weight holds its scales and offsets (``form``) -> the C entry that reads it
ENTRIES = {"fp32": "linear", "fp16": "linear_f16", "fp16 symmetric": "linear_sym", "fp16 5-bit": "linear_five",
           "super-block": "linear_super", "6-bit super-block": "linear_six"}

SOURCE = r"""
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_Q8 1
#else
#define HAVE_Q8 0
#endif
int available(void) { return HAVE_Q8; }

#if HAVE_Q8
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define ISA 3
#define DOT(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define ISA 2
#define DOT(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#else
#define ISA 1
#endif
#if defined(__AVX512F__)
#define QRN 4  /* 32 vector registers */
#else
#define QRN 2
#endif
#define QPF 16  /* the 5-bit plane's rows prefetched this far ahead (row-major; the codes are tiled, row_tiles.py) */
#define QRM 4
""" + FORMS + DOTS + r"""
/* 0 none, 1 AVX2 maddubs, 2 AVX-VNNI, 3 AVX512-VNNI: what this build's integer dot product is. */
int dot_isa(void) { return ISA; }

/* y[r, n] for r < rm rows of quantized x and n < rn rows of W from row 0 of q/sc/of; rows of y ys apart. The codes
   are tiled (row_tiles.py): block b of row n at q + 32 (b tr + n), tr the rows of its tile of 4. */
static inline __attribute__((always_inline)) void qtile(const signed char *xi, const float *d, const float *sums,
        const unsigned char *q, const void *sc, const void *of, float *y, int I, int G, int gs, int ys, int tr,
        const int rm, const int rn, const int fmt) {
    __m256 acc[QRM][4];
    const __m256i low = _mm256_set1_epi8(15);
    const int P = I / 64;
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) acc[r][n] = _mm256_setzero_ps();
    /* d holds 8 lanes per block of 64 */
    for (int b = 0; b < P; b++) {
        const int g = b * 64 / gs;
        if (fmt == FIVE && (b & 7) == 0) prefetch_rows((const unsigned char *)of + 8 * b, I / 8, rn, QPF);
        for (int n = 0; n < rn; n++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * ((size_t)b * tr + n)));
            __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (fmt == FIVE) {  /* of: the plane of fifth bits, 8 bytes per block of 64 (lo's mask, hi's) */
                const unsigned char *h = (const unsigned char *)of + (size_t)n * (I / 8) + 8 * b;
                lo = _mm256_or_si256(lo, fifth_bits(h));
                hi = _mm256_or_si256(hi, fifth_bits(h + 4));
            }
            if (fmt == SIX) {  /* of: 32 bytes of crumbs per 2 blocks (2c, 2c + 1 at bits 0-3, 4-7), tiled as q; groups of 16 */
                __m256i qh = _mm256_loadu_si256((const __m256i *)((const unsigned char *)of + 32 * ((size_t)(b / 2) * tr + n)));
                if (b & 1) qh = _mm256_srli_epi16(qh, 4);  /* the upper byte's bits land in 4-7, masked off below */
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(12)), 2));
                __m256 sl, sh;
                six_scales((const unsigned char *)sc + n * scales_row_bytes(fmt, G, 0), b, &sl, &sh);
                for (int r = 0; r < rm; r++) {
                    __m256i dl, dh;
                    half_dots(lo, hi, xi + (size_t)r * I + 64 * b, &dl, &dh);
                    const __m256 dv = _mm256_loadu_ps(d + ((size_t)r * P + b) * 8);
                    acc[r][n] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dl), dv), sl, acc[r][n]);
                    acc[r][n] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dh), dv), sh, acc[r][n]);
                }
                continue;
            }
            /* groups of 32 (llama.cpp's Q4_0/Q4_1 blocks): lanes 0-3 hold inputs of group 2b, lanes 4-7 of 2b + 1 */
            const __m256 sv = scale_vector(sc, of, (size_t)n * G + g, gs, fmt);
            for (int r = 0; r < rm; r++) {
                const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(block_dot(lo, hi, xi + (size_t)r * I + 64 * b)),
                                                 _mm256_loadu_ps(d + ((size_t)r * P + b) * 8));
                acc[r][n] = _mm256_fmadd_ps(dot, sv, acc[r][n]);
            }
        }
    }
    /* the offsets' term, 8 groups a vector (a scalar loop here cost Q4_0's 18-48 groups a row 10-25 % of the call) */
    const int G8 = G & ~7;
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) {
            __m256 a = acc[r][n];
            for (int g = 0; g < G8; g += 8)
                a = _mm256_fmadd_ps(fmt == SIX ? six_offsets8((const unsigned char *)sc + n * scales_row_bytes(fmt, G, 0), g)
                                               : offsets8(sc, of, (size_t)n * G + g, fmt), _mm256_loadu_ps(sums + (size_t)r * G + g), a);
            const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
            float out = _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
            for (int g = G8; g < G; g++) out += offset1(sc, of, (size_t)n * G + g, fmt) * sums[(size_t)r * G + g];
            y[(size_t)r * ys + n] = out;
        }
}

#define QCASE(f, a, b) case (f * 8 + a) * 8 + b: \
    if (a <= QRM && (b <= QRN || a == 1)) qtile(xi, d, sums, q, sc, of, y, I, G, gs, ys, tr, a, b, f); break;
#define QCASES(f, a) QCASE(f, a, 1) QCASE(f, a, 2) QCASE(f, a, 3) QCASE(f, a, 4)
#define QFORM(f) QCASES(f, 1) QCASES(f, 2) QCASES(f, 3) QCASES(f, 4)
static void any_qtile(const signed char *xi, const float *d, const float *sums, const unsigned char *q, const void *sc,
                      const void *of, float *y, int I, int G, int gs, int ys, int tr, int rm, int rn, int fmt) {
    switch ((fmt * 8 + rm) * 8 + rn) { QFORM(F32) QFORM(F16) QFORM(SYM) QFORM(FIVE) QFORM(SUPER) QFORM(SIX) }
}

/* y [M, O] = x [M, I] @ dequant(W)^T with x quantized to int8 (quantize_row); 1 where a buffer could not be allocated. */
static int run(const float *x, const unsigned char *q, const void *sc, const void *of, float *y,
               int M, int O, int I, int G, int threads, int fmt) {
    if (fmt == SIX) G *= 16;  /* the caller counts super-blocks (the scales' shape[1]) */
    /* one row of x (decode) leaves registers for 4 rows of W a tile on AVX2 too */
    const int rnm = M == 1 ? 4 : QRN, gs = I / G, P = I / 64, blocks = (O + rnm - 1) / rnm, es = fmt == F32 ? 4 : 2;
    signed char *xi = malloc((size_t)M * I);
    float *d = malloc(sizeof(float) * ((size_t)M * P * 8 + (size_t)M * G));
    if (!xi || !d) { free(xi); free(d); return 1; }
    float *sums = d + (size_t)M * P * 8;
    /* x rounded as ggml rounds it for the GGUF type each form holds (our own checkpoints' F32 form: X32) */
    const int mode = fmt == SUPER || fmt == SIX ? XQ8_K : fmt == SYM || fmt == FIVE ? XQ8_0 : fmt == F16 && gs == 32 ? XQ8_1 : X32;
    for (int r = 0; r < M; r++)
        quantize_row(x + (size_t)r * I, xi + (size_t)r * I, d + (size_t)r * P * 8, sums + (size_t)r * G, I, G, gs, mode);
    if (threads > blocks) threads = blocks;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        int o0, o1;
        share(O, rnm, t, threads, &o0, &o1);
        for (int m = 0; m < M; m += QRM)
            for (int o = o0; o < o1; o += rnm) {
                const int t0 = o - o % 4;  /* the first row of o's tile of 4 */
                any_qtile(xi + (size_t)m * I, d + (size_t)m * P * 8, sums + (size_t)m * G, q + (size_t)t0 * (I / 2) + 32 * (o % 4),
                          (const char *)sc + o * scales_row_bytes(fmt, G, es), offsets_at(of, o, fmt, I, G, es),
                          y + (size_t)m * O + o, I, G, gs, O, O - t0 < 4 ? O - t0 : 4,
                          M - m < QRM ? M - m : QRM, o1 - o < rnm ? o1 - o : rnm, fmt);
            }
    }
    free(xi);
    free(d);
    return 0;
}

/* One entry per form, in the 4-bit kernels' calling convention (the decode step's table takes any of them). */
int linear(const float *x, const unsigned char *q, const void *sc, const void *of, float *y, int M, int O, int I, int G,
           int threads) { return run(x, q, sc, of, y, M, O, I, G, threads, F32); }
int linear_f16(const float *x, const unsigned char *q, const void *sc, const void *of, float *y, int M, int O, int I,
               int G, int threads) { return run(x, q, sc, of, y, M, O, I, G, threads, F16); }
int linear_sym(const float *x, const unsigned char *q, const void *sc, const void *of, float *y, int M, int O, int I,
               int G, int threads) { return run(x, q, sc, of, y, M, O, I, G, threads, SYM); }
int linear_five(const float *x, const unsigned char *q, const void *sc, const void *of, float *y, int M, int O, int I,
                int G, int threads) { return run(x, q, sc, of, y, M, O, I, G, threads, FIVE); }
int linear_super(const float *x, const unsigned char *q, const void *sc, const void *of, float *y, int M, int O, int I,
                 int G, int threads) { return run(x, q, sc, of, y, M, O, I, G, threads, SUPER); }
int linear_six(const float *x, const unsigned char *q, const void *sc, const void *of, float *y, int M, int O, int I,
               int G, int threads) { return run(x, q, sc, of, y, M, O, I, G, threads, SIX); }
#else
int dot_isa(void) { return 0; }
int linear(const float *x, const unsigned char *q, const void *sc, const void *of, float *y,
           int M, int O, int I, int G, int threads) { return 2; }
int linear_f16(const float *x, const unsigned char *q, const void *sc, const void *of, float *y,
               int M, int O, int I, int G, int threads) { return 2; }
int linear_sym(const float *x, const unsigned char *q, const void *sc, const void *of, float *y,
               int M, int O, int I, int G, int threads) { return 2; }
int linear_five(const float *x, const unsigned char *q, const void *sc, const void *of, float *y,
                int M, int O, int I, int G, int threads) { return 2; }
int linear_super(const float *x, const unsigned char *q, const void *sc, const void *of, float *y,
                 int M, int O, int I, int G, int threads) { return 2; }
int linear_six(const float *x, const unsigned char *q, const void *sc, const void *of, float *y,
               int M, int O, int I, int G, int threads) { return 2; }
#endif
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built or the CPU has no integer dot product for it."""
    lib = cpu_build.load("nibble_q8", SOURCE, {
        **{name: ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 5, ctypes.c_int) for name in ENTRIES.values()},
        "available": ([], ctypes.c_int),
        "dot_isa": ([], ctypes.c_int),
    })
    return lib if lib is not None and lib.available() else None


def isa() -> str:
    """The integer dot product this host's build uses, for reports ("none" without the kernel)."""
    lib = load()
    return ("none", "avx2-maddubs", "avx-vnni", "avx512-vnni")[lib.dot_isa() if lib else 0]


def supports(scale: torch.Tensor, in_features: int) -> bool:
    """Whether weights with this scale [O, G] and in_features can run here: on an x86 CPU with AVX2,
    in_features a multiple of 64 and the group size 32 or a multiple of 64, with the kernel built."""
    groups = scale.shape[1]  # [O, G] (or [O, G, 2]: the super-block form)
    group = in_features // groups if groups > 0 and in_features % groups == 0 else 0
    return (scale.device.type == "cpu" and in_features % BLOCK == 0 and (group == 32 or (group > 0 and group % BLOCK == 0))
            and load() is not None)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] ~ x [..., I] @ dequant(W)^T (+ bias [O]), fp32 in and out, x rounded to int8 as the form asks;
    packed as ``pack`` or ``compact`` gives it (row-major codes: tiled here per call, as the runtime holds them once)."""
    check_form(x, packed, bias)
    in_features, groups = 2 * packed[0].shape[1], packed[1].shape[1]
    if not supports(packed[1], in_features):
        raise ValueError(f"the int8-activation kernel needs AVX2, in_features ({in_features}) a multiple of {BLOCK} and "
                         f"the group size ({in_features // max(groups, 1)}) 32 or a multiple of {BLOCK}")
    codes, scales, offsets = (t.contiguous() for t in packed)
    return unchecked(x, (row_tiles.tiled(codes), scales, offsets), bias)


def unchecked(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` without its checks, for a caller that made sure once that they pass (the runtime's Linears), the
    codes already tiled (``row_tiles.tiled``)."""
    return call(load(), x, packed, bias, "x's int8 copy", ENTRIES[form(packed)])
