"""y = x (s * C)^T on CPU for a weight held as signed 8-bit codes C [O, I] (one byte a weight) with one fp32 scale
per group of 16, 32 or a multiple of 32 inputs, x rounded to int8 on the fly as ggml rounds it (groups of 32, Q8_0:
fp16 steps per 32 inputs; of 16, Q6_K: one step per 256): integer dot products as llama.cpp's Q8_0 x Q8_0 path. Imports only torch, the standard library and the shared checks.

Why: llama.cpp's 5-, 6- and 8-bit block types (Q5_0, Q6_K, Q8_0, the wider half of a Q4_K_M file) are symmetric,
w = d (q - 2^(bits-1)), so each is ggml's signed code times its block's (or sub-block's) scale; held as those
bytes they run on the same integer dot product as ggml computes them, instead of dequantized to fp32 (4x the
bytes a step). The codes are read whole bytes (not ggml's split low and high bits): simpler unpacking for up to
1.6x the bytes of a Q5_0 row.

The arithmetic, per row r of x and row n of W, c over blocks of 32 inputs, g(c) their group(s):
  x [r, 32c:32c+32] ~ d[r, c] * xi, xi int8 = round(x * 127 / max |x|), d = max |x| / 127 (``quantize_row``)
  y[r, n] = sum_c d[r, c] * sum_{g in c} s[n, g] * (C . xi)_g
that is ``reference.round_blocks_int8(x) @ (s * C)^T`` up to fp32 summation order. A signed x signed byte
product has no x86 instruction below AVX-VNNI-INT8, so as ggml does: |C| (unsigned, <= 128) times x with C's sign.
I must be a multiple of 32. The kernel reads the codes tiled by 4 rows (``row_tiles``: one stream a tile).
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build, row_tiles
from compress.kernels.checks import check_bias

BLOCK = 32  # inputs per block of x's int8 copy and per 32-byte load of codes
Packed = tuple[torch.Tensor, torch.Tensor]  # (codes int8 [O, I], scales fp32 [O, G])

SOURCE = r"""
#include <stdlib.h>
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
#define DOT(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define DOT(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#endif
#if defined(__AVX512F__)
#define QRN 4  /* 32 vector registers */
#else
#define QRN 2
#endif
#define QRM 4

/* Row of x [I] -> xi [I] int8 and d [I/32]: the step of each block of 32, as ggml takes it for the weight type: for
   groups of 32 (Q8_0) max |x| / 127 rounded to fp16 (its Q8_0 activations), for groups of 16 (Q6_K) one step per 256
   inputs, 1 / (127 / max |x|) (Q8_K); else max |x| / 127 per 32 in fp32. Codes round(x * 127 / max |x|) in each. */
static void quantize_row(const float *x, signed char *xi, float *d, int I, int gs) {
    const int span = gs == 16 && I % 256 == 0 ? 256 : 32;
    float inv = 0.f, step = 0.f;
    for (int c = 0; c < I / 32; c++) {
        const float *xc = x + 32 * c;
        if ((32 * c) % span == 0) {
            float amax = 0.f;
            for (int k = 0; k < span; k++) {
                const float a = fabsf(xc[k]);
                amax = a > amax ? a : amax;
            }
            inv = amax > 0.f ? 127.f / amax : 0.f;
            step = span == 256 ? (amax > 0.f ? 1.f / inv : 0.f) : gs == 32 ? _cvtsh_ss(_cvtss_sh(amax / 127.f, 0)) : amax / 127.f;
        }
        d[c] = step;
        for (int k = 0; k < 32; k++) xi[32 * c + k] = (signed char)lrintf(xc[k] * inv);
    }
}

/* 8 int32 lanes summing to (w . x) over 32 signed bytes: lane l holds inputs 4l..4l+3. */
static inline __m256i signed_dot(__m256i aw, __m256i w, __m256i x) {
    const __m256i sx = _mm256_sign_epi8(x, w);
#if defined(DOT)
    return DOT(_mm256_setzero_si256(), aw, sx);
#else
    /* |w| <= 128, |x| <= 127: a pair sums to at most 32512, no int16 saturation */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
#endif
}

/* The 8 lanes' scales of block b of a row of W: groups of 16 (lanes 0-3 | 4-7), of 32, or wider. */
static inline __m256 lane_scales(const float *s, int b, int gs) {
    if (gs == 16) return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(s[2 * b])), _mm_set1_ps(s[2 * b + 1]), 1);
    return _mm256_set1_ps(s[b * 32 / gs]);
}

/* y[r, n] for r < rm rows of quantized x and n < rn rows of W from row 0 of q/sc; rows of y ys apart. The codes are
   tiled (row_tiles.py): block b of row n at q + 32 (b tr + n), tr the rows of its tile of 4. */
static inline __attribute__((always_inline)) void qtile(const signed char *xi, const float *d, const signed char *q,
        const float *sc, float *y, int I, int G, int gs, int ys, int tr, const int rm, const int rn) {
    __m256 acc[QRM][4];
    const int P = I / 32;
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) acc[r][n] = _mm256_setzero_ps();
    for (int b = 0; b < P; b++) {
        __m256i xv[QRM];
        __m256 dv[QRM];
        for (int r = 0; r < rm; r++) {
            xv[r] = _mm256_loadu_si256((const __m256i *)(xi + (size_t)r * I + 32 * b));
            dv[r] = _mm256_set1_ps(d[(size_t)r * P + b]);
        }
        for (int n = 0; n < rn; n++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(q + 32 * ((size_t)b * tr + n)));
            const __m256i aw = _mm256_sign_epi8(w, w);  /* |w|; -128 stays 0x80, read as unsigned 128 */
            const __m256 sv = lane_scales(sc + (size_t)n * G, b, gs);
            for (int r = 0; r < rm; r++)
                acc[r][n] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(signed_dot(aw, w, xv[r])), dv[r]), sv, acc[r][n]);
        }
    }
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) {
            const __m256 a = acc[r][n];
            const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
            y[(size_t)r * ys + n] = _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
        }
}

#define QCASE(a, b) case a * 8 + b: if (a <= QRM && (b <= QRN || a == 1)) qtile(xi, d, q, sc, y, I, G, gs, ys, tr, a, b); break;
#define QCASES(a) QCASE(a, 1) QCASE(a, 2) QCASE(a, 3) QCASE(a, 4)
static void any_qtile(const signed char *xi, const float *d, const signed char *q, const float *sc, float *y,
                      int I, int G, int gs, int ys, int tr, int rm, int rn) {
    switch (rm * 8 + rn) { QCASES(1) QCASES(2) QCASES(3) QCASES(4) }
}

/* y [M, O] = x [M, I] @ (s * q)^T with x quantized per block of 32; 1 where a buffer could not be allocated. */
int linear(const float *x, const signed char *q, const float *sc, float *y, int M, int O, int I, int G, int threads) {
    const int rnm = M == 1 ? 4 : QRN, gs = I / G, P = I / 32, blocks = (O + rnm - 1) / rnm;
    signed char *xi = malloc((size_t)M * I);
    float *d = malloc(sizeof(float) * (size_t)M * P);
    if (!xi || !d) { free(xi); free(d); return 1; }
    for (int r = 0; r < M; r++) quantize_row(x + (size_t)r * I, xi + (size_t)r * I, d + (size_t)r * P, I, gs);
    if (threads > blocks) threads = blocks;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        int o0, o1;
        share(O, rnm, t, threads, &o0, &o1);
        for (int m = 0; m < M; m += QRM)
            for (int o = o0; o < o1; o += rnm) {
                const int t0 = o - o % 4;  /* the first row of o's tile of 4 */
                any_qtile(xi + (size_t)m * I, d + (size_t)m * P, q + (size_t)t0 * I + 32 * (o % 4), sc + (size_t)o * G,
                          y + (size_t)m * O + o, I, G, gs, O, O - t0 < 4 ? O - t0 : 4, M - m < QRM ? M - m : QRM,
                          o1 - o < rnm ? o1 - o : rnm);
            }
    }
    free(xi);
    free(d);
    return 0;
}
#else
int linear(const float *x, const signed char *q, const float *sc, float *y, int M, int O, int I, int G, int threads) {
    return 2;
}
#endif

/* ``linear`` in the 4-bit kernels' calling convention (an offsets pointer, unused): decode_step_cpu's table */
int step_linear(const float *x, const signed char *q, const float *sc, const float *of, float *y, int M, int O, int I,
                int G, int threads) {
    return linear(x, q, sc, y, M, O, I, G, threads);
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built or the CPU has no AVX2."""
    lib = cpu_build.load("byte_q8", SOURCE, {
        "linear": ([ctypes.c_void_p] * 4 + [ctypes.c_int] * 5, ctypes.c_int),
        "step_linear": ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 5, ctypes.c_int),
        "available": ([], ctypes.c_int),
    })
    return lib if lib is not None and lib.available() else None


def group_ok(in_features: int, groups: int) -> bool:
    """Groups of 16, 32 or a multiple of 32 inputs, whole blocks of 32."""
    if groups <= 0 or in_features % groups or in_features % BLOCK:
        return False
    group = in_features // groups
    return group == 16 or group % BLOCK == 0


def supports(scale: torch.Tensor, in_features: int) -> bool:
    """Whether weights with this scale [O, G] and in_features can run here (AVX2, the kernel built)."""
    return scale.device.type == "cpu" and group_ok(in_features, scale.shape[-1]) and load() is not None


def check(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> None:
    codes, scales = packed
    if codes.dim() != 2 or scales.dim() != 2 or scales.shape[0] != codes.shape[0] or not group_ok(codes.shape[1], scales.shape[1]):
        raise ValueError(f"codes {list(codes.shape)} and scales {list(scales.shape)} do not describe one weight "
                         f"in groups of 16, 32 or a multiple of 32 inputs")
    out_features, in_features = codes.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"x must end in {in_features} features, got shape {list(x.shape)}")
    if x.dtype != torch.float32 or codes.dtype != torch.int8 or scales.dtype != torch.float32:
        raise ValueError(f"x and scales must be torch.float32 and codes torch.int8, got {x.dtype}, {scales.dtype}, {codes.dtype}")
    if not (x.is_cpu and codes.is_cpu and scales.is_cpu):
        raise ValueError(f"x and the weight must be on the CPU, got {x.device} and {codes.device}")
    check_bias(bias, out_features, torch.float32)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] ~ x [..., I] @ (s * C)^T (+ bias [O]), fp32 in and out, x rounded to int8 per block of 32; C row-major
    (tiled here per call, as the runtime holds it once)."""
    check(x, packed, bias)
    if load() is None:
        raise ValueError("the byte-code kernel needs an x86 CPU with AVX2 and a C compiler")
    codes, scales = (t.contiguous() for t in packed)
    return unchecked(x, (row_tiles.tiled(codes), scales), bias)


def unchecked(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` without its checks, for a caller that made sure once that they pass (the runtime's Linears), the
    codes tiled (``row_tiles.tiled``)."""
    codes, scales = packed
    out_features, in_features = codes.shape
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty(x.shape[:-1] + (out_features,), dtype=torch.float32)  # [..., O]
    rows = x.numel() // in_features
    if rows and out_features:
        failed = cpu_build.require(load()).linear(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), y.data_ptr(), rows,
                                                  out_features, in_features, scales.shape[1], torch.get_num_threads())
        if failed:
            raise MemoryError(f"the {out_features}x{in_features} byte-code CPU kernel could not allocate x's int8 copy")
    if bias is not None:
        y += bias
    return y


def dequantize(packed: Packed, out: torch.Tensor | None = None) -> torch.Tensor:
    """W [O, I] fp32 = s * C per group, into ``out`` (a contiguous fp32 buffer of at least O * I elements) where given."""
    codes, scales = packed
    out_features, in_features = codes.shape
    if out is None:
        out = torch.empty(out_features * in_features, dtype=torch.float32)
    w = out[: out_features * in_features].view(out_features, scales.shape[1], -1)  # [O, G, I/G]
    torch.mul(codes.view(w.shape), scales.unsqueeze(-1), out=w)
    return w.view(out_features, in_features)
