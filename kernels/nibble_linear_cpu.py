"""y = x dequant(W)^T (+ b) on CPU, fp32 activations, for group-quantized int4/int3 W: a small C GEMM
built by ``cpu_build`` over codes held as 4-bit nibbles. Imports only torch, the standard library,
the shared checks (torch and triton) and ``linear_cpu``'s panel layout.

Why: the fp32 C GEMM (``linear_cpu``) reads 4 bytes per weight, and at 1-8 rows that read is the
step's cost. Here a weight is half a byte plus its group's scale and offset, so a decode step of an
int4/int3 model reads ~6x fewer bytes; the codes are turned into floats in registers, a cost paid
once per tile of up to 6 rows. int3 codes are stored as nibbles too (same speed, same memory as int4).

Layout (``pack``), 16 output rows a panel as in ``linear_cpu``:
  codes   uint8 [P, I, 8]: byte (c, i, j) = q[16c + j, i] | q[16c + 8 + j, i] << 4
  scales  fp32  [P, G, 16]: s of rows 16c..16c+15 in group g
  offsets fp32  [P, G, 16]: -z * s, so that w = q * s + offset
and per group y += s * sum_i q_i x_i + offset * sum_i x_i, with sum_i x_i computed once per call.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build
from compress.kernels.checks import check_bias
from compress.kernels.linear_cpu import PANEL, panels_of

SOURCE = r"""
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef unsigned char u8x8 __attribute__((vector_size(8), aligned(1)));
typedef int i8 __attribute__((vector_size(32)));

/* 8 bytes zero-extended to 8 int32 lanes. GCC turns the portable form into 8 scalar loads; on x86 one
   vpmovzxbd does it (the loop ran ~3x faster with it). */
#if defined(__AVX2__)
#include <immintrin.h>
static inline i8 widen(const unsigned char *p) { return (i8)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
#else
static inline i8 widen(const unsigned char *p) { return __builtin_convertvector(*(const u8x8 *)p, i8); }
#endif

#define ACC(r) v8 a##r##0 = {0}, a##r##1 = {0}, b##r##0 = {0}, b##r##1 = {0};
#define FMA(r, acc, k) if (NR > r) { const float t = x[(size_t)(r) * I + (k)]; acc##r##0 += t * w0; acc##r##1 += t * w1; }
#define WEIGHTS(k) const i8 c = widen(q + (size_t)(k) * 8); \
    const v8 w0 = __builtin_convertvector(c & 15, v8), w1 = __builtin_convertvector(c >> 4, v8);
#define STEP(acc, k) { WEIGHTS(k) FMA(0, acc, k) FMA(1, acc, k) FMA(2, acc, k) FMA(3, acc, k) FMA(4, acc, k) FMA(5, acc, k) }
/* The group's sums go into the output tile, which stays in L1: registers hold only accumulators. */
#define FOLD(r) if (NR > r) { const float t = xs[(size_t)(r) * G + g]; v8u *yr = (v8u *)(y + (size_t)(r) * ys); \
    yr[0] += s0 * (a##r##0 + b##r##0) + o0 * t; yr[1] += s1 * (a##r##1 + b##r##1) + o1 * t; }
/* A tile of NR <= 6 rows of x times one panel. With 1-2 rows, odd and even inputs go to separate
   accumulators (a, b): one chain per vector would wait on the FMA latency (1 row: 4 cycles a step
   instead of ~2). From 3 rows on the rows' chains hide it, and 6 rows fill 12 of the 16 registers. */
#define TILE(ROWS) \
static void tile##ROWS(const float *x, const float *xs, const unsigned char *q, const float *sc, const float *of, \
                       float *y, int I, int G, int gs, int ys) { \
    enum { NR = ROWS, SPLIT = ROWS <= 2 }; \
    for (int r = 0; r < NR; r++) memset(y + (size_t)r * ys, 0, 16 * sizeof(float)); \
    for (int g = 0; g < G; g++) { \
        ACC(0) ACC(1) ACC(2) ACC(3) ACC(4) ACC(5) \
        const int end = (g + 1) * gs; \
        int i = g * gs; \
        if (SPLIT) for (; i + 1 < end; i += 2) { STEP(a, i) STEP(b, i + 1) } \
        for (; i < end; i++) STEP(a, i) \
        const v8 s0 = *(const v8u *)(sc + (size_t)g * 16), s1 = *(const v8u *)(sc + (size_t)g * 16 + 8); \
        const v8 o0 = *(const v8u *)(of + (size_t)g * 16), o1 = *(const v8u *)(of + (size_t)g * 16 + 8); \
        FOLD(0) FOLD(1) FOLD(2) FOLD(3) FOLD(4) FOLD(5) \
    } \
}
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

typedef void (*tile_fn)(const float *, const float *, const unsigned char *, const float *, const float *,
                        float *, int, int, int, int);
static const tile_fn TILES[7] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

/* y [M, O] = x [M, I] @ dequant(W)^T with W as (codes, scales, offsets) above; gs = I / G. */
int linear(const float *x, const unsigned char *q, const float *sc, const float *of, float *y,
           int M, int O, int I, int G, int threads) {
    const int gs = I / G, panels = (O + 15) / 16;
    float *xs = malloc(sizeof(float) * ((size_t)M * G + 1));  /* [M, G] per-group sums of x (+1: never malloc(0)) */
    if (!xs) return 1;
    for (int m = 0; m < M; m++)
        for (int g = 0; g < G; g++) {
            float t = 0;
            for (int i = g * gs; i < (g + 1) * gs; i++) t += x[(size_t)m * I + i];
            xs[(size_t)m * G + g] = t;
        }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int c = 0; c < panels; c++) {
        const unsigned char *qc = q + (size_t)c * I * 8;
        const float *sc_c = sc + (size_t)c * G * 16, *of_c = of + (size_t)c * G * 16;
        const int cols = O - c * 16 < 16 ? O - c * 16 : 16;
        for (int m = 0; m < M; m += 6) {
            const int rows = M - m < 6 ? M - m : 6;
            const float *xm = x + (size_t)m * I, *xsm = xs + (size_t)m * G;
            if (cols == 16) {
                TILES[rows](xm, xsm, qc, sc_c, of_c, y + (size_t)m * O + c * 16, I, G, gs, O);
            } else {  /* the ragged last panel: through a scratch tile, so padding is never stored */
                float t[6 * 16];
                TILES[rows](xm, xsm, qc, sc_c, of_c, t, I, G, gs, 16);
                for (int r = 0; r < rows; r++) memcpy(y + (size_t)(m + r) * O + c * 16, t + r * 16, cols * sizeof(float));
            }
        }
    }
    free(xs);
    return 0;
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    return cpu_build.load("nibble_linear", SOURCE, "linear", [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5, ctypes.c_int)


def supports(scale: torch.Tensor) -> bool:
    """Whether weights with this scale [O, G] can run here: on CPU, with the kernel built."""
    return scale.device.type == "cpu" and load() is not None


def pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes uint8 [O, I] in [0, 16), scale and zero [O, G] -> (codes [P, I, 8] uint8, scales, offsets [P, G, 16] fp32)."""
    if codes.dim() != 2 or scale.shape != zero.shape or scale.shape[0] != codes.shape[0] or codes.shape[1] % scale.shape[1]:
        raise ValueError(f"codes {list(codes.shape)}, scale {list(scale.shape)} and zero {list(zero.shape)} do not describe one grouped weight")
    if codes.dtype != torch.uint8 or int(codes.max()) > 15:
        raise ValueError("codes must be uint8 values below 16 (int4 or int3)")
    p = panels_of(codes)  # [P, I, 16]
    nibbles = p[..., :8] | (p[..., 8:] << 4)  # [P, I, 8]
    s = scale.float()
    return nibbles.contiguous(), panels_of(s), panels_of(-zero.float() * s)


def linear(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor], out_features: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ dequant(W)^T (+ bias [O]), fp32, with packed = pack(codes, scale, zero)."""
    codes, scales, offsets = packed
    panels, in_features, groups = -(-out_features // PANEL), codes.shape[1], scales.shape[1]
    if codes.shape != (panels, in_features, 8) or scales.shape != (panels, groups, PANEL) or offsets.shape != scales.shape:
        raise ValueError(f"packed shapes {[list(t.shape) for t in packed]} do not hold {out_features} output rows: use pack()")
    if groups == 0 or in_features % groups:
        raise ValueError(f"{groups} groups do not divide {in_features} input features")
    if x.shape[-1] != in_features:
        raise ValueError(f"x must end in {in_features} features, got shape {list(x.shape)}")
    if x.dtype != torch.float32 or codes.dtype != torch.uint8 or scales.dtype != torch.float32 or offsets.dtype != torch.float32:
        raise ValueError(f"x, scales, offsets must be torch.float32 and codes torch.uint8, got {x.dtype}, {scales.dtype}, {offsets.dtype}, {codes.dtype}")
    if not (x.is_cpu and codes.is_cpu and scales.is_cpu and offsets.is_cpu):
        raise ValueError(f"x and the packed weight must be on the CPU, got {x.device} and {codes.device}")
    check_bias(bias, out_features, torch.float32)
    rows = x.reshape(-1, in_features).contiguous()  # [M, I]
    y = torch.empty(rows.shape[0], out_features, dtype=torch.float32)  # [M, O]
    status = cpu_build.require(load()).linear(
        rows.data_ptr(), codes.contiguous().data_ptr(), scales.contiguous().data_ptr(), offsets.contiguous().data_ptr(),
        y.data_ptr(), rows.shape[0], out_features, in_features, groups, torch.get_num_threads(),
    )
    if status:
        raise MemoryError("the int4 CPU kernel could not allocate its per-group sums")
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], out_features)
