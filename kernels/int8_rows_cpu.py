"""y = x (s * Q)^T on CPU, fp32 activations, for a weight stored as int8 codes Q [O, I] with one fp32
scale per output row: a small C GEMM built by ``cpu_build``, and ``quantize`` (symmetric, per row).
Imports only torch, the standard library and the shared checks (torch and triton).

Why: an lm_head is the largest single read of a decode step of a small model (SmolLM2's tied
49152 x 576 table: 108 MiB in fp32, read whole for every token); int8 reads a quarter of that, as
llama.cpp's Q8_0 output does. The register tile is the fp32 kernel's (``linear_cpu``): RM rows of x
by RN rows of W, each W vector widened from 16 (AVX-512) or 8 bytes to floats once and used for
every row of x; the row's scale multiplies the finished sum.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build, panel_cpu
from compress.kernels.checks import check_bias
from compress.kernels.linear_cpu import TILE

SOURCE = TILE + r"""
#if defined(__AVX2__)
#include <immintrin.h>
#endif
/* W's rows prefetched this far ahead: without it a 1-row call read 14 GB/s on one core of an AMD EPYC (the lm_head
   of SmolLM2, 27 MiB); 12-24 rows ahead: 2.3-2.9x there, 1.6x on a 4096-input weight. */
#define PF 16
typedef signed char i8v __attribute__((vector_size(VW), aligned(1)));
typedef int vi __attribute__((vector_size(VW * 4)));

/* VW int8 codes as floats: one vpmovsxbd on x86 (GCC's portable form loads byte by byte). */
static inline vf widen(const signed char *p) {
#if VW == 16
    return __builtin_convertvector((vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)), vf);
#elif VW == 8 && defined(__AVX2__)
    return __builtin_convertvector((vi)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)), vf);
#else
    return __builtin_convertvector(*(const i8v *)p, vf);
#endif
}

/* y[r, n] = s[n] * x[r, :] . q[n, :] for r < rm, n < rn; rows of x and q are I apart, of y ys. */
static inline __attribute__((always_inline)) void qtile(const float *x, const signed char *q, const float *s, float *y,
                                                        int I, int ys, const int rm, const int rn) {
    vf acc[RM][RN];
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) acc[r][n] = (vf){0};
    int k = 0;
    for (; k + VW <= I; k += VW) {
        if ((k & 63) == 0) prefetch_rows(q + k, I, rn, PF);  /* once per 64-byte line of each row */
        vf wv[RN];
        for (int n = 0; n < rn; n++) wv[n] = widen(q + (size_t)n * I + k);
        for (int r = 0; r < rm; r++) {
            const vf xv = *(const vfu *)(x + (size_t)r * I + k);
            for (int n = 0; n < rn; n++) acc[r][n] += xv * wv[n];
        }
    }
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) {
            float t = hsum(acc[r][n]);
            for (int j = k; j < I; j++) t += x[(size_t)r * I + j] * q[(size_t)n * I + j];  /* I % VW inputs */
            y[(size_t)r * ys + n] = s[n] * t;
        }
}

#define QCASE(a, b) case a * 8 + b: if (a <= RM && b <= RN) qtile(x, q, s, y, I, ys, a, b); break;
#define QCASES(a) QCASE(a, 1) QCASE(a, 2) QCASE(a, 3) QCASE(a, 4) QCASE(a, 5) QCASE(a, 6)
static void any_qtile(const float *x, const signed char *q, const float *s, float *y, int I, int ys, int rm, int rn) {
    switch (rm * 8 + rn) { QCASES(1) QCASES(2) QCASES(3) QCASES(4) }
}

/* y [M, O] = x [M, I] @ (s * q)^T; each thread a contiguous share of W's rows, all rows of x per W tile. */
void linear(const float *x, const signed char *q, const float *s, float *y, int M, int O, int I, int threads) {
    const int blocks = (O + RN - 1) / RN;
    if (threads > blocks) threads = blocks;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        int o0, o1;
        share(O, RN, t, threads, &o0, &o1);
        for (int o = o0; o < o1; o += RN)
            for (int m = 0; m < M; m += RM)
                any_qtile(x + (size_t)m * I, q + (size_t)o * I, s + o, y + (size_t)m * O + o, I, O,
                          M - m < RM ? M - m : RM, o1 - o < RN ? o1 - o : RN);
    }
}
""" + panel_cpu.PANEL + r"""
struct wsrc { const signed char *q; const float *s; int I; };

/* panel_cpu's panels straight from the codes: cnt rows scaled into spare, then put in place. */
static void pack_rows(const struct wsrc *w, int o, int cnt, int k0, int K, float *panel, float *spare) {
    for (int j = 0; j < cnt; j++) {
        const signed char *q = w->q + (size_t)(o + j) * w->I + k0;
        const float s = w->s[o + j];
        for (int k = 0; k < K; k++) spare[(size_t)j * K + k] = s * q[k];
    }
    put_rows(spare, K, cnt, K, panel);
}

int panel(const float *x, const signed char *q, const float *s, float *y, int M, int O, int I, int threads) {
    const struct wsrc w = {q, s, I};
    return panel_linear(x, &w, y, M, O, I, 1, threads);
}
"""

Packed = tuple[torch.Tensor, torch.Tensor]  # (codes int8 [O, I], scale fp32 [O])


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    return cpu_build.load("int8_rows", SOURCE, {"linear": ([ctypes.c_void_p] * 4 + [ctypes.c_int] * 4, None),
                                                "panel": ([ctypes.c_void_p] * 4 + [ctypes.c_int] * 4, ctypes.c_int)})


def supports(weight: torch.Tensor) -> bool:
    """Whether a weight [O, I] can be held and run this way here: on CPU, with the kernel built."""
    return weight.device.type == "cpu" and weight.dim() == 2 and weight.is_floating_point() and load() is not None


def quantize(weight: torch.Tensor, rows: int = 4096) -> Packed:
    """(codes int8 [O, I], scale fp32 [O]) with weight ~ scale[:, None] * codes, symmetric per row,
    computed ``rows`` rows at a time (no fp32 copy of a large weight)."""
    codes = torch.empty(weight.shape, dtype=torch.int8)
    scale = torch.empty(weight.shape[0], dtype=torch.float32)
    for o in range(0, weight.shape[0], rows):
        w = weight[o:o + rows].float()  # [rows, I]
        s = w.abs().amax(1) / 127  # [rows]
        scale[o:o + rows] = s
        codes[o:o + rows] = torch.round(w / torch.where(s > 0, s, 1)[:, None]).to(torch.int8)
    return codes, scale


def dequantize(packed: Packed, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 weight [O, I] the codes stand for, written into ``out`` (a contiguous fp32 buffer of at least
    O * I elements, e.g. a scratch buffer reused across calls) where given."""
    codes, scale = packed
    if out is None:
        return codes.float() * scale[:, None]
    return torch.mul(codes, scale[:, None], out=out.view(-1)[:codes.numel()].view(codes.shape))


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ (scale * codes)^T (+ bias [O]), fp32, with packed = quantize(weight)."""
    codes, scale = packed
    if codes.dim() != 2 or codes.dtype != torch.int8 or scale.shape != codes.shape[:1] or scale.dtype != torch.float32:
        raise ValueError(f"packed must be int8 codes [O, I] and fp32 scales [O] (quantize), got {codes.dtype} "
                         f"{list(codes.shape)} and {scale.dtype} {list(scale.shape)}")
    if x.shape[-1] != codes.shape[1] or x.dtype != torch.float32 or not (x.is_cpu and codes.is_cpu and scale.is_cpu):
        raise ValueError(f"x must be fp32 on the CPU ending in {codes.shape[1]} features, got {x.dtype} "
                         f"{list(x.shape)} on {x.device}")
    check_bias(bias, codes.shape[0], torch.float32)
    return unchecked(x, (codes.contiguous(), scale.contiguous()), bias)


def unchecked(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` without its checks, for a caller that made sure once that they pass (the runtime's Linears)."""
    codes, scale = packed
    out_features, in_features = codes.shape
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty(x.shape[:-1] + (out_features,), dtype=torch.float32)  # [..., O]
    rows = x.numel() // in_features if in_features else 0
    if rows and out_features:
        cpu_build.require(load()).linear(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), y.data_ptr(), rows,
                                         out_features, in_features, torch.get_num_threads())
    elif not in_features:
        y.zero_()
    if bias is not None:
        y += bias
    return y


def panel(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``unchecked`` by ``panel_cpu``'s GEMM over panels dequantized per call (for many rows; no dense copy)."""
    codes, scale = packed
    return panel_cpu.call(lambda lib, x, y, rows: lib.panel(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), y.data_ptr(), rows,
                                                            *codes.shape, torch.get_num_threads()),
                          load(), x, *codes.shape, bias)
