"""y = x dequant(W)^T (+ b) on CPU, fp32 activations, for group-quantized int4/int3 W: a small C GEMM
built by ``cpu_build`` over codes held as 4-bit nibbles, and ``dequantize`` (W to dense fp32, for a
caller that runs torch's GEMM at large row counts). Imports only torch, the standard library and
the shared checks (torch and triton).

Why: the fp32 GEMM reads 4 bytes per weight, and at 1-16 rows that read is the step's cost. Here a
weight is half a byte plus its group's scale and offset (~5 bits at g64). Up to 4 rows (decode) the
tile is the fp32 kernel's (``linear_cpu``: RM rows of x by RN rows of W, vectors of the host's width
along I) with each W vector turned into floats in registers, ``q * scale + offset``, and used for
every row; with more rows each block of W is dequantized once per call into an L1 buffer and the
fp32 tile runs over it. int3 codes are stored as nibbles too (same speed, same memory as int4).

Layout (``pack``), row-major like the weight, 32 codes of a row in 16 bytes:
  codes   uint8 [O, I/2]: byte (o, 16c + j) = q[o, 32c + j] | q[o, 32c + 16 + j] << 4
  scales  fp32  [O, G]: s per row and group
  offsets fp32  [O, G]: -z * s, so that w = q * s + offset
I and the group size must be multiples of 32 (``supports``): a group is whole 16-byte chunks.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build
from compress.kernels.checks import check_bias
from compress.kernels.linear_cpu import TILE

CHUNK = 32  # codes per 16 bytes
Packed = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (codes, scales, offsets) as pack() returns them

# The codes' dequantization, shared with nibble_panel_cpu (which dequantizes into panel_cpu's panels).
NIBBLES = r"""
#include <stdlib.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#define HALF (16 / VW)  /* vectors per nibble half of a chunk */

typedef int vi __attribute__((vector_size(VW * 4)));
typedef unsigned char u8v __attribute__((vector_size(VW), aligned(1)));

/* VW bytes zero-extended to VW int32 lanes: one vpmovzxbd on x86 (GCC's portable form is a load per byte). */
static inline vi widen(const unsigned char *p) {
#if VW == 16
    return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#elif VW == 8 && defined(__AVX2__)
    return (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
#else
    return __builtin_convertvector(*(const u8v *)p, vi);
#endif
}

/* A group's dequantization (scale s, offset o) as one piece() needs it. AVX-512: its 16 values q * s + o in a
   register, looked up by the codes (vpermps reads an index's low 4 bits only, so the low nibbles need no mask):
   one or two ops a vector of weights (a shift for the high nibbles, the lookup) instead of three, mask or shift,
   convert, multiply-add. */
#if VW == 16
typedef vf deq;
static inline deq deq_of(float s, float o) {
    return (vf){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} * s + o;
}
#else
typedef struct { float s, o; } deq;
static inline deq deq_of(float s, float o) { return (deq){s, o}; }
#endif

/* Weights v*VW .. v*VW + VW - 1 of the 32 in the 16-byte chunk at p, as floats (low nibbles first). */
static inline vf piece(const unsigned char *p, int v, deq d) {
    const vi lanes = widen(p + (v % HALF) * VW);
#if VW == 16
    return (vf)_mm512_permutexvar_ps((__m512i)(v < HALF ? lanes : lanes >> 4), (__m512)d);
#else
    const vi q = v < HALF ? lanes & 15 : lanes >> 4;
    return __builtin_convertvector(q, vf) * d.s + d.o;
#endif
}

/* w [rn, K] (rows ws floats apart) = dequant of rows of q (I/2 bytes apart) from group g0, K / gs whole groups. */
static void dequant_rows(const unsigned char *q, const float *sc, const float *of, float *w, int ws, int rn,
                         int I, int G, int gs, int g0, int K) {
    for (int n = 0; n < rn; n++)
        for (int g = 0; g < K / gs; g++) {
            const deq d = deq_of(sc[(size_t)n * G + g0 + g], of[(size_t)n * G + g0 + g]);
            for (int k = g * gs; k < (g + 1) * gs; k += 32)
                for (int v = 0; v < 32 / VW; v++)
                    *(vfu *)(w + (size_t)n * ws + k + v * VW) = piece(q + (size_t)n * (I / 2) + (size_t)g0 * gs / 2 + k / 2, v, d);
        }
}

"""

SOURCE = TILE + NIBBLES + r"""
/* The in-register tile: AVX-512 4 x 4 (16 accumulators, 4 weights, 8 scales and offsets); 16 registers: 4 x 2. */
#if VW == 16 || defined(__aarch64__)
#define NRN 4
#else
#define NRN 2
#endif
/* The in-register tile asks for W's rows this far ahead: a 1-row decode streamed at ~9.5 GB/s from memory on
   one core of an AMD EPYC, half what it ran at from cache, until it did (1.7x; 8 and 16 rows ahead were even on
   SmolLM2's and Llama-3-8B's shapes, 16 a few % ahead on the first). */
#define PF 16

/* At most RM rows: y[r, n] = x[r, :] . dequant(w)[n, :], each W vector dequantized in registers once and
   used for every row (nothing written but y). Rows of x are I floats apart, of q I/2 bytes, of sc and of G. */
static inline __attribute__((always_inline)) void ntile(const float *x, const unsigned char *q, const float *sc,
        const float *of, float *y, int I, int G, int gs, int ys, const int rm, const int rn) {
    vf acc[RM][NRN];
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) acc[r][n] = (vf){0};
    for (int g = 0; g < G; g++) {
        deq d[NRN];
        for (int n = 0; n < rn; n++) d[n] = deq_of(sc[(size_t)n * G + g], of[(size_t)n * G + g]);
        for (int k = g * gs; k < (g + 1) * gs; k += 32) {
            if ((k & 127) == 0) prefetch_rows(q + k / 2, I / 2, rn, PF);  /* once per 64-byte line of each row */
            for (int v = 0; v < 32 / VW; v++) {
                vf wv[NRN];
                for (int n = 0; n < rn; n++) wv[n] = piece(q + (size_t)n * (I / 2) + k / 2, v, d[n]);
                for (int r = 0; r < rm; r++) {
                    const vf xv = *(const vfu *)(x + (size_t)r * I + k + v * VW);
                    for (int n = 0; n < rn; n++) acc[r][n] += xv * wv[n];
                }
            }
        }
    }
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) y[(size_t)r * ys + n] = hsum(acc[r][n]);
}

#define NCASE(a, b) case a * 8 + b: if (a <= RM && b <= NRN) ntile(x, q, sc, of, y, I, G, gs, ys, a, b); break;
#define NCASES(a) NCASE(a, 1) NCASE(a, 2) NCASE(a, 3) NCASE(a, 4)
static void any_ntile(const float *x, const unsigned char *q, const float *sc, const float *of, float *y,
                      int I, int G, int gs, int ys, int rm, int rn) {
    switch (rm * 8 + rn) { NCASES(1) NCASES(2) NCASES(3) NCASES(4) }
}

/* y[:, o0:o1] of y [M, O] = x [M, I] @ dequant(W)^T. Up to RM rows: the in-register tile. More: each block
   of RN rows x one block of inputs of W (block_inputs) is dequantized once into wb and the fp32 tile runs over
   it for every row of x, so the dequantization is paid once per call, not once per RM rows. */
static int nrows(const float *x, const unsigned char *q, const float *sc, const float *of, float *y,
                 int M, int O, int I, int G, int o0, int o1) {
    const int gs = I / G;
    if (M <= RM) {
        for (int o = o0; o < o1; o += NRN)
            any_ntile(x, q + (size_t)o * (I / 2), sc + (size_t)o * G, of + (size_t)o * G, y + o, I, G, gs, O,
                      M, o1 - o < NRN ? o1 - o : NRN);
        return 0;
    }
    const int kc = block_inputs(M, I, gs), mc = block_rows(kc);  /* linear_cpu's blocks, in whole groups */
    float *wb = malloc(sizeof(float) * RN * kc);
    if (!wb) return 1;
    for (int k0 = 0; k0 < I; k0 += kc) {
        const int K = I - k0 < kc ? I - k0 : kc;
        for (int m0 = 0; m0 < M; m0 += mc) {
            const int m1 = M - m0 < mc ? M : m0 + mc;
            for (int o = o0; o < o1; o += RN) {
                const int rn = o1 - o < RN ? o1 - o : RN;
                dequant_rows(q + (size_t)o * (I / 2), sc + (size_t)o * G, of + (size_t)o * G, wb, K, rn, I, G, gs, k0 / gs, K);
                for (int m = m0; m < m1; m += RM)
                    any_tile(x + (size_t)m * I + k0, I, wb, K, y + (size_t)m * O + o, O, K, k0 > 0, 0, m1 - m < RM ? m1 - m : RM, rn);
            }
        }
    }
    free(wb);
    return 0;
}

int linear(const float *x, const unsigned char *q, const float *sc, const float *of, float *y,
           int M, int O, int I, int G, int threads) {
    const int rn = M <= RM ? NRN : RN, blocks = (O + rn - 1) / rn;
    int failed = 0;
    if (threads > blocks) threads = blocks;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        int o0, o1;
        share(O, rn, t, threads, &o0, &o1);
        if (nrows(x, q, sc, of, y, M, O, I, G, o0, o1)) failed = 1;
    }
    return failed;
}

/* w [O, I] = dequant(W). */
void dequantize(const unsigned char *q, const float *sc, const float *of, float *w, int O, int I, int G, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int o = 0; o < O; o++)
        dequant_rows(q + (size_t)o * (I / 2), sc + (size_t)o * G, of + (size_t)o * G, w + (size_t)o * I, I, 1, I, G, I / G, 0, I);
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    return cpu_build.load("nibble_linear", SOURCE, {
        "linear": ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 5, ctypes.c_int),
        "dequantize": ([ctypes.c_void_p] * 4 + [ctypes.c_int] * 4, None),
    })


def supports(scale: torch.Tensor, in_features: int) -> bool:
    """Whether weights with this scale [O, G] and in_features can run here: on CPU, whole 32-code
    chunks per group, with the kernel built."""
    groups = scale.shape[-1]
    return scale.device.type == "cpu" and in_features % groups == 0 and (in_features // groups) % CHUNK == 0 and load() is not None


def pack(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Packed:
    """codes uint8 [O, I] in [0, 16), scale and zero [O, G] -> (codes [O, I/2] uint8, scales, offsets [O, G] fp32)."""
    if codes.dim() != 2 or scale.shape != zero.shape or scale.shape[0] != codes.shape[0] or codes.shape[1] % scale.shape[1]:
        raise ValueError(f"codes {list(codes.shape)}, scale {list(scale.shape)} and zero {list(zero.shape)} "
                         "do not describe one grouped weight")
    if (codes.shape[1] // scale.shape[1]) % CHUNK:
        raise ValueError(f"the group size ({codes.shape[1] // scale.shape[1]}) must be a multiple of {CHUNK}")
    s = scale.float().contiguous()
    return pack_offsets(codes, s, -zero.float() * s)


def pack_offsets(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> Packed:
    """``pack`` for w = codes * scale + offset per group, offsets given (a GGUF's Q4_1 and Q4_K)."""
    if codes.dtype != torch.uint8 or int(codes.max()) > 15:
        raise ValueError("codes must be uint8 values below 16 (int4 or int3)")
    if (codes.shape[1] // scale.shape[1]) % CHUNK or offset.shape != scale.shape:
        raise ValueError(f"codes {list(codes.shape)}, scale {list(scale.shape)} and offset {list(offset.shape)} do not "
                         f"describe one weight in groups of a multiple of {CHUNK}")
    return nibbles(codes), scale.float().contiguous(), offset.float().contiguous()


def nibbles(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [O, I] below 16 -> [O, I/2] as the layout above holds them."""
    chunks = codes.view(codes.shape[0], -1, 2, CHUNK // 2)  # [O, I/32, 2 halves, 16]
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(codes.shape[0], -1).contiguous()  # [O, I/32, 16] -> [O, I/2]


def check(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> None:
    codes, scales, offsets = packed
    out_features, in_features, groups = codes.shape[0], 2 * codes.shape[1], scales.shape[1]
    if codes.dim() != 2 or scales.shape != (out_features, groups) or offsets.shape != scales.shape:
        raise ValueError(f"packed shapes {[list(t.shape) for t in packed]} do not describe one weight: use pack()")
    if groups == 0 or in_features % groups or (in_features // groups) % CHUNK:
        raise ValueError(f"{groups} groups do not cut {in_features} input features into multiples of {CHUNK}")
    if x.shape[-1] != in_features:
        raise ValueError(f"x must end in {in_features} features, got shape {list(x.shape)}")
    if x.dtype != torch.float32 or codes.dtype != torch.uint8 or scales.dtype != torch.float32 or offsets.dtype != torch.float32:
        raise ValueError(f"x, scales, offsets must be torch.float32 and codes torch.uint8, "
                         f"got {x.dtype}, {scales.dtype}, {offsets.dtype}, {codes.dtype}")
    if not (x.is_cpu and codes.is_cpu and scales.is_cpu and offsets.is_cpu):
        raise ValueError(f"x and the packed weight must be on the CPU, got {x.device} and {codes.device}")
    check_bias(bias, out_features, torch.float32)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ dequant(W)^T (+ bias [O]), fp32, with packed = pack(codes, scale, zero)."""
    check(x, packed, bias)
    return unchecked(x, tuple(t.contiguous() for t in packed), bias)


def unchecked(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` without its checks, for a caller that made sure once that they pass and that the
    packed tensors are contiguous (the runtime's Linears)."""
    return call(load(), x, packed, bias, "its dequantized weight block")


def call(lib, x: torch.Tensor, packed: Packed, bias: torch.Tensor | None, buffer: str, entry: str = "linear") -> torch.Tensor:
    """y [..., O] from ``lib.<entry>`` over packed nibbles (this kernel's, or ``nibble_q8_cpu``'s with the
    same signature); ``buffer`` names what the C code allocates, for the error when it cannot."""
    codes, scales, offsets = packed
    out_features, half = codes.shape
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty(x.shape[:-1] + (out_features,), dtype=torch.float32)  # [..., O]
    rows = x.numel() // (2 * half)
    if rows and out_features:
        failed = getattr(cpu_build.require(lib), entry)(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), offsets.data_ptr(),
                                                        y.data_ptr(), rows, out_features, 2 * half, scales.shape[1],
                                                        torch.get_num_threads())
        if failed:
            raise MemoryError(f"the {out_features}x{2 * half} 4-bit CPU kernel could not allocate {buffer}")
    if bias is not None:
        y += bias
    return y


def dequantize(packed: Packed, out: torch.Tensor | None = None) -> torch.Tensor:
    """W [O, I] fp32 of packed = pack(...), written into ``out`` (a contiguous fp32 buffer of at least
    O * I elements, e.g. a scratch buffer reused across calls) where given."""
    codes, scales, offsets = packed
    out_features, in_features = codes.shape[0], 2 * codes.shape[1]
    if out is None:
        out = torch.empty(out_features * in_features, dtype=torch.float32)
    if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() < out_features * in_features:
        raise ValueError(f"out must be a contiguous float32 buffer of at least {out_features * in_features} elements")
    w = out.view(-1)[:out_features * in_features].view(out_features, in_features)
    if w.numel():
        cpu_build.require(load()).dequantize(codes.data_ptr(), scales.data_ptr(), offsets.data_ptr(), w.data_ptr(),
                                             out_features, in_features, scales.shape[1], torch.get_num_threads())
    return w
